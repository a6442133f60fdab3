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


class _TermOnCollect:
    """An object whose collection sends this process SIGTERM: the KeyboardInterrupt the engine's handler raises lands
    in __del__, which Python reports and swallows (as a Popen collected at the wrong moment did in a worker)."""

    def __del__(self) -> None:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGTERM)


def swallowed(ctx: StageContext) -> dict:
    """A stage during which SIGTERM arrives where its interrupt is swallowed; it then returns as if nothing happened."""
    _record(ctx)
    _TermOnCollect()  # made and collected at once
    return {"value": 2}


def catalogue(ctx: StageContext) -> dict:
    """Catalogue a tool named after the run's need into the catalog the stage's settings open (as instruct does)."""
    from flakebot.deliver.catalog import Catalog

    _record(ctx)
    name = ctx.request.need
    store = ctx.run.dir / "store"
    (store / "bin").mkdir(parents=True, exist_ok=True)
    (store / "bin" / name).write_text("#!/bin/sh\necho made\n")
    (store / "bin" / name).chmod(0o755)
    flake = ctx.run.dir / "flake"
    flake.mkdir(exist_ok=True)
    manifest = {"name": name, "main_program": name, "store_path": str(store), "nix_run_argv": ["nix", "run", "x"]}
    Catalog.open(ctx.settings).add(
        name, need=f"{name} rows", flake_dir=flake, manifest={**manifest, "summary": ""}, usage_md=f"# {name}\n",
        store_path=str(store), run_id=ctx.run.id, origin={},
    )  # fmt: skip
    return {"tenant": ctx.settings.tenant}


SLOW = [Stage("first", first), Stage("slow", slow), Stage("last", last)]
SWALLOWED = [Stage("first", first), Stage("swallowed", swallowed), Stage("last", last),
             Stage("cleanup", cleanup, always=True)]  # fmt: skip
FAILING = [Stage("first", first), Stage("broken", broken), Stage("last", last), Stage("cleanup", cleanup, always=True)]
CATALOGUING = [Stage("first", first), Stage("catalogue", catalogue, writes=lambda run: ("catalog_dir",))]
