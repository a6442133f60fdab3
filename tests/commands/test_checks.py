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
    # what a door gives (settings, sink, ...), passed by an API caller: checked as the door would give it
    (lambda: api.search("csv", settings="x"), "'settings' must be a flakebot.config.Settings or None, got str"),
    (
        lambda: api.list_runs(settings={"offline": True}),
        "'settings' must be a flakebot.config.Settings or None, got dict",
    ),
    (lambda: api.resume("r", sink="x"), "'sink' must be a function taking an event, got str"),
    (lambda: api.run_tool("t", agent="yes"), "'agent' must be true or false, got str"),
    (lambda: api.call_tool("t", {}, cwd=5), "'cwd' must be a path or None, got int"),
    # the request-building functions (craft, improve, package) bound to their signatures as the others are
    (lambda: api.craft(), "craft(): missing a required argument: 'need'"),
    (lambda: api.package("a", "b"), "package(): too many positional arguments"),
    (lambda: api.improve("t", "x", settings="x"), "'settings' must be a flakebot.config.Settings or None, got str"),
    # a value JSON has no word for is named by its Python type, never "null"
    (lambda: api.search(b"csv"), "'query' must be a string, got bytes"),
    # negative waits and windows: refused, not read as 0 or as no window at all
    (lambda: api.status("r", wait_seconds=-5), "'wait_seconds' must be at least 0, got -5"),
    (lambda: api.token_audit(minutes=-1.0), "'minutes' must be at least 0, got -1.0"),
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


def test_package_of_what_is_no_crate_is_one_line_before_a_run(flakebot_home: Path) -> None:
    """A target too long for a file name (was an OSError traceback), a crate the local registry does not hold (was a
    run failing in its locate stage): refused before a run exists, each in one line with its own exit code."""
    long = run_cli("package", "a" * 300, "--registry", "local", "--json")
    assert long.returncode == 2 and "Traceback" not in long.stderr, long.stderr
    said = json.loads(long.stdout)
    assert said["error"] == f"'{'a' * 64}...' is neither a directory nor a crate name", said
    missing = run_cli("package", "nosuchcrate-zz", "--registry", "local")
    assert missing.returncode == 10 and missing.stderr.startswith("error: crate 'nosuchcrate-zz' is not in"), (
        missing.stderr
    )
    assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    kv_service = str(Path(__file__).parents[1] / "fixtures/kv-service")
    bad_bin = run_cli("package-service", kv_service, "--bin", "b" * 300, "--offline")  # was refused after a run began
    assert bad_bin.returncode == 2 and bad_bin.stderr.startswith(f"error: '{'b' * 64}...' is not a binary name")
    assert len(bad_bin.stderr) < 300, bad_bin.stderr
    runs = flakebot_home / "work" / "runs"
    assert not runs.exists() or not list(runs.iterdir())


def test_a_search_query_past_its_bound_is_one_short_line_at_every_door(flakebot_home: Path) -> None:
    """A 100 KB query was echoed whole by the CLI ("No crate matches 'aaa...'", exit 0) and, sent to crates.io, an
    httpx InvalidURL: a JSON-RPC error with a Python message over MCP and a traceback in its log."""
    import asyncio

    from tests.mcp.test_server import mcp_client

    huge = "csv " * 25_000
    done = run_cli("search", huge, "--registry", "local")
    assert done.returncode == 2 and done.stdout == "", done.stdout[:200]
    assert done.stderr.startswith("error: the search query is 100,000 characters, more than 500. Fix: ")
    assert len(done.stderr) < 300, done.stderr[:300]

    async def session() -> tuple[dict[str, Any], bool]:
        async with mcp_client() as client:
            return await client.call("search", {"query": huge})  # no registry: crates.io first, as an agent's

    answer, error = asyncio.run(session())
    assert error and answer["type"] == "UsageError" and answer["exit_code"] == 2, answer
    with pytest.raises(UsageError, match="more than 500"):
        api.search(huge, registry="local")


def test_resume_of_a_run_whose_directory_is_read_only_is_one_line_before_any_stage(flakebot_home: Path) -> None:
    """The run's own directory is written first (its lock, state.json): read-only, resume was an OSError traceback
    (exit 1) from the lock. Now refused before any stage as the read-only catalog is (exit 5), by the CLI and MCP,
    and the run is left to resume once it can be written."""
    import asyncio

    from flakebot.pipeline.run import Run
    from tests.commands.test_runs_and_setup import _read_only
    from tests.conftest import REPO, json_result
    from tests.mcp.test_server import mcp_client

    script = REPO / "flakebot/data/sessions/csv-dedup.json"
    offline = ("--registry", "local", "--offline")
    made = run_cli(
        "craft", "need a CSV deduper", "--model", f"scripted:{script}", *offline, "--stop-after", "spec", "--json"
    )
    run_id = json_result(made)["run_id"]
    workdir = flakebot_home / "work"

    async def session() -> tuple[dict[str, Any], bool]:
        async with mcp_client() as client:
            return await client.call("resume", {"run_id": run_id})

    with _read_only(workdir / "runs" / run_id):
        done = run_cli("resume", run_id)
        answer, error = asyncio.run(session())
    assert done.returncode == 5 and "Traceback" not in done.stderr, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: run {run_id}'s directory ") and "is not writable" in line and ". Fix: " in line
    assert error and answer["type"] == "HostError", answer
    jobs = workdir / "mcp-jobs"
    assert not jobs.exists() or not [p for p in jobs.iterdir() if not p.name.startswith(".")]
    run = Run.load(workdir, run_id)
    assert run.state["status"] == "stopped" and run.stage_status("search") == "pending"


