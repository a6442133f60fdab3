"""The edit stage of the craft pipeline: freeze the acceptance tests, then run the loop in the sandbox."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flakebot.agent.loop import EditLoop, Limits, LoopResult, Verdict
from flakebot.errors import BudgetExceeded, EditError, FlakebotError, ModelError
from flakebot.fsutil import atomic_write_json
from flakebot.pipeline import StageContext
from flakebot.spec import ACCEPTANCE_TEST, ToolSpec, acceptance_test_names, write_acceptance_test
from flakebot.templates import render

logger = logging.getLogger(__name__)

COMPILE_FAILURE = 10_000  # a crate that does not build is worse than any number of failing tests


def edit_stage(ctx: StageContext) -> dict[str, Any]:
    import git

    from flakebot.agent.cargo import run_cargo
    from flakebot.agent.sandbox import open_sandbox
    from flakebot.agent.tools import Toolbox
    from flakebot.cargo import Cargo
    from flakebot.craft import stage_model
    from flakebot.llm.transcript import Transcript

    spec = ToolSpec.from_dict(ctx.output("spec"))
    workspace, crate_rel = ctx.run.workspace, ctx.output("acquire").get("crate_dir", "")
    crate_dir = workspace / crate_rel
    repo = git.Repo(workspace)
    _start_clean(ctx, repo)
    frozen = {str(Path(crate_rel) / rel): digest for rel, digest in write_acceptance_test(spec, crate_dir).items()}
    commit = _committer(repo)
    commit(f"flakebot: acceptance tests for {spec.name}")

    settings = ctx.settings
    sandbox = open_sandbox(
        settings.sandbox, workspace=workspace, writable=[workspace, ctx.run.target_dir], timeout=settings.command_timeout, output_cap=settings.output_cap
    )
    cargo = Cargo.for_run(settings, ctx.run.target_dir)
    toolbox = Toolbox(workspace, sandbox, cargo, crate_dir=crate_rel, frozen=frozen)

    verdict = make_verdict(lambda extra: run_cargo(sandbox, cargo, "test", cwd=crate_dir, extra=extra, timeout=settings.command_timeout), spec, workspace)
    ctx.progress("running the tests before any edit")
    baseline = verdict()
    transcript = Transcript(ctx.run.transcript_path)
    with stage_model(ctx) as model:
        loop = EditLoop(
            model,
            toolbox,
            verdict,
            commit,
            lambda sha: _restore(repo, sha),
            Limits(settings.max_iterations, settings.max_wall_seconds),
            on_step=lambda i, result, v: _on_step(ctx, model, i, v),
            record=transcript.record,
        )
        task = render("prompts/edit_task.j2", spec=spec, need=ctx.run.state["need"], origin=ctx.output("acquire"), files=toolbox.call("list_files", {}).text)
        result = loop.run(render("prompts/edit.j2", spec=spec, acceptance=str(Path(crate_rel) / ACCEPTANCE_TEST)), task, baseline)
    atomic_write_json(ctx.run.dir / "edit.json", result.to_dict())
    return _outcome(result, spec)


def _start_clean(ctx: StageContext, repo: Any) -> None:
    """A (re)started edit stage begins from what acquire produced, so a resumed run redoes the stage whole."""
    base = ctx.run.state.setdefault("edit_base", repo.head.commit.hexsha)
    ctx.run.save()
    repo.git.reset("--hard", base)
    repo.git.clean("-fdx")


def _committer(repo: Any) -> Any:
    def commit(message: str) -> str:
        repo.git.add("-A")
        repo.index.commit(message) if repo.is_dirty(index=True) else None
        return str(repo.head.commit.hexsha)

    return commit


def _restore(repo: Any, sha: str) -> None:
    repo.git.reset("--hard", sha)
    repo.git.clean("-fd")


def _on_step(ctx: StageContext, model: Any, iteration: int, verdict: Verdict | None) -> None:
    spent = model.budget.spent
    data: dict[str, Any] = {"iteration": iteration, "tokens": spent.total_tokens, "cost_usd": spent.cost_usd}
    ctx.run.state["usage"] = spent.to_dict()  # saved every step: a killed run keeps what it spent
    ctx.run.save()
    if verdict is not None:
        data.update(failures=verdict.failures, green=verdict.green, **{k: v for k, v in verdict.data.items() if k in ("passed", "failed")})
    note = (
        "no test run"
        if verdict is None
        else ("green" if verdict.green else f"{verdict.data.get('passed', 0)} passing, {verdict.data.get('failed', '?')} failing")
    )
    cost = f", ${spent.cost_usd:.4f}" if spent.cost_usd else ""
    ctx.progress(f"iteration {iteration}: {note} ({spent.total_tokens:,} tokens{cost})", **data)


def make_verdict(cargo_test: Callable[[list[str]], Any], spec: ToolSpec, workspace: Path) -> Callable[[], Verdict]:
    """flakebot's verdict on the workspace: `cargo test --tests`, then, once that is green and the
    workspace has doc tests (slow: rustdoc compiles them anew every run), the full `cargo test`.
    `cargo_test(extra_args)` runs `cargo test` (in the sandbox) and returns its CargoReport."""

    def verdict() -> Verdict:
        report = cargo_test(["--tests"])
        quick = judge(report, spec)
        if not quick.green or not has_doctests(report, workspace):
            return quick
        return judge(cargo_test([]), spec)

    return verdict


def judge(report: Any, spec: ToolSpec) -> Verdict:
    """flakebot's verdict from a `cargo test` report: green only when everything passed and every
    acceptance example ran, in the acceptance test binary, and passed."""
    missing = acceptance_missing(report, spec)
    compiled = not report.errors and not report.timed_out
    failed_names = {t.name.rsplit("::", 1)[-1] for t in report.failed_tests}
    failures = (report.failed + len(set(missing) - failed_names)) if compiled else COMPILE_FAILURE + report.error_count
    data = {"passed": report.passed, "failed": report.failed, "compiled": compiled, "acceptance_missing": missing}
    summary = report.summary()
    if compiled and missing:
        summary += f"\nAcceptance tests not passing in {ACCEPTANCE_TEST}: {', '.join(missing)}."
    return Verdict(
        green=report.ok and not missing, failures=max(failures, 0 if report.ok and not missing else 1), summary=summary, key=_key(report, missing), data=data
    )


def has_doctests(report: Any, workspace: Path) -> bool:
    """Whether cargo built a target of the workspace's own crates that has doc tests (a library)."""
    for line in report.result.stdout.splitlines() if report.result else []:
        if '"doctest":true' not in line:
            continue
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message.get("target", {}).get("doctest"):
            if Path(message.get("manifest_path", "/")).resolve().is_relative_to(workspace.resolve()):
                return True
    return False


