"""The clean stage of both pipelines: remove what a run no longer needs, keep what it made for audit."""

from __future__ import annotations

import logging

from flakebot.pipeline.engine import StageContext
from flakebot.stages.outputs import AcquireOut, CleanOut

logger = logging.getLogger(__name__)


def clean_stage(ctx: StageContext) -> CleanOut:
    """Push the branch when asked, remove the workspace, target dir and temp files, delete a fork when
    asked (the run's processes end with their commands). Keeps flake, manifest, transcript and state for
    audit. Runs after failures and Ctrl-C too."""
    from flakebot.pipeline.cleanup import clean_run
    from flakebot.source.remote import push_branch, release_run_forks

    pushed = None
    if ctx.request.push and ctx.failed is None and ctx.run.workspace.is_dir():
        pushed = push_branch(ctx.run.workspace, ctx.get(AcquireOut).origin, ctx.settings)
    if ctx.request.keep:
        ctx.progress("--keep: leaving the workspace in place")
        return CleanOut(kept=True, pushed=pushed)
    forks = release_run_forks(ctx.run, ctx.settings)  # registered before the fork was polled: failed acquisitions too
    removed = clean_run(ctx.run)
    ctx.progress(f"removed {len(removed)} item(s)")
    return CleanOut(removed=removed, forks=forks, pushed=pushed)


def package_clean_stage(ctx: StageContext) -> CleanOut:
    """Remove the workspace and temp files a package run made; the flake and its GC root stay."""
    from flakebot.pipeline.cleanup import clean_run

    removed = clean_run(ctx.run)
    return CleanOut(removed=removed)
