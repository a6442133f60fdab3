"""Crash points: SIGKILL a real craft's whole process group inside each stage, then `flakebot resume` it.

The kill is timed from the run's events.jsonl: the stage's stage_started event (or a progress message
inside it), plus a delay. Stages that finish in milliseconds get the kill at once; the model stages get a
slow reply (a `slow` fault on their first turn) so the kill lands while the model call is in flight.
Where the kill really landed is read back, not assumed: the stage's status in state.json, its last
progress message, and the processes that were running under the craft at that moment.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import records
from benchmarks.perf.craft import salt_script
from benchmarks.reliability.env import OFFLINE, Home, Scratch, descendants, session, survivors, wait_for, write_json
from benchmarks.reliability.table import table, yes
from flakebot.pipeline.run import Run

STAGES = ("spec", "search", "choose", "acquire", "edit", "package", "instruct")
NEED = "need a CSV deduper"


@dataclass
class CrashPoint:
    """Kill `delay` seconds after the stage starts (or after its progress message starting with `message`)."""

    stage: str
    message: str | None = None
    delay: float = 0.0
    slow: float | None = None  # a slow fault of this many seconds on the stage's first model turn
    fresh_name: bool = False  # a tool name never built before, so nix really builds (no cached store path)
    fresh_deps: bool = False  # a dependency set never built before, so the loop's deps derivation really builds

    def trigger(self) -> str:
        start = f"progress '{self.message}...'" if self.message else "stage_started"
        return f"{start} + {self.delay:g} s" + (f" (model reply slowed to {self.slow:g} s)" if self.slow else "")


POINTS = [
    CrashPoint("spec", delay=1.0, slow=4),
    CrashPoint("search"),
    CrashPoint("choose", delay=1.0, slow=4),
    CrashPoint("acquire", message="starting new crate"),
    CrashPoint("edit", message="building the dependencies once", delay=1.5, fresh_deps=True),
    CrashPoint("package", message="nix build", delay=0.5, fresh_name=True),
    CrashPoint("instruct"),
]


def script_for(point: CrashPoint, home: Home) -> Path:
    """The hand-written session, with the point's slow fault and tool name."""
    script = session()
    if point.slow and point.stage in script["stages"]:
        first = script["stages"][point.stage][0]
        first["fault"] = {"kind": "slow", "seconds": point.slow}
    if point.fresh_name:
        arguments = script["stages"]["spec"][0]["tool_calls"][0]["arguments"]
        arguments["name"] = f"csv-dedup-{secrets.token_hex(3)}"
    if point.fresh_deps:  # a new dependency set, nothing else changed
        salt_script(script, secrets.token_hex(6))
    return write_json(home.root / "script.json", script)


@dataclass
class CrashResume:
    """`flakebot resume` after the kill."""

    exit_code: int
    status: str
    error_line: str
    seconds: float
    finished_before: list[str]
    reran: list[str]
    attempts: dict[str, int | None]
    verified: bool
    in_catalog: bool


@dataclass
class CrashRow:
    """One crash point: where SIGKILL landed, what was running, and how the resume went."""

    stage: str
    trigger: str
    triggered: bool
    killed_after_s: float
    run_id: str
    status_after_kill: str
    stage_status_after_kill: str
    landed_inside: bool
    landed_in: str
    last_progress: str
    running_at_kill: list[str]
    strays_after_kill: list[Any]
    resume: CrashResume
    strays_after_resume: list[Any]
    ok: bool


def run_point(point: CrashPoint, home: Home) -> CrashRow:
    script = script_for(point, home)
    argv = ("craft", NEED, "--model", f"scripted:{script}", *OFFLINE, "--json")
    started = time.monotonic()
    proc = home.popen(*argv)
    try:
        fired = wait_for(lambda: _triggered(home, point), timeout=300)
        time.sleep(point.delay)
        os.killpg(proc.pid, signal.SIGSTOP)  # frozen at the trigger while we look at what was running
        killed_at = time.monotonic() - started
        running = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    run_id = (home.run_ids() or [""])[-1]
    landing = _landing(home, run_id, point, list(running.values()))
    # Anything that outlived the kill: processes that were running under the craft, and any other process of this home.
    strays_after_kill = survivors(running) + home.strays()
    resume = _resume(home, run_id)
    row = CrashRow(
        stage=point.stage,
        trigger=point.trigger(),
        triggered=bool(fired),
        killed_after_s=round(killed_at, 3),
        run_id=landing.run_id,
        status_after_kill=landing.status_after_kill,
        stage_status_after_kill=landing.stage_status_after_kill,
        landed_inside=landing.landed_inside,
        landed_in=landing.landed_in,
        last_progress=landing.last_progress,
        running_at_kill=landing.running_at_kill,
        strays_after_kill=strays_after_kill,
        resume=resume,
        strays_after_resume=home.strays(),
        ok=False,
    )
    row.ok = (
        row.triggered
        and row.landed_inside
        and resume.status == "succeeded"
        and not row.strays_after_kill
        and not row.strays_after_resume
    )
    return row


def _triggered(home: Home, point: CrashPoint) -> bool:
    run_ids = home.run_ids()
    if not run_ids:
        return False
    for event in home.events(run_ids[-1]):
        if event.get("stage") != point.stage:
            continue
        if point.message is None and event["event"] == "stage_started":
            return True
        if point.message and event["event"] == "progress" and str(event.get("message", "")).startswith(point.message):
            return True
    return False


