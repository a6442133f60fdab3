"""The smoke run of a built tool, with levels: how far the binary got in the sandbox, and the evidence.

    help         `--help` or `--version` (a cargo-NAME subcommand also `NAME --help`) exited 0
    usage        it exited non-zero after printing its usage or an argument error naming itself: it loads and runs
    runs         none of that, but given an input (no arguments, or an empty file as its one argument) it ran its own
                 code on it: exited 0, or, having taken `--help` for a file it could not open, got past opening it
    starts-only  it exited non-zero saying it needed something the sandbox withholds (privilege, a device)

A binary that reaches none of them (it crashed, its loader found no library, it printed nothing of the kind) is
refused, and so is one that hangs. nixpkgs' install check is opt-in and a package whose binary cannot be exercised
says so in its metadata; flakebot records the level in the manifest rather than refusing a tool that builds.
`strict` keeps the older rule: only `help` passes.

    smoke_run(bin_path, timeout, sandbox_mode, strict=False) -> {"level", "command", "first_lines", ...}

The try that exited 0 keeps its whole stdout (`stdout`): a later stage that reads the tool's help (instruct, a
catalogued package) takes it from there rather than running the binary again, so it runs under the limits that stage
ran it with (`limits`: the settings', limits_for).
"""

from __future__ import annotations

import logging
import re
import shlex
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flakebot.errors import NixError

if TYPE_CHECKING:
    from flakebot.sandbox.process import SandboxLimits

logger = logging.getLogger(__name__)

SMOKE_OUTPUT_HEAD = 2000
FIRST_LINES = 8
LEVELS = ("help", "usage", "runs", "starts-only")
MEANING = {
    "help": "it printed its help or version and exited 0",
    "usage": "it printed its usage or an argument error and exited non-zero: it loads and runs, but has no --help "
    "that exits 0",
    "runs": "it has no help or usage of its own, but given an input (no arguments, or an empty file as its one "
    "argument) it ran its own code on it: flakebot learned nothing of its parameters",
    "starts-only": "it started but stopped on something the sandbox withholds (privilege, a device): it may not do "
    "its work inside flakebot's sandbox",
}

# The binary did not get to run its own code: a signal, the shell's "cannot execute"/"not found", the loader.
_NOT_STARTED = re.compile(
    r"error while loading shared libraries|cannot open shared object file|exec format error|"
    r"cannot execute|no such file or directory.*(?:interpreter|ld-linux)|symbol lookup error",
    re.IGNORECASE,
)
_PANIC = re.compile(r"panicked at|stack overflow|segmentation fault|core dumped", re.IGNORECASE)
_USAGE = re.compile(r"\busage\b", re.IGNORECASE)
_ARGUMENT_ERROR = re.compile(
    r"unknown|unrecognized|unrecognised|unexpected|invalid|illegal|argument|option|flag", re.IGNORECASE
)
# A file the tool could not open: a tool whose one argument is its input takes `--help` for a file name
# (xml-rs' xml-analyze: "Cannot open input file: No such file or directory (os error 2)").
_NO_SUCH_FILE = re.compile(r"no such file or directory|os error 2\b|kind: NotFound|cannot find the file", re.IGNORECASE)
# The empty file the input try hands a tool as its one argument, in the sandbox's working directory.
EMPTY_INPUT = "empty-input"
# What a tool says when the sandbox withholds privilege or a device (pleaser: "I cannot set privs").
_WITHHELD = re.compile(
    r"\b(?:privs?|privileges?|privileged|setuid|setgid|capabilit(?:y|ies)|superuser|sudo)\b|"
    r"\b(?:as|be|needs?|requires?) root\b|permission denied|operation not permitted|\bEPERM\b|\bEACCES\b|"
    r"no such device|/dev/\w+",
    re.IGNORECASE,
)


def smoke_run(
    bin_path: Path,
    timeout: float,
    sandbox_mode: str = "auto",
    *,
    strict: bool = False,
    limits: SandboxLimits | None = None,
) -> dict[str, Any]:
    """Run the smoke tries (smoke_arguments) in the sandbox with stdin empty and return the best level reached, with
    its evidence: the command, its exit code and the first lines of its output (at `help`, also the try's whole
    stdout). A NixError when the binary reached no level (with `strict`: when no try exited 0) or a try hung past
    `timeout` seconds. `limits` (their timeout `timeout`): the sandbox's, else its defaults."""
    attempts: list[dict[str, Any]] = []
    for args in smoke_arguments(bin_path.name):
        record = _attempt(bin_path, args, timeout, sandbox_mode, limits)
        if record["exit_code"] == 0:
            stdout = record.pop("stdout")
            return {
                **record,
                "level": "help",
                "meaning": MEANING["help"],
                "attempts": _brief(attempts),
                "stdout": stdout,
            }
        del record["stdout"]
        attempts.append(record)
    best = None if strict else best_level(bin_path.name, attempts)
    if best is None and not strict:  # no help, usage or withheld need: does it run on an input at all?
        best = _input_level(bin_path, attempts, timeout, sandbox_mode, limits)
    if best is not None:
        level, record = best
        return {**record, "level": level, "meaning": MEANING[level], "attempts": _brief(attempts)}
    said = [f"'{a['command']}' exited {a['exit_code']}" for a in attempts]
    codes = " and ".join([", ".join(said[:-1]), said[-1]] if len(said) > 1 else said)
    fix = (
        "--strict-smoke: the tool must print help or its version and exit 0"
        if strict
        else "the tool must start and print help, its usage or an argument error naming itself "
        "(a crash or a missing library is refused)"
    )
    raise NixError(f"smoke run failed: {codes}", fix=fix, smoke=attempts[-1])


