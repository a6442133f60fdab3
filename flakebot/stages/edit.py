"""The edit stage of the craft pipeline: freeze the acceptance tests, then run the loop in the sandbox.

The acceptance test is frozen (agent.acceptance.Frozen): bound read-only in the sandbox, refused to the
file tools, and hashed after every tool call and verdict; a change ends the loop as `tampered`."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flakebot.agent.acceptance import ACCEPTANCE_TEST, BuiltRunner, Frozen, built_file, write_acceptance_test
from flakebot.agent.disputes import DisputeDesk, refreezer
from flakebot.agent.loop import EditLoop, LoopLimits, LoopResult, Verdict
from flakebot.agent.verdict import LifecycleCheck, not_run
from flakebot.agent.workspace import Checks, Workspace, WorkspaceGit
from flakebot.config import Settings
from flakebot.errors import BudgetExceeded, EditError, FlakebotError, ModelError, UnsafePath
from flakebot.fsutil import atomic_write_json
from flakebot.llm.base import Model
from flakebot.llm.budget import Budget
from flakebot.pipeline.engine import StageContext
from flakebot.render import render
from flakebot.stages.outputs import AcquireOut, ChoiceOut, EditOut, SpecOut
from flakebot.toolspec import ToolSpec

if TYPE_CHECKING:
    from flakebot.cargo.runner import Cargo
    from flakebot.llm.transcript import Transcript
    from flakebot.nix.loopdeps import Plan

logger = logging.getLogger(__name__)


def edit_stage(ctx: StageContext) -> EditOut:
    from flakebot.agent.tools import Toolbox
    from flakebot.cargo.fetch import refresh_git_view
    from flakebot.cargo.runner import Cargo
    from flakebot.llm.transcript import Transcript
    from flakebot.nix.loopdeps import crate_name
    from flakebot.pipeline.models import run_budget, stage_model
    from flakebot.sandbox import limits_for, open_sandbox

    spec, acquired = ctx.get(SpecOut).tool_spec(), ctx.get(AcquireOut)
    root, crate_rel = ctx.run.workspace, acquired.crate_dir
    crate_dir = root / crate_rel
    git = WorkspaceGit(root)
    base = _start_clean(ctx, git)
    frozen = Frozen(
        root, {str(Path(crate_rel) / rel): digest for rel, digest in write_acceptance_test(spec, crate_dir).items()}
    )
    git.commit(f"flakebot: acceptance tests for {spec.name}")

    settings = ctx.settings
    cargo = Cargo.for_run(settings, ctx.run.target_dir, ctx.run.dir)
    refresh_git_view(cargo, crate_dir, watch=root)  # the sandbox sees only the git checkouts the lock names
    store = _store_plan(ctx, cargo)
    sandbox = open_sandbox(
        settings.sandbox,
        workspace=root,
        writable=[root, ctx.run.target_dir],
        readable=[cargo.registry_dir] if cargo.registry_dir else [],
        cargo_home=cargo.home,
        cargo_git=cargo.git_view,
        adopt=True,
        frozen=frozen.paths(),
        limits=limits_for(settings),
        binds=[(False, cargo.registry_dir, store.registry)] if store and cargo.registry_dir else [],
    )
    cargo.features = acquired.features
    isolated = sandbox.name == "bubblewrap"
    if store and isolated:  # the loop builds as the deps derivation did, so cargo takes its output as fresh
        cargo.sandbox_registry, cargo.profile = store.registry, store.profile(crate_name(crate_dir))
    seeder = _seed_dependencies(ctx, cargo, crate_dir, isolated=isolated, store=store if isolated else None)
    alone = bool(acquired.dropped_dev_dependencies)  # the crate's own tests need what was left out
    toolbox = Toolbox(
        root, sandbox, cargo, crate_dir=crate_rel, frozen=frozen, only_acceptance=alone, before_test=seeder
    )

    transcript = Transcript(ctx.run.transcript_path)
    runner = example_runner(settings, ctx.run.target_dir)
    checks = Checks(
        sandbox,
        cargo,
        spec,
        runner,
        snapshot=runner.snapshot,
        timeout=settings.command_timeout,
        fork=ctx.get(ChoiceOut).mode == "fork",
        only_acceptance=alone,
        record=transcript.record,
        before_test=seeder,
        lifecycle=service_check(settings, runner, spec),
    )
    workspace = Workspace(
        git, crate_rel, frozen, checks, base=base, scratch=[ctx.run.target_dir], disk_mb=settings.sandbox_disk_mb
    )

    if acquired.origin.get("method") == "new":
        # cargo's hello-world against the frozen test: a run would teach the model nothing, and would build the
        # library's dependency set, which the model's first edit changes: the first build waits for that edit
        ctx.progress("not running the tests before any edit: the crate is new (cargo's hello-world)")
        baseline = not_run(f"the crate is cargo's new hello-world; flakebot runs {ACCEPTANCE_TEST} after your edits")
    else:
        ctx.progress("running the tests before any edit")
        baseline = workspace.baseline()
    budget = run_budget(ctx)
    with stage_model(ctx, budget) as model, ExitStack() as later:
        spec_model = _lazy_model(ctx, budget, transcript, later)
        desk = DisputeDesk(
            toolbox,
            spec,
            ctx.run.state["need"],
            spec_model,
            refreezer(toolbox, crate_dir, crate_rel),
            transcript.record,
        )
        limits = LoopLimits(settings.max_iterations, settings.max_wall_seconds)
        loop = EditLoop(model, desk, workspace, limits, StageEvents(ctx, budget, transcript))
        task = render(
            "prompts/edit_task.j2",
            spec=spec,
            need=ctx.run.state["need"],
            origin=acquired.origin,
            files=toolbox.call("list_files", {}).text,
        )
        result = loop.run(
            render("prompts/edit.j2", spec=spec, acceptance=str(Path(crate_rel) / ACCEPTANCE_TEST)), task, baseline
        )
    # later stages (examples run on the built tool, USAGE.md) read the corrected examples through tested_spec
    corrected = [asdict(e) for e in spec.examples] if desk.corrected else []
    atomic_write_json(ctx.run.dir / "edit.json", {**result.to_dict(), "disputes": desk.disputes})
    return dataclasses.replace(_outcome(result, spec), disputes=desk.disputes, examples=corrected)


def _store_plan(ctx: StageContext, cargo: Cargo) -> Plan | None:
    """How the loop starts from the flake's deps derivation (nix/loopdeps.py), or None (logged why): then from the
    dependency cache's entry, as before."""
    from flakebot.nix.loopdeps import NoStoreDeps, plan

    if not ctx.settings.dependency_cache:
        return None
    try:
        return plan(ctx.settings, cargo)
    except NoStoreDeps as exc:
        logger.info("the edit loop does not start from the deps derivation: %s", exc)
        return None


