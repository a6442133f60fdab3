"""The smoke run's levels on real programs run in the sandbox: help, usage, starts-only, and what is still refused."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from flakebot.errors import NixError
from flakebot.nix.smoke import SMOKE_OUTPUT_HEAD, smoke_run
from flakebot.sandbox.process import SandboxLimits


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    for made in (path, path.parent):  # as a store path is: the smoke run's unprivileged uid reads and runs it
        made.chmod(0o755)
    return path


# What Debian's cargo-lock 8.0.2 prints for `cargo-lock --help` (gumdrop: its default `list` command has no help
# option), from src/bin/cargo-lock/main.rs: "*** error: {e}", "USAGE:", ListCmd::usage(), exit(1).
CARGO_LOCK = """echo '*** error: unrecognized option `--help`' >&2
echo 'USAGE:' >&2
echo '  -f, --file FILE      input Cargo.lock file' >&2
exit 1
"""


def test_a_tool_printing_its_usage_on_every_try_is_usage_level_with_its_evidence(tmp_path: Path) -> None:
    tool = _script(tmp_path / "bin" / "cargo-lock", CARGO_LOCK)
    record = smoke_run(tool, timeout=10)
    assert record["level"] == "usage" and record["command"] == "cargo-lock --help" and record["exit_code"] == 1
    assert record["first_lines"] == [
        "*** error: unrecognized option `--help`",
        "USAGE:",
        "  -f, --file FILE      input Cargo.lock file",
    ]
    assert [a["command"] for a in record["attempts"]] == [
        "cargo-lock --help",
        "cargo-lock --version",
        "cargo-lock lock --help",
    ]
    assert "loads and runs" in record["meaning"]


def test_an_argument_error_naming_the_tool_is_usage_level(tmp_path: Path) -> None:
    tool = _script(tmp_path / "bin" / "frob", "echo \"frob: unknown option '$1'\" >&2\nexit 2\n")
    assert smoke_run(tool, timeout=10)["level"] == "usage"


def test_a_tool_stopped_by_the_sandbox_withholding_privilege_is_starts_only(tmp_path: Path) -> None:
    """pleaser's `please` sets root's privileges before it reads its arguments (src/lib.rs set_privs)."""
    tool = _script(
        tmp_path / "bin" / "please", 'echo "I cannot set privs. Exiting as not installed correctly."\nexit 1\n'
    )
    record = smoke_run(tool, timeout=10)
    assert record["level"] == "starts-only" and record["command"] == "please --help"
    assert record["first_lines"] == ["I cannot set privs. Exiting as not installed correctly."]


@pytest.mark.parametrize(
    "said",
    ["this program must be run as root", "open /dev/ttyUSB0: No such file or directory", "Operation not permitted"],
)
def test_other_things_the_sandbox_withholds_are_starts_only(tmp_path: Path, said: str) -> None:
    tool = _script(tmp_path / "bin" / "needy", f'echo "{said}" >&2\nexit 1\n')
    assert smoke_run(tool, timeout=10)["level"] == "starts-only"


def test_strict_smoke_keeps_the_old_rule(tmp_path: Path) -> None:
    tool = _script(tmp_path / "bin" / "cargo-lock", CARGO_LOCK)
    with pytest.raises(NixError) as caught:
        smoke_run(tool, timeout=10, strict=True)
    assert caught.value.message == (
        "smoke run failed: 'cargo-lock --help' exited 1, 'cargo-lock --version' exited 1 and "
        "'cargo-lock lock --help' exited 1"
    )
    assert (caught.value.fix or "").startswith("--strict-smoke")


def test_a_help_exiting_0_is_help_level(tmp_path: Path) -> None:
    tool = _script(tmp_path / "bin" / "hi", 'echo "hi: says hi"\n')
    record = smoke_run(tool, timeout=10)
    assert record["level"] == "help" and record["first_lines"] == ["hi: says hi"] and record["attempts"] == []


def test_the_help_try_keeps_its_whole_stdout_under_the_limits_given(tmp_path: Path) -> None:
    """Its stdout whole (past the evidence's head), not its stderr, run under the given limits: what the instruct stage
    reads instead of running the tool's --help again; a try that did not exit 0 keeps none."""
    lines = "".join(f"echo 'hi: line {n} of a long help'\n" for n in range(200))
    tool = _script(tmp_path / "bin" / "hi", f"ulimit -d\necho 'on stderr' >&2\n{lines}")
    record = smoke_run(tool, timeout=10, limits=SandboxLimits(timeout=10, memory_mb=300))
    assert record["level"] == "help" and record["argv"] == [str(tool), "--help"]
    help_lines = "".join(f"hi: line {n} of a long help\n" for n in range(200))
    assert record["stdout"] == f"{300 * 1024}\n{help_lines}"  # RLIMIT_DATA of the limits given
    assert len(record["output_head"]) == SMOKE_OUTPUT_HEAD < len(record["stdout"])
    usage = _script(tmp_path / "other" / "frob", "echo \"frob: unknown option '$1'\" >&2\nexit 2\n")
    record = smoke_run(usage, timeout=10)
    assert record["level"] == "usage" and "stdout" not in record


@pytest.mark.parametrize(
    "body",
    [
        pytest.param("echo \"thread 'main' panicked at src/main.rs:3:5: usage\" >&2\nexit 101\n", id="panic"),
        pytest.param('echo "usage: crash" >&2\nkill -SEGV $$\n', id="signal"),
        pytest.param('echo "a78e31: no help here" >&2\nexit 3\n', id="says-nothing-of-itself"),
        pytest.param('echo "error: could not find the project root" >&2\nexit 1\n', id="a-root-that-is-no-privilege"),
    ],
)
def test_a_crash_or_an_unexplained_failure_is_still_refused(tmp_path: Path, body: str) -> None:
    tool = _script(tmp_path / "bin" / "crash", body)
    with pytest.raises(NixError, match=r"^smoke run failed: 'crash --help' exited"):
        smoke_run(tool, timeout=10)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to make a binary whose library is gone")
def test_a_binary_whose_library_is_missing_is_refused(tmp_path: Path) -> None:
    """A real ELF linked against a shared library that is then removed: the loader prints usage-free 'error while
    loading shared libraries' and exits 127; it never ran its own code."""
    lib, bin_dir = tmp_path / "lib", tmp_path / "bin"
    lib.mkdir()
    bin_dir.mkdir()
    (lib / "gone.c").write_text("int gone(void) { return 0; }\n")
    (bin_dir / "main.c").write_text(
        '#include <stdio.h>\nint gone(void);\nint main(void) { puts("usage"); return gone() + 1; }\n'
    )
    subprocess.run(["cc", "-shared", "-fPIC", "-o", lib / "libgone.so", lib / "gone.c"], check=True)
    subprocess.run(
        ["cc", "-o", bin_dir / "needslib", bin_dir / "main.c", f"-L{lib}", "-lgone", f"-Wl,-rpath,{lib}"], check=True
    )
    (lib / "libgone.so").unlink()
    bin_dir.chmod(0o755)
    with pytest.raises(NixError) as caught:
        smoke_run(bin_dir / "needslib", timeout=10)
    assert "exited 127" in caught.value.message
    assert "error while loading shared libraries" in caught.value.details["smoke"]["output_head"]


# Programs whose one argument is their input and which have no options, as Debian's crates build them (their
# words from the real binaries): xml-rs 0.8.3's xml-analyze (src/analyze.rs), markdown 0.3.0's markdown (src/main.rs:
# it prints its argv, then unwraps the file it read), difference 2.0.0's difference (getopts' error in a panic!, its
# usage with no arguments).
XML_ANALYZE = """if [ -z "$1" ]; then echo 'Error parsing XML document: 1:1 Unexpected end of stream: no root element found' >&2; exit 1; fi
if [ ! -e "$1" ]; then echo 'Cannot open input file: No such file or directory (os error 2)' >&2; exit 1; fi
echo 'Error parsing XML document: 1:1 Unexpected end of stream: no root element found' >&2; exit 1
"""
MARKDOWN = """echo "[\\"$0\\", \\"$1\\"]"
if [ -z "$1" ]; then echo "thread 'main' panicked at src/main.rs:9:31:" >&2; echo 'index out of bounds: the len is 1 but the index is 1' >&2; exit 101; fi
if [ ! -e "$1" ]; then echo "thread 'main' panicked at src/main.rs:12:50:" >&2
  echo 'called `Result::unwrap()` on an `Err` value: Os { code: 2, kind: NotFound, message: "No such file or directory" }' >&2; exit 101; fi
cat "$1"; echo
"""
DIFFERENCE = """if [ -n "$1" ] && [ "${1#-}" != "$1" ]; then echo "thread 'main' panicked at src/main.rs:27:19:" >&2
  echo "Unrecognized option: '${1#--}'" >&2; exit 101; fi
printf 'Usage: %s [options]\\n\\nOptions:\\n    -s, --split char|word|line\\n' "$0"
"""


def test_a_tool_taking_help_for_its_input_file_runs_when_given_an_empty_file(tmp_path: Path) -> None:
    tool = _script(tmp_path / "bin" / "xml-analyze", XML_ANALYZE)
    record = smoke_run(tool, timeout=10)
    assert (record["level"], record["command"], record["exit_code"]) == ("runs", "xml-analyze empty-input", 1)
    assert record["first_lines"] == ["Error parsing XML document: 1:1 Unexpected end of stream: no root element found"]
    assert [a["command"] for a in record["attempts"]] == ["xml-analyze --help", "xml-analyze --version", "xml-analyze"]


def test_a_tool_panicking_on_a_missing_file_runs_when_given_an_empty_one(tmp_path: Path) -> None:
    tool = _script(tmp_path / "bin" / "markdown", MARKDOWN)
    record = smoke_run(tool, timeout=10)
    assert (record["level"], record["command"], record["exit_code"]) == ("runs", "markdown empty-input", 0)
    assert "flakebot learned nothing of its parameters" in record["meaning"]


def test_a_tool_printing_its_usage_with_no_arguments_is_usage_level(tmp_path: Path) -> None:
    tool = _script(tmp_path / "bin" / "difference", DIFFERENCE)
    record = smoke_run(tool, timeout=10)
    assert (record["level"], record["command"], record["exit_code"]) == ("usage", "difference", 0)
    assert record["first_lines"][0].endswith("difference [options]")


@pytest.mark.parametrize(
    "body",
    [
        # an install missing its own data file says so whatever it is given, the empty file too
        pytest.param(
            "echo 'error: /share/tool/table.dat: No such file or directory' >&2\nexit 1\n", id="own-file-gone"
        ),
        # a tool that crashes on every input
        pytest.param("echo \"thread 'main' panicked at src/main.rs:3:5: No such file\" >&2\nexit 101\n", id="panics"),
    ],
)
def test_a_tool_that_runs_on_no_input_is_still_refused_with_every_try_listed(tmp_path: Path, body: str) -> None:
    tool = _script(tmp_path / "bin" / "broken", body)
    with pytest.raises(NixError) as caught:
        smoke_run(tool, timeout=10)
    assert caught.value.message.endswith("'broken' exited 1 and 'broken empty-input' exited 1") or (
        caught.value.message.endswith("'broken' exited 101 and 'broken empty-input' exited 101")
    )
