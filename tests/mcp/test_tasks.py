"""MCP tasks (spec 2025-11-25) for the long tools, through clients nobody here wrote: the official TypeScript SDK's
task API (tests/mcp_ts/tasks.mjs) creates, follows, lists and cancels tasks; the Python SDK's client session, on a
second `flakebot mcp`, reads them back. (That session cannot create a task: it checks every tools/call result
against CallToolResult, and a CreateTaskResult is not one.)"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client

from tests.conftest import REPO, require, wait_for
from tests.fakes.processes import descendants, own_processes
from tests.mcp.test_server import TS_CLIENT, Client, mcp_client, require_typescript_sdk

LONG_TOOLS = {"craft", "improve", "package", "resume", "service_rollback", "service_up"}
# A craft whose model takes minutes to write the spec: its task is still working when it is cancelled.
SLOW_MODEL = {"format": 1, "stages": {"spec": [{"fault": {"kind": "slow", "seconds": 300}, "content": "too late"}]}}
# What a package result says about the build itself (the rest names its run).
BUILT = ("ok", "pname", "version", "store_path", "bin_path", "main_program", "licenses", "nixpkgs_mode")


async def ask(client: Any, request: Any, result_type: Any) -> Any:
    """A task request's typed result, or the MCPError it was answered with."""
    try:
        return await client.session.send_request(request, result_type)
    except MCPError as exc:
        return exc


def test_tasks_are_offered_on_protocol_2025_11_25_only(flakebot_home: Path) -> None:
    async def session() -> tuple[Any, list[types.Tool], Any, Any, Any]:
        async with mcp_client() as client:
            tools = (await client.session.list_tools()).tools
            listed = await ask(client, types.ListTasksRequest(), types.ListTasksResult)
            unknown = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id="no-such-task"))
            bad_cursor = types.ListTasksRequest(params=types.PaginatedRequestParams(cursor="page 2"))
            return (
                client.init,
                tools,
                listed,
                await ask(client, unknown, types.GetTaskResult),
                await ask(client, bad_cursor, types.ListTasksResult),
            )

    init, tools, listed, unknown, bad_cursor = asyncio.run(session())
    assert init.protocol_version == "2025-11-25"
    tasks = init.capabilities.tasks
    assert tasks is not None and tasks.list is not None and tasks.cancel is not None
    assert tasks.requests is not None and tasks.requests.tools is not None and tasks.requests.tools.call is not None
    support = {tool.name: tool.execution.task_support if tool.execution else None for tool in tools}
    assert {name for name, value in support.items() if value == "optional"} == LONG_TOOLS
    assert {value for name, value in support.items() if name not in LONG_TOOLS} == {None}
    assert listed == types.ListTasksResult(tasks=[])
    assert isinstance(unknown, MCPError) and unknown.code == types.INVALID_PARAMS
    assert "no task 'no-such-task'" in unknown.message and "tasks/list" in unknown.message
    assert isinstance(bad_cursor, MCPError) and bad_cursor.code == types.INVALID_PARAMS
    assert "invalid cursor 'page 2'" in bad_cursor.message

    # Nor does one of 2026-07-28, which moved tasks out of the core protocol (the Python SDK's discover, no handshake).
    async def modern() -> tuple[Any, list[types.Tool], Any]:
        params = StdioServerParameters(command=sys.executable, args=["-m", "flakebot", "mcp"], env=dict(os.environ))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            found = await session.discover()
            tools = (await session.list_tools()).tools
            listed = await ask(Client(session, []), types.ListTasksRequest(), types.ListTasksResult)
            return found, tools, listed

    found, modern_tools, modern_list = asyncio.run(modern())
    assert found.capabilities.tasks is None and [tool.execution for tool in modern_tools if tool.execution] == []
    assert isinstance(modern_list, MCPError) and modern_list.code == types.METHOD_NOT_FOUND

    # A client of an earlier revision (2025-06-18 has no tasks) sees none of it, and its `task` param is ignored.
    with raw_session("2025-06-18") as older:
        assert older.init["protocolVersion"] == "2025-06-18" and "tasks" not in older.init["capabilities"]
        assert not any("execution" in tool for tool in older.ask("tools/list")["result"]["tools"])
        refused = older.ask("tasks/list")["error"]
        assert refused["code"] == types.METHOD_NOT_FOUND and "2025-11-25 only" in refused["message"]
        status = older.ask("tools/call", {"name": "status", "arguments": {"run_id": "nope"}, "task": {}})["result"]
        assert status["isError"] and "nope" in status["structuredContent"]["error"]