def acceptance_missing(report: Any, spec: ToolSpec) -> list[str]:
    """Acceptance tests that did not run and pass (all of them if their binary never ran)."""
    names = acceptance_test_names(spec)
    result = report.result
    # cargo names the test binary it runs (relative to the package or the workspace root).
    if result is None or not re.search(rf"Running \S*{re.escape(ACCEPTANCE_TEST)}\b", result.stderr):
        return names
    passed = set(re.findall(r"^test (\w+) \.\.\. ok$", result.stdout, re.M))
    return [name for name in names if name not in passed]


def _key(report: Any, missing: list[str]) -> str:
    return "|".join(sorted(report.failure_key() | {f"acceptance {m}" for m in missing}))


# How a loop that ended without green tests is reported: a spent budget or a failing provider is
# the model's trouble (exit 31 / 30), everything else the edit loop's (exit 41).
STOP_ERRORS: dict[str, type[FlakebotError]] = {"budget": BudgetExceeded, "model_error": ModelError}


def _outcome(result: LoopResult, spec: ToolSpec) -> dict[str, Any]:
    if not result.green:
        raise STOP_ERRORS.get(result.status, EditError)(
            f"the edit loop stopped ({result.status}): {result.error or 'tests not green'}",
            fix=result.fix or "raise --max-iterations/--max-cost, give a clearer need, or inspect the workspace with --keep",
            status=result.status,
            iterations=result.iterations,
            best_failures=result.best_failures,
        )
    return {
        "status": "green",
        "summary": result.summary,
        "iterations": result.iterations,
        "commit": result.best_commit,
        "verdict": result.verdict,
        "binary": spec.name,
    }
