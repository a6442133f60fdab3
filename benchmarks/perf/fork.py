"""P2-fork: a fork-mode edit-loop iteration against a full `cargo test` of the same crate after the same edit.

A crate from Debian's registry (csv: one integration test and many doc tests; flate2: five integration test
files and doc tests) is copied into a git workspace, given a binary (src/bin/p2-echo.rs) and flakebot's frozen
acceptance test for it, and tested once in full (the baseline, warm target dir). Then, per sample, in the
bubblewrap sandbox:
  iteration  a one-line edit to the library (src/lib.rs), then flakebot's fork-mode verdict (`ForkVerdict`) for a
             step whose acceptance test still fails: the acceptance test binary only, as most iterations of a craft
  full       the same kind of edit, then the full `cargo test` (doc tests included): what every iteration would cost
             if it ran the whole suite
Ratio (goal <= 0.05): per sample iteration seconds / full seconds; the median over the samples.

`sandbox` is "off" by default: as root here, bubblewrap's unprivileged uid cannot link proc-macro crates (rust-lld:
"cannot find version script .../deps/rustcXXXX/list"), and csv's tests need serde_derive. No model-written code
runs in this benchmark (Debian's sources and a fixed two-line binary), and both sides run the same way.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import git

from flakebot.agent.acceptance import write_acceptance_test
from flakebot.agent.verdict import ForkVerdict
from flakebot.cargo.diagnostics import run_cargo
from flakebot.cargo.runner import Cargo
from flakebot.config import Settings
from flakebot.sandbox import open_sandbox
from flakebot.source.tree import copy_crate
from flakebot.stages.edit import example_runner
from flakebot.toolspec import Example, ToolSpec

GOAL_RATIO = 0.05
REGISTRY = Path("/usr/share/cargo/registry")
CRATES = ("csv-1.1.6", "flate2-1.0.25")
SPEC = ToolSpec(
    name="p2-echo",
    summary="prints its arguments",
    usage="p2-echo [WORDS]...",
    examples=[
        Example(args=["a"], stdout="a\n"),
        Example(args=["a", "b"], stdout="a b\n"),
        Example(args=[], stdout="\n"),
    ],
)
RED_BIN = 'fn main() {\n    println!("not yet");\n}\n'


def run(crates: tuple[str, ...] = CRATES, samples: int = 3, sandbox: str = "off") -> dict[str, Any]:
    cases, skipped = {}, {}
    for name in crates:
        try:
            cases[name] = measure_crate(name, samples, sandbox)
        except NoBaseline as exc:
            skipped[name] = str(exc)
    if not cases:
        raise NoBaseline("; ".join(skipped.values()))
    ratios = [c["ratio"] for c in cases.values()]
    return {"goal_ratio": GOAL_RATIO, "ratio": max(ratios), "cases": cases, "skipped": skipped}


class NoBaseline(RuntimeError):
    """A crate whose full `cargo test` ran no test: there is nothing to divide by."""


def measure_crate(name: str, samples: int, sandbox_mode: str = "off") -> dict[str, Any]:
    # Not under /tmp: the sandbox gives commands a private /tmp, where rustc's linker files would not be shared.
    scratch = Path("scratch").resolve()
    scratch.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-p2fork-", dir=scratch) as tmp:
        crate, target = Path(tmp) / "crate", Path(tmp) / "target"
        crate.mkdir()
        copy_crate(REGISTRY / name, crate)
        (crate / "src/bin").mkdir(parents=True, exist_ok=True)
        (crate / "src/bin/p2-echo.rs").write_text(RED_BIN)
        write_acceptance_test(SPEC, crate)
        with git.Repo.init(crate) as repo:  # closed: its cat-file processes would outlive the run
            repo.git.add("-A")
            repo.index.commit("baseline")
        cargo = Cargo.for_run(Settings(offline=True, registry="local"), target)
        sandbox = open_sandbox(sandbox_mode, workspace=crate, writable=[crate, target], timeout=1800)

        def cargo_test(extra: list[str]) -> Any:
            return run_cargo(sandbox, cargo, "test", cwd=crate, extra=extra, timeout=1800)

        runner = example_runner(
            Settings(sandbox=sandbox_mode), target
        )  # as the edit stage runs examples on a green build
        verdict = ForkVerdict(cargo_test, SPEC, crate, lambda: ["src/lib.rs"], runner)
        baseline = verdict.full()
        if not baseline.data.get("passed"):
            # flate2's optional libz-sys must be in the directory registry for cargo to resolve it at all; the
            # corpus `make bench` installs brings it, the test set-up alone does not
            raise NoBaseline(
                f"{name}: its full cargo test ran no test ({_first_error(baseline.summary)}); "
                "run `bash scripts/bench-setup.sh` (make bench does) for the crates it needs"
            )
        rows = [_sample(crate, i, verdict, cargo_test) for i in range(samples)]
    ratios = [r["iteration"] / r["full"] for r in rows]
    return {
        "ratio": round(statistics.median(ratios), 4),
        "iteration_s": round(statistics.median(r["iteration"] for r in rows), 3),
        "full_s": round(statistics.median(r["full"] for r in rows), 3),
        "baseline": baseline.summary.splitlines()[0],
        "samples": rows,
    }


def _sample(crate: Path, number: int, verdict: ForkVerdict, cargo_test: Any) -> dict[str, float]:
    _edit(crate, f"iteration_{number}")
    started = time.perf_counter()
    step = verdict()
    iteration = time.perf_counter() - started
    assert step.data["scopes"] == ["acceptance"], step.data
    _edit(crate, f"full_{number}")
    started = time.perf_counter()
    cargo_test([])
    return {"iteration": round(iteration, 3), "full": round(time.perf_counter() - started, 3)}


def _first_error(summary: str) -> str:
    lines = [line.strip() for line in summary.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("error")), lines[0] if lines else "no output")


def _edit(crate: Path, name: str) -> None:
    """A one-line change to the library: every target that links it is rebuilt."""
    with (crate / "src/lib.rs").open("a") as lib:
        lib.write(f"\n#[doc(hidden)]\npub fn p2_{name}() {{}}\n")


@dataclass(frozen=True, kw_only=True)
class ForkCase:
    ratio: float
    iteration_s: float
    full_s: float
    baseline: str
    samples: list[Any]


@dataclass(frozen=True, kw_only=True)
class ForkResult:
    """run()'s result, as report.json holds it (cases by crate)."""

    goal_ratio: float
    ratio: float
    cases: dict[str, ForkCase]
    skipped: dict[str, str] = field(default_factory=dict)  # crate -> why it was not measured


RESULT = ForkResult