def test_a_task_whose_process_is_killed_fails(flakebot_home: Path, tmp_path: Path) -> None:
    require("nix")
    script = tmp_path / "slow-model.json"
    script.write_text(json.dumps(SLOW_MODEL))
    craft = {"need": "upper-case my input", "model": f"scripted:{script}", "registry": "local"}
    with raw_session("2025-11-25") as session:
        created = session.ask("tools/call", {"name": "craft", "arguments": craft, "task": {"ttl": 60000}})["result"]
        task_id = created["task"]["taskId"]
        record = json.loads((flakebot_home / f"work/mcp-jobs/{task_id}.task.json").read_text())
        os.killpg(record["pid"], signal.SIGKILL)

        def settled() -> dict[str, Any] | None:
            task: dict[str, Any] = session.ask("tasks/get", {"taskId": task_id})["result"]
            return task if task["status"] != "working" else None

        got = wait_for(settled)
        result = session.ask("tasks/result", {"taskId": task_id})["result"]
    assert (created["task"]["status"], created["task"]["ttl"]) == ("working", 60000)
    assert (
        got["status"] == "failed" and f"the process of task {task_id} ended before it finished" in got["statusMessage"]
    )
    assert result["isError"] and result["structuredContent"]["error"] in got["statusMessage"]
    assert result["_meta"] == {"io.modelcontextprotocol/related-task": {"taskId": task_id}}


class RawSession:
    """JSON-RPC on `flakebot mcp`'s stdio, one request at a time: what no SDK client here sends (an earlier protocol
    revision; a task created by a client that stays to watch its process be killed)."""

    def __init__(self, server: subprocess.Popen[str]) -> None:
        assert server.stdin is not None and server.stdout is not None
        self.stdin, self.stdout = server.stdin, server.stdout
        self.sent = 0
        self.init: dict[str, Any] = {}

    def ask(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.sent += 1
        self.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.sent, "method": method, "params": params or {}}))
        self.stdin.write("\n")
        self.stdin.flush()
        answer: dict[str, Any] = json.loads(self.stdout.readline())
        return answer


