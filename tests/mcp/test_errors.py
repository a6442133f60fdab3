"""The MCP server's error contract, over stdio as a client speaks it (raw JSON-RPC lines, no SDK smoothing them):
a line that is not JSON gets -32700, JSON that is no message -32600, a tool's bad input an isError result with
flakebot's error object, and a refused long call leaves no job file behind."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


class Wire:
    """`flakebot mcp` driven line by line."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "flakebot", "mcp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "wire", "version": "1"}}})  # fmt: skip
        assert self.receive()["id"] == 0
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message: dict[str, Any] | str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((message if isinstance(message, str) else json.dumps(message)) + "\n")
        self.process.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        answer: dict[str, Any] = json.loads(self.process.stdout.readline())
        return answer

    def call(self, id_: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.send(
            {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
        )
        return self.receive()

    def end_input(self) -> list[dict[str, Any]]:
        """Close the server's input, then read every line it writes until it ends."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        lines = [json.loads(line) for line in self.process.stdout]
        assert self.process.wait(timeout=60) == 0
        return lines

    def close(self) -> None:
        self.process.terminate()
        if self.process.stdin is not None and self.process.stdin.closed:
            self.process.stdin = None  # end_input closed it
        self.process.communicate(timeout=30)  # closes the pipes too


@pytest.fixture
def wire() -> Iterator[Wire]:
    opened = Wire()
    yield opened
    opened.close()


def test_unreadable_lines_get_json_rpc_errors_and_the_session_goes_on(wire: Wire) -> None:
    wire.send("{this is not json")
    first = wire.receive()
    assert first["id"] is None and first["error"]["code"] == -32700 and "not JSON" in first["error"]["message"]
    wire.send('{"hello": "world"}')
    second = wire.receive()
    assert second["id"] is None and second["error"]["code"] == -32600
    wire.send({"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
    assert wire.receive()["id"] == 7


def test_requests_in_flight_when_the_input_ends_are_answered_before_the_server_exits(wire: Wire) -> None:
    """A client may close the server's input right after its last requests (the SDK cancelled what was still running
    then: a tools/list sent with the input's end went unanswered)."""
    for id_ in (1, 2):
        wire.send({"jsonrpc": "2.0", "id": id_, "method": "tools/list"})
    wire.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "list", "arguments": {}}})
    answers = wire.end_input()
    assert sorted(a["id"] for a in answers) == [1, 2, 3] and all("result" in a for a in answers), answers


def test_bad_input_is_a_tool_error_and_an_oversized_need_leaves_no_job(wire: Wire, flakebot_home: Path) -> None:
    typed = wire.call(1, "status", {"run_id": ["not", "a", "string"]})["result"]
    assert typed["isError"] and typed["structuredContent"]["type"] == "UsageError"
    for id_, need, words in ((2, "x" * 1_000_000, "1,000,000 characters"), (3, "y" * 5000, "5,000 characters")):
        answer = wire.call(id_, "craft", {"need": need})["result"]
        assert answer["isError"] and words in answer["structuredContent"]["error"], answer["structuredContent"]
    jobs = flakebot_home / "state/flakebot/mcp-jobs"
    assert not jobs.exists() or not any(jobs.iterdir()), list(jobs.iterdir())


@pytest.mark.parametrize(
    ("tool", "arguments", "says"),
    [
        ("craft", {"need": 123}, "'need' must be a string, got a whole number"),
        ("craft", {}, "'need' is a required property"),
        ("search", {"query": "csv", "limit": "ten"}, "'limit' must be a whole number or null, got a string"),
        ("services", {"extra": 1}, "services takes no argument extra"),
        ("status", {"run_id": "x", "wait_seconds": "ten"}, "'wait_seconds' must be a whole number or null"),
        ("service_up", {"service": "kv", "port": 8080.5}, "'port' must be a whole number or null, got a number"),
        ("run", {"tool": "t", "stdin": ["id", "1"]}, "'stdin' must be a string or null, got a list"),
        ("run", {"tool": "t", "args": [1]}, "'args.0' must be a string, got a whole number"),
        ("service_logs", {"service": "kv", "lines": True}, "'lines' must be a whole number or null, got true or false"),
    ],
)
def test_arguments_of_the_wrong_type_are_refused_never_coerced_and_leave_nothing(
    flakebot_home: Path, wire: Wire, tool: str, arguments: dict[str, Any], says: str
) -> None:
    answer = wire.call(1, tool, arguments)
    assert "error" not in answer, answer  # a tool's bad input is its result, not a JSON-RPC error (code 0 before)
    result = answer["result"]
    payload = json.loads(result["content"][0]["text"])
    assert result["isError"] is True and says in payload["error"] and payload["fix"] and payload["exit_code"] == 2
    assert not (flakebot_home / "work" / "mcp-jobs").exists() or not list(
        (flakebot_home / "work" / "mcp-jobs").iterdir()
    )


@pytest.mark.parametrize(
    ("tool", "arguments", "says"),
    [
        ("service_up", {"service": "nosuch"}, "no service 'nosuch' in the catalog"),
        ("service_up", {"service": "Bad/Name"}, "'Bad/Name' is not a service name"),
        ("service_up", {"service": "x" * 100_000}, f"'{'x' * 64}...' is not a service name"),
        ("resume", {"run_id": "nosuch"}, "no run 'nosuch'"),
        ("resume", {"run_id": "nosuch", "wait": False}, "no run 'nosuch'"),
    ],
)
def test_long_calls_that_need_nothing_started_to_be_refused_leave_no_job_file(
    flakebot_home: Path, wire: Wire, tool: str, arguments: dict[str, Any], says: str
) -> None:
    result = wire.call(1, tool, arguments)["result"]
    payload = json.loads(result["content"][0]["text"])
    assert result["isError"] is True and says in payload["error"], payload
    jobs = flakebot_home / "work" / "mcp-jobs"
    assert not jobs.exists() or not list(jobs.iterdir())
