"""`make bench`: flakebot measured against the raw cargo and nix work it runs.

One module per section (startup.py, calls.py, ...: each a `run(**args)` returning its measurements, and RESULT, the
dataclass of that result), listed in SECTIONS. report.json holds run()'s dict; Bench.load types it (a missing or unknown
key fails there, not in a figure); figures.py turns a section's record into its figures (each figure names its
section), report.py writes bench/report.{json,md}, stages.png (chart.py) and the README's Performance section. May import flakebot and
benchmarks.scenarios; never tests/.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from benchmarks import records
from benchmarks.perf.figures import Failed, section_figures


@dataclass(frozen=True)
class Bench:
    """A perf section: the module benchmarks.perf.NAME, and the arguments of its run() in each profile."""

    name: str
    full: dict[str, Any] = field(default_factory=dict)
    """What `make bench` publishes."""
    quick: dict[str, Any] | None = None
    """`--quick` (no cargo, no nix, seconds): proves the report is generated, not how fast anything is; None: skipped."""

    @property
    def module(self) -> ModuleType:
        return importlib.import_module(f"benchmarks.perf.{self.name}")

    def run(self, setup: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.module.run(**setup)
        return result

    def load(self, data: Any) -> Any:
        """run()'s result (or report.json's) as the section's record, or Failed when the section raised."""
        if isinstance(data, dict) and set(data) == {"error"}:
            return Failed(data["error"])
        return records.load(self.module.RESULT, data)

    def summarize(self, record: Any, context: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The section's figures (benchmarks.perf.figures); `context` holds the load and cores that explain waits."""
        return section_figures(self.name, record, context)

    def markdown(self, record: dict[str, Any]) -> list[str]:
        """The section's method, as the report's table of benchmarks gives it: its module docstring's first paragraph."""
        doc = self.module.__doc__ or ""
        return [f"`benchmarks/perf/{self.name}.py`: " + " ".join(doc.strip().split("\n\n")[0].split())]


# The sections, in the order they run and are reported. "full" takes 4 to 5 minutes on 2 cores, plus the corpus
# (its builds take longest).
SECTIONS: tuple[Bench, ...] = (
    Bench("startup", {"repeat": 7}, quick={"repeat": 2}),
    Bench("calls", {"repeat": 7, "calls": 15}),
    Bench("search", {"crates": 20_000, "repeat": 5}, quick={"crates": 300, "repeat": 1}),
    Bench("diagnostics", {"edits": 5}),
    Bench("loop", {"samples": 7}),
    Bench("fork", {"samples": 3}),
    Bench("craft", {"crafts": 3, "hits": 5}),
    Bench("repeat"),  # four crafts of the csv-dedup session: P9, P9-improve
    Bench("compile_once"),  # a cold craft against one release build of the same crate: P14
    Bench("nix"),
    Bench("acquire"),
    Bench("corpus"),
    Bench("shared", {"samples": 3}),
    Bench("services", {"samples": 5, "requests": 50}),
    Bench("front", {"tokens": 50, "rounds": 4}),  # T1: 50 agents at once on one `flakebot serve`
    Bench("builders", {"builds": 6, "build_seconds": 3.0}),  # T2: six stand-in builds on two ssh-ng builders vs one
    Bench("workers", {"crafts": 6, "rounds": 2}),  # T3: six queued crafts, two workers vs one (PostgreSQL)
    Bench("failover", {"lease": 20.0}),  # T4: a worker killed -9 mid-craft, another finishing it (PostgreSQL)
    # P15, P16: 10,000 tools catalogued through Catalog.add (each its own nix-store GC root): minutes of its own
    Bench(
        "catalog", {"sizes": (1, 1000, 10_000), "repeat": 5}, quick={"sizes": (1, 10, 20), "repeat": 2, "nix": False}
    ),
)


def bench(name: str) -> Bench:
    return next(b for b in SECTIONS if b.name == name)