@contextmanager
def raw_session(protocol: str) -> Iterator[RawSession]:
    command = [sys.executable, "-m", "flakebot", "mcp"]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as server:
        session = RawSession(server)
        hello = {"protocolVersion": protocol, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
        session.init = session.ask("initialize", hello)["result"]
        session.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
        session.stdin.flush()
        yield session
        session.stdin.close()


@pytest.mark.slow
def test_typescript_sdk_runs_package_as_a_task_and_cancels_a_craft(
    flakebot_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_typescript_sdk()
    monkeypatch.setenv("FLAKEBOT_OFFLINE", "1")
    script = tmp_path / "slow-model.json"
    script.write_text(json.dumps(SLOW_MODEL))
    package = {"target": "hexyl", "registry": "local"}
    craft = {"need": "upper-case my input", "model": f"scripted:{script}", "crate": "csv", "registry": "local"}
    with own_processes():  # what the server's jobs leave stays in this test's tree, where _processes_naming looks
        done = subprocess.run(
            ["node", str(TS_CLIENT / "tasks.mjs"), sys.executable, json.dumps(package), json.dumps(craft)],
            capture_output=True,
            text=True,
            timeout=1200,
            cwd=REPO,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])

    assert seen["capabilities"]["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    assert {name for name, value in seen["execution"].items() if value} == LONG_TOOLS
    # The package task, followed by the SDK's own polling to the result the call would have returned.
    kinds = [message["type"] for message in seen["package"]]
    assert kinds[0] == "taskCreated" and kinds[-1] == "result" and "error" not in kinds, seen["package"]
    created, result = seen["package"][0]["task"], seen["package"][-1]["result"]
    package_id = created["taskId"]
    assert created["status"] == "working" and created["ttl"] == 24 * 3600 * 1000 and created["pollInterval"]
    last = seen["package"][-2]["task"]
    assert last["status"] == "completed" and last["statusMessage"].endswith("succeeded")
    assert last["createdAt"] == created["createdAt"] <= last["lastUpdatedAt"]
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": package_id}
    packaged = result["structuredContent"]
    assert not result.get("isError") and json.loads(result["content"][0]["text"]) == packaged
    assert (packaged["ok"], packaged["pname"], packaged["version"]) == (True, "hexyl", "0.8.0")
    assert [task["taskId"] for task in seen["listed"]["tasks"]] == [package_id]

    # A call the job refuses fails (its result the error the call returns); a task past its ttl is forgotten.
    assert seen["failed"]["status"] == "failed" and seen["failedResult"]["isError"]
    refused = seen["failedResult"]["structuredContent"]
    assert "library crate" in refused["error"] and seen["failed"]["statusMessage"].startswith(refused["error"]), refused
    assert seen["brief"]["code"] == types.INVALID_PARAMS and "forgotten once its ttl passed" in seen["brief"]["message"]

    # The craft task: cancelled while its run waits for the model; the run is interrupted, as on Ctrl-C.
    craft_id = seen["craft"]["task"]["taskId"]
    assert seen["polls"][-1].startswith("spec: "), seen["polls"]
    assert seen["cancelled"]["status"] == seen["afterCancel"]["status"] == "cancelled"
    interrupted = seen["cancelledResult"]["structuredContent"]
    assert seen["cancelledResult"]["isError"] and (interrupted["type"], interrupted["stage"]) == ("Interrupted", "spec")
    assert seen["afterCancel"]["statusMessage"] == f"cancelled: interrupted. Fix: {interrupted['fix']}"
    assert seen["cancelAgain"]["code"] == types.INVALID_PARAMS and "already cancelled" in seen["cancelAgain"]["message"]
    assert seen["unknown"]["code"] == types.INVALID_PARAMS
    not_a_task = seen["notATask"]
    assert not_a_task["code"] == types.METHOD_NOT_FOUND and "'list' does not run as a task" in not_a_task["message"]

    jobs = flakebot_home / "work/mcp-jobs"
    pid = json.loads((jobs / f"{craft_id}.task.json").read_text())["pid"]
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the craft's process group is gone
    assert _processes_naming(jobs) == []

    # A second server (the Python SDK's client) reads the tasks the first one created.
    async def second() -> dict[str, Any]:
        async with mcp_client() as client:
            found = {
                "get": types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=package_id)),
                "result": types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=package_id)),
                "cancel": types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=package_id)),
                "list": types.ListTasksRequest(),
            }
            answers = {
                "get": await ask(client, found["get"], types.GetTaskResult),
                "result": await ask(client, found["result"], types.CallToolResult),
                "cancel": await ask(client, found["cancel"], types.CancelTaskResult),
                "list": await ask(client, found["list"], types.ListTasksResult),
            }
            answers["status"] = await client.call("status", {"run_id": interrupted["run_id"]})
            answers["waited"] = await client.call("package", {**package, "wait": True})
            return answers

    answers = asyncio.run(second())
    assert answers["get"].status == "completed" and answers["get"].created_at == created["createdAt"]
    again = answers["result"]
    assert again.structured_content == packaged and not again.is_error
    assert again.meta == {"io.modelcontextprotocol/related-task": {"taskId": package_id}}
    assert isinstance(answers["cancel"], MCPError) and answers["cancel"].code == types.INVALID_PARAMS
    listed = [(task.task_id, task.status) for task in answers["list"].tasks]
    assert listed == [(craft_id, "cancelled"), (seen["failed"]["taskId"], "failed"), (package_id, "completed")]
    assert answers["status"][0]["status"] == "interrupted"
    waited, waited_error = answers["waited"]
    assert not waited_error and set(waited) == set(packaged)
    assert {k: waited[k] for k in BUILT} == {k: packaged[k] for k in BUILT}


def _processes_naming(directory: Path) -> list[str]:
    """Command lines of this test's live processes that name a file in `directory` (a job's names its journal)."""
    return [text for text in (" ".join(argv) for _, argv in descendants()) if str(directory) in text]


def test_a_task_takes_the_same_argument_check_as_a_call_and_starts_nothing_when_refused(flakebot_home: Path) -> None:
    with raw_session("2025-11-25") as session:
        answer = session.ask("tools/call", {"name": "craft", "arguments": {"need": 123}, "task": {}})
    assert answer["error"]["code"] == types.INVALID_PARAMS, answer
    assert "'need' must be a string, got a whole number" in answer["error"]["message"]
    jobs = flakebot_home / "work" / "mcp-jobs"
    assert not jobs.exists() or not list(jobs.iterdir())  # no job, no task record
