"""Host file access in trees someone else wrote (benchmarks.scenarios.hostfile_cases): links, hard links, FIFOs and
swapped-in links planted by a dependency's build script, a cloned repository, the model's workspace or a shared
cache's owner, and a tool's caller granting it a configuration directory (grant_cases), each judged from outside (a
root-owned file and a directory beyond the tree unchanged, no hang)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks import records
from benchmarks.reliability.env import Scratch
from benchmarks.reliability.table import table, yes
from benchmarks.scenarios.hostfile_cases import QUICK, run_hostfile_cases


@dataclass
class HostFileRow:
    """One attack on one door, judged from outside."""

    case: str
    door: str
    attempt: str
    expected: str
    contained: bool
    outcome: str
    seconds: float


@dataclass
class HostFileSummary:
    attacks: int
    contained: int
    by_door: dict[str, list[int]]  # door -> [contained, attacks]

    def lines(self) -> list[str]:
        doors = "; ".join(f"{door} {n} of {total}" for door, (n, total) in self.by_door.items())
        return [
            f"- **Host file access in untrusted trees**: {self.contained} of {self.attacks} attacks contained ({doors})."
        ]

    def json(self) -> Any:
        return {"attacks": self.attacks, "contained": self.contained, "by_door": self.by_door}


class HostFiles:
    name = "hostfiles"

    def run(self, setup: Scratch) -> list[HostFileRow]:
        return self.load(run_hostfile_cases(setup.root / "hostfiles", QUICK if setup.quick else None))

    def load(self, data: Any) -> list[HostFileRow]:
        return records.load_all(HostFileRow, data)

    def summarize(self, record: list[HostFileRow]) -> HostFileSummary:
        by_door: dict[str, list[int]] = {}
        for row in record:
            counts = by_door.setdefault(row.door, [0, 0])
            counts[0] += int(row.contained)
            counts[1] += 1
        return HostFileSummary(len(record), sum(1 for r in record if r.contained), by_door)

    def markdown(self, record: list[HostFileRow]) -> list[str]:
        lines = [
            "## Host file access in untrusted trees",
            "",
            "Each attack (`benchmarks/scenarios/hostfile_cases.py`) plants a link, a hard link, a FIFO or a link swapped in "
            "while flakebot works, where a host step of flakebot expects a plain file or directory, then runs that step "
            "for real in a child process; the door `tool grants` (`benchmarks/scenarios/grant_cases.py`) has a caller "
            "grant a save-stdin tool a configuration directory (/etc/nix, /etc/cron.d, ~/.config/git, flakebot's own) "
            "or widen the grant roots itself, through the real `flakebot run` and `flakebot mcp`. Judged from outside: "
            "a root-owned 0600 file and a directory beyond the tree keep their bytes, nothing lands in the directory "
            "named, nothing of the host's is copied or linked into a tree the model's code reads (the edit loop's "
            "target dir, seeded from a deps derivation's store path), and flakebot does not hang.",
            "",
        ]
        body = [[r.door, r.attempt, r.expected, yes(r.contained), r.outcome, f"{r.seconds:.1f} s"] for r in record]
        return lines + table(["door", "attempt", "expected", "contained", "outcome", "time"], body)
