"""Bad input to the real CLI: the exact error line and exit code, and a check that nothing was half-written.

Each case runs in a fresh Home. Before and after, the report lists the run directories, the catalog and
the processes of that home. A case says whether it may leave a run record: "none" (the input is refused
before a run exists) or "failed" (the input is only found bad inside a stage, e.g. a crate that is not in
the registry: the run is kept as an audit record with only its audit files, the workspace removed).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import records
from benchmarks.reliability.env import DEBIAN_REGISTRY, OFFLINE, SESSION, Home, Scratch, write_json
from benchmarks.reliability.table import code, table, yes
from benchmarks.scenarios.shout import SHOUT_SPEC
from flakebot.errors import CatalogError, ConfigError, ModelError, NixError, RunError, SearchError, UsageError

AUDIT_FILES = {
    ".lock",
    "events.jsonl",
    "run.log",
    "state.json",
    "transcript.jsonl",
    "flake",
    "edit.json",
    "manifest.json",
    "USAGE.md",
}
CSV_NEED = "need a CSV deduper"
SCRIPTED = ["--model", f"scripted:{SESSION}"]

Setup = Callable[[Home], dict[str, str]]  # prepares files in the home; returns placeholders for the argv


@dataclass
class BadInput:
    """One invocation with bad input, what it should exit with, and whether a run record may remain."""

    name: str
    argv: list[str]
    expect_exit: int
    leaves: str = "none"  # "none" | "failed"
    env: dict[str, str] = field(default_factory=dict)
    setup: Setup | None = None


def _corrupt_state(home: Home) -> dict[str, str]:
    """A real run stopped after its spec stage, whose state.json is then cut in half."""
    stopped = home.cli("craft", CSV_NEED, *SCRIPTED, *OFFLINE, "--stop-after", "spec")
    if stopped.returncode != 0:
        raise RuntimeError(f"setting up a run failed: {stopped.error_line}")
    (run_id,) = home.run_ids()
    state = home.workdir / "runs" / run_id / "state.json"
    text = state.read_text()
    state.write_text(text[: len(text) // 2])
    return {"RUN": run_id}


def _config_file(text: str, where: str = "user") -> Setup:
    def setup(home: Home) -> dict[str, str]:
        path = home.root / "config/flakebot/flakebot.toml" if where == "user" else home.root / "flakebot.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return {}

    return setup


def _files(**contents: str) -> Setup:
    def setup(home: Home) -> dict[str, str]:
        for name, text in contents.items():
            (home.root / name.replace("_", ".")).write_text(text)
        return {name.upper(): str(home.root / name.replace("_", ".")) for name in contents}

    return setup


def _empty_dir(home: Home) -> dict[str, str]:
    (home.root / "not-a-registry").mkdir()
    (home.root / "not-a-registry/readme.txt").write_text("no crates here\n")
    return {"DIR": str(home.root / "not-a-registry")}


def _shout_spec(home: Home) -> dict[str, str]:
    return {"SPEC": str(write_json(home.root / "spec.json", SHOUT_SPEC))}


def _closed_port(home: Home) -> dict[str, str]:
    with socket.socket() as sock:  # bound then closed: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return {"PORT": str(port)}


def _path_without_nix(home: Home) -> dict[str, str]:
    """A PATH holding everything the system PATH holds except nix's programs."""
    shim = home.root / "bin-without-nix"
    shim.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        for program in Path(directory).glob("*") if Path(directory).is_dir() else []:
            if not program.name.startswith("nix") and not (shim / program.name).exists():
                (shim / program.name).symlink_to(program)
    return {"NOPATH": str(shim)}


def _with(*setups: Setup) -> Setup:
    def setup(home: Home) -> dict[str, str]:
        values: dict[str, str] = {}
        for one in setups:
            values.update(one(home))
        return values

    return setup


