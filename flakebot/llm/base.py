"""The Model seam. Messages are OpenAI chat-format dicts ({"role": ..., "content": ..., "tool_calls": ...});
tools are OpenAI function-tool dicts ({"type": "function", "function": {name, description, parameters}})."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol


@dataclass
class ToolCall:
    """One function call the model asked for. `arguments` is parsed; `error` says why parsing failed."""

    id: str
    name: str
    arguments: dict[str, Any]
    raw_arguments: str = ""
    error: str | None = None


@dataclass
class Usage:
    """Tokens one reply (or a whole run) used; `cached_tokens` is the part of the prompt the provider served from cache."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cached_tokens += other.cached_tokens
        if other.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + other.cost_usd

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Usage:
        """A Usage from to_dict() output (unknown keys, such as total_tokens, are ignored)."""
        return cls(
            **{k: data[k] for k in ("prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd") if k in data}
        )


@dataclass
class Reply:
    """One assistant turn."""

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = ""
    usage: Usage = field(default_factory=Usage)
    latency: float = 0.0  # seconds, including the SDK's own retries
    model: str = ""
    shrunk: int = 0  # history messages elided in place to fit the context window during this call

    def to_message(self) -> dict[str, Any]:
        """This reply as the assistant message to append to the history."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.raw_arguments or _dumps(c.arguments)},
                }
                for c in self.tool_calls
            ]
        return message

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value)


class Model(Protocol):
    """A chat model that can call tools."""

    name: str  # "provider:model", as chosen

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *, temperature: float = 0.0
    ) -> Reply: ...

    def close(self) -> None: ...
