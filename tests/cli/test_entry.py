"""The console-script entry: which `flakebot run` command lines it reads itself (no typer) and what it makes of
them; every other line goes to the typer app, which reads it as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flakebot.cli.entry import AS_JSON, json_options, mcp_options, only_command, run_options
from tests.conftest import run_cli


def test_run_lines_the_entry_reads_itself() -> None:
    assert run_options(["csv-dedup", "--", "--key", "id", "data.csv"]) == {
        "tool": "csv-dedup", "args": ["--key", "id", "data.csv"], "args_json": None, "capture": False,
        "writable": [], "grant_roots": [], "sandbox": None,
    }  # fmt: skip
    read = run_options(["--json", "t", "--writable", "a", "--writable=b", "--sandbox=auto", "--args-json", "{}",
                        "--grant-root", "r", "--grant-root=s"])  # fmt: skip
    assert read == {
        "tool": "t",
        "args": [],
        "args_json": "{}",
        "capture": True,
        "writable": ["a", "b"],
        "grant_roots": ["r", "s"],
        "sandbox": "auto",
    }
    after = run_options(["t", "--", "--json"])  # after `--`, everything is the tool's
    assert after is not None and after["args"] == ["--json"] and after["capture"] is False


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["t", "-h"],
        ["t", "extra"],
        ["t", "--key", "id"],
        ["t", "--writable"],
        ["t", "--grant-root"],
        ["t", "--json=1"],
        ["--", "t"],
        [],
    ],
)
def test_run_lines_left_to_typer(argv: list[str]) -> None:
    assert run_options(argv) is None


def test_mcp_lines_the_entry_reads_itself() -> None:
    assert mcp_options([]) == [] and mcp_options(["--grant-root", "a", "--grant-root=b"]) == ["a", "b"]
    for left in (["--help"], ["--grant-root"], ["--other"], ["x"]):
        assert mcp_options(left) is None, left


def test_up_lines_with_json_the_entry_reads_itself() -> None:
    default = {"service": None, "port": None, "every": False, "secret": None, "network": False, "replace": False}
    assert json_options("up", ["kv", "--json"]) == {**default, "service": "kv"}
    read = json_options("up", ["--json", "kv@0.2.0", "--port", "8080", "--secret", "a=f", "--secret=b=g",
                               "--network", "--replace"])  # fmt: skip
    assert read == {**default, "service": "kv@0.2.0", "port": 8080, "secret": ["a=f", "b=g"], "network": True,
                    "replace": True}  # fmt: skip
    assert json_options("up", ["--all", "--json"]) == {**default, "every": True}


@pytest.mark.parametrize(
    "argv",
    [
        ["kv"],  # no --json: a person's, shown by typer's app
        ["kv", "--json", "--help"],
        ["kv", "other", "--json"],
        ["kv", "--port", "abc", "--json"],  # typer says what is wrong with it
        ["kv", "--port=8.5", "--json"],
        ["kv", "--port", "--json"],
        ["kv", "--port", "1", "--port", "2", "--json"],
        ["kv", "--network", "--network", "--json"],
        ["kv", "--no-such-option", "--json"],
        ["kv", "--", "--json"],
    ],
)
def test_up_lines_left_to_typer(argv: list[str]) -> None:
    assert json_options("up", argv) is None


def test_commands_read_here_print_their_data_as_typer_would() -> None:
    """With --json, typer's app prints a command's data, unless cli/display.py names a display for it: none of the
    commands read here may have one (their --json output would differ by who read the line)."""
    from flakebot.cli.display import SHOWN

    assert AS_JSON and not set(AS_JSON) & set(SHOWN)


def test_up_read_here_fails_as_typer_s_app_does(flakebot_home: Path) -> None:
    """`up NAME --json`, read by the entry without importing typer, refuses an unknown service with the same error
    object and exit code as the typer app (reached here through a global option)."""
    ran = subprocess.run([sys.executable, "-X", "importtime", "-m", "flakebot", "up", "no-such-service", "--json"],
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert not any(line.split("|")[-1].strip() == "typer" for line in ran.stderr.splitlines())
    typer_s = run_cli("-q", "up", "no-such-service", "--json")
    assert ran.returncode == typer_s.returncode == 60
    assert json.loads(ran.stdout.splitlines()[-1]) == json.loads(typer_s.stdout.splitlines()[-1])
    assert ran.stderr.splitlines()[-1] == typer_s.stderr.splitlines()[-1]


def test_a_line_left_to_typer_still_works() -> None:
    helped = run_cli("run", "--help")
    assert helped.returncode == 0 and "--args-json" in helped.stdout
    unknown = run_cli("run", "no-such-tool", "--no-such-option")
    assert unknown.returncode != 0 and "no-such-tool" in unknown.stderr and "Traceback" not in unknown.stderr


def test_a_line_naming_one_command_gives_typer_that_command_alone(flakebot_home: Path) -> None:
    """`flakebot craft ...` builds the craft command alone; what a person sees is what the whole app shows: the same
    help and usage error as with a global option first (every command built), a typo's suggestion among all names."""
    assert only_command(["craft", "a need"]) == "craft" and only_command(["runs", "--json"]) == "runs"
    for argv in (["-q", "craft"], ["config", "show"], ["crft"], ["mcp"], ["serve"], []):
        assert only_command(argv) is None, argv
    alone, every = run_cli("craft", "--help"), run_cli("-q", "craft", "--help")
    assert alone.returncode == every.returncode == 0 and alone.stdout == every.stdout
    assert "Usage: flakebot craft" in alone.stdout
    alone, every = run_cli("craft"), run_cli("-q", "craft")
    assert alone.returncode == every.returncode == 2 and alone.stderr == every.stderr
    assert "Missing argument 'NEED'" in alone.stderr
    typo = run_cli("crft", "x")
    assert typo.returncode == 2 and "Did you mean 'craft'" in typo.stderr