CASES = [
    BadInput("empty need", ["craft", "", *SCRIPTED], UsageError.exit_code),
    BadInput("blank need", ["craft", "   ", *SCRIPTED], UsageError.exit_code),
    BadInput("unknown run id", ["resume", "20990101-000000-abcdef"], RunError.exit_code),
    BadInput("show an unknown run or tool", ["show", "no-such-thing"], RunError.exit_code),
    BadInput("corrupt state.json", ["resume", "{RUN}"], RunError.exit_code, setup=_corrupt_state),
    BadInput(
        "unknown config key (user flakebot.toml)",
        ["craft", CSV_NEED, *SCRIPTED, *OFFLINE],
        ConfigError.exit_code,
        setup=_config_file('colour = "red"\n'),
    ),
    BadInput(
        "invalid TOML (./flakebot.toml)",
        ["craft", CSV_NEED, *SCRIPTED, *OFFLINE],
        ConfigError.exit_code,
        setup=_config_file("model = \n", "local"),
    ),
    BadInput(
        "trust setting in ./flakebot.toml (sandbox = off)",
        ["craft", CSV_NEED, *SCRIPTED, *OFFLINE],
        ConfigError.exit_code,
        setup=_config_file('sandbox = "off"\n', "local"),
    ),
    BadInput(
        "limit raised in ./flakebot.toml",
        ["craft", CSV_NEED, *SCRIPTED, *OFFLINE],
        ConfigError.exit_code,
        setup=_config_file("max_cost = 100.0\n", "local"),
    ),
    BadInput(
        "unknown FLAKEBOT_ variable",
        ["craft", CSV_NEED, *SCRIPTED, *OFFLINE],
        ConfigError.exit_code,
        env={"FLAKEBOT_COLOUR": "red"},
    ),
    BadInput(
        "setting of the wrong type",
        ["craft", CSV_NEED, *SCRIPTED, *OFFLINE],
        ConfigError.exit_code,
        env={"FLAKEBOT_MAX_COST": "lots"},
    ),
    BadInput("config set of an unknown key", ["config", "set", "colour", "red"], ConfigError.exit_code),
    BadInput("unknown provider prefix", ["craft", CSV_NEED, "--model", "foo:bar", *OFFLINE], ModelError.exit_code),
    BadInput("no key and no --model", ["craft", CSV_NEED, *OFFLINE], ModelError.exit_code),
    BadInput(
        "groq chosen without GROQ_API_KEY", ["craft", CSV_NEED, "--model", "groq", *OFFLINE], ModelError.exit_code
    ),
    BadInput(
        "unreachable model base URL",
        ["craft", CSV_NEED, "--model", "openai-compatible:m@http://127.0.0.1:{PORT}/v1", *OFFLINE],
        ModelError.exit_code,
        leaves="failed",
        env={"FLAKEBOT_MODEL_RETRIES": "1"},
        setup=_closed_port,
    ),
    BadInput(
        "script that is not JSON",
        ["craft", CSV_NEED, "--model", "scripted:{BROKEN_JSON}", *OFFLINE],
        ModelError.exit_code,
        setup=_files(broken_json="{\n"),
    ),
    BadInput(
        "script with an unknown key",
        ["craft", CSV_NEED, "--model", "scripted:{ODD_JSON}", *OFFLINE],
        ModelError.exit_code,
        setup=_files(odd_json=json.dumps({"format": 1, "turns": [{"bogus": 1}]})),
    ),
    BadInput(
        "script file missing",
        ["craft", CSV_NEED, "--model", "scripted:/nonexistent/script.json", *OFFLINE],
        ModelError.exit_code,
    ),
    BadInput(
        "registry path that is not a directory source",
        ["search", "csv", "--registry", "{DIR}"],
        SearchError.exit_code,
        setup=_empty_dir,
    ),
    BadInput("empty search query", ["search", "", "--registry", "local"], SearchError.exit_code),
    BadInput("stopword-only search query", ["search", "the a of", "--registry", "local"], SearchError.exit_code),
    BadInput(
        "nonexistent crate with --crate",
        ["craft", "shout it", *SCRIPTED, "--spec", "{SPEC}", "--crate", "no-such-crate", "--mode", "new", *OFFLINE],
        SearchError.exit_code,
        leaves="failed",
        setup=_shout_spec,
    ),
    BadInput(
        "unknown --mode",
        ["craft", "shout it", *SCRIPTED, "--spec", "{SPEC}", "--crate", "csv", "--mode", "sideways", *OFFLINE],
        UsageError.exit_code,
        setup=_shout_spec,
    ),
    BadInput("--mode without --crate", ["craft", CSV_NEED, *SCRIPTED, "--mode", "new", *OFFLINE], UsageError.exit_code),
    BadInput(
        "unknown --stop-after stage",
        ["craft", CSV_NEED, *SCRIPTED, "--stop-after", "bogus", *OFFLINE],
        UsageError.exit_code,
    ),
    BadInput(
        "--max-iterations 0", ["craft", CSV_NEED, *SCRIPTED, "--max-iterations", "0", *OFFLINE], UsageError.exit_code
    ),
    BadInput(
        "--spec file missing",
        ["craft", "shout it", *SCRIPTED, "--spec", "/nonexistent/spec.json", *OFFLINE],
        UsageError.exit_code,
    ),
    BadInput(
        "--spec file without examples",
        ["craft", "shout it", *SCRIPTED, "--spec", "{SPEC_JSON}", *OFFLINE],
        42,
        setup=_files(spec_json=json.dumps({"name": "shout"})),
    ),
    BadInput(
        "unwritable --workdir",
        ["--workdir", "/proc/flakebot-runs", "craft", CSV_NEED, *SCRIPTED, *OFFLINE],
        RunError.exit_code,
    ),
    BadInput(
        "package of a crate with no binary",
        ["package", "csv", "--registry", "local"],
        UsageError.exit_code,
        leaves="failed",
    ),
    BadInput(
        "package of a crate not in the registry",
        ["package", "no-such-crate", "--registry", "local"],
        SearchError.exit_code,
        leaves="failed",
    ),
    BadInput(
        "package of a directory without Cargo.toml",
        ["package", "{DIR}"],
        UsageError.exit_code,
        leaves="failed",
        setup=_empty_dir,
    ),
    BadInput(
        "craft without nix on PATH",
        ["craft", CSV_NEED, *SCRIPTED, *OFFLINE],
        NixError.exit_code,
        env={"PATH": "{NOPATH}"},
        setup=_path_without_nix,
    ),
    BadInput(
        "package without nix on PATH",
        ["package", str(DEBIAN_REGISTRY / "hexyl-0.8.0")],
        NixError.exit_code,
        leaves="failed",
        env={"PATH": "{NOPATH}"},
        setup=_path_without_nix,
    ),
    BadInput("flakebot run of an unknown tool", ["run", "no-such-tool", "--", "--help"], CatalogError.exit_code),
    BadInput("flakebot rm of an unknown tool", ["rm", "no-such-tool"], CatalogError.exit_code),
    BadInput("clean with neither RUN nor --all", ["clean"], UsageError.exit_code),
]


