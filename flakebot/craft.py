"""The craft pipeline: need -> spec -> search -> choose -> acquire -> edit -> package -> instruct -> clean.

Stage functions live with their role (crates/, source.py, agent/, packaging.py, deliver/) and are
imported only when their stage runs, so listing or showing runs stays fast.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from flakebot.pipeline import Stage, StageContext

logger = logging.getLogger(__name__)


def _lazy(target: str) -> Callable[[StageContext], dict[str, Any] | None]:
    module, _, name = target.partition(":")

    def stage(ctx: StageContext) -> dict[str, Any] | None:
        return getattr(importlib.import_module(module), name)(ctx)  # type: ignore[no-any-return]

    stage.__name__ = name
    return stage


STAGES = [
    Stage("spec", _lazy("flakebot.spec_stage:spec_stage")),
    Stage("search", _lazy("flakebot.crates.stage:search_stage")),
    Stage("choose", _lazy("flakebot.choose:choose_stage")),
    Stage("acquire", _lazy("flakebot.source:acquire_stage"), valid=lambda run: run.workspace.is_dir()),
    Stage("edit", _lazy("flakebot.agent.edit_stage:edit_stage")),
    Stage("package", _lazy("flakebot.packaging:package_stage")),
    Stage("instruct", _lazy("flakebot.deliver.instruct:instruct_stage")),
    Stage("clean", _lazy("flakebot.craft:clean_stage"), always=True),
]


@contextmanager
def stage_model(ctx: StageContext) -> Iterator[Any]:
    """The run's model for this stage: transcript in the run, one budget carried across stages and resumes."""
    from flakebot.llm.budget import Budget
    from flakebot.llm.providers import resolve_model
    from flakebot.llm.transcript import Transcript

    budget = Budget.from_settings(ctx.settings, spent=ctx.run.state.get("usage") or None)
    transcript = Transcript(ctx.run.transcript_path)
    model = resolve_model(ctx.options.get("model"), ctx.settings, stage=ctx.stage, transcript=transcript, budget=budget)
    try:
        yield model
    finally:
        model.close()
        ctx.run.state["usage"] = budget.spent.to_dict()
        ctx.run.save()


def clean_stage(ctx: StageContext) -> dict[str, Any]:
    """Push the branch when asked, remove the workspace, target dir and temp files, delete a fork when
    asked (the run's processes end with their commands). Keeps flake, manifest, transcript and state for
    audit. Runs after failures and Ctrl-C too."""
    from flakebot.cleanup import clean_run
    from flakebot.source import push_branch, release_run_forks

    pushed = None
    if ctx.options.get("push") and ctx.failed is None and ctx.run.workspace.is_dir():
        pushed = push_branch(ctx.run.workspace, ctx.output("acquire").get("origin", {}), ctx.settings)
    if ctx.options.get("keep"):
        ctx.progress("--keep: leaving the workspace in place")
        return {"kept": True, "removed": [], "pushed": pushed}
    forks = release_run_forks(ctx.run, ctx.settings)  # registered before the fork was polled: failed acquisitions too
    removed = clean_run(ctx.run)
    ctx.progress(f"removed {len(removed)} item(s)")
    return {"kept": False, "removed": removed, "forks": forks, "pushed": pushed}
