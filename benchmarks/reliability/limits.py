"""Limits on what a caller can pile up through `flakebot mcp` (benchmarks.scenarios.pileup): crafts from one session
and from several, a task whose pid now belongs to a kernel thread or another process, tasks/result on a task that
is still working, and tool outputs past the outputs/ quota. Each attack runs in its own flakebot home against the
default limits (the outputs case sets a 1 MiB quota, tasks/result a 3 s wait) and is judged from outside: job
processes counted in /proc, task status, seconds until an answer, files left in outputs/."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import records
from benchmarks.reliability.env import Home, Scratch
from benchmarks.reliability.table import table
from benchmarks.scenarios import pileup
from flakebot import config

MIB = 1024 * 1024


@dataclass
class LimitRow:
    """One attack, what bounds it, and what was seen."""

    case: str
    attack: str
    expected: str
    bounded: bool
    outcome: str
    seconds: float


def _sessions(home: Home) -> tuple[bool, str]:
    seen = pileup.crafts_from_sessions(home.env(), home.workdir, home.root, [12, 2, 1])
    refused = [answer for session in seen.answers for answer, error in session if error]
    bounded = seen.processes == [2, 4, 4] and seen.journals == 4 and len(refused) == 12
    bounded = bounded and all(a.get("type") == "JobLimit" and "\n" not in a["error"] for a in refused)
    return bounded, f"job processes after each session: {seen.processes}; {len(refused)} calls refused in one line"


def _reused_pid(home: Home) -> tuple[bool, str]:
    seen = pileup.reused_pids(home.env(), home.workdir)
    tasks = {name: seen[name].status for name in ("kernel", "impostor")}
    bounded = set(tasks.values()) == {"failed"} and set(seen["runs"].values()) == {"interrupted"}
    shown = [f"task by {k}: {v}" for k, v in tasks.items()] + [f"run by {k}: {v}" for k, v in seen["runs"].items()]
    return bounded, ", ".join(shown)


def _result_wait(home: Home) -> tuple[bool, str]:
    seen = pileup.result_of_working_task(home.env({"FLAKEBOT_TASK_RESULT_WAIT": "3"}), home.workdir, home.root, 90)
    if seen.answer is None:
        return False, f"no answer in {seen.seconds:g} s"
    message = seen.answer.get("error", {}).get("message", "an answer that is no error")
    return seen.seconds < 15 and seen.status_after == "working", f"after {seen.seconds:g} s: {message[:90]}"


def _outputs(home: Home) -> tuple[bool, str]:
    env = home.env({"FLAKEBOT_TOOL_OUTPUT_LIMIT": "10000", "FLAKEBOT_OUTPUTS_MB": "1"})
    settings = config.Settings(catalog_dir=str(home.catalog_dir), workdir=str(home.workdir))
    pileup.catalogue_lines(settings, home.root)
    caller = home.root / "caller"  # beside the tool's directory: the tool runs in an empty one at this path
    caller.mkdir(exist_ok=True)
    seen = pileup.spill_calls(env, cwd=caller)
    biggest = max([home.workdir.joinpath("outputs", name).stat().st_size for name in seen.left] or [0])
    bounded = seen.kept == [False, False, True, True, True] and seen.held <= MIB and biggest <= MIB
    return bounded, f"kept after 5 calls: {seen.kept}; {seen.held} bytes held; largest file {biggest} bytes"


# (case, attack, what bounds it, the attack)
CASES: list[tuple[str, str, str, Callable[[Home], tuple[bool, str]]]] = [
    ("jobs", "12 detached crafts from one MCP session, then 2 and 1 from two more sessions",
     "2 job processes per session, 4 on the machine; the rest refused in one line, no file written", _sessions),
    ("reused pid", "task records and runs whose pid is kthreadd's (2), or another live process's",
     "the tasks read failed, the runs interrupted; never working or running", _reused_pid),
    ("result wait", "tasks/result on a craft task that stays working for minutes",
     "an answer after task_result_wait (3 s here) with the status; the task goes on", _result_wait),
    ("outputs", "5 spilled stdouts of 288 KB, then one of 6.9 MB, under a 1 MiB outputs_mb",
     "oldest files removed first; no file past the per-call cap", _outputs),
]  # fmt: skip
QUICK = ("reused pid", "outputs")


def run_cases(root: Path, cache: Path, names: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    rows = []
    for case, attack, expected, attempt in CASES:
        if names is not None and case not in names:
            continue
        home = Home(root / f"limits-{case.replace(' ', '-')}", cache)
        began = time.monotonic()
        try:
            bounded, outcome = attempt(home)
        except Exception as exc:  # noqa: BLE001 - an attack that broke is a row saying so, not a lost report
            bounded, outcome = False, f"the attack failed: {type(exc).__name__}: {exc}"[:200]
        home.strays()
        rows.append(
            {"case": case, "attack": attack, "expected": expected, "bounded": bounded, "outcome": outcome,
             "seconds": round(time.monotonic() - began, 1)}
        )  # fmt: skip
    return rows


@dataclass
class LimitSummary:
    attacks: int
    bounded: int

    def lines(self) -> list[str]:
        return [f"- **Limits**: {self.bounded} of {self.attacks} pile-up attacks over MCP bounded."]

    def json(self) -> Any:
        return records.dump(self)


class Limits:
    name = "limits"

    def run(self, setup: Scratch) -> list[LimitRow]:
        return self.load(run_cases(setup.root, setup.cache, QUICK if setup.quick else None))

    def load(self, data: Any) -> list[LimitRow]:
        return records.load_all(LimitRow, data)

    def summarize(self, record: list[LimitRow]) -> LimitSummary:
        return LimitSummary(attacks=len(record), bounded=sum(1 for r in record if r.bounded))

    def markdown(self, record: list[LimitRow]) -> list[str]:
        lines = [
            "## Limits",
            "",
            "Each attack (`benchmarks/scenarios/pileup.py`) drives the real `flakebot mcp` over stdio with the MCP Python "
            "SDK's client (a task over raw JSON-RPC) in a home of its own, against the default limits (docs/limits.md), "
            "judged from outside: job processes counted in /proc, task status, seconds to an answer, files in outputs/.",
            "",
        ]
        body = [
            [r.attack, r.expected, "yes" if r.bounded else "**NO**", r.outcome, f"{r.seconds:.0f} s"] for r in record
        ]
        return lines + table(["attack", "expected", "bounded", "outcome", "time"], body)
