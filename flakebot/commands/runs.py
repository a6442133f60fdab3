"""Runs: show, status, resume, list and remove them."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from flakebot import config
from flakebot.commands.common import settings_or_default, workdir_of
from flakebot.commands.craft import craft_result
from flakebot.errors import CatalogError, FlakebotError, RunError
from flakebot.events import EventSink, ignore
from flakebot.fsutil import remove_tree
from flakebot.pipeline.run import Run

logger = logging.getLogger(__name__)


def show_run(run_id: str, settings: config.Settings | None = None) -> dict[str, Any]:
    """A run's stage timeline and outcome."""
    settings = settings_or_default(settings)
    run = Run.load(workdir_of(settings), run_id)
    from flakebot.pipeline.engine import stage_names

    try:
        names = stage_names(run.state["pipeline"])
    except RunError:
        names = list(run.state["stages"])
    stages = [{"name": n, **run.state["stages"].get(n, {"status": "pending"})} for n in names]
    return {
        "kind": "run",
        "id": run.id,
        "dir": str(run.dir),
        "pipeline": run.state["pipeline"],
        "need": run.state.get("need", ""),
        "status": run.status,
        "created": run.state.get("created"),
        "age_seconds": round(time.time() - run.state.get("created", time.time())),
        "stages": stages,
        "error": run.state.get("error"),
        "outputs": run.state["outputs"],
    }


def status(run_id: str, settings: config.Settings | None = None) -> dict[str, Any]:
    """What a caller polling a run needs: its status, the stage timeline and, once it succeeded, its result (a craft's manifest)."""
    settings = settings_or_default(settings)
    report = show_run(run_id, settings)
    stages = [{k: stage.get(k) for k in ("name", "status", "seconds", "attempts")} for stage in report["stages"]]
    answer = {
        "run_id": report["id"],
        "pipeline": report["pipeline"],
        "need": report["need"],
        "status": report["status"],
        "stages": stages,
    }
    answer["error"] = report["error"]
    if report["status"] in ("succeeded", "stopped"):
        answer["result"] = run_result(Run.load(workdir_of(settings), report["id"]))
    return answer


def resume(run_id: str, *, sink: EventSink = ignore, settings: config.Settings | None = None) -> dict[str, Any]:
    """Continue a run from its first unfinished stage; returns its result as `status` gives it."""
    return run_result(_resume(run_id, sink, settings))


def resume_report(run_id: str, *, sink: EventSink = ignore, settings: config.Settings | None = None) -> dict[str, Any]:
    """Continue a run (as `resume` does); its id, pipeline, status and stage outputs, and under "craft" the
    CraftResult of a craft that got as far as its instructions (else None)."""
    run = _resume(run_id, sink, settings)
    crafted = craft_result(run).to_dict() if run.state["pipeline"] == "craft" and run.output("instruct") else None
    return {
        "run_id": run.id,
        "status": run.state["status"],
        "outputs": run.state["outputs"],
        "pipeline": run.state["pipeline"],
        "craft": crafted,
    }


def _resume(run_id: str, sink: EventSink, settings: config.Settings | None) -> Run:
    from flakebot.pipeline import engine as pipeline

    settings = settings_or_default(settings)
    return pipeline.resume(workdir_of(settings), run_id, settings, sink)


def run_result(run: Run) -> dict[str, Any]:
    """A finished run's result: a craft's CraftResult, a package run's PackageOut, else its stage outputs."""
    if run.state["pipeline"] == "craft":
        return craft_result(run).to_dict()
    if run.state["pipeline"] == "package" and run.output("package"):
        return {**run.output("package"), "run_id": run.id}
    return {"run_id": run.id, "status": run.state.get("status"), "outputs": run.state["outputs"]}


def show(name: str, settings: config.Settings | None = None) -> dict[str, Any]:
    """A run (by id) or, failing that, a catalogued tool (by name)."""
    settings = settings_or_default(settings)
    try:
        return show_run(name, settings)
    except RunError as run_error:
        if run_error.details.get("reason") not in ("not_found", "bad_id"):  # NAME@VERSION is not a run id
            raise
    from flakebot.deliver import catalog

    try:
        return catalog.show_tool(name, settings)
    except CatalogError as exc:
        if exc.details.get("reason") == "damaged":  # the tool exists: say what is wrong with it
            raise
        raise RunError(
            f"no run or tool named '{name}'", fix="list them with 'flakebot runs' and 'flakebot list'"
        ) from None


def list_runs(settings: config.Settings | None = None) -> list[dict[str, Any]]:
    """Every readable run, newest first: id, status, pipeline, need, created."""
    from flakebot.pipeline.run import list_runs as runs

    keys = ("pipeline", "need", "created")
    return [
        {"id": r.id, "status": r.status, **{k: r.state.get(k) for k in keys}}
        for r in runs(workdir_of(settings_or_default(settings)))
    ]


def remove_runs(run_id: str | None, settings: config.Settings | None = None) -> list[Path]:
    """`flakebot clean RUN|--all`: remove one run directory (or all), releasing its forks and paths first."""
    from flakebot.pipeline.cleanup import clean_run
    from flakebot.pipeline.run import Run, find_run_dir, runs_dir
    from flakebot.source.remote import release_run_forks

    settings = settings_or_default(settings)
    workdir = workdir_of(settings)
    directories = (
        [find_run_dir(workdir, run_id)]
        if run_id
        else sorted(p for p in runs_dir(workdir).glob("*") if p.is_dir() and not p.is_symlink())
    )
    for directory in directories:
        try:
            run = Run.load(workdir, directory.name)
            release_run_forks(run, settings)
            clean_run(run)
        except FlakebotError as exc:  # a corrupt run is still removed; say why its resources were not read
            logger.warning("could not read %s before removing it: %s", directory, exc.one_line())
        remove_tree(directory)
    return directories
