"""evaluate(): craft every need of a suite, run its held-out checks on the built tool, and score it.

Each need is crafted in its own work directory under the eval root, with a catalog of its own, so an
evaluation never touches the user's catalog. Offline (no model given) each need replays its
hand-written session; with a model every need goes to that model.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.errors import FlakebotError, SpecError
from flakebot.evaluate.checks import run_checks
from flakebot.evaluate.fixtures import prepare_fixture
from flakebot.evaluate.suite import Need, Suite
from flakebot.fsutil import atomic_write_json, remove_tree
from flakebot.pipeline.run import Run, list_runs

logger = logging.getLogger(__name__)

FORMAT = 1
# The craft command's function (flakebot.commands.craft.craft), given by the eval command: evaluate/ does not import
# the commands that call it.
Craft = Callable[..., Any]


@dataclass
class NeedResult:
    """How one need fared: the craft's outcome, the held-out checks, and what it cost."""

    id: str
    need: str
    expect: str
    outcome: str  # crafted | rejected | failed
    passed: bool  # the outcome is the expected one and every held-out check passed
    heldout_passed: int = 0
    heldout_total: int = 0
    iterations: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    model: str = ""
    run_id: str = ""
    error: str = ""
    covers: list[str] = field(default_factory=list)
    mistakes: list[str] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class EvalReport:
    suite: str
    model: str
    results: list[NeedResult]
    seconds: float = 0.0

    def totals(self) -> dict[str, Any]:
        results = self.results
        return {
            "needs": len(results),
            "passed": sum(r.passed for r in results),
            "crafted": sum(r.outcome == "crafted" for r in results),
            "heldout_passed": sum(r.heldout_passed for r in results),
            "heldout_total": sum(r.heldout_total for r in results),
            "iterations": sum(r.iterations for r in results),
            "tokens": sum(r.tokens for r in results),
            "cost_usd": round(sum(r.cost_usd for r in results), 6),
            "seconds": round(self.seconds, 1),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "suite": self.suite,
            "model": self.model,
            "totals": self.totals(),
            "results": [asdict(r) for r in self.results],
        }


def evaluate(
    suite: Suite,
    *,
    model: str | None,
    settings: Settings,
    root: Path,
    record: Path | None = None,
    progress: Callable[[str], None] = lambda _: None,
    craft: Craft,
) -> EvalReport:
    """Craft each need of `suite` under `root` (emptied first) with `craft` (the craft command's function) and score
    it; with `record`, write each need's session as a replayable script there (DIR/<need id>.json)."""
    remove_tree(root)
    root.mkdir(parents=True)
    started = time.monotonic()
    results = []
    for number, need in enumerate(suite.needs, 1):
        progress(f"[{number}/{len(suite.needs)}] {need.id}: {need.need}")
        result = evaluate_need(need, suite, model, settings, root / need.id, craft)
        if record is not None and result.run_id:
            _record(root / need.id, result, record / f"{need.id}.json")
        progress(
            f"[{number}/{len(suite.needs)}] {need.id}: {'passed' if result.passed else 'FAILED'} ({_outcome_line(result)})"
        )
        results.append(result)
    return EvalReport(suite.name, model or "hand-written sessions", results, time.monotonic() - started)


def evaluate_need(
    need: Need, suite: Suite, model: str | None, settings: Settings, root: Path, craft: Craft
) -> NeedResult:
    registry = (
        str(prepare_fixture(suite.directory / "fixtures" / need.fixture, root)) if need.fixture else need.registry
    )
    settings = dataclasses.replace(
        settings, workdir=str(root), catalog_dir=str(root / "catalog"), offline=settings.offline or model is None
    )
    chosen = model or f"scripted:{need.session}"
    started = time.monotonic()
    error = ""
    try:
        craft(need.need, model=chosen, registry=registry, method=need.method, fresh=True, settings=settings)
        outcome = "crafted"
    except SpecError as exc:  # only the model's reject_need is a rejection; an unusable spec is a failure
        outcome, error = (
            ("rejected" if exc.message.startswith("the model declined the need") else "failed"),
            exc.one_line(),
        )
    except FlakebotError as exc:
        outcome, error = "failed", exc.one_line()
    seconds = time.monotonic() - started
    run = _only_run(root)
    checks = _held_out(need, run, settings) if outcome == "crafted" and run is not None else []
    result = NeedResult(
        id=need.id, need=need.need, expect=need.expect, outcome=outcome, passed=False, seconds=round(seconds, 1), model=chosen.split("/")[-1],
        error=error, covers=need.covers, mistakes=need.mistakes, checks=checks, heldout_total=len(need.heldout),
        heldout_passed=sum(c["passed"] for c in checks),
    )  # fmt: skip
    if run is not None:
        _add_usage(result, run)
    result.passed = outcome == need.expect and result.heldout_passed == result.heldout_total
    return result


