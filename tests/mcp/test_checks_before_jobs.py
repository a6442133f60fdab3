"""A long tool's checks that need nothing built run before its job exists (the command's `check`, table.py), over
the real MCP SDK and as an MCP task: refused, nothing is left in mcp-jobs/; and an MCP error names the argument as
MCP spells it, never the CLI's option."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from tests.conftest import REPO, run_cli
from tests.mcp.test_server import mcp_client
from tests.mcp.test_tasks import raw_session

SCRIPTED = f"scripted:{REPO / 'flakebot/data/sessions/csv-dedup.json'}"
CRAFT = {"need": "need a CSV deduper", "model": SCRIPTED}
REFUSED = [
    ("package", {"target": "/nonexistent/crate"}, "UsageError", "/nonexistent/crate is not a directory"),
    ("package", {"target": "./no-such-dir"}, "UsageError", "./no-such-dir is not a directory"),
    ("package", {"target": "hexyl", "name": "hex"}, "UsageError", "a name is for a catalogued package only"),
    # a target too long for a file name (was an OSError: JSON-RPC error, a traceback in the log) and a crate the
    # local registry does not hold (was a detached job and a run, failing in its locate stage)
    ("package", {"target": "a" * 300}, "UsageError", "is neither a directory nor a crate name"),
    ("package", {"target": "hexyl", "bin": "b" * 300}, "UsageError", "is not a binary name"),
    ("package", {"target": "nosuchcrate-zz", "registry": "local"}, "SearchError", "crate 'nosuchcrate-zz' is not in"),
    ("improve", {"tool": "nosuch", "request": "add --x"}, "CatalogError", "no tool 'nosuch' in the catalog"),
    ("package", {"target": "hexyl", "out": "/proc/nope"}, "HostError", "out /proc/nope cannot be made"),
    ("craft", {"need": "need a CSV deduper", "model": "nosuch:model"}, "ModelError", "unknown model provider 'nosuch'"),
    ("craft", {"need": "need a CSV deduper"}, "ModelError", "no model chosen"),  # no key in this test's environment
    # what craft's run checks before its first stage, checked before its job too (each left a job file)
    ("craft", {**CRAFT, "registry": "/nonexistent"}, "UsageError", "the registry /nonexistent is not a directory"),
    ("craft", {**CRAFT, "from": "/nonexistent"}, "UsageError", "/nonexistent is neither a directory nor a repository"),
    # a --crate that is no crate name, or one the local registry does not hold: was a run, failing in its search
    # stage after the spec stage's model call (the name echoed whole)
    ("craft", {**CRAFT, "crate": "x" * 300}, "UsageError", f"'{'x' * 64}...' is not a crate name"),
    ("craft", {**CRAFT, "crate": "nosuchcrate-zz", "registry": "local"}, "SearchError", "crate 'nosuchcrate-zz'"),
    # a URL no git can clone (a space in its host): was a run, failing in acquire after the spec stage's model call
    ("craft", {**CRAFT, "from": "https://exa mple.com/x"}, "UsageError", "has a space or control character"),
]


def _jobs(home: Path) -> list[Path]:
    jobs = home / "work" / "mcp-jobs"
    return sorted(jobs.iterdir()) if jobs.exists() else []


@pytest.mark.parametrize(
    ("tool", "args", "kind", "said"), REFUSED, ids=[f"{t}-{i}" for i, (t, *_) in enumerate(REFUSED)]
)
def test_a_long_call_refused_by_its_check_leaves_no_job(
    flakebot_home: Path, tool: str, args: dict[str, Any], kind: str, said: str
) -> None:
    async def session() -> list[tuple[dict[str, Any], bool]]:
        async with mcp_client() as client:
            return [
                await client.call(tool, args),  # detached by default: answered with a run handle once a run exists
                await client.call(tool, {**args, "wait": True}),
            ]

    for answer, error in asyncio.run(session()):
        assert error and answer["type"] == kind and said in answer["error"], answer
    with raw_session("2025-11-25") as wire:  # as a task: refused before a task (and its job) exists
        refused = wire.ask("tools/call", {"name": tool, "arguments": args, "task": {}})
    assert refused["error"]["code"] == types.INVALID_PARAMS and said in refused["error"]["message"], refused
    assert _jobs(flakebot_home) == []


def test_mcp_errors_name_the_mcp_argument(flakebot_home: Path) -> None:
    async def session() -> list[tuple[dict[str, Any], bool]]:
        async with mcp_client() as client:
            return [
                await client.call("search", {"query": "csv", "limit": 0}),
                await client.call("package", {"target": "hexyl", "name": "hex"}),
                await client.call("service_up", {"service": "nosuch", "port": 80}),
                await client.call("service_logs", {"service": "nosuch", "lines": 0}),
            ]

    (limit, limit_error), (name, name_error), (port, port_error), (lines, lines_error) = asyncio.run(session())
    assert port_error and port["error"] == "'port' must be from 1024 to 65535, got 80", port
    assert lines_error and lines["error"] == "lines 0 is out of range", lines  # its range differs by door: control.logs
    cli = run_cli("up", "nosuch", "--port", "80")
    assert cli.returncode == 2 and cli.stderr.startswith("error: '--port' must be from 1024 to 65535, got 80"), (
        cli.stderr
    )
    for said in (port, lines, name):
        assert "--" not in said["error"] + said["fix"], said
    assert limit_error and limit["error"] == "'limit' must be at least 1, got 0", limit
    assert name_error and "--" not in name["error"], name
    assert "--" not in limit["error"] + limit["fix"]


def test_a_catalog_name_refused_over_mcp_names_the_mcp_argument(flakebot_home: Path, tmp_path: Path) -> None:
    """package's and craft's catalog name, malformed, too long or held by another need: the fix said `--name` over
    MCP, where the argument is `name`; the name is said back cut short; craft's was checked only inside its job (a
    job file left, and a 5000-character name taken: a run started)."""
    from tests.commands.test_checks import catalogued

    catalogued("shout", "shout at me", tmp_path)

    async def session() -> list[tuple[dict[str, Any], bool]]:
        async with mcp_client() as client:
            return [
                await client.call("package", {"target": "hexyl", "catalog": True, "name": name})
                for name in ("../x", "Bad_Name", "shout", "x" * 5000)
            ] + [
                await client.call("craft", {"need": "upper-case my input", "model": SCRIPTED, "name": name})
                for name in ("Bad_Name", "shout", "x" * 5000, "csv\n")
            ]

    for answer, error in asyncio.run(session()):
        assert error and answer["type"] == "UsageError", answer
        assert "--" not in answer["fix"] and "name" in answer["fix"], answer
        assert len(answer["error"]) < 200, answer["error"][:300]
    cli = run_cli("package", "hexyl", "--catalog", "--name", "shout", "--registry", "local")
    assert cli.returncode == 2 and "pass --name shout-2" in cli.stderr, cli.stderr
    assert _jobs(flakebot_home) == []


def test_a_craft_of_a_need_already_being_crafted_is_refused_before_its_job(flakebot_home: Path) -> None:
    """The same need crafted by a process now: craft's check says which run, before a job exists (it was said only
    by the job, a job file left per refused call)."""
    from flakebot.pipeline.request import RunRequest
    from flakebot.pipeline.run import Run

    run = Run.create(flakebot_home / "work", "craft", RunRequest(need="upper-case my input"))
    run.state["status"] = "running"
    run.save()

    async def session() -> tuple[dict[str, Any], bool]:
        async with mcp_client() as client:
            return await client.call("craft", {"need": "upper-case my input", "model": SCRIPTED})

    with run.lock():  # this test's process drives it, as far as anyone can tell
        answer, error = asyncio.run(session())
    assert error and answer["type"] == "RunError" and f"already running: run {run.id}" in answer["error"], answer
    assert "--" not in answer["fix"] and "status tool" in answer["fix"], answer
    assert _jobs(flakebot_home) == []


def test_an_improvement_improve_would_refuse_before_its_run_is_refused_before_its_job(
    flakebot_home: Path, tmp_path: Path
) -> None:
    """improve's check asked only that the tool is catalogued: a tool without its acceptance examples kept (or its
    sources), a model that cannot be used, were said by the job, a job file left per call."""
    from flakebot import config
    from flakebot.deliver.catalog import Catalog

    flake = tmp_path / "flake"
    flake.mkdir()
    (flake / "flake.nix").write_text("{ }\\n")
    Catalog.open(config.load()).add(
        "shout", need="shout at me", flake_dir=flake, manifest={"name": "shout"}, usage_md="",
        store_path="/nonexistent", run_id="r1", origin={},
    )  # fmt: skip

    async def session() -> list[tuple[dict[str, Any], bool]]:
        async with mcp_client() as client:
            return [
                await client.call("improve", {"tool": "shout", "request": "add a flag", "model": SCRIPTED}),
                await client.call("improve", {"tool": "shout", "request": "add a flag", "wait": True}),
            ]

    for answer, error in asyncio.run(session()):
        assert error and answer["type"] == "CatalogError" and "kept its acceptance examples" in answer["error"], answer
    assert _jobs(flakebot_home) == []


def test_a_call_whose_arguments_or_task_are_no_object_says_which_over_the_wire() -> None:
    """tools/call with `arguments` a list, `task` a string or its ttl a string was the SDK's bare "Invalid request
    parameters" (data ""): one JSON-RPC error naming what is wrong and the fix, as a tool's own refusal says it."""
    with raw_session("2025-11-25") as wire:
        answers = [
            wire.ask("tools/call", {"name": "search", "arguments": [1]}),
            wire.ask("tools/call", {"name": "search", "arguments": "csv"}),
            wire.ask("tools/call", {"name": 5, "arguments": {}}),
            wire.ask("tools/call", {"name": "package", "arguments": {"target": "hexyl"}, "task": "soon"}),
            wire.ask("tools/call", {"name": "package", "arguments": {"target": "hexyl"}, "task": {"ttl": "1h"}}),
            wire.ask("tools/call", {"name": "search", "arguments": {"query": "csv", "limit": 1}}),  # still answered
        ]
    *refused, taken = answers
    said = [answer["error"] for answer in refused]
    assert all(error["code"] == types.INVALID_PARAMS and ". Fix: " in error["message"] for error in said), said
    assert said[0]["message"].startswith("tools/call: 'arguments' must be an object, got a list"), said
    assert said[1]["message"].startswith("tools/call: 'arguments' must be an object, got a string"), said
    assert said[2]["message"].startswith("tools/call: 'name' must be a string, got a whole number"), said
    assert said[3]["message"].startswith("tools/call: 'task' must be an object, got a string"), said
    assert said[4]["message"].startswith("tools/call: 'task.ttl' must be a number (milliseconds), got a string"), said
    assert "result" in taken, taken
