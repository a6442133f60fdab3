"""The edit stage of the craft pipeline: freeze the acceptance tests, then run the loop in the sandbox."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from flakebot.agent.acceptance import ACCEPTANCE_TEST, write_acceptance_test
from flakebot.agent.loop import EditLoop, LoopLimits, LoopResult, Verdict
from flakebot.agent.verdict import make_verdict
from flakebot.errors import BudgetExceeded, EditError, FlakebotError, ModelError
from flakebot.fsutil import atomic_write_json
from flakebot.llm.budget import Budget
from flakebot.pipeline.engine import StageContext
from flakebot.stages.outputs import AcquireOut, EditOut, SpecOut
from flakebot.templates import render
from flakebot.toolspec import ToolSpec

logger = logging.getLogger(__name__)


def edit_stage(ctx: StageContext) -> EditOut:
    import git

    from flakebot.agent.tools import Toolbox
    from flakebot.cargo.diagnostics import run_cargo
    from flakebot.cargo.runner import Cargo
    from flakebot.llm.transcript import Transcript
    from flakebot.pipeline.models import run_budget, stage_model
    from flakebot.sandbox import open_sandbox

    spec, acquired = ctx.get(SpecOut).tool_spec(), ctx.get(AcquireOut)
    workspace, crate_rel = ctx.run.workspace, acquired.crate_dir
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
    cargo.features = acquired.features
    alone = bool(acquired.dropped_dev_dependencies)  # the crate's own tests need what was left out
    toolbox = Toolbox(workspace, sandbox, cargo, crate_dir=crate_rel, frozen=frozen, only_acceptance=alone)

    def cargo_test(extra: list[str]) -> Any:
        return run_cargo(sandbox, cargo, "test", cwd=crate_dir, extra=extra, timeout=settings.command_timeout)

    verdict = make_verdict(cargo_test, spec, workspace, only_acceptance=alone)
    ctx.progress("running the tests before any edit")
    baseline = verdict()
    transcript = Transcript(ctx.run.transcript_path)
    budget = run_budget(ctx)
    with stage_model(ctx, budget) as model:
        loop = EditLoop(
            model,
            toolbox,
            verdict,
            commit,
            lambda sha: _restore(repo, sha),
            LoopLimits(settings.max_iterations, settings.max_wall_seconds),
            on_step=lambda i, result, v: _on_step(ctx, budget, i, v),
            record=transcript.record,
        )
        task = render("prompts/edit_task.j2", spec=spec, need=ctx.run.state["need"], origin=acquired.origin, files=toolbox.call("list_files", {}).text)
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


def _on_step(ctx: StageContext, budget: Budget, iteration: int, verdict: Verdict | None) -> None:
    spent = budget.spent
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


# How a loop that ended without green tests is reported: a spent budget or a failing provider is
# the model's trouble (exit 31 / 30), everything else the edit loop's (exit 41).
STOP_ERRORS: dict[str, type[FlakebotError]] = {"budget": BudgetExceeded, "model_error": ModelError}


def _outcome(result: LoopResult, spec: ToolSpec) -> EditOut:
    if not result.green:
        raise STOP_ERRORS.get(result.status, EditError)(
            f"the edit loop stopped ({result.status}): {result.error or 'tests not green'}",
            fix=result.fix or "raise --max-iterations/--max-cost, give a clearer need, or inspect the workspace with --keep",
            status=result.status,
            iterations=result.iterations,
            best_failures=result.best_failures,
        )
    return EditOut(status="green", summary=result.summary, iterations=result.iterations, commit=result.best_commit, verdict=result.verdict, binary=spec.name)
