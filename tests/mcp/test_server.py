"""The MCP server, driven by the official MCP SDK's own client over stdio (and crafts through it, offline:
scripted model, Debian's registry, real cargo in bubblewrap, real nix with the host stand-in)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from benchmarks.scenarios.many_tools import Tools, store_path
from benchmarks.scenarios.shout import shout_script
from flakebot import __version__
from flakebot.mcp.server import OWN_TOOLS
from tests.conftest import REPO, require, run_cli
from tests.deliver.test_shared_index import a as publisher_a  # noqa: F401 - fixture `a`: a shared catalog

SESSION = REPO / "flakebot/data/sessions/csv-dedup.json"
CSV = "id,name\n1,ann\n2,bob\n1,ann\n3,cy\n2,bob\n"
TS_CLIENT = REPO / "tests/mcp_ts"


def require_typescript_sdk() -> None:
    """Skip unless the TypeScript SDK's client can run a craft here (node, the SDK, bwrap, cargo and nix)."""
    if not (TS_CLIENT / "node_modules/@modelcontextprotocol/sdk").is_dir():
        pytest.skip(
            "the MCP TypeScript SDK is not installed: scripts/setup.sh installs it when npm reaches its registry"
        )
    require("node", "bwrap", "cargo", "nix")


CRAFT_STAGES = ["spec", "search", "choose", "acquire", "edit", "package", "instruct", "clean"]


class Client:
    """An MCP client session on `flakebot mcp` that records the server's notifications."""

    def __init__(self, session: ClientSession, notices: list[Any], init: Any = None) -> None:
        self.session = session
        self.notices = notices
        self.init = init  # the server's initialize result

    async def tool_names(self) -> list[str]:
        return [tool.name for tool in (await self.session.list_tools()).tools]

    async def call(self, name: str, arguments: dict[str, Any], **options: Any) -> tuple[dict[str, Any], bool]:
        """(the JSON result, isError)."""
        result = await self.session.call_tool(name, arguments, **options)
        assert isinstance(result, types.CallToolResult)
        return json.loads(result.content[0].text), bool(result.is_error)

    def list_changes(self) -> int:
        return sum(isinstance(n, types.ToolListChangedNotification) for n in self.notices)


@asynccontextmanager
async def mcp_client() -> Any:
    notices: list[Any] = []

    async def on_message(message: Any) -> None:
        notices.append(message)

    params = StdioServerParameters(command=sys.executable, args=["-m", "flakebot", "mcp"], env=dict(os.environ))
    async with stdio_client(params) as (read, write), ClientSession(read, write, message_handler=on_message) as session:
        init = await session.initialize()
        yield Client(session, notices, init)


def test_mcp_client_lists_and_calls_tools(flakebot_home: Path) -> None:
    async def session() -> tuple[list[str], Any, Any, Any, Any, Any, Any]:
        async with mcp_client() as client:
            names = await client.tool_names()
            assert client.init.server_info.name == "flakebot" and client.init.server_info.version == __version__
            return (
                names,
                await client.call("list", {}),
                await client.call("run", {"tool": "nope", "args": []}),
                await client.call("status", {"run_id": "nope"}),
                await client.call("status", {"run_id": 42}),
                await client.call("run", {"tool": "nope", "args": {"a": 1}}),
                await client.call("resume", {"run_id": "nope"}),  # no progress token: in a detached process
            )

    names, listing, unknown, no_run, number_id, bad_args, detached = asyncio.run(session())
    assert detached[1] is True and detached[0]["exit_code"] == 4 and detached[0]["error"] == no_run[0]["error"]
    jobs = flakebot_home / "work/mcp-jobs"
    assert not jobs.exists() or not list(jobs.glob("*.jsonl"))  # no such run: refused before a job exists
    assert {"craft", "improve", "status", "resume", "search", "list", "show", "package", "runs", "run", "rm"} <= set(
        names
    )
    assert listing == ({"ok": True, "tools": []}, False)
    assert unknown[1] is True and unknown[0]["ok"] is False and "no tool 'nope'" in unknown[0]["error"]
    assert no_run[1] is True and no_run[0]["exit_code"] == 4 and no_run[0]["fix"]
    assert number_id[1] is True and "'run_id' must be a string, got a whole number" in number_id[0]["error"]
    assert bad_args[1] is True and "'args' must be a list or a string or null, got an object" in bad_args[0]["error"]


