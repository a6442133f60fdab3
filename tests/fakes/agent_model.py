"""A model on 127.0.0.1 for an agent framework's own loop: each turn is decided from the conversation so far, as a
model following flakebot's tool descriptions would: craft, follow the run handle with `status` until the run is no
longer running, call the crafted tool, answer with what it printed.

The framework under test (the OpenAI Agents SDK's Runner, LangChain's ChatOpenAI) sends real chat-completions
requests to it over HTTP; every request is kept (`requests`), so a test sees the tools the framework offered the
model, with their `strict` flags and schemas. A conversation it cannot continue (a tool result it did not expect)
is answered with a 400 naming the problem, and the problem is kept in `failures`.
"""

from __future__ import annotations

import json
from typing import Any

from flakebot.llm.script import Script
from flakebot.llm.stub_server import StubServer

RUNNING = ("created", "running")
DONE = ("crafted", "succeeded")


class FollowingModel(StubServer):
    """Crafts with `craft_arguments`, follows the run, then calls `tool` with `tool_arguments` (all as a strict model
    fills them: every property present). Polls are paced by `poll_seconds`, as a model told "every few seconds"."""

    def __init__(
        self,
        craft_arguments: dict[str, Any],
        tool: str,
        tool_arguments: dict[str, Any],
        poll_seconds: float = 1.0,
        wait_seconds: float | None = None,
    ) -> None:
        super().__init__(Script([], model="following", source="<following model>"))
        self.craft_arguments = craft_arguments
        self.tool = tool
        self.tool_arguments = tool_arguments
        self.poll_seconds = poll_seconds
        self.wait_seconds = wait_seconds  # status's wait_seconds, as a model told to hold each answer sends it
        self.run_id: str | None = None
        self.polls: list[str] = []

    def take_turn(self, request: dict[str, Any]) -> tuple[int, dict[str, Any] | None, str | None]:
        with self._lock:
            index = self._next
            self._next += 1
            try:
                return index, self.decide(request.get("messages") or []), None
            except ValueError as exc:
                problem = f"script expectation failed: turn {index} of the following model: {exc}"
                self.failures.append(problem)
                return index, {"content": problem}, problem

    def decide(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        last = messages[-1] if messages else {}
        if last.get("role") == "user":
            return _call("craft", self.craft_arguments)
        if last.get("role") != "tool":
            raise ValueError(f"the last message is {last.get('role')!r}, not the user's need or a tool result")
        called = _called(messages, str(last.get("tool_call_id")))
        result = tool_output(last.get("content"))
        if called in ("craft", "status"):
            status = str(result.get("status"))
            self.run_id = str(result.get("run_id") or self.run_id)
            if called == "status":
                self.polls.append(status)
            if status in RUNNING:
                return {
                    **_call("status", {"run_id": self.run_id, "wait_seconds": self.wait_seconds}),
                    "fault": {"kind": "slow", "seconds": self.poll_seconds},
                }
            if status in DONE:
                return _call(self.tool, self.tool_arguments)
            raise ValueError(f"{called} answered status {status!r}: {json.dumps(result)[:500]}")
        if called == self.tool:
            return {"content": f"{self.tool} printed:\n{result.get('stdout')}"}
        raise ValueError(f"no next step after a call of {called!r}")


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def _called(messages: list[dict[str, Any]], call_id: str) -> str:
    """The name of the tool whose call `call_id` names (in the assistant message that made it)."""
    for message in messages:
        for call in message.get("tool_calls") or []:
            if call.get("id") == call_id:
                return str(call["function"]["name"])
    raise ValueError(f"no assistant message made the tool call {call_id!r}")


def tool_output(content: Any) -> dict[str, Any]:
    """flakebot's JSON result from a tool message, however the framework wrapped the MCP result's text block (the
    text itself, a content part, a list of parts, or their JSON)."""
    if isinstance(content, str):
        try:
            content = json.loads(content)
        except ValueError:
            raise ValueError(f"a tool result that is not JSON: {content[:300]!r}") from None
    if isinstance(content, list) and content:
        content = content[0]
    if isinstance(content, dict) and content.get("type") == "text":
        return tool_output(content["text"])
    if isinstance(content, dict):
        return content
    raise ValueError(f"a tool result of an unknown shape: {json.dumps(content)[:300]}")
