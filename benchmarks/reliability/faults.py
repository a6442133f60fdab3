"""Model-server faults during a real offline craft: which ones a craft survives, who retried, and what it cost.

Each case crafts "need a CSV deduper" from the hand-written session, served by flakebot's stub server
(in this process, on 127.0.0.1) to the real groq SDK in the craft's process (GROQ_BASE_URL points at
the stub), with fault turns inserted before one turn of one stage. A fault answers one request; the
retry is answered by the next turn (docs/scripts.md). The stub's request log says how many HTTP
requests came and when; the run's transcript says how many calls flakebot made and why it retried:
more HTTP requests than transcript requests means the SDK retried on its own.

Faults that cannot be survived (more than the retries allow) must end the craft with one error line
and exit code; then the provider "recovers" (a new stub without the faults) and `flakebot resume` must
finish the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import records
from benchmarks.reliability.env import OFFLINE, Home, Scratch, session, write_json
from benchmarks.reliability.table import code, table, yes
from flakebot.llm.chat import MAX_FORMAT_ERRORS
from flakebot.llm.script import load_script
from flakebot.llm.stub_server import StubServer

STAGES = ("spec", "choose", "edit")
MODEL = "groq:hand-written-csv-dedup"
FAKE_KEY = "gsk_reliability_stub_not_a_real_key"
RETRIES = 2  # the default model_retries; set explicitly so the cases do not depend on a user's config
NEED = "need a CSV deduper"


@dataclass
class FaultCase:
    """Fault turns inserted in a row before turn `before` of `stage`."""

    name: str
    faults: list[dict[str, Any]]
    stage: str = "edit"
    before: int = 0
    settings: dict[str, str] = field(default_factory=dict)  # FLAKEBOT_* for this case
    survivable: bool = True

    @property
    def kind(self) -> str:
        return self.faults[0]["kind"] if self.faults else "none"

    def describe(self) -> str:
        if not self.faults:
            return "no fault (baseline)"
        count = f"{len(self.faults)} x " if len(self.faults) > 1 else ""
        extra = {k: v for k, v in self.faults[0].items() if k != "kind"}
        detail = f" ({', '.join(f'{k}={v}' for k, v in extra.items())})" if extra else ""
        return f"{count}{self.kind}{detail} before {self.stage} turn {self.before}"


CASES = [
    FaultCase("baseline", []),
    FaultCase("429", [{"kind": "429", "retry_after": 1}]),
    FaultCase("429-in-spec", [{"kind": "429", "retry_after": 1}], stage="spec"),
    FaultCase("500", [{"kind": "500"}]),
    FaultCase("tool_use_failed", [{"kind": "tool_use_failed"}]),
    FaultCase("reset", [{"kind": "reset"}]),
    FaultCase("malformed_json", [{"kind": "malformed_json"}]),
    FaultCase("slow", [{"kind": "slow", "seconds": 6}], settings={"FLAKEBOT_MODEL_TIMEOUT": "2"}),
    FaultCase("context_overflow", [{"kind": "context_overflow"}], before=1),
    FaultCase("500-beyond-retries", [{"kind": "500"}] * (RETRIES + 1), survivable=False),
    FaultCase("tool_use_failed-in-a-row", [{"kind": "tool_use_failed"}] * MAX_FORMAT_ERRORS, survivable=False),
]


@dataclass
class Resume:
    """`flakebot resume` of a run a fault beyond the retries ended, once the server is healthy."""

    failed_stage: str
    served_stages: list[str]
    exit_code: int
    status: str
    error_line: str
    attempts: dict[str, int | None]
    seconds: float
    in_catalog: bool


@dataclass
class FaultRow:
    """One fault case: how the craft ended, who retried, and what the fault cost."""

    case: str
    kind: str
    fault: str
    survivable: bool
    exit_code: int
    survived: bool
    craft_s: float
    error_line: str
    traceback: bool
    run_id: str
    http_requests: int
    flakebot_calls: int
    sdk_retries: int
    flakebot_retries: list[str]
    how: str
    strays: list[Any]
    ok: bool
    run_status: str | None = None
    stage_seconds: dict[str, float | None] | None = None
    faults_answered: int | None = None
    recovery_s: float | None = None
    resume: Resume | None = None


def script_turns(
    case: FaultCase, stages: tuple[str, ...] = STAGES, with_faults: bool = True
) -> tuple[list[dict[str, Any]], list[int]]:
    """The session's turns for `stages` in order, with the case's fault turns inserted; and the faults' indices."""
    recorded = session()["stages"]
    turns: list[dict[str, Any]] = []
    indices: list[int] = []
    for stage in stages:
        for i, turn in enumerate(recorded[stage]):
            if with_faults and stage == case.stage and i == case.before:
                indices += range(len(turns), len(turns) + len(case.faults))
                turns += [{"fault": fault, "note": f"reliability: {case.name}"} for fault in case.faults]
            turns.append(turn)
    return turns, indices