@dataclass
class LeftRun:
    """A run directory a case left behind."""

    run: str
    status: str
    extra_files: list[str]


@dataclass
class InputRow:
    """One invocation with bad input: its error line and exit code, and what it left in its home."""

    case: str
    command: str
    env: dict[str, str]
    exit_code: int
    expected_exit: int
    error_line: str
    traceback: bool
    seconds: float
    may_leave: str
    new_runs: list[LeftRun]
    catalog_changed: bool
    strays: list[Any]
    clean: bool
    ok: bool


def run_case(case: BadInput, home: Home) -> InputRow:
    values = case.setup(home) if case.setup else {}
    argv = [arg.format(**values) if "{" in arg and arg != "" else arg for arg in case.argv]
    env = {key: value.format(**values) for key, value in case.env.items()}
    runs_before, catalog_before = set(home.run_ids()), home.catalog()
    outcome = home.cli(*argv, env=env, timeout=300)
    new_runs = sorted(set(home.run_ids()) - runs_before)
    left = _what_was_left(home, new_runs)
    strays = home.strays()
    row = InputRow(
        case=case.name,
        command="flakebot " + shlex.join(_shown(a, home) for a in argv),
        env={k: _shown(v, home) for k, v in env.items()},
        exit_code=outcome.returncode,
        expected_exit=case.expect_exit,
        error_line=_shown(outcome.error_line, home),
        traceback=outcome.traceback,
        seconds=outcome.seconds,
        may_leave=case.leaves,
        new_runs=left,
        catalog_changed=home.catalog() != catalog_before,
        strays=strays,
        clean=False,
        ok=False,
    )
    row.clean = _clean(case, row)
    row.ok = (
        row.clean
        and outcome.returncode == case.expect_exit
        and outcome.error_line.startswith("error: ")
        and not outcome.traceback
    )
    return row