def best_level(name: str, attempts: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    """The highest level below `help` the failed tries show (usage, then starts-only), with the try showing it."""
    started = [a for a in attempts if _started(a)]
    for level, shows in (("usage", _shows_usage), ("starts-only", _shows_withheld)):
        for attempt in started:
            if shows(name, attempt["output_head"]):
                return level, attempt
    return None


def _input_level(
    bin_path: Path, attempts: list[dict[str, Any]], timeout: float, sandbox_mode: str, limits: SandboxLimits | None
) -> tuple[str, dict[str, Any]] | None:
    """The level the input tries show (each added to `attempts`): `usage` when one prints its usage (difference with
    no arguments), `runs` when one exits 0 on its own (markdown on an empty file) or when `--help` was a file the
    tool could not open and the empty file was not (xml-analyze: it got to parsing it). A crash, a missing library
    or a hang shows nothing."""
    help_missed_a_file = any(_started(a) and _NO_SUCH_FILE.search(a["output_head"]) for a in attempts)
    for args in ([], [EMPTY_INPUT]):
        try:
            record = _attempt(bin_path, args, timeout, sandbox_mode, limits)
        except NixError as exc:  # it hung on this input: no evidence either way
            logger.info("smoke input try of %s: %s", bin_path.name, exc.message)
            continue
        del record["stdout"]
        if _started(record):
            if _shows_usage(bin_path.name, record["output_head"]):
                return "usage", record
            opened = bool(args) and help_missed_a_file and not _NO_SUCH_FILE.search(record["output_head"])
            if record["exit_code"] == 0 or opened:
                return "runs", record
        attempts.append(record)
    return None


def smoke_arguments(name: str) -> list[list[str]]:
    """The smoke runs to try in turn: --help, --version, and for a cargo subcommand (cargo-NAME, which cargo runs as
    `cargo-NAME NAME ARGS`) NAME --help."""
    tries = [["--help"], ["--version"]]
    if name.startswith("cargo-") and len(name) > len("cargo-"):
        tries.append([name.removeprefix("cargo-"), "--help"])
    return tries


def _started(attempt: dict[str, Any]) -> bool:
    """Whether the binary ran its own code and exited on its own: no signal, no loader error, no panic."""
    code, output = attempt["exit_code"], attempt["output_head"]
    if code < 0 or code >= 126:  # killed by a signal (128+N from a shell), or not executable / not found
        return False
    return not (_NOT_STARTED.search(output) or _PANIC.search(output))


def _shows_usage(name: str, output: str) -> bool:
    """Its usage, or an argument error naming itself (as `name`, or as cargo's `cargo NAME` subcommand)."""
    if _USAGE.search(output):
        return True
    names = {name, name.removeprefix("cargo-")} - {""}
    named = any(re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", output) for n in names)
    return named and bool(_ARGUMENT_ERROR.search(output))


def _shows_withheld(name: str, output: str) -> bool:
    return bool(_WITHHELD.search(output))


def _attempt(
    bin_path: Path, args: list[str], timeout: float, sandbox_mode: str, limits: SandboxLimits | None = None
) -> dict[str, Any]:
    """One try's record; its `stdout` whole (smoke_run keeps it for the try that exited 0)."""
    argv = [str(bin_path), *args]
    result = _sandboxed(argv, timeout, sandbox_mode, limits)
    output = (result.stdout + result.stderr)[:SMOKE_OUTPUT_HEAD]
    command = shlex.join([bin_path.name, *args])
    record = {
        "argv": argv,
        "command": command,
        "exit_code": result.returncode,
        "output_head": output,
        "first_lines": output.splitlines()[:FIRST_LINES],
    }
    if result.timed_out:
        raise NixError(
            f"smoke run '{command}' hung and was killed after {timeout:g} s",
            fix="make the tool exit after printing --help, or raise smoke_timeout",
            smoke={**record, "timed_out": True},
        )
    return {**record, "stdout": result.stdout}


def _brief(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tries before the one recorded: each command and its exit code."""
    return [{"command": a["command"], "exit_code": a["exit_code"]} for a in attempts]


def _sandboxed(argv: list[str], timeout: float, sandbox_mode: str, limits: SandboxLimits | None = None) -> Any:
    """The built tool may hold model-written code: run it like every such command, in the sandbox."""
    from flakebot.sandbox import open_sandbox

    with tempfile.TemporaryDirectory(prefix="flakebot-smoke-") as tmp:
        (Path(tmp) / EMPTY_INPUT).write_text("")  # the input try's file (readable by the sandbox's uid)
        (Path(tmp) / EMPTY_INPUT).chmod(0o644)
        tool_dir = Path(argv[0]).parent  # the store's bin/, checked to hold the binary itself (no link: flake.py)
        sandbox = open_sandbox(
            sandbox_mode,
            workspace=Path(tmp),
            writable=[Path(tmp)],
            readable=[tool_dir],
            timeout=timeout,
            limits=limits,
            adopt=True,
        )
        return sandbox.run(argv, cwd=Path(tmp), stdin="", timeout=timeout)
