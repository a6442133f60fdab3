"""Models: one small interface over Groq, OpenAI and any OpenAI-compatible server.

    base.py         Model protocol, Reply, ToolCall, Usage (messages are OpenAI-format dicts)
    providers.py    provider:model strings -> Model: resolve_model(), check_model(), describe()
    chat.py         ChatModel: the groq/openai SDK call plus retries, format errors, context overflow
    budget.py       Budget: token and cost limits, charged after every reply
    transcript.py   Transcript: transcript.jsonl records, secrets redacted (flakebot.redact)
    prices.py       cost of a reply from flakebot/data/prices.json
    history.py      recognising context overflow; shrinking a history to fit
    script.py       the script format the stub server replays (docs/scripts.md)
    stub_server.py  a chat-completions server on 127.0.0.1 replaying a script, with faults on demand

May import flakebot.config, flakebot.errors, flakebot.fsutil. SDKs are imported lazily.
"""

from flakebot.llm.base import Model, Reply, ToolCall, Usage
from flakebot.llm.budget import Budget
from flakebot.llm.transcript import Transcript

__all__ = ["Budget", "Model", "Reply", "ToolCall", "Transcript", "Usage"]
