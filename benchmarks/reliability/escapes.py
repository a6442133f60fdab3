"""Sandbox escape attempts (benchmarks.scenarios.escape_cases) under bubblewrap, the same attempts in a plain process for
contrast, and hostile model sessions through the real pipeline (benchmarks.scenarios.hostile)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import records
from benchmarks.reliability.env import Scratch
from benchmarks.reliability.table import table
from benchmarks.scenarios.escape_cases import run_escape_cases
from benchmarks.scenarios.hostile import CASES as HOSTILE_CASES
from benchmarks.scenarios.hostile import run_hostile
from flakebot.sandbox import Sandbox, open_sandbox

SANDBOXES = {"bubblewrap": "required", "plain process": "off"}
HOSTILE = "hostile session (pipeline)"
QUICK = ["network", "write-outside", "symlink-out"]


def run_cases(root: Path, names: list[str] | None = None) -> list[dict[str, Any]]:
    """Every case (or those named) in each sandbox, then the hostile sessions (or those named); one row each."""
    rows = []
    for label, mode in SANDBOXES.items():
        results = run_escape_cases(_factory(mode), names)
        rows += [{**result, "sandbox": label, "mode": mode} for result in results]
    hostile = [c.name for c in HOSTILE_CASES if names is None or c.name in names]
    return rows + (run_hostile(root / "hostile", hostile) if hostile else [])


def _factory(mode: str) -> Callable[[Path, list[Path]], Sandbox]:
    def factory(workspace: Path, writable: list[Path]) -> Sandbox:
        # the edit loop's sandbox: flakebot's own trees, handed to the unprivileged uid (as root)
        return open_sandbox(mode, workspace=workspace, writable=writable, timeout=30, adopt=True)

    return factory


# ------------------------------------------------------------------ the report's section


@dataclass
class EscapeRow:
    """One attempt in one sandbox (or one hostile session through the pipeline), judged from outside."""

    case: str
    sandbox: str
    mode: str
    attempt: str
    expected: str
    contained: bool
    outcome: str
    returncode: int
    seconds: float
    timed_out: bool | None = None  # escape cases
    stderr_tail: str | None = None  # hostile sessions


@dataclass
class Contained:
    attempts: int
    contained: int


@dataclass
class EscapeSummary:
    by_sandbox: dict[str, Contained]

    def lines(self) -> list[str]:
        parts = [f"{v.contained} of {v.attempts} contained by {k}" for k, v in self.by_sandbox.items()]
        return [f"- **Sandbox escapes**: {'; '.join(parts)}."]

    def json(self) -> Any:
        return {label: records.dump(counts) for label, counts in self.by_sandbox.items()}


class Escapes:
    name = "escapes"

    def run(self, setup: Scratch) -> list[EscapeRow]:
        return self.load(run_cases(setup.root, QUICK if setup.quick else None))

    def load(self, data: Any) -> list[EscapeRow]:
        return records.load_all(EscapeRow, data)

    def summarize(self, record: list[EscapeRow]) -> EscapeSummary:
        by_sandbox = {}
        for label in dict.fromkeys(r.sandbox for r in record):
            mine = [r for r in record if r.sandbox == label]
            by_sandbox[label] = Contained(attempts=len(mine), contained=sum(1 for r in mine if r.contained))
        return EscapeSummary(by_sandbox)

    def markdown(self, record: list[EscapeRow]) -> list[str]:
        hostile = [r for r in record if r.sandbox == HOSTILE]
        rows = [r for r in record if r.sandbox != HOSTILE]
        lines = [
            "## Sandbox escapes",
            "",
            "Each attempt from `benchmarks/scenarios/escape_cases.py` runs as `bash -c SCRIPT` in the sandbox the edit loop uses "
            '(`open_sandbox("required")`: bubblewrap), and for contrast in a plain process (`open_sandbox("off")`). The outcome is judged from outside.',
            "",
        ]
        by_case: dict[str, dict[str, EscapeRow]] = {}
        for r in rows:
            by_case.setdefault(r.case, {})[r.sandbox] = r
        labels = list(dict.fromkeys(r.sandbox for r in rows))
        header = ["attempt", "expected"] + [f"{label}: contained" for label in labels]
        header += [f"{label}: outcome" for label in labels]
        body = []
        for results in by_case.values():
            first = next(iter(results.values()))
            contained = [_contained(results[label]) if label in results else "" for label in labels]
            outcomes = [results[label].outcome if label in results else "" for label in labels]
            body.append([first.attempt, first.expected, *contained, *outcomes])
        return lines + table(header, body) + (_hostile(hostile) if hostile else [])


def _hostile(rows: list[EscapeRow]) -> list[str]:
    lines = [
        "",
        "### Hostile model sessions",
        "",
        "Each is a scripted model session run through the real pipeline (`flakebot craft --model scripted:FILE`, "
        "`benchmarks/scenarios/hostile.py`): the model writes the tool and a build script (or a tool) that attacks the host, with a key "
        "in flakebot's environment since start. The outcome is judged from outside.",
        "",
    ]
    body = [[r.attempt, r.expected, _contained(r), r.outcome, f"{r.seconds:.0f} s"] for r in rows]
    return lines + table(["attempt", "expected", "contained", "outcome", "time"], body)


def _contained(row: EscapeRow) -> str:
    if row.contained:
        return "yes"
    return "**NO**" if row.mode == "required" else "no: escaped"
