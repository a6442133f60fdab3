"""The service tools' arguments through the real `flakebot mcp` and the Python SDK's client: what an agent must give
is asked for by the schema and refused in one line when missing (null, "" or blank), before any job is admitted; a
whole number sent as 8080.0 is refused as the hand-written tools refused it, not a crash inside the work."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.mcp.test_server import mcp_client


def _jobs(home: Path) -> list[Path]:
    directory = home / "work" / "mcp-jobs"
    return sorted(directory.glob("*.jsonl")) if directory.exists() else []


def test_service_up_asks_for_its_service_and_refuses_none_before_a_job(flakebot_home: Path) -> None:
    async def session() -> tuple[Any, list[Any]]:
        async with mcp_client() as client:
            tools = {t.name: t for t in (await client.session.list_tools()).tools}
            calls = [{}, {"service": None}, {"service": ""}, {"service": "  "}]
            return tools["service_up"], [await client.call("service_up", args) for args in calls]

    tool, answers = asyncio.run(session())
    assert tool.input_schema["properties"]["service"]["type"] == "string"  # required, not nullable
    for answer, error in answers:
        assert error and answer["type"] == "UsageError" and answer["error"].count("'service'") == 1, answer
        assert "required" in answer["error"] or "must be a string" in answer["error"], answer
        assert "--all" not in answer["error"] + answer["fix"]  # the MCP door offers no --all
    assert _jobs(flakebot_home) == []  # refused before admission: no job process started


@pytest.mark.parametrize(
    ("tool", "args", "missing"),
    [
        ("service_down", {"service": ""}, "service"),
        ("service_logs", {"service": ""}, "service"),
        ("service_logs", {"service": "   "}, "service"),
        ("service_request", {"service": "kv", "method": "", "path": "/"}, "method"),
        ("service_request", {"service": "kv", "method": "GET", "path": ""}, "path"),
    ],
)
def test_an_empty_required_argument_is_one_usage_error(
    flakebot_home: Path, tool: str, args: dict[str, Any], missing: str
) -> None:
    async def session() -> Any:
        async with mcp_client() as client:
            return await client.call(tool, args)

    answer, error = asyncio.run(session())
    assert error and answer["type"] == "UsageError" and answer["error"] == f"'{missing}' is required", answer


@pytest.mark.parametrize(
    ("tool", "args", "name"),
    [
        ("service_up", {"service": "kv-service", "port": 18080.0}, "port"),
        ("service_logs", {"service": "kv-service", "lines": 10.0}, "lines"),
        ("service_request", {"service": "kv-service", "method": "GET", "path": "/", "timeout_seconds": 5.0},
         "timeout_seconds"),
    ],
)  # fmt: skip
def test_a_whole_number_sent_as_a_float_is_refused_in_one_line(
    flakebot_home: Path, tool: str, args: dict[str, Any], name: str
) -> None:
    """JSON Schema counts 18080.0 as an integer; the work's sockets do not (the hand-written tools refused it)."""

    async def session() -> Any:
        async with mcp_client() as client:
            return await client.call(tool, args)

    answer, error = asyncio.run(session())
    assert error and answer["type"] == "UsageError", answer
    assert answer["error"] == f"'{name}' must be a whole number, got a number", answer
    assert _jobs(flakebot_home) == []


@pytest.mark.parametrize(
    "args",
    [{"service": "nosuch"}, {"service": ""}, {"service": "kv-service", "port": 18080.0}],
)
def test_service_up_as_a_task_is_checked_before_a_job_is_admitted(flakebot_home: Path, args: dict[str, Any]) -> None:
    """The tasks door (protocol 2025-11-25) starts a detached job: what `service_up` would refuse at once (no such
    service, no service at all, a port that is no whole number) is refused there too, with no job process."""
    from tests.mcp.test_tasks import raw_session

    with raw_session("2025-11-25") as session:
        answer = session.ask("tools/call", {"name": "service_up", "arguments": args, "task": {"ttl": 60000}})
    assert "error" in answer and answer["error"]["code"] == -32602, answer  # INVALID_PARAMS, one line
    assert "\n" not in answer["error"]["message"]
    assert _jobs(flakebot_home) == []


def test_a_huge_timeout_is_refused_as_out_of_range(flakebot_home: Path) -> None:
    """A whole number too large for a float (10**400 is valid JSON) is out of range, not an OverflowError."""

    async def session() -> Any:
        async with mcp_client() as client:
            args = {"service": "kv-service", "method": "GET", "path": "/", "timeout_seconds": 10**400}
            return await client.call("service_request", args)

    answer, error = asyncio.run(session())
    assert error and answer["type"] == "UsageError" and "out of range" in answer["error"], answer
