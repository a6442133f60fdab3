"""Where flakebot's own processes start (benchmarks.scenarios.steering_cases): a planted flakebot/ package in the
working directory, sitecustomize.py on PYTHONPATH and PYTHONSTARTUP, against a long MCP call's job and a service's
supervisor, each judged from outside (no planted module ran, and the child did flakebot's work)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks import records
from benchmarks.reliability.env import Scratch
from benchmarks.reliability.table import table, yes
from benchmarks.scenarios.steering_cases import QUICK, run_steering_cases


@dataclass
class SteeringRow:
    """One attempt on one door, judged from outside."""

    case: str
    door: str
    attempt: str
    contained: bool
    outcome: str
    seconds: float


@dataclass
class SteeringSummary:
    attempts: int
    contained: int
    by_attempt: dict[str, list[int]]  # attempt -> [contained, attempts]

    def lines(self) -> list[str]:
        kinds = "; ".join(f"{kind} {n} of {total}" for kind, (n, total) in self.by_attempt.items())
        return [
            f"- **Processes steered by where they start**: {self.contained} of {self.attempts} attempts contained "
            f"({kinds})."
        ]

    def json(self) -> Any:
        return {"attempts": self.attempts, "contained": self.contained, "by_attempt": self.by_attempt}


class Steering:
    name = "steering"

    def run(self, setup: Scratch) -> list[SteeringRow]:
        return self.load(run_steering_cases(setup.root / "steering", QUICK if setup.quick else None))

    def load(self, data: Any) -> list[SteeringRow]:
        return records.load_all(SteeringRow, data)

    def summarize(self, record: list[SteeringRow]) -> SteeringSummary:
        by_attempt: dict[str, list[int]] = {}
        for row in record:
            counts = by_attempt.setdefault(row.attempt, [0, 0])
            counts[0] += int(row.contained)
            counts[1] += 1
        return SteeringSummary(len(record), sum(1 for r in record if r.contained), by_attempt)

    def markdown(self, record: list[SteeringRow]) -> list[str]:
        lines = [
            "## Processes steered by where they start",
            "",
            "Each attempt (`benchmarks/scenarios/steering_cases.py`) plants Python that marks a file when imported "
            "where a Python process would pick it up (a `flakebot/` package in the working directory, sitecustomize.py "
            "on PYTHONPATH, PYTHONSTARTUP), then has flakebot start a long MCP call's job or a service's supervisor "
            "there for real. Contained: nothing planted ran, and the child did flakebot's own work.",
            "",
        ]
        body = [[r.door, r.attempt, yes(r.contained), r.outcome, f"{r.seconds:.1f} s"] for r in record]
        return lines + table(["door", "attempt", "contained", "outcome", "time"], body)
