"""A person's and an agent's mistakes around services, through the real CLI and `flakebot mcp` (the Python SDK):
each one clear line (`error: ... Fix: ...`), exit 2, nothing left behind, before anything is built or started."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require, run_cli
from tests.mcp.test_server import mcp_client
from tests.mcp.test_services import packaged as packaged  # noqa: F401 - the fixture: kv-service in this test's home
from tests.services.test_supervisor import KV_SERVICE

pytestmark = pytest.mark.slow


def one_error(done: Any, *words: str, code: int = 2) -> str:
    """The one `error:` line of a refused command (exit `code`, no traceback), checked to hold `words` and a fix."""
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert all(word in line for word in words) and ". Fix: " in line, line
    return str(line)


def catalogued(home: Path) -> set[str]:
    return {p.name for p in (home / "data" / "flakebot" / "tools").iterdir()}


def test_a_service_is_refused_as_a_tool_at_once_by_every_door(packaged: str) -> None:
    done = run_cli("run", packaged, "--", "--help", timeout=30)
    one_error(done, "kv-service is a service, not a tool", "flakebot up kv-service", "service_up")
    captured = run_cli("run", packaged, "--args-json", "{}", timeout=30)
    one_error(captured, "is a service, not a tool")

    async def session() -> tuple[Any, Any]:
        async with mcp_client() as client:
            as_run = await client.call("run", {"tool": packaged, "args": []})
            as_tool = await client.call(packaged, {})
            return as_run, as_tool

    as_run, as_tool = asyncio.run(session())
    for payload, is_error in (as_run, as_tool):
        assert is_error is True and "is a service, not a tool" in payload["error"] and "service_up" in payload["fix"]


def test_declarations_out_of_range_and_bad_names_are_refused_before_any_build(flakebot_home: Path) -> None:
    for flag, value, words in (
        ("--stop-grace", "-1", "stop grace -1 is out of range"),
        ("--stop-grace", "1e9", "stop grace 1e+09 is out of range"),
        ("--name", "Bad_Name", "'Bad_Name' is not a service name"),
        ("--name", "../x", "'../x' is not a service name"),
        ("--socket", "systemd", "socket 'systemd' is neither of handoff, pasta"),
    ):
        done = run_cli("package-service", str(KV_SERVICE), "--offline", flag, value, timeout=60)
        one_error(done, words)
    assert not (flakebot_home / "work" / "runs").exists() or not list((flakebot_home / "work" / "runs").iterdir())
    assert not (flakebot_home / "data" / "flakebot" / "tools").exists()


def test_up_with_a_name_and_all_says_they_cannot_be_combined(flakebot_home: Path) -> None:
    one_error(run_cli("up", "kv-service", "--all"), "up NAME and up --all cannot be combined")
    one_error(run_cli("up"), "name one service or pass --all")


def test_a_huge_name_is_echoed_cut(flakebot_home: Path) -> None:
    name = "a" * 100_000
    done = run_cli("up", name, "--json")
    assert done.returncode != 0 and len(done.stdout) + len(done.stderr) < 5_000
    error = json.loads(done.stdout.splitlines()[-1])
    assert "a" * 65 not in error["error"] and "..." in error["error"]  # the name echoed cut, never whole
    assert error["exit_code"] == done.returncode


@pytest.mark.parametrize("workdir", ["/etc/passwd", "/etc/passwd/below", "/proc/nope"])
def test_a_workdir_that_is_no_directory_is_refused_by_reading_commands_too(flakebot_home: Path, workdir: str) -> None:
    one_error(run_cli("--workdir", workdir, "runs"), f"workdir {workdir}", code=5)  # HostError, as for a craft
    assert not Path("/proc/nope").exists()


def test_a_workdir_not_made_yet_reads_as_empty_and_is_not_made(flakebot_home: Path) -> None:
    fresh = flakebot_home / "not-yet" / "work"
    done = run_cli("--workdir", str(fresh), "runs")
    assert done.returncode == 0 and "No runs" in done.stdout
    assert not (flakebot_home / "not-yet").exists()


def test_package_into_a_name_a_service_holds_is_refused_before_the_build(packaged: str, flakebot_home: Path) -> None:
    runs = flakebot_home / "work" / "runs"
    before = set(runs.iterdir())
    done = run_cli("package", str(KV_SERVICE), "--catalog", "--name", packaged, "--offline", timeout=60)
    one_error(done, f"the catalog already has a tool named {packaged} for another need", f"--name {packaged}-2")
    assert set(runs.iterdir()) == before  # refused before a run (it was refused after the nix build)


@pytest.mark.parametrize("lines", ["-5", "0", "100000"])
def test_logs_out_of_range_is_refused_not_silent(flakebot_home: Path, lines: str) -> None:
    one_error(run_cli("logs", "kv-service", "-n", lines), f"lines {lines} is out of range")


def test_service_logs_over_mcp_bounds_lines_and_its_echo(flakebot_home: Path) -> None:
    async def session() -> list[Any]:
        async with mcp_client() as client:
            return [
                await client.call("service_logs", {"service": "kv-service", "lines": 0}),
                await client.call("service_logs", {"service": "x" * 1_000_000}),
            ]

    (zero, is_error), (huge, huge_error) = asyncio.run(session())
    assert is_error and "lines 0 is out of range" in zero["error"] and "1 to 500" in zero["fix"]
    assert huge_error and len(json.dumps(huge)) < 10_000  # a 1 MB name was echoed back twice (1.9 MB)


def test_services_at_80_columns_never_cut_a_name_to_ambiguity(flakebot_home: Path) -> None:
    require("nix", "cargo", "bwrap", "pasta")
    names = ["kv-service-alpha-one", "kv-service-alpha-two"]
    for name in names:
        done = run_cli("package-service", str(KV_SERVICE), "--offline", "--stop-grace", "2", "--name", name)
        assert done.returncode == 0, done.stderr
        assert run_cli("up", name).returncode == 0
    try:
        shown = run_cli("services", env={"COLUMNS": "80"})
        listed = run_cli("list", env={"COLUMNS": "80"})
    finally:
        for name in names:
            run_cli("down", name)
    for table in (shown.stdout, listed.stdout):
        assert max(len(line) for line in table.splitlines()) <= 80, table
        assert all(name in table for name in names) and "…" not in table, table  # whole, on one line each
    assert shown.stdout.count("running") == 2


def test_ctrl_c_during_up_says_where_it_left_the_service(packaged: str, flakebot_home: Path) -> None:
    import os
    import signal
    import subprocess

    from tests.conftest import FLAKEBOT, wait_for

    launch = flakebot_home / "work" / "services" / packaged / "launch.json"
    process = subprocess.Popen([*FLAKEBOT, "up", packaged], stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    wait_for(launch.exists, timeout=60, interval=0.005)  # up is waiting for the supervisor's first health check
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    try:
        assert process.returncode == 130, stderr
        [line] = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert f"interrupted: {packaged} is" in line and f"flakebot down {packaged}" in line, line
        assert "resume RUN" not in stderr  # the craft's advice, which `up` has no run for
    finally:
        run_cli("down", packaged)