def _help(*options: str, env: dict[str, str] | None = None) -> tuple[str, bool]:
    """`flakebot` with `options`, run under `python -X importtime`: (its standard output, whether typer was imported)."""
    ran = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "flakebot", *options],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=True,
    )
    return ran.stdout, any(line.split("|")[-1].strip() == "typer" for line in ran.stderr.splitlines())


def test_help_is_printed_from_what_typer_printed_for_the_same_layout(flakebot_home: Path) -> None:
    """`flakebot --help` prints typer's own help the first time and stores it; the next run prints the same text
    without importing typer; another layout (COLUMNS) is typer's again, and stored beside nothing else."""
    first, typer_first = _help("--help")
    again, typer_again = _help("--help")
    assert typer_first and not typer_again
    assert again == first and "Usage: flakebot [OPTIONS] COMMAND" in first and "craft" in first
    narrow, typer_narrow = _help("--help", env={"COLUMNS": "60"})
    assert typer_narrow and narrow != first and max(map(len, narrow.splitlines())) <= 60
    assert _help("-h", env={"COLUMNS": "60"})[0] == narrow
    stored = (flakebot_home / "cache/flakebot/cli-help.json").read_text()
    assert "COLUMNS" not in stored and len(json.loads(stored)) == 1  # the digest alone, never the environment


def test_a_secret_in_the_environment_never_enters_the_helps_digest(flakebot_home: Path) -> None:
    """FLAKEBOT_DATABASE_URL may carry a password: the stored digest depends on whether it is set, not on its value
    (a digest of a weak password could be guessed back), so another password serves the same stored help."""
    first, typer_first = _help("--help", env={"FLAKEBOT_DATABASE_URL": "postgresql://u:first-password@db/flakebot"})
    again, typer_again = _help("--help", env={"FLAKEBOT_DATABASE_URL": "postgresql://u:other-password@db/flakebot"})
    assert typer_first and not typer_again and again == first
    assert "password" not in (flakebot_home / "cache/flakebot/cli-help.json").read_text()


LEAVING = """
import atexit, concurrent.futures, sys, threading, time
from flakebot.cli.entry import leave
pool = concurrent.futures.ThreadPoolExecutor(2)
pool.submit(int).result()  # left idle, never shut down: the interpreter's exit step stops it
worker = threading.Thread(target=lambda: (time.sleep(0.2), print("worker done", file=sys.stderr)))
worker.start()
atexit.register(lambda: print("exit handler ran", flush=True))
print("result", end="")  # buffered: stdout is a pipe
leave(3)
"""


def test_leaving_without_teardown_keeps_what_an_exit_does() -> None:
    """A typer command ends through leave(): its exit code, the threads it started finished, the exit handlers run,
    standard output flushed; an idle thread pool does not hold it."""
    done = subprocess.run([sys.executable, "-c", LEAVING], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "resultexit handler ran\n"
    assert done.stderr == "worker done\n"


def _imported(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """`flakebot ARGV` under `python -X importtime`: the finished process and the modules it imported."""
    ran = subprocess.run([sys.executable, "-X", "importtime", "-m", "flakebot", *argv],
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    return ran, {line.split("|")[-1].strip() for line in ran.stderr.splitlines() if line.startswith("import time:")}


def test_a_command_that_prints_json_never_imports_rich(flakebot_home: Path) -> None:
    """An agent's `--json` commands print JSON only: rich (20 ms of start-up) is imported when a person's table or
    an error line is drawn, not before. The same commands for a person still draw with it."""
    for argv in (["list", "--json"], ["runs", "--json"], ["config", "show", "--json"]):
        ran, modules = _imported(argv)
        assert ran.returncode == 0, ran.stderr[-500:]
        assert json.loads(ran.stdout.splitlines()[-1])
        assert "rich" not in modules, argv
    ran, modules = _imported(["config", "show"])
    assert ran.returncode == 0 and "rich.table" in modules
    failed, modules = _imported(["show", "no-such-tool", "--json"])
    assert failed.returncode != 0 and "error:" in failed.stderr and "rich" in modules  # the person's line on stderr