def _what_was_left(home: Home, run_ids: list[str]) -> list[LeftRun]:
    left = []
    for run_id in run_ids:
        try:
            status = home.state(run_id)["status"]
        except (OSError, ValueError, KeyError):
            status = "unreadable"
        left.append(LeftRun(run_id, status, sorted(set(home.run_files(run_id)) - AUDIT_FILES)))
    return left


def _clean(case: BadInput, row: InputRow) -> bool:
    if row.strays or row.catalog_changed:
        return False
    if case.leaves == "none":
        return not row.new_runs
    return len(row.new_runs) == 1 and row.new_runs[0].status == "failed" and not row.new_runs[0].extra_files


def _shown(text: str, home: Home) -> str:
    """The scratch home's path shown as <home>, the session's relative to the repository: the same on every machine."""
    return text.replace(str(home.root), "<home>").replace(str(SESSION), "flakebot/data/sessions/csv-dedup.json")


def run_cases(root: Path, cache: Path, names: list[str] | None = None) -> list[InputRow]:
    rows = []
    for i, case in enumerate(c for c in CASES if names is None or c.name in names):
        home = Home(root / f"input-{i:02d}", cache)
        rows.append(run_case(case, home))
        shutil.rmtree(home.root, ignore_errors=True)
    return rows


# ------------------------------------------------------------------ the report's section

QUICK = ["empty need", "unknown run id", "unknown --stop-after stage", "registry path that is not a directory source"]


@dataclass
class InputSummary:
    cases: int
    ok: int
    expected_exit: int
    nothing_half_written: int
    tracebacks: int

    def lines(self) -> list[str]:
        return [
            f"- **Bad input**: {self.ok} of {self.cases} invocations ended with one `error:` line and the documented exit code "
            f"({self.expected_exit} with the expected code, {self.nothing_half_written} left nothing half-written, {self.tracebacks} tracebacks)."
        ]

    def json(self) -> Any:
        return records.dump(self)


class Inputs:
    name = "inputs"

    def run(self, setup: Scratch) -> list[InputRow]:
        return run_cases(setup.root, setup.cache, QUICK if setup.quick else None)

    def load(self, data: Any) -> list[InputRow]:
        return records.load_all(InputRow, data)

    def summarize(self, record: list[InputRow]) -> InputSummary:
        return InputSummary(
            cases=len(record),
            ok=sum(1 for r in record if r.ok),
            expected_exit=sum(1 for r in record if r.exit_code == r.expected_exit),
            nothing_half_written=sum(1 for r in record if r.clean),
            tracebacks=sum(1 for r in record if r.traceback),
        )

    def markdown(self, record: list[InputRow]) -> list[str]:
        lines = [
            "## Bad input",
            "",
            "Each invocation runs the real CLI in a fresh home. *left* says what the home holds afterwards: input refused before a run starts "
            "leaves no run directory; input found bad inside a stage leaves one failed run holding only its audit files (state, events, log). "
            "Every case also checks that the catalog did not change and that no process was left.",
            "",
        ]
        header = ["bad input", "command", "exit", "stderr line", "left", "ok"]
        return lines + table(header, [_row(r) for r in record])


def _row(r: InputRow) -> list[Any]:
    env = " ".join(f"{k}={v}" for k, v in r.env.items())
    command = f"{env} {r.command}".strip()
    runs = [f"1 {n.status} run" + (f" + {n.extra_files}" if n.extra_files else "") for n in r.new_runs]
    left = ", ".join(runs) if runs else "nothing"
    exit_cell = (
        str(r.exit_code) if r.exit_code == r.expected_exit else f"**{r.exit_code}** (expected {r.expected_exit})"
    )
    return [r.case, code(command), exit_cell, code(r.error_line), left, yes(r.ok)]