@pytest.mark.slow
def test_mcp_craft_reports_progress_then_the_tool_is_an_mcp_tool(
    flakebot_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("bwrap", "cargo", "nix")
    monkeypatch.setenv("FLAKEBOT_OFFLINE", "1")

    async def session() -> dict[str, Any]:
        seen: dict[str, Any] = {"progress": []}

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen["progress"].append((progress, message))

        async with mcp_client() as client:
            before = await client.tool_names()
            arguments = {"need": "need a CSV deduper", "model": f"scripted:{SESSION}", "registry": "local"}
            seen["craft"] = await client.call("craft", arguments, progress_callback=on_progress)
            seen["changes_after_craft"] = client.list_changes()
            tools = {tool.name: tool for tool in (await client.session.list_tools()).tools}
            seen["new_tools"] = sorted(set(tools) - set(before))
            seen["schema"] = tools["csv-dedup"].input_schema if "csv-dedup" in tools else None
            seen["description"] = tools["csv-dedup"].description if "csv-dedup" in tools else None
            seen["dedup"] = await client.call("csv-dedup", {"stdin": CSV})
            seen["by_key"] = await client.call("csv-dedup", {"key": "name", "stdin": "id,name\n1,a\n2,a\n"})
            seen["refused"] = await client.call("csv-dedup", {"key": "zip", "stdin": "id,name\n1,a\n"})
            # What a strict model sends: every property, the unwanted ones blank or null (the failing call).
            blank = {"file": "", "key": "", "no_header": False, "stdin": CSV}
            seen["strict_blank"] = await client.call("csv-dedup", blank)
            nulls = {"file": None, "key": ["name", "id"], "no_header": None, "stdin": "id,name\n1,a\n1,a\n2,a\n"}
            seen["strict_keys"] = await client.call("csv-dedup", nulls)
            by_name = {"tool": "csv-dedup", "args": "--key 'name'", "stdin": "id,name\n1,a\n2,a\n"}
            seen["run_string"] = await client.call("run", by_name)
            no_zip = {"tool": "csv-dedup", "args": ["--key", "zip"], "stdin": "id,name\n1,a\n"}
            seen["run_fails"] = await client.call("run", no_zip)
            seen["bad_args"] = await client.call("csv-dedup", {"colour": "red"})
            seen["rm"] = await client.call("rm", {"tool": "csv-dedup"})
            await asyncio.sleep(0.2)  # the notification may trail the result
            seen["changes_after_rm"] = client.list_changes()
            seen["after_rm"] = await client.tool_names()
        return seen

    seen = asyncio.run(session())

    result, is_error = seen["craft"]
    assert not is_error and result["status"] == "crafted" and result["name"] == "csv-dedup", result
    # Progress: numbered in order, every stage in pipeline order, edit iterations with tests and tokens.
    numbers = [p for p, _ in seen["progress"]]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    messages = [m or "" for _, m in seen["progress"]]
    started = [m.split(":")[0] for m in messages if m.endswith(": started")]
    assert started == CRAFT_STAGES
    iterations = [m for m in messages if m.startswith("edit: iteration")]
    assert iterations and "tokens" in iterations[-1] and "green" in iterations[-1]
    assert any("passing" in m and "failing" in m for m in iterations)

    assert seen["changes_after_craft"] >= 1 and seen["new_tools"] == ["csv-dedup"]
    assert {"file", "key", "no_header", "stdin"} <= set(seen["schema"]["properties"])
    # Read from the real clap 4 --help, where the Append option shows as plain `-k, --key <COLUMN>`.
    assert seen["schema"]["properties"]["key"]["type"] == ["array", "null"], seen["schema"]
    assert seen["schema"]["additionalProperties"] is False
    assert seen["schema"]["required"] == list(seen["schema"]["properties"])
    assert "Usage: csv-dedup" in seen["description"]
    assert seen["dedup"] == (
        {"tool": "csv-dedup", "argv": [], "exit_code": 0, "stdout": "id,name\n1,ann\n2,bob\n3,cy\n", "stderr": ""},
        False,
    )
    assert seen["by_key"][0]["argv"] == ["--key", "name"] and seen["by_key"][0]["stdout"] == "id,name\n1,a\n"
    assert seen["strict_blank"] == (seen["dedup"][0], False)
    assert seen["strict_keys"][0]["argv"] == ["--key", "name", "--key", "id"]
    assert seen["strict_keys"][0]["stdout"] == "id,name\n1,a\n2,a\n"
    assert seen["run_string"] == ({"ok": True, "exit_code": 0, "stdout": "id,name\n1,a\n", "stderr": ""}, False)
    failed, failed_error = seen["run_fails"]
    assert failed_error and failed["ok"] is False and failed["exit_code"] == 1 and "zip" in failed["stderr"]
    refused, refused_error = seen["refused"]
    assert refused_error and refused["exit_code"] == 1 and "no column named 'zip'" in refused["stderr"]
    assert seen["bad_args"][1] and "unknown argument(s): colour" in seen["bad_args"][0]["error"]
    assert seen["rm"][1] is False and seen["changes_after_rm"] > seen["changes_after_craft"]
    assert "csv-dedup" not in seen["after_rm"]


@pytest.mark.slow
def test_mcp_craft_without_waiting_then_status_until_done(
    flakebot_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("bwrap", "cargo", "nix")
    monkeypatch.setenv("FLAKEBOT_OFFLINE", "1")
    script = shout_script(tmp_path)

    async def session() -> dict[str, Any]:
        seen: dict[str, Any] = {"polls": []}
        async with mcp_client() as client:
            arguments = {
                "need": "upper-case my input",
                "model": f"scripted:{script}",
                "crate": "csv",
                "registry": "local",
                "wait": False,
            }
            started = time.monotonic()
            seen["job"] = await client.call("craft", arguments)
            seen["answered_in"] = time.monotonic() - started
            run_id = seen["job"][0].get("run_id")
            for _ in range(600):
                status, _ = await client.call("status", {"run_id": run_id})
                seen["polls"].append(status["status"])
                if status["status"] not in ("created", "running"):
                    break
                await asyncio.sleep(0.5)
            seen["status"] = status
            seen["shown"], _ = await client.call("show", {"name": "shout"})  # the whole manifest is a show away
            await asyncio.sleep(0.2)
            seen["changes"] = client.list_changes()
            seen["shout"] = await client.call("shout", {"stdin": "abc\n"})
            seen["resumed"] = await client.call("resume", {"run_id": run_id})
        return seen

    seen = asyncio.run(session())
    job, is_error = seen["job"]
    assert not is_error and job["status"] == "running" and job["run_id"], job
    assert seen["answered_in"] < 15  # the run id comes back while the craft goes on
    status = seen["status"]
    assert status["status"] == "succeeded", status
    assert "running" in seen["polls"]
    assert [s["name"] for s in status["stages"]] == CRAFT_STAGES and all(
        s["status"] == "finished" for s in status["stages"]
    )
    assert status["result"]["name"] == "shout" and status["result"]["call"]["mcp_tool"] == "shout"
    assert status["result"]["kind"] == "tool"  # what it is, beside the door to use it by (deliver/howto.py)
    assert len(json.dumps(status)) <= 2048 and "manifest" not in status["result"]
    assert seen["shown"]["manifest"]["name"] == "shout" and seen["shown"]["manifest"]["verification_command"]["passed"]
    assert seen["changes"] >= 1  # the job's craft changed the catalog
    assert seen["shout"][0]["stdout"] == "ABC\n"
    assert seen["resumed"][0]["status"] == "crafted"  # resuming a finished run returns its result


@pytest.mark.slow
def test_the_typescript_sdk_client_crafts_calls_and_removes_a_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second, independent MCP client: the official TypeScript SDK's, run by node (tests/mcp_ts/client.mjs)."""
    require_typescript_sdk()
    monkeypatch.setenv("FLAKEBOT_OFFLINE", "1")
    arguments = {
        "need": "upper-case my input",
        "model": f"scripted:{shout_script(tmp_path)}",
        "crate": "csv",
        "registry": "local",
    }
    done = subprocess.run(
        ["node", str(TS_CLIENT / "client.mjs"), sys.executable, json.dumps(arguments)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["server"]["name"] == "flakebot" and seen["server"]["version"] == __version__
    assert seen["capabilities"]["tools"]["listChanged"] is True
    assert not seen["craft"]["isError"] and seen["craft"]["result"]["status"] == "crafted", seen["craft"]
    progress = [p["progress"] for p in seen["progress"]]
    assert progress == sorted(progress) and any(p["message"] == "edit: started" for p in seen["progress"])
    assert seen["changesAfterCraft"] >= 1 and "shout" not in seen["before"]
    assert seen["tool"]["name"] == "shout" and "stdin" in seen["tool"]["inputSchema"]["properties"]
    assert seen["call"] == {
        "result": {"tool": "shout", "argv": [], "exit_code": 0, "stdout": "HELLO FROM TYPESCRIPT\n", "stderr": ""},
        "isError": False,
    }
    assert seen["badCall"]["isError"] and seen["badCall"]["result"]["exit_code"] == 2
    assert (
        not seen["rm"]["isError"]
        and seen["changesAfterRm"] > seen["changesAfterCraft"]
        and "shout" not in seen["after"]
    )


def test_runs_live_in_the_state_directory_whatever_the_servers_cwd(
    flakebot_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run crafted from one directory is listed and shown by an MCP server started in another (no workdir set)."""
    monkeypatch.delenv("FLAKEBOT_WORKDIR")
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    monkeypatch.chdir(here)
    crafted = run_cli("craft", "upper-case my input", "--model", f"scripted:{shout_script(tmp_path)}",
                      "--stop-after", "spec", "--json")  # fmt: skip
    run_id = json.loads(crafted.stdout.splitlines()[-1])["result"]["run_id"]
    assert (flakebot_home / "state/flakebot/runs" / run_id / "state.json").is_file(), crafted.stderr
    assert not (here / "scratch").exists()
    monkeypatch.chdir(there)

    async def session() -> tuple[Any, Any]:
        async with mcp_client() as client:
            return await client.call("runs", {}), await client.call("status", {"run_id": run_id})

    runs, status = asyncio.run(session())
    assert [r["id"] for r in runs[0]["runs"]] == [run_id]
    assert status[1] is False and status[0]["status"] == "stopped" and status[0]["stages"][0]["name"] == "spec"


def test_the_sdk_lists_a_thousand_catalogued_tools_and_each_change(
    flakebot_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,000 tools catalogued through Catalog.add (made cheaply: benchmarks/scenarios/many_tools.py; no nix-store on
    PATH, so each GC root is the plain link flakebot keeps without Nix): all listed with their schemas, a tool added
    or removed by another process is in or out of the next list, and a new server lists the same definitions from
    the index's cache as the first made from the manifests."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    tools = Tools(flakebot_home, store_path(tmp_path, nix=False))
    tools.grow(1000)
    crafted = {f"t{n:05d}" for n in range(1, 1001)}

    async def listed(client: Client) -> dict[str, Any]:
        return {t.name: t.model_dump() for t in (await client.session.list_tools()).tools}

    async def sessions() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with mcp_client() as client:
            first = await listed(client)
            tools.add("t99999")
            added = await listed(client)
            tools.catalog.remove("t00500")
            removed = await listed(client)
        async with mcp_client() as client:
            return first, added, removed, await listed(client)

    first, added, removed, again = asyncio.run(sessions())
    assert set(first) == crafted | set(OWN_TOOLS)
    schema = first["t00042"]["input_schema"]
    assert {"delimiter", "key", "output", "files", "writable"} <= set(schema["properties"])
    assert "t00042: dedupe rows of CSV files" in first["t00042"]["description"]
    assert set(added) == set(first) | {"t99999"} and set(removed) == set(added) - {"t00500"}
    assert again == removed  # the definitions kept in catalog.db are the ones made from the manifests


@pytest.mark.slow
def test_a_detached_mcp_package_with_catalog_tells_the_client_its_tool_list_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`package` with catalog answered at once with a run handle (no progress token, no wait): once the run has
    catalogued the tool, the session that asked still hears notifications/tools/list_changed, as after a craft."""
    monkeypatch.setenv("FLAKEBOT_OFFLINE", "1")

    crate = tmp_path / "hello"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text('[package]\nname = "hello"\nversion = "1.0.0"\nedition = "2021"\n')
    (crate / "src" / "main.rs").write_text('fn main() {\n    println!("hello");\n}\n')

    async def session() -> tuple[Any, Any, int, list[str]]:
        async with mcp_client() as client:
            handle = await client.call("package", {"target": str(crate), "catalog": True})
            status = await client.call("status", {"run_id": handle[0].get("run_id", ""), "wait_seconds": 0})
            deadline = time.monotonic() + 1200
            while status[0].get("status") not in ("succeeded", "failed") and time.monotonic() < deadline:
                status = await client.call("status", {"run_id": handle[0]["run_id"], "wait_seconds": 20})
            await asyncio.sleep(2)  # the server watches the job's journal every 0.1 s
            return handle, status, client.list_changes(), await client.tool_names()

    handle, status, changes, names = asyncio.run(session())
    assert handle[0]["status"] == "running", handle
    assert status[0]["status"] == "succeeded" and "hello" in names, status
    assert changes >= 1


# A client of `flakebot mcp` run as a step of machine B: one craft (waited), then every method the server sent.
_CRAFT_CLIENT = """
import json, subprocess, sys
server = subprocess.Popen([sys.executable, "-m", "flakebot", "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True)
def send(message):
    server.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\\n"); server.stdin.flush()
hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
send({"id": 1, "method": "initialize", "params": hello}); server.stdout.readline()
send({"method": "notifications/initialized"})
send({"id": 2, "method": "tools/call", "params": {"name": "craft", "arguments": {"need": "need note", "wait": True}}})
methods, answer = [], None
while answer is None:
    message = json.loads(server.stdout.readline())
    if message.get("id") == 2:
        answer = message["result"]
    elif "method" in message:
        methods.append(message["method"])
server.stdin.close(); server.wait(timeout=60)
print(json.dumps({"answer": json.loads(answer["content"][0]["text"]), "methods": methods}))
"""


@pytest.mark.slow
def test_a_craft_installed_from_a_shared_catalog_tells_the_client_its_tool_list_changed(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A craft over MCP whose need a trusted shared catalog already answers installs that tool (status installed):
    the catalog, and so the tool list, changed, and the client hears notifications/tools/list_changed."""
    from tests.fakes.machines import Step, on_machine_b

    a = request.getfixturevalue("publisher_a")  # publisher A of tests/deliver/test_shared_index.py: note 0.1.0, 0.2.0
    catalogs = f"file://{a.cache} {a.key}"
    b = on_machine_b(tmp_path / "b", catalogs, [Step([sys.executable, "-c", _CRAFT_CLIENT])])
    (done,) = b.results
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["answer"]["status"] == "installed", seen
    assert "notifications/tools/list_changed" in seen["methods"], seen
