"""The run and setup commands (runs, show, resume, clean, status, search, config show/set, models) as the command
table declares them: each door made from one declaration, through the real CLI and the real MCP SDK."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from flakebot import api
from flakebot.errors import RunError, UsageError
from flakebot.pipeline.request import RunRequest
from flakebot.pipeline.run import Run
from tests.conftest import json_result, require, run_cli
from tests.mcp.test_server import mcp_client


def _running_run(workdir: Path) -> Run:
    """A craft run this test process drives (its pid is alive: the run reads as running)."""
    run = Run.create(workdir, "craft", RunRequest(need="need a CSV deduper"))
    run.state["status"] = "running"
    run.save()
    return run


def _moved_later(run: Run, seconds: float) -> threading.Thread:
    def move() -> None:
        time.sleep(seconds)
        run.state["stages"]["spec"] = {"status": "running"}
        run.save()

    thread = threading.Thread(target=move)
    thread.start()
    return thread


def test_integers_an_agent_sends_are_declared_integers(flakebot_home: Path) -> None:
    async def schemas() -> dict[str, Any]:
        async with mcp_client() as client:
            return {t.name: t.input_schema for t in (await client.session.list_tools()).tools}

    tools = asyncio.run(schemas())
    assert tools["status"]["properties"]["wait_seconds"]["type"] == ["integer", "null"]
    assert tools["search"]["properties"]["limit"]["type"] == ["integer", "null"]


def test_search_takes_its_limit_as_an_integer_over_mcp(flakebot_home: Path) -> None:
    async def calls() -> tuple[Any, Any]:
        async with mcp_client() as client:
            found = await client.call("search", {"query": "csv", "registry": "local", "limit": 1})
            refused = await client.call("search", {"query": "csv", "registry": "local", "limit": "1"})
            return found, refused

    (found, found_error), (refused, refused_error) = asyncio.run(calls())
    assert found_error is False and found["ok"] is True and len(found["candidates"]) == 1, found
    assert refused_error is True and "'limit' must be a whole number" in refused["error"], refused


def test_status_holds_its_answer_until_the_run_moves_on_over_mcp(workdir: Path) -> None:
    """wait_seconds holds the answer (a blocking wait in the server's worker thread): the whole wait when nothing
    moves, until the change has settled when a stage starts; no wait without it."""
    run = _running_run(workdir)

    async def calls() -> list[tuple[float, Any]]:
        answers = []
        async with mcp_client() as client:
            for arguments in ({"wait_seconds": 1}, {"wait_seconds": None}, {"wait_seconds": 30}):
                if arguments["wait_seconds"] == 30:
                    _moved_later(run, 0.5)
                started = time.monotonic()
                answer = await client.call("status", {"run_id": run.id, **arguments})
                answers.append((time.monotonic() - started, answer))
        return answers

    (still, held), (_, at_once), (moved, changed) = asyncio.run(calls())
    assert held[0]["status"] == "running" and 1 <= still < 5, (still, held)
    assert at_once[0]["status"] == "running" and at_once[1] is False
    assert 2 <= moved < 10, moved  # the stage started after 0.5 s, and answered once that had settled (2 s)
    assert {"name": "spec", "status": "running", "seconds": None} in changed[0]["stages"], changed


def test_status_waits_in_the_python_api_too(workdir: Path) -> None:
    run = _running_run(workdir)
    started = time.monotonic()
    assert api.status(run.id)["status"] == "running" and time.monotonic() - started < 1
    _moved_later(run, 0.3).join()
    started = time.monotonic()
    assert api.status(run.id, wait_seconds=1)["stages"][0]["status"] == "running"
    assert 1 <= time.monotonic() - started < 4


def test_a_blank_required_argument_is_refused_over_mcp(flakebot_home: Path) -> None:
    async def calls() -> list[Any]:
        async with mcp_client() as client:
            return [await client.call(name, arguments) for name, arguments in
                    (("show", {"name": ""}), ("status", {"run_id": "  "}), ("resume", {"run_id": ""}))]  # fmt: skip

    for answer, error in asyncio.run(calls()):
        assert error is True and answer["type"] == "UsageError", answer
        assert answer["error"] in ("'name' is required", "'run_id' is required"), answer


def test_clean_takes_a_run_or_all_and_says_so_in_every_door(workdir: Path) -> None:
    for argv in (("clean",), ("clean", "some-run", "--all")):
        result = run_cli(*argv)
        assert result.returncode == UsageError.exit_code and "give either a RUN id or --all" in result.stderr
    with pytest.raises(UsageError, match="give either a RUN id or --all"):
        api.remove_runs()
    run = Run.create(workdir, "craft", RunRequest(need="x"))
    assert run_cli("clean", run.id, check=True).stdout.strip() == "removed 1 run(s)"
    assert api.remove_runs(every=True) == []


def test_clean_leaves_a_run_still_running_and_refuses_it_by_name(workdir: Path) -> None:
    """Its tree removed under it would fail the run half-way (and its next save would make the directory again)."""
    running, ended = _running_run(workdir), Run.create(workdir, "craft", RunRequest(need="x"))
    refused = run_cli("clean", running.id)
    assert refused.returncode == RunError.exit_code, refused.stderr
    assert f"run {running.id} is still running" in refused.stderr and running.dir.is_dir()
    assert api.remove_runs(every=True) == [ended.dir] and running.dir.is_dir() and not ended.dir.exists()
    running.state["status"] = "failed"
    running.save()
    assert run_cli("clean", running.id, check=True).stdout.strip() == "removed 1 run(s)"
    assert not running.dir.exists()


def test_clean_leaves_a_run_another_process_drives_before_it_marks_it_running(workdir: Path) -> None:
    """A resume in another process holds the run's lock (Run.lock) from before it writes `running` with its pid: clean
    reads the state as not running, and before removed the tree from under that resume. Now clean takes the run's
    lock for as long as it removes it: one held elsewhere is a refusal by name (exit 4, reason 'running'), a run left
    by --all; and the run is removed once that process let it go."""
    import sys

    run = Run.create(workdir, "craft", RunRequest(need="x"))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(run.dir / ".lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        refused = run_cli("clean", run.id, "--json")
        assert refused.returncode == RunError.exit_code, refused.stderr
        said = json.loads(refused.stdout.splitlines()[-1])
        assert said["details"] == {"reason": "running"} and "driven by another process" in said["error"]
        assert api.remove_runs(every=True) == [] and run.dir.is_dir()
    finally:
        holder.communicate("")
    assert api.remove_runs(run.id) == [run.dir] and not run.dir.exists()


HOLD_LOCK = "import fcntl, sys; f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()"


def test_a_resume_whose_run_clean_removed_since_it_read_it_is_one_line(workdir: Path) -> None:
    """A resume that read the run, then found clean had removed it before it took the run's lock: a RunError saying
    so. Before, opening the lock in the directory gone raised FileNotFoundError (a traceback at the CLI)."""
    from flakebot import config
    from flakebot.pipeline import engine

    run = Run.create(workdir, "craft", RunRequest(need="x"))
    read = Run.load(workdir, run.id)  # the resume's read
    assert api.remove_runs(run.id) == [run.dir]
    with pytest.raises(RunError, match=f"run {run.id} was removed"):
        engine.execute(read, config.load())
    assert not run.dir.exists()  # its next save did not make it again


def test_clean_tells_a_program_a_running_run_from_one_not_found(workdir: Path) -> None:
    """Both exit 4 (RunError): the --json answer's reason tells them apart ('running', 'not_found'), so a script
    knows whether to stop the run or give another id. Before, a running run's refusal had no reason at all."""
    running = _running_run(workdir)
    refused = run_cli("clean", running.id, "--json")
    assert refused.returncode == RunError.exit_code, refused.stderr
    assert json.loads(refused.stdout.splitlines()[-1])["details"] == {"reason": "running"} and running.dir.is_dir()
    unknown = run_cli("clean", "20000101-000000-abcdef", "--json")
    assert unknown.returncode == RunError.exit_code, unknown.stderr
    assert json.loads(unknown.stdout.splitlines()[-1])["details"] == {"reason": "not_found"}


def test_clean_leaves_a_running_run_whose_state_it_cannot_load(workdir: Path) -> None:
    """A run a newer flakebot drives (its state.json of a format this one refuses to load), its process alive: clean
    reads whether it runs from the state as it is, and refuses it by name, leaves it with --all. Before, the state
    unreadable, its tree was removed from under the live run."""
    from flakebot.pipeline.run import STATE_FORMAT

    running = _running_run(workdir)
    state = json.loads((running.dir / "state.json").read_text())
    (running.dir / "state.json").write_text(json.dumps({**state, "format": STATE_FORMAT + 1}))
    refused = run_cli("clean", running.id)
    assert refused.returncode == RunError.exit_code, refused.stderr
    assert f"run {running.id} is still running" in refused.stderr and running.dir.is_dir()
    assert api.remove_runs(every=True) == [] and running.dir.is_dir()
    (running.dir / "state.json").write_text(json.dumps({**state, "format": STATE_FORMAT + 1, "status": "failed"}))
    assert api.remove_runs(every=True) == [running.dir] and not running.dir.exists()


def test_runs_and_clean_take_a_state_nested_past_the_parser_for_corrupt(workdir: Path) -> None:
    """A state.json nested deeper than json's decoder recurses is a corrupt run like any other: skipped by `runs`,
    removed by `clean`. Before, both ended in a traceback (RecursionError), and --all removed no run after it."""
    broken = Run.create(workdir, "craft", RunRequest(need="x"))
    (broken.dir / "state.json").write_text("[" * 100_000)
    assert run_cli("runs", "--json", check=True).returncode == 0
    assert json_result(run_cli("runs", "--json", check=True))["runs"] == []
    assert run_cli("clean", "--all", check=True).stdout.strip() == "removed 1 run(s)"
    assert not broken.dir.exists()


def test_runs_show_and_config_speak_to_people_and_programs(workdir: Path) -> None:
    assert run_cli("runs", check=True).stdout.strip() == f"No runs in {workdir / 'runs'}."
    run = Run.create(workdir, "craft", RunRequest(need="need a CSV deduper"))
    listed = json_result(run_cli("runs", "--json", check=True))
    assert [r["id"] for r in listed["runs"]] == [run.id]
    shown = json_result(run_cli("show", run.id, "--json", check=True))
    assert shown["kind"] == "run" and shown["id"] == run.id
    assert f"run {run.id}" in run_cli("show", run.id, check=True).stdout
    written = run_cli("config", "set", "max_iterations", "12", check=True).stdout
    assert written.startswith("max_iterations = '12' written to ")
    values = json_result(run_cli("config", "show", "--json", check=True))
    assert values["max_iterations"] == 12
    assert api.set_setting("max_iterations", "13")["value"] == 13
    models = json_result(run_cli("models", "--json", check=True))
    assert {"providers", "default", "warnings"} <= set(models)


def test_status_holding_its_answer_does_not_hold_up_other_calls_over_mcp(workdir: Path) -> None:
    """Many agents following runs at once (each status held up to 50 s) leave the server answering everything else:
    a held answer takes none of the worker threads the other tools (list, tools/list, crafted tools) run in."""
    run = _running_run(workdir)

    async def calls() -> float:
        async with mcp_client() as client:
            held = [
                asyncio.create_task(client.call("status", {"run_id": run.id, "wait_seconds": 50})) for _ in range(45)
            ]
            await asyncio.sleep(2)
            started = time.monotonic()
            listed = await client.call("list", {})
            took = time.monotonic() - started
            assert listed[1] is False, listed
            run.state["status"] = "failed"  # the held answers end at their next look
            run.save()
            await asyncio.gather(*held)
            return took

    took = asyncio.run(calls())
    assert took < 10, took


def test_a_cancelled_held_status_lets_the_server_end_at_once(workdir: Path) -> None:
    """A client that cancels a status it asked to hold (notifications/cancelled), then ends its input: the server
    stops holding (within a poll) and exits, not 50 s later with a worker thread still asleep."""
    import json
    import subprocess
    import sys

    run = _running_run(workdir)
    with subprocess.Popen(
        [sys.executable, "-m", "flakebot", "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as server:
        assert server.stdin is not None and server.stdout is not None

        def send(message: dict[str, Any]) -> None:
            assert server.stdin is not None
            server.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
            server.stdin.flush()

        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
        send({"id": 1, "method": "initialize", "params": hello})
        assert "result" in json.loads(server.stdout.readline())
        send({"method": "notifications/initialized"})
        held = {"name": "status", "arguments": {"run_id": run.id, "wait_seconds": 50}}
        send({"id": 2, "method": "tools/call", "params": held})
        time.sleep(2)
        send({"method": "notifications/cancelled", "params": {"requestId": 2}})
        time.sleep(0.5)
        started = time.monotonic()
        server.stdin.close()
        server.wait(timeout=120)
        took = time.monotonic() - started
    assert took < 10, took


@contextmanager
def _read_only(where: Path) -> Iterator[Callable[[bool], None]]:
    """`where` on a read-only bind mount of itself (root writes anywhere else); the callable makes it writable
    again (False) or read-only (True)."""
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(where), str(where)], check=True)

    def read_only(yes: bool) -> None:
        subprocess.run(["mount", "-o", f"remount,bind,{'ro' if yes else 'rw'}", str(where)], check=True)

    try:
        read_only(True)
        yield read_only
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.mark.slow
def test_resume_into_a_read_only_catalog_is_one_line_and_loses_nothing(flakebot_home: Path, workdir: Path) -> None:
    """A package run built to its catalog stage: resumed into a read-only catalog it is refused at once (exit 5,
    one line, before any stage); a catalog that turns read-only while the stage writes fails that stage in one line
    (no OSError traceback); made writable again, the same run resumes to its catalogued tool."""
    require("nix", "cargo", "bwrap")
    from flakebot import config
    from flakebot.errors import HostError
    from flakebot.pipeline import engine

    settings = config.load()
    overrides = {"offline": True, "nixpkgs": "host"}
    request = RunRequest(need="package hexyl", target="hexyl", registry="local", catalog=True, settings=overrides)
    built = engine.start("package", workdir, settings, request, stop_after="package")  # built, not catalogued
    assert built.state["status"] == "stopped" and built.stage_status("catalog") == "pending"
    catalog = flakebot_home / "data" / "flakebot"
    with _read_only(catalog) as read_only:
        refused = run_cli("resume", built.id)
        assert refused.returncode == HostError.exit_code and "Traceback" not in refused.stderr, refused.stderr
        [line] = refused.stderr.strip().splitlines()
        assert line.startswith(f"error: catalog_dir {catalog} is not writable") and ". Fix: " in line, line
        as_json = run_cli("resume", built.id, "--json")
        assert as_json.returncode == 5 and json.loads(as_json.stdout)["type"] == "HostError", as_json.stdout
        assert Run.load(workdir, built.id).stage_status("catalog") == "pending"  # refused before any stage ran

        with pytest.raises(HostError) as failed:  # read-only only once the stage writes: no check could know
            engine.execute(Run.load(workdir, built.id), settings)
        assert failed.value.stage == "catalog" and "read-only" in failed.value.message
        assert f"flakebot resume {built.id}" in (failed.value.fix or "")
        assert Run.load(workdir, built.id).stage_status("package") == "finished"
        read_only(False)
        resumed = run_cli("resume", built.id, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert Run.load(workdir, built.id).state["status"] == "succeeded"
    assert "hexyl" in {t["name"] for t in api.list_tools()["tools"]}


def test_show_of_a_damaged_catalog_says_it_is_damaged_not_that_nothing_is_there(flakebot_home: Path) -> None:
    """As list and run say it: a catalog index cut short is unusable (exit 60), not "no run or tool named X"."""
    index = flakebot_home / "data" / "flakebot" / "catalog.db"
    index.parent.mkdir(parents=True)
    index.write_bytes(b"SQLite format 3\x00" + b"\x10\x00" + b"\x00" * 80)  # a header, then nothing: cut short
    listed, shown = run_cli("list"), run_cli("show", "hexyl")
    assert listed.returncode == 60 and "is unusable" in listed.stderr, listed.stderr
    assert shown.returncode == 60 and shown.stderr == listed.stderr, shown.stderr