def test_a_registry_path_too_long_for_a_file_name_is_one_line(flakebot_home: Path) -> None:
    """`--registry` names crates-io, local or a directory: one too long for a file name was an OSError traceback
    (search, package, craft's preflight); now the unknown registry's one line, the name cut short."""
    long = "r" * 300
    script = Path(__file__).parents[2] / "flakebot/data/sessions/csv-dedup.json"
    for args in (
        ("search", "csv", "--registry", long),
        ("package", "hexyl", "--registry", long),
        ("craft", "need a CSV deduper", "--model", f"scripted:{script}", "--registry", long),
    ):
        done = run_cli(*args)
        assert done.returncode in (2, 10) and "Traceback" not in done.stderr, done.stderr[-1500:]
        [line] = done.stderr.strip().splitlines()
        assert f"{'r' * 64}..." in line and long not in line and ". Fix: " in line, line
    runs = flakebot_home / "work" / "runs"
    assert not runs.exists() or not list(runs.iterdir())


def test_a_path_too_long_for_a_file_name_is_one_line_wherever_a_path_is_taken(flakebot_home: Path) -> None:
    """craft --from, package --out, --workdir and eval's suite, each a path 300 characters long: an OSError
    (ENAMETOOLONG) traceback from asking whether it exists; now one line naming it, cut short (preflight)."""
    long = "/tmp/" + "p" * 300
    script = Path(__file__).parents[2] / "flakebot/data/sessions/csv-dedup.json"
    craft = ("craft", "need a CSV deduper", "--model", f"scripted:{script}", "--registry", "local", "--offline")
    for args in (
        (*craft, "--from", long),
        ("package", "hexyl", "--registry", "local", "--out", long),
        ("--workdir", long, "runs"),
        ("eval", long),
    ):
        done = run_cli(*args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (args[0], done.stderr[-1500:])
        [line] = done.stderr.strip().splitlines()
        assert "is too long for a file name" in line and long not in line and ". Fix: " in line, line
    runs = flakebot_home / "work" / "runs"
    assert not runs.exists() or not list(runs.iterdir())


def test_package_catalog_name_held_by_another_crates_package_is_refused_before_the_build(
    flakebot_home: Path, tmp_path: Path
) -> None:
    """`package CRATE --catalog --name N` where N is another crate's packaged tool: the catalog stage refused it
    after the nix build, a run left; a crate named from the registry is known before the run."""
    catalogued("locks", "packaged crate cargo-lock", tmp_path)
    done = run_cli("package", "hexyl", "--registry", "local", "--offline", "--catalog", "--name", "locks")
    assert done.returncode == 2 and done.stderr.startswith("error: the catalog already has a tool named locks"), (
        done.stderr[-1500:]
    )
    assert "--name locks-2" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    runs = flakebot_home / "work" / "runs"
    assert not runs.exists() or not list(runs.iterdir())


@pytest.mark.slow
def test_a_directory_crates_catalog_name_held_by_another_crate_is_said_without_craft_words(
    flakebot_home: Path, tmp_path: Path
) -> None:
    """A directory's crate is known only once cargo reads it in the run: its catalog stage refuses a name another
    crate's package holds. The fix said "craft again with --name" to a package."""
    catalogued("locks", "packaged crate cargo-lock", tmp_path)
    kv_service = str(Path(__file__).parents[1] / "fixtures/kv-service")
    done = run_cli("package", kv_service, "--offline", "--catalog", "--name", "locks", timeout=1200)
    said = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 60 and "already has a tool named locks" in said, done.stderr[-1500:]
    assert "craft" not in said and "--name locks-2" in said, said


def test_a_negative_number_where_typer_sees_an_option_says_how_to_pass_it(flakebot_home: Path) -> None:
    """`config set max_iterations -5` read -5 as an option: "No such option: -5", and a fix pointing at --help;
    the fix says to put the value after --."""
    done = run_cli("config", "set", "max_iterations", "-5")
    assert done.returncode == 2 and done.stderr.startswith("error: No such option: -5"), done.stderr
    assert "after '--'" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_json_nested_deeper_than_python_reads_is_one_line(flakebot_home: Path, tmp_path: Path) -> None:
    """`--args-json '[[[...]]]'` 50,000 deep, a spec file or a service's examples file as deep: a RecursionError
    traceback from json.loads; now the not-JSON line each already had."""
    deep = "[" * 50_000 + "]" * 50_000
    spec = tmp_path / "spec.json"
    spec.write_text(deep)
    script = Path(__file__).parents[2] / "flakebot/data/sessions/csv-dedup.json"
    kv_service = str(Path(__file__).parents[1] / "fixtures/kv-service")
    for args in (
        ("run", "t", "--args-json", deep),
        ("craft", "need a CSV deduper", "--model", f"scripted:{script}", "--spec", str(spec), "--offline"),
        ("package-service", kv_service, "--examples", str(spec), "--offline"),
    ):
        done = run_cli(*args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (args[0], done.stderr[-800:])
        [line] = done.stderr.strip().splitlines()
        assert "nested too deeply" in line and ". Fix: " in line, line
    with pytest.raises(UsageError, match="nested too deeply"):
        api.run_tool("t", args_json=deep)


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


def catalogued(name: str, need: str, tmp_path: Path) -> None:
    """A tool `name` in this test's catalog (an empty flake, no store path): what a name check meets."""
    from flakebot import config
    from flakebot.deliver.catalog import Catalog

    flake = tmp_path / "flake"
    flake.mkdir()
    (flake / "flake.nix").write_text("{ }\n")
    Catalog.open(config.load()).add(
        name, need=need, flake_dir=flake, manifest={"name": name}, usage_md="", store_path="/nonexistent",
        run_id="r1", origin={},
    )  # fmt: skip
