"""Shared catalog index attacks (benchmarks.scenarios.index_attacks): each refused in one line, and craft going on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks import records
from benchmarks.reliability.env import Scratch
from benchmarks.reliability.table import code, table, yes
from benchmarks.scenarios.index_attacks import QUICK, run_index_attacks


@dataclass
class AttackRow:
    """One attack on a shared catalog's index, judged from outside."""

    attack: str
    what: str
    exit_code: int
    error_line: str
    one_line: bool
    craft_exit: int
    craft_went_on: bool
    escapes_reached_terminal: bool
    traceback: bool
    refused: bool
    ok: bool


@dataclass
class AttackSummary:
    attacks: int
    refused: int
    craft_went_on: int
    ok: int

    def lines(self) -> list[str]:
        return [
            f"- **Shared catalog index attacks**: {self.refused} of {self.attacks} refused in one line (exit 61); "
            f"craft went on past {self.craft_went_on} of them."
        ]

    def json(self) -> Any:
        return records.dump(self)


class Catalogs:
    name = "catalogs"

    def run(self, setup: Scratch) -> list[AttackRow]:
        return self.load(run_index_attacks(setup.root / "catalogs", QUICK if setup.quick else None))

    def load(self, data: Any) -> list[AttackRow]:
        return records.load_all(AttackRow, data)

    def summarize(self, record: list[AttackRow]) -> AttackSummary:
        return AttackSummary(
            attacks=len(record),
            refused=sum(1 for r in record if r.refused),
            craft_went_on=sum(1 for r in record if r.craft_went_on),
            ok=sum(1 for r in record if r.ok),
        )

    def markdown(self, record: list[AttackRow]) -> list[str]:
        lines = [
            "## Shared catalog index attacks",
            "",
            "Each attack writes a file:// cache's `flakebot/index.json` as its owner could (`benchmarks/scenarios/index_attacks.py`), "
            "in a fresh home trusting one key for that cache. `flakebot list --remote` must refuse it in one line (exit 61), and "
            "`flakebot craft` of the need it claims must skip the catalog with a warning and go on; no terminal escape may reach the terminal.",
            "",
        ]
        header = ["attack", "what the cache owner wrote", "exit", "error line", "craft went on", "ok"]
        body = [[r.attack, r.what, r.exit_code, code(r.error_line), yes(r.craft_went_on), yes(r.ok)] for r in record]
        return lines + table(header, body)
