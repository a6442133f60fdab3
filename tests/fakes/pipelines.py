"""Small pipelines used by the foundation tests; loaded by import path like any pipeline.

Each stage appends its name to <run dir>/calls so a test can see exactly which stages ran.
"""

from __future__ import annotations

import time

from flakebot.errors import FlakebotError
from flakebot.pipeline.engine import Stage, StageContext


def _record(ctx: StageContext) -> int:
    """Append this stage's name to the run's call log; return how often it has been called."""
    calls = ctx.run.dir / "calls"
    with open(calls, "a") as handle:
        handle.write(ctx.stage + "\n")
    return calls.read_text().split().count(ctx.stage)


def first(ctx: StageContext) -> dict:
    _record(ctx)
    return {"value": 1}


def slow(ctx: StageContext) -> dict:
    """Slow on its first attempt (long enough to be killed), quick afterwards."""
    if _record(ctx) == 1:
        (ctx.run.dir / "slow-started").touch()
        time.sleep(60)
    return {"value": ctx.output("first")["value"] + 1}


def last(ctx: StageContext) -> dict:
    _record(ctx)
    return {"value": ctx.output("slow")["value"] + 1}


def broken(ctx: StageContext) -> dict:
    _record(ctx)
    raise FlakebotError("the broken stage broke", fix="nothing to fix: the test wants this")


def cleanup(ctx: StageContext) -> dict:
    _record(ctx)
    return {"after_failure": ctx.failed is not None}


SLOW = [Stage("first", first), Stage("slow", slow), Stage("last", last)]
FAILING = [Stage("first", first), Stage("broken", broken), Stage("last", last), Stage("cleanup", cleanup, always=True)]
