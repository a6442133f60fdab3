"""The console-script entry: which `flakebot run` command lines it reads itself (no typer) and what it makes of
them; every other line goes to the typer app, which reads it as before."""

from __future__ import annotations

import pytest

from flakebot.cli.entry import mcp_options, run_options
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


def test_a_line_left_to_typer_still_works() -> None:
    helped = run_cli("run", "--help")
    assert helped.returncode == 0 and "--args-json" in helped.stdout
    unknown = run_cli("run", "no-such-tool", "--no-such-option")
    assert unknown.returncode != 0 and "no-such-tool" in unknown.stderr and "Traceback" not in unknown.stderr