def serve(home: Home, turns: list[dict[str, Any]], name: str) -> StubServer:
    """A stub server for `turns` (validated as a script file would be)."""
    path = write_json(
        home.root / f"{name}.json", {"format": 1, "sdk": "groq", "model": "hand-written-csv-dedup", "turns": turns}
    )
    return StubServer(load_script(path)).start()


def model_env(case: FaultCase, server: StubServer) -> dict[str, str]:
    return {
        "GROQ_API_KEY": FAKE_KEY,
        "GROQ_BASE_URL": server.url,
        "FLAKEBOT_MODEL_RETRIES": str(RETRIES),
        **case.settings,
    }


def run_case(case: FaultCase, home: Home) -> FaultRow:
    """Craft with the case's faults; for an unsurvivable one, resume once the faults are gone."""
    turns, fault_turns = script_turns(case)
    server = serve(home, turns, "script")
    try:
        crafted = home.cli("craft", NEED, "--model", MODEL, *OFFLINE, "--json", env=model_env(case, server))
    finally:
        server.close()
    run_id = (home.run_ids() or [""])[-1]
    state = home.state(run_id) if run_id else None
    retries = retry_figures(home, run_id, server, fault_turns)
    row = FaultRow(
        case=case.name,
        kind=case.kind,
        fault=case.describe(),
        survivable=case.survivable,
        exit_code=crafted.returncode,
        survived=crafted.returncode == 0 and crafted.result().get("status") == "crafted",
        craft_s=crafted.seconds,
        error_line="" if crafted.returncode == 0 else crafted.error_line,
        traceback=crafted.traceback,
        run_id=run_id,
        http_requests=retries.http_requests,
        flakebot_calls=retries.flakebot_calls,
        sdk_retries=retries.sdk_retries,
        flakebot_retries=retries.flakebot_retries,
        faults_answered=retries.faults_answered,
        recovery_s=retries.recovery_s,
        how=retries.how(bool(fault_turns)),
        run_status=state["status"] if state else None,
        stage_seconds={name: s.get("seconds") for name, s in state["stages"].items()} if state else None,
        resume=resume_without_faults(case, home, run_id) if not case.survivable and run_id else None,
        strays=home.strays(),
        ok=False,
    )
    row.ok = _ok(case, row)
    return row


@dataclass
class Retries:
    """Who retried and how long the fault cost, from the stub's request log and the run's transcript."""

    http_requests: int
    flakebot_calls: int
    flakebot_retries: list[str]
    faults_answered: int | None = None
    recovery_s: float | None = None

    @property
    def sdk_retries(self) -> int:
        return self.http_requests - self.flakebot_calls

    def how(self, faulted: bool) -> str:
        parts = []
        if self.sdk_retries > 0:
            parts.append(f"the SDK retried {self.sdk_retries} time(s)")
        if self.flakebot_retries:
            counts = {r: self.flakebot_retries.count(r) for r in dict.fromkeys(self.flakebot_retries)}
            parts.append("flakebot retried: " + ", ".join(f"{r} x{n}" for r, n in counts.items()))
        if not parts:
            return "no retry was needed" if not faulted else "no retry"
        return "; ".join(parts)


def retry_figures(home: Home, run_id: str, server: StubServer, fault_turns: list[int]) -> Retries:
    transcript = home.transcript(run_id) if run_id else []
    answered = [(r["turn"], r["time"]) for r in server.requests]
    retries = Retries(
        http_requests=len(answered),
        flakebot_calls=sum(1 for t in transcript if t["kind"] == "model_request"),
        flakebot_retries=[str(t.get("reason")) for t in transcript if t["kind"] == "model_retry"],
    )
    if fault_turns:
        first = next((t for turn, t in answered if turn == fault_turns[0]), None)
        after = next((t for turn, t in answered if turn == fault_turns[-1] + 1), None)
        retries.faults_answered = sum(1 for turn, _ in answered if turn in fault_turns)
        retries.recovery_s = round(after - first, 3) if first is not None and after is not None else None
    return retries


def resume_without_faults(case: FaultCase, home: Home, run_id: str) -> Resume:
    """The provider is healthy again: a stub with the session's turns from the failed stage on, then `flakebot resume`."""
    failed = next((name for name, s in home.state(run_id)["stages"].items() if s.get("status") == "failed"), "")
    stages = STAGES[STAGES.index(failed) :] if failed in STAGES else STAGES
    turns, _ = script_turns(case, stages, with_faults=False)
    server = serve(home, turns, "recovered")
    started = time.monotonic()
    try:
        resumed = home.cli("resume", run_id, "--json", env=model_env(case, server))
    finally:
        server.close()
    state = home.state(run_id)
    return Resume(
        failed_stage=failed,
        served_stages=list(stages),
        exit_code=resumed.returncode,
        status=state["status"],
        error_line="" if resumed.returncode == 0 else resumed.error_line,
        attempts={name: s.get("attempts") for name, s in state["stages"].items()},
        seconds=round(time.monotonic() - started, 3),
        in_catalog=run_id in {e.get("run_id") for e in home.catalog().values()},
    )