def _seed_dependencies(
    ctx: StageContext, cargo: Cargo, crate_dir: Path, *, isolated: bool, store: Plan | None
) -> Callable[[], None]:
    """The returned call, before each `cargo test`, keeps the run's target dir on a private copy of the crate's
    compiled dependencies: the flake's deps derivation (`store`), else the dependency cache's entry, if it can. The
    first copy is made before the first test, not before: a new crate's first test comes after the model's first
    edit, which usually changes the dependency set, and each set built is a build of every dependency in it."""
    from flakebot.cargo.depcache import LoopSeeder
    from flakebot.nix.loopdeps import StoreSeeder

    if not ctx.settings.dependency_cache:
        return lambda: None
    seeder: LoopSeeder | StoreSeeder
    if store is not None:
        seeder = StoreSeeder(
            ctx.settings, crate_dir, ctx.run.target_dir, ctx.run.dir / "loop-deps", store, ctx.progress
        )
    else:
        seeder = LoopSeeder(ctx.settings, cargo, crate_dir, ctx.run.target_dir, progress=ctx.progress)
    seeded: list[bool] = []

    def before_test() -> None:
        if not seeded:
            seeded.append(True)
            first = seeder.seed(isolated=isolated)
            ctx.progress(first.note(), dependency_cache=first.status)
            return
        again = seeder.refresh()
        if again is not None:
            ctx.progress(f"dependencies changed: {again.note()}", dependency_cache=again.status)

    return before_test


def _lazy_model(ctx: StageContext, budget: Budget, transcript: Any, stack: ExitStack) -> Callable[[], Model]:
    """The spec model for disputes, made on the first dispute (stage "dispute" in the transcript and in model scripts)."""
    made: list[Model] = []

    def get() -> Model:
        if not made:
            from flakebot.llm.providers import resolve_model

            model = resolve_model(
                ctx.request.model, ctx.settings, stage="dispute", transcript=transcript, budget=budget
            )
            stack.callback(model.close)
            made.append(model)
        return made[0]

    return get


