"""Models: one small interface over Groq, OpenAI and any OpenAI-compatible server.

    base.py         Model protocol, Reply, ToolCall, Usage (messages are OpenAI-format dicts)
    providers.py    provider:model strings -> Model (groq, openai, openai-compatible, ollama, scripted)
    stub_server.py  a chat-completions server on 127.0.0.1 replaying a script, with faults on demand

May import flakebot.config, flakebot.errors, flakebot.fsutil. SDKs are imported lazily.
"""

from flakebot.llm.base import Model, Reply, ToolCall, Usage

__all__ = ["Model", "Reply", "ToolCall", "Usage"]