def _ok(case: FaultCase, row: FaultRow) -> bool:
    if row.strays or row.traceback:
        return False
    if case.survivable:
        return row.survived and (not case.faults or row.faults_answered == len(case.faults))
    clean_failure = row.exit_code != 0 and row.error_line.startswith("error:") and row.run_status == "failed"
    return clean_failure and row.resume is not None and row.resume.status == "succeeded"


def run_cases(root: Path, cache: Path, names: list[str] | None = None) -> list[FaultRow]:
    """Every fault case (or those named), each in its own home under `root`."""
    return [
        run_case(case, Home(root / f"fault-{case.name}", cache))
        for case in CASES
        if names is None or case.name in names
    ]


# ------------------------------------------------------------------ the report's section

QUICK = ["429"]


@dataclass
class FaultSummary:
    survivable_kinds: int
    survived: int
    survivable_cases: int
    fatal_cases: int
    fatal_failed_cleanly_and_resumed: int
    baseline_craft_s: float | None
    all_ok: bool

    def lines(self) -> list[str]:
        text = f"- **Model-server faults**: {self.survived} of {self.survivable_cases} survivable fault cases "
        text += f"({self.survivable_kinds} kinds) ended in a crafted tool"
        if self.fatal_cases:
            text += (
                f"; {self.fatal_failed_cleanly_and_resumed} of {self.fatal_cases} faults beyond the retries failed with one error line"
                " and then resumed to success once the server was healthy"
            )
        if self.baseline_craft_s is not None:
            text += f" (a craft without faults: {self.baseline_craft_s:.1f} s)"
        return [text + "."]

    def json(self) -> Any:
        return records.dump(self)


class Faults:
    name = "faults"

    def run(self, setup: Scratch) -> list[FaultRow]:
        return run_cases(setup.root, setup.cache, QUICK if setup.quick else None)

    def load(self, data: Any) -> list[FaultRow]:
        return records.load_all(FaultRow, data)

    def summarize(self, record: list[FaultRow]) -> FaultSummary:
        survivable = [r for r in record if r.survivable and r.kind != "none"]
        fatal = [r for r in record if not r.survivable]
        return FaultSummary(
            survivable_kinds=len({r.kind for r in survivable}),
            survived=sum(1 for r in survivable if r.survived),
            survivable_cases=len(survivable),
            fatal_cases=len(fatal),
            fatal_failed_cleanly_and_resumed=sum(1 for r in fatal if r.ok),
            baseline_craft_s=next((r.craft_s for r in record if r.kind == "none"), None),
            all_ok=all(r.ok for r in record),
        )

    def markdown(self, record: list[FaultRow]) -> list[str]:
        lines = [
            "## Model-server faults",
            "",
            'A real offline craft of "need a CSV deduper" from the hand-written session, served by flakebot\'s stub server to the real groq SDK '
            "(`GROQ_BASE_URL`), with fault turns inserted before one turn of a stage. *HTTP* counts the requests the server answered, *calls* the "
            "model calls in the run's transcript: the difference is retries the SDK made on its own. *recovery* is the time from the first fault "
            "to the request that the next turn answered.",
            "",
        ]
        header = ["case", "fault", "survived", "outcome", "how", "HTTP", "calls", "recovery", "craft", "ok"]
        lines += table(header, [_row(r) for r in record])
        fatal = [r for r in record if not r.survivable]
        if fatal:
            lines += [
                "Faults beyond what retries can absorb, then `flakebot resume` once the server is healthy again (a new stub without the faults):",
                "",
            ]
            header = ["case", "craft", "error line", "resume", "stages run again", "resume time"]
            lines += table(header, [_fatal_row(r) for r in fatal])
        return lines


def _row(r: FaultRow) -> list[Any]:
    recovery = "" if r.recovery_s is None else f"{r.recovery_s:.2f} s"
    outcome = "crafted" if r.survived else f"exit {r.exit_code}"
    survived = yes(r.survived) if r.survivable else "no (expected)"
    return [
        r.case,
        r.fault,
        survived,
        outcome,
        r.how,
        r.http_requests,
        r.flakebot_calls,
        recovery,
        f"{r.craft_s:.1f} s",
        yes(r.ok),
    ]


def _fatal_row(r: FaultRow) -> list[Any]:
    if r.resume is None:
        return [r.case, f"exit {r.exit_code}", code(r.error_line), "not resumed", "", f"{0:.1f} s"]
    reran = ", ".join(k for k, v in r.resume.attempts.items() if (v or 0) > 1 and k != "clean")
    status, seconds = r.resume.status, r.resume.seconds
    return [r.case, f"exit {r.exit_code}", code(r.error_line), status, reran, f"{seconds:.1f} s"]