def _record(root: Path, result: NeedResult, dest: Path) -> None:
    from flakebot.evaluate.record import write_recording

    run = Run.load(root, result.run_id)
    write_recording(run.transcript_path, dest, result.model, result.need)


def _only_run(root: Path) -> Run | None:
    runs = list_runs(root)
    return runs[0] if runs else None


def _held_out(need: Need, run: Run, settings: Settings) -> list[dict[str, Any]]:
    package = run.output("package")
    return run_checks(
        need.heldout,
        Path(package["store_path"]) / "bin",
        package.get("main_program") or run.output("spec")["name"],
        settings,
    )


def _add_usage(result: NeedResult, run: Run) -> None:
    usage = run.state.get("usage") or {}
    result.run_id = run.id
    result.iterations = int(run.output("edit").get("iterations") or 0)
    result.tokens = int(usage.get("total_tokens") or usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0))
    result.cost_usd = float(usage.get("cost_usd") or 0.0)


def _outcome_line(result: NeedResult) -> str:
    held = f"held-out {result.heldout_passed}/{result.heldout_total}" if result.heldout_total else "no held-out checks"
    return f"{result.outcome}, {held}, {result.iterations} iterations, {result.seconds:.0f}s" + (
        f": {result.error}" if result.error and not result.passed else ""
    )


# ------------------------------------------------------------------ the report


def write_report(report: EvalReport, out_dir: Path) -> dict[str, Path]:
    """bench/eval.json (everything) and bench/eval.md (the table)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "eval.json", "markdown": out_dir / "eval.md"}
    atomic_write_json(paths["json"], report.to_dict())
    paths["markdown"].write_text(markdown(report))
    return paths


def markdown(report: EvalReport) -> str:
    totals = report.totals()
    lines = [
        f"# flakebot eval: suite `{report.suite}`, model: {report.model}",
        "",
        "| need | expected | outcome | held-out | iterations | tokens | cost | time | covers | mistakes the session makes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *(_row(r) for r in report.results),
        f"| **total: {totals['passed']}/{totals['needs']} passed** | | {totals['crafted']} crafted | {totals['heldout_passed']}/{totals['heldout_total']} "
        f"| {totals['iterations']} | {totals['tokens']:,} | ${totals['cost_usd']:.4f} | {totals['seconds']:.0f}s | | |",
        "",
        "Held-out checks are cases the model never saw, run on the tool Nix built, in the sandbox.",
    ]
    failed = [r for r in report.results if not r.passed]
    for result in failed:
        lines += [
            "",
            f"## {result.id}: not passed",
            "",
            f"- outcome: {result.outcome} (expected {result.expect})",
            f"- error: {result.error or 'none'}",
        ]
        lines += [
            f"- check failed: `{c['bin']} {' '.join(c['args'])}`: exit {c['exit_code']}, stdout {json.dumps(c['stdout'][:200])}"
            for c in result.checks
            if not c["passed"]
        ]
    return "\n".join(lines) + "\n"


def _row(r: NeedResult) -> str:
    status = "✔" if r.passed else "✘"
    held = f"{r.heldout_passed}/{r.heldout_total}" if r.heldout_total else "-"
    return (
        f"| {status} {r.id} | {r.expect} | {r.outcome} | {held} | {r.iterations} | {r.tokens:,} | ${r.cost_usd:.4f} | {r.seconds:.0f}s "
        f"| {'; '.join(r.covers)} | {'; '.join(r.mistakes) or '-'} |"
    )


def run_eval(
    suite_name: str = "default",
    *,
    model: str | None = None,
    only: list[str] | None = None,
    out_dir: Path = Path("bench"),
    record: Path | None = None,
    settings: Settings,
    progress: Callable[[str], None] = lambda _: None,
    craft: Craft,
) -> tuple[EvalReport, dict[str, Path]]:
    """`flakebot eval`: load the suite, craft (with `craft`, the craft command's function) and score every need,
    write the report."""
    from flakebot.evaluate.suite import load_suite
    from flakebot.llm.providers import check_model

    if model is not None:
        check_model(model, settings)  # a missing key fails before the first craft
    suite = load_suite(suite_name).select(only or [])
    root = settings.path("workdir") / "eval" / suite.name
    report = evaluate(suite, model=model, settings=settings, root=root, record=record, progress=progress, craft=craft)
    return report, write_report(report, out_dir)