def example_runner(settings: Settings, target_dir: Path) -> BuiltRunner:
    """Runs one example on a built binary in the sandbox the settings ask for (the smoke timeout per example); the
    binary must be a regular file in the run's `target_dir` (cargo's JSON naming it is the build's to forge)."""
    from flakebot.sandbox import limits_for

    limits = limits_for(settings, timeout=settings.smoke_timeout)
    return BuiltRunner(settings.sandbox, limits, target_dir)


def service_check(settings: Settings, runner: BuiltRunner, spec: ToolSpec) -> LifecycleCheck | None:
    """For a service: flakebot's own lifecycle check of the binary cargo built, run as `flakebot up` runs it, on the
    same terms as the examples (`runner`'s): the copy taken at cargo's artifact message, or a regular file in the
    run's target dir (cargo's JSON naming it is the build's to forge)."""
    if not spec.service:
        return None
    from flakebot.services.crafting import lifecycle_failures

    def check(binary: Path) -> list[str]:
        try:
            binary = built_file(binary, runner.inside(binary))
        except UnsafePath as exc:
            return [f"flakebot refused to run the built binary: {exc}"]
        return lifecycle_failures(binary, spec.service, settings)

    return check


def _start_clean(ctx: StageContext, git: WorkspaceGit) -> str:
    """A (re)started edit stage begins from what acquire produced, so a resumed run redoes the stage whole."""
    if "edit_base" not in ctx.run.state:  # HEAD read from .git's files when it is plainly there: no git process
        ctx.run.state["edit_base"] = git.head_from_files() or git.head()
        ctx.run.save()
    base: str = ctx.run.state["edit_base"]
    committed, ctx.run.workspace_committed = ctx.run.workspace_committed, ""
    if committed == base:  # this process's acquire made the tree and committed it whole: nothing to restore or clean
        return base
    git.reset(base, "-fdx")
    return base


class StageEvents:
    """The loop's events in a run: records go to the transcript; each step saves what was spent and reports progress."""

    def __init__(self, ctx: StageContext, budget: Budget, transcript: Transcript) -> None:
        self.ctx, self.budget, self.record = ctx, budget, transcript.record

    def step(self, iteration: int, result: LoopResult, verdict: Verdict | None) -> None:
        _on_step(self.ctx, self.budget, iteration, verdict)


def _on_step(ctx: StageContext, budget: Budget, iteration: int, verdict: Verdict | None) -> None:
    spent = budget.spent
    data: dict[str, Any] = {"iteration": iteration, "tokens": spent.total_tokens, "cost_usd": spent.cost_usd}
    ctx.run.state["usage"] = spent.to_dict()  # saved every step: a killed run keeps what it spent
    # its rename not synced (its bytes are): lost to a machine's crash, the stage redoes itself from edit_base (saved
    # durably at its start), as a stage's start and its model's usage are (pipeline/engine.py, models.py); written on
    # a thread of its own (Run.checkpoint): the next step does not wait for its fsync
    ctx.run.checkpoint()
    if verdict is not None:
        data.update(
            failures=verdict.failures,
            green=verdict.green,
            **{k: v for k, v in verdict.data.items() if k in ("passed", "failed")},
        )
    note = (
        "no test run"
        if verdict is None
        else (
            "green"
            if verdict.green
            else f"{verdict.data.get('passed', 0)} passing, {verdict.data.get('failed', '?')} failing"
        )
    )
    settings = ctx.settings
    data.update(max_iterations=settings.max_iterations, max_tokens=settings.max_tokens, max_cost_usd=settings.max_cost)
    cost = f", ${spent.cost_usd:.4f} of ${settings.max_cost:.2f}" if spent.cost_usd else ""
    ctx.progress(
        f"iteration {iteration} of {settings.max_iterations}: {note} ({spent.total_tokens:,} tokens{cost})", **data
    )


# How a loop that ended without green tests is reported: a spent budget or a failing provider is
# the model's trouble (exit 31 / 30), everything else the edit loop's (exit 41).
STOP_ERRORS: dict[str, type[FlakebotError]] = {"budget": BudgetExceeded, "model_error": ModelError}


def _outcome(result: LoopResult, spec: ToolSpec) -> EditOut:
    if not result.green:
        raise STOP_ERRORS.get(result.status, EditError)(
            f"the edit loop stopped ({result.status}): {result.error or 'tests not green'}",
            fix=result.fix
            or "raise --max-iterations/--max-cost, give a clearer need, or inspect the workspace with --keep",
            status=result.status,
            iterations=result.iterations,
            best_failures=result.best_failures,
        )
    return EditOut(
        status="green",
        summary=result.summary,
        iterations=result.iterations,
        commit=result.best_commit,
        verdict=result.verdict,
        binary=spec.name,
    )
