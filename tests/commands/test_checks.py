"""One check of a call's arguments for every door (flakebot.commands.table: check_types, check_values): the Python
API's functions check their arguments against the table's declaration as MCP checks its schema (never coerced,
one UsageError with its fix, no traceback from inside the work), and the checks beyond types are the same
function at all three doors, each naming the argument as that door spells it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flakebot import api
from flakebot.errors import UsageError
from tests.conftest import run_cli

REFUSED: list[tuple[Callable[[], Any], str]] = [
    (lambda: api.search(123), "'query' must be a string, got a whole number"),
    (lambda: api.search("csv", limit="ten"), "'limit' must be a whole number, got a string"),
    (lambda: api.search("csv", limit=0), "'limit' must be at least 1, got 0"),
    (lambda: api.search("csv", limit=2.0), "'limit' must be a whole number, got a number"),
    (lambda: api.list_services(extra=1), "list_services() takes no argument extra"),
    (lambda: api.status("r", wait_seconds="ten"), "'wait_seconds' must be a whole number or null, got a string"),
    (lambda: api.run_tool("t", stdin=["id", "1"]), "'stdin' must be a string or null, got a list"),
    (lambda: api.show("  "), "'name' is required"),
    (lambda: api.search(), "search(): missing a required argument: 'query'"),
    (lambda: api.craft(need=123), "'need' must be a string, got a whole number"),
    (lambda: api.package(target=5), "'target' must be a string or null, got a whole number"),
    (lambda: api.craft_request("csv"), "'request' must be a RunRequest, got str"),
    (lambda: api.craft_request(api.RunRequest(need=5)), "'request.need' must be a string, got a whole number"),
    (lambda: api.improve_request(api.RunRequest(improve=api.Improvement(tool=" ", request="x"))), "'tool' is required"),
    (lambda: api.up("kv", port="8080"), "'port' must be a whole number or null, got a string"),
    # the library functions beside the commands, checked against their annotations (table.typed)
    (lambda: api.resume(123), "'run_id' must be a string, got a whole number"),
    (lambda: api.call_tool(5, {}), "'name' must be a string, got a whole number"),
    (lambda: api.tool_manifest("t", x=1), "tool_manifest() takes no argument x"),
    (lambda: api.list_remote(5), "'url' must be a string or null, got a whole number"),
]


@pytest.mark.parametrize(("call", "said"), REFUSED, ids=[said for _, said in REFUSED])
def test_the_api_refuses_a_wrong_argument_in_one_line(flakebot_home: Path, call: Callable[[], Any], said: str) -> None:
    with pytest.raises(UsageError) as refused:
        call()
    assert refused.value.message == said and refused.value.fix
    assert not (flakebot_home / "work").exists() or not any((flakebot_home / "work").rglob("state.json"))


def test_the_api_still_takes_what_the_declaration_allows(flakebot_home: Path) -> None:
    assert api.list_services()["services"] == []
    assert api.search("csv", registry="local", limit=1, offline=True)  # a declared keyword, a whole number
    assert api.show.__wrapped__.__name__ == "show" and api.show.__doc__


def test_the_cli_and_mcp_run_the_same_range_check_each_naming_its_own_argument(flakebot_home: Path) -> None:
    done = run_cli("search", "csv", "--limit", "0", "--json")
    answer = json.loads(done.stdout)
    assert done.returncode == 2 and answer["error"] == "'--limit' must be at least 1, got 0", answer
    blank = run_cli("show", "  ")
    assert (
        blank.returncode == 2
        and blank.stderr.strip() == "error: 'NAME' is required. Fix: pass NAME as a non-empty string"
    )


def test_package_into_a_read_only_catalog_is_refused_before_a_run_or_job(flakebot_home: Path) -> None:
    import asyncio

    from tests.commands.test_runs_and_setup import _read_only
    from tests.mcp.test_server import mcp_client

    async def session() -> tuple[dict[str, Any], bool]:
        async with mcp_client() as client:
            return await client.call("package", {"target": "hexyl", "catalog": True})

    with _read_only(flakebot_home / "data" / "flakebot"):
        done = run_cli("package", "hexyl", "--registry", "local", "--catalog", "--offline")
        answer, error = asyncio.run(session())
    assert done.returncode == 5 and done.stderr.startswith("error: catalog_dir ") and "Traceback" not in done.stderr
    assert error and answer["type"] == "HostError" and "is not writable" in answer["error"], answer
    work = flakebot_home / "work"
    assert not (work / "runs").exists() or not list((work / "runs").iterdir())
    assert not (work / "mcp-jobs").exists() or not list((work / "mcp-jobs").iterdir())


def test_package_out_where_no_directory_can_be_made_is_one_line_before_a_run(flakebot_home: Path) -> None:
    done = run_cli("package", "hexyl", "--registry", "local", "--out", "/proc/nope/new")
    assert done.returncode == 5 and "Traceback" not in done.stderr, done.stderr  # was a FileNotFoundError traceback
    assert done.stderr.startswith("error: out /proc/nope/new cannot be made") and ". Fix: " in done.stderr
    runs = flakebot_home / "work" / "runs"
    assert not runs.exists() or not list(runs.iterdir())


def test_a_schemas_validator_is_made_once_and_never_serves_another_schema() -> None:
    """validation keeps one validator per schema object (flakebot's own schemas are checked several times per call):
    the same object gets the same validator; another schema, even equal in shape, is checked by its own."""
    from flakebot import validation

    whole = {"type": "object", "properties": {"n": {"type": "integer"}}, "additionalProperties": False}
    text = {"type": "object", "properties": {"n": {"type": "string"}}, "additionalProperties": False}
    assert validation._validator(whole) is validation._validator(whole)
    for _ in range(2):
        validation.check_arguments("t", {"n": 5}, whole)
        with pytest.raises(UsageError, match="'n' must be a string"):
            validation.check_arguments("t", {"n": 5}, text)
    for _ in range(validation.VALIDATORS_KEPT + 1):  # schemas made per call (crafted tools): the cache stays bounded
        validation.check_arguments("t", {"n": "x"}, {**text})
    assert len(validation._validators) <= validation.VALIDATORS_KEPT
