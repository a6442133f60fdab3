"""Context overflow: recognise the providers' messages, and shrink a history to fit (oldest tool outputs first)."""

from __future__ import annotations

from typing import Any

# Substrings of what Groq, OpenAI, vLLM, llama.cpp and Ollama answer when the prompt does not fit.
OVERFLOW_MARKERS = (
    "context_length_exceeded",
    "maximum context length",
    "reduce the length of the messages",
    "context window",
    "exceeds the context",
    "prompt is too long",
    "too many tokens",
    "input is too long",
    "context size",
    "request too large",  # Groq 413: the request alone exceeds the tokens-per-minute limit
)
ELIDED = "[elided by flakebot to fit the context window: {n} characters of {what}]"
KEEP_CHARS = 400  # head and tail kept of a long non-tool message


def is_overflow(code: str | None, message: str) -> bool:
    """True when an error code or message says the prompt is longer than the model's context."""
    text = f"{code or ''} {message}".lower()
    return any(marker in text for marker in OVERFLOW_MARKERS)


def shrink(messages: list[dict[str, Any]]) -> int:
    """Elide, in place, the older half of the tool outputs still whole; failing that, cut long older messages.

    The system prompt and the last message are kept. Returns how many messages changed (0: nothing left to cut).
    """
    tools = [i for i, m in enumerate(messages[:-1]) if m.get("role") == "tool" and not _elided(m)]
    if tools:
        chosen = tools[: max(1, len(tools) // 2)]
        for i in chosen:
            messages[i] = {**messages[i], "content": ELIDED.format(n=len(_text(messages[i])), what="tool output")}
        return len(chosen)
    long = [
        i
        for i, m in enumerate(messages[:-1])
        if m.get("role") != "system" and len(_text(m)) > 4 * KEEP_CHARS and not _elided(m)
    ]
    for i in long:
        text = _text(messages[i])
        cut = ELIDED.format(n=len(text) - 2 * KEEP_CHARS, what=str(messages[i].get("role")))
        messages[i] = {**messages[i], "content": f"{text[:KEEP_CHARS]}\n{cut}\n{text[-KEEP_CHARS:]}"}
    return len(long)


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _elided(message: dict[str, Any]) -> bool:
    return "[elided by flakebot" in _text(message)