@dataclass
class Landing:
    """Where the kill landed, as the run's own record says."""

    run_id: str
    status_after_kill: str
    stage_status_after_kill: str
    landed_inside: bool
    landed_in: str
    last_progress: str
    running_at_kill: list[str]


def _landing(home: Home, run_id: str, point: CrashPoint, running: list[str]) -> Landing:
    run = Run.load(home.workdir, run_id)
    stages = run.state["stages"]
    inside = [name for name, record in stages.items() if record.get("status") == "running"]
    progress = [e["message"] for e in home.events(run_id) if e["event"] == "progress" and e.get("stage") == point.stage]
    return Landing(
        run_id=run_id,
        status_after_kill=run.status,
        stage_status_after_kill=run.stage_status(point.stage),
        landed_inside=inside == [point.stage],
        landed_in=inside[0] if inside else "between stages",
        last_progress=progress[-1] if progress else "",
        running_at_kill=_programs(running),
    )


def _programs(commands: list[str]) -> list[str]:
    """Short names of what was running (the program and its subcommand), in order, without repeats."""
    names = []
    for command in commands:
        words = command.split()
        if not words:
            continue
        name = os.path.basename(words[0])
        if name.startswith("python"):
            continue  # flakebot itself
        plain = (w for w in words[1:] if not w.startswith("-") and "/" not in w and "=" not in w and len(w) < 24)
        # nix's feature flag values are not its subcommand
        sub = next((w for w in plain if w not in ("nix-command", "flakes")), "")
        label = f"{name} {sub}".strip()
        if label not in names:
            names.append(label)
    return names[:8]


def _resume(home: Home, run_id: str) -> CrashResume:
    before = Run.load(home.workdir, run_id).state["stages"]
    finished_before = [name for name, record in before.items() if record.get("status") == "finished"]
    resumed = home.cli("resume", run_id, "--json")
    state = home.state(run_id)
    attempts = {name: record.get("attempts") for name, record in state["stages"].items()}
    manifest = state["outputs"].get("instruct", {}).get("manifest", {})
    return CrashResume(
        exit_code=resumed.returncode,
        status=state["status"],
        error_line="" if resumed.returncode == 0 else resumed.error_line,
        seconds=resumed.seconds,
        finished_before=finished_before,
        reran=[name for name in STAGES if (attempts.get(name) or 0) > 1],
        attempts=attempts,
        verified=bool(manifest.get("verification_command", {}).get("passed")),
        in_catalog=run_id in {e.get("run_id") for e in home.catalog().values()},
    )


def run_cases(root: Path, cache: Path, stages: list[str] | None = None) -> list[CrashRow]:
    return [
        run_point(point, Home(root / f"crash-{point.stage}", cache))
        for point in POINTS
        if stages is None or point.stage in stages
    ]


# ------------------------------------------------------------------ the report's section

QUICK = ["choose"]


@dataclass
class CrashSummary:
    points: int
    landed_inside: int
    resumed: int
    only_killed_stage_reran: int
    strays: int

    def lines(self) -> list[str]:
        return [
            f"- **Crash points**: SIGKILL landed inside the target stage {self.landed_inside} of {self.points} times; `flakebot resume` "
            f"succeeded {self.resumed} of {self.points} times, re-running only the killed stage {self.only_killed_stage_reran} times; "
            f"{self.strays} processes outlived a kill or a resume."
        ]

    def json(self) -> Any:
        return records.dump(self)


class Crashes:
    name = "crashes"

    def run(self, setup: Scratch) -> list[CrashRow]:
        return run_cases(setup.root, setup.cache, QUICK if setup.quick else None)

    def load(self, data: Any) -> list[CrashRow]:
        return records.load_all(CrashRow, data)

    def summarize(self, record: list[CrashRow]) -> CrashSummary:
        return CrashSummary(
            points=len(record),
            landed_inside=sum(1 for r in record if r.landed_inside),
            resumed=sum(1 for r in record if r.resume.status == "succeeded"),
            only_killed_stage_reran=sum(1 for r in record if r.resume.reran == [r.stage]),
            strays=sum(len(r.strays_after_kill) + len(r.strays_after_resume) for r in record),
        )

    def markdown(self, record: list[CrashRow]) -> list[str]:
        lines = [
            "## Crash points",
            "",
            '`craft "need a CSV deduper"` (hand-written session, offline) is started in its own process group and the whole group gets SIGKILL at the '
            "trigger; then `flakebot resume RUN`. *landed in* is the stage state.json shows running after the kill; *running* lists the programs "
            "that were running under the craft at that moment; *left behind* counts processes alive 3 s after the kill or after the resume.",
            "",
        ]
        header = ["stage", "trigger", "killed at", "landed in", "running", "last progress", "resume", "re-ran"]
        header += ["resume time", "nix run verified", "left behind", "ok"]
        return lines + table(header, [_row(r) for r in record])


def _row(r: CrashRow) -> list[Any]:
    resume = r.resume
    outcome = resume.status if resume.exit_code == 0 else f"exit {resume.exit_code}: {resume.error_line}"
    return [
        r.stage,
        r.trigger,
        f"{r.killed_after_s:.1f} s",
        r.landed_in,
        ", ".join(r.running_at_kill) or "(flakebot alone)",
        r.last_progress,
        outcome,
        ", ".join(resume.reran),
        f"{resume.seconds:.1f} s",
        yes(resume.verified),
        len(r.strays_after_kill) + len(r.strays_after_resume),
        yes(r.ok),
    ]
