"""Runs: show, status, resume, list and remove them."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from flakebot import config
from flakebot.commands.common import settings_or_default, workdir_of
from flakebot.commands.craft import craft_result
from flakebot.commands.table import Command, Hints, Param
from flakebot.deliver.results import compact_status
from flakebot.errors import CatalogError, FlakebotError, RunError, UsageError
from flakebot.events import EventSink, ignore
from flakebot.fsutil import remove_tree
from flakebot.pipeline.run import Run

logger = logging.getLogger(__name__)

MAX_WAIT_SECONDS = 50  # the longest `status` holds an answer: below a client's 60 s request timeout
SETTLE_SECONDS = 2.0  # a change answers once nothing more changed for this long
POLL_SECONDS = 0.5
ENDED = ("succeeded", "failed", "stopped", "interrupted")


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


def status(
    run_id: Annotated[str, Param("The run id craft returned.")],
    settings: config.Settings | None = None,
    *,
    wait_seconds: Annotated[
        int | None,
        Param(
            "Hold the answer until the run's stage changes or it ends, at most this many seconds (at most 50; keep it "
            "below your client's request timeout). Null or 0: answer at once.",
            doors=frozenset({"mcp", "api"}),
            least=0,
        ),
    ] = None,
) -> dict[str, Any]:
    """What a caller polling a run needs: its status, the stage timeline and, once it succeeded, its result (a craft's
    manifest). With `wait_seconds`, held (blocking) until the run ended or its status or stage changed and settled,
    at most that long (MAX_WAIT_SECONDS): an agent following a craft spends a few turns on it, not one per poll."""
    settings = settings_or_default(settings)
    seconds = max(0, min(wait_seconds or 0, MAX_WAIT_SECONDS))
    return _held(lambda: _status(run_id, settings), seconds)


def _status(run_id: str, settings: config.Settings) -> dict[str, Any]:
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


def _held(read: Callable[[], dict[str, Any]], seconds: float) -> dict[str, Any]:
    """`read()` (a run's status) once the run ended or its status or stage changed (and settled), or `seconds` passed."""
    report = read()
    deadline = time.monotonic() + seconds
    changed_at: float | None = None
    while report["status"] not in ENDED and time.monotonic() < deadline:
        if changed_at is not None and time.monotonic() - changed_at >= SETTLE_SECONDS:
            break
        time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        _stop_if_cancelled()
        before, report = _where(report), read()
        if _where(report) != before:
            changed_at = time.monotonic()
    return report


def _stop_if_cancelled() -> None:
    """End a hold whose caller went away: in a door's worker thread (the MCP server's), a call the client cancelled
    raises here, within a poll, instead of sleeping out its wait and keeping the server from ending."""
    try:
        import anyio.from_thread  # the MCP SDK's; the Python API works without it

        anyio.from_thread.check_cancelled()
    except (ImportError, RuntimeError):  # not in an AnyIO worker thread (the Python API's caller): nobody cancels it
        pass


def _where(report: dict[str, Any]) -> tuple[Any, ...]:
    """Where a run is: its status and each stage's status."""
    return (report.get("status"), tuple((s.get("name"), s.get("status")) for s in report.get("stages", [])))


def resume(run_id: str, *, sink: EventSink = ignore, settings: config.Settings | None = None) -> dict[str, Any]:
    """Continue a run from its first unfinished stage; returns its result as `status` gives it."""
    return run_result(_resume(run_id, sink, settings))


def resume_report(
    run_id: Annotated[
        str, Param("The run to continue (id or unique prefix).", positional=True, mcp_help="The run to continue.")
    ],
    *,
    sink: EventSink = ignore,
    settings: config.Settings | None = None,
) -> dict[str, Any]:
    """Continue a run from its first unfinished stage (after a crash, Ctrl-C or failure)."""
    # its id, pipeline, status and stage outputs; under "craft" the CraftResult of a craft that got as far as its
    # instructions (else None); under "result" its result as `resume` and `status` give it
    run = _resume(run_id, sink, settings)
    crafted = craft_result(run).to_dict() if run.state["pipeline"] == "craft" and run.output("instruct") else None
    return {
        "run_id": run.id,
        "status": run.state["status"],
        "outputs": run.state["outputs"],
        "pipeline": run.state["pipeline"],
        "craft": crafted,
        "result": run_result(run),
    }


def _check_resume(run_id: str, settings: config.Settings | None = None) -> None:
    """No such run, or one whose next stages would write a directory that cannot be written (a read-only
    catalog): refused before a job exists."""
    from flakebot.pipeline.engine import check_tenant, check_writes
    from flakebot.pipeline.run import Run

    settings = settings_or_default(settings)
    run = Run.load(settings.path("workdir"), run_id)
    check_tenant(run, settings)
    if run.status != "succeeded":
        check_writes(run, settings)


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


def show(
    name: Annotated[
        str,
        Param(
            "A run id (or unique prefix), or a catalogued tool: NAME or NAME@VERSION.",
            positional=True,
            mcp_help="A run id or a tool name.",
        ),
    ],
    settings: config.Settings | None = None,
) -> dict[str, Any]:
    """Show a run's stage timeline and outcome, or a catalogued tool's usage."""
    # a run (by id) or, failing that, a catalogued tool (by name)
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
        if exc.details.get("reason") != "unknown":  # a damaged tool or catalog: say what is wrong with it
            raise
        raise RunError(
            f"no run or tool named '{name}'", fix="list them with 'flakebot runs' and 'flakebot list'"
        ) from None


def list_runs(settings: config.Settings | None = None) -> list[dict[str, Any]]:
    """List runs, newest first, with status, age and need."""
    # every readable run: id, status, pipeline, need, created
    from flakebot.pipeline.run import list_runs as runs

    keys = ("pipeline", "need", "created")
    return [
        {"id": r.id, "status": r.status, **{k: r.state.get(k) for k in keys}}
        for r in runs(workdir_of(settings_or_default(settings)))
    ]


def remove_runs(
    run_id: Annotated[str | None, Param("The run whose directory to remove.", positional=True)] = None,
    settings: config.Settings | None = None,
    *,
    every: Annotated[bool, Param("Remove every run directory.", cli=("--all",))] = False,
) -> list[Path]:
    """Remove run directories and everything the runs created; a run still running is not removed (refused when
    named)."""
    # one run's directory (or every run's with `every`), its forks and paths released first
    from flakebot.pipeline.cleanup import clean_run
    from flakebot.pipeline.run import find_run_dir, runs_dir
    from flakebot.source.remote import release_run_forks

    if bool(run_id) == every:
        raise UsageError("give either a RUN id or --all", fix="run 'flakebot clean RUN' or 'flakebot clean --all'")
    settings = settings_or_default(settings)
    workdir = workdir_of(settings)
    directories = (
        [find_run_dir(workdir, run_id)]
        if run_id
        else sorted(p for p in runs_dir(workdir).glob("*") if p.is_dir() and not p.is_symlink())
    )
    removed = []
    for directory in directories:
        with contextlib.ExitStack() as held:
            run, busy = _still_driven(workdir, directory, held)
            if busy:  # its tree removed under it fails the run half-way
                if run_id:
                    # its reason tells a program this refusal from a run not found, which exits 4 too
                    raise RunError(
                        busy,
                        fix="stop it first (Ctrl-C where it runs, or kill that pid), then clean it",
                        reason="running",
                    )
                logger.warning("%s: not removed", busy)
                continue
            if run is not None:
                try:
                    release_run_forks(run, settings)
                    clean_run(run)
                except FlakebotError as exc:
                    logger.warning("could not release what %s holds before removing it: %s", directory, exc.one_line())
            remove_tree(directory)
            removed.append(directory)
    return removed


def _still_driven(workdir: Path, directory: Path, held: contextlib.ExitStack) -> tuple[Run | None, str | None]:
    """The run in `directory` (None when it cannot be loaded) and why it is not to be removed (None: it may be): its
    process alive, or another process holding its lock (a resume about to mark it running). Its lock, taken, is held
    in `held` until the tree is gone, so no process starts driving it meanwhile."""
    from flakebot.pipeline.run import running_pid

    try:
        run = Run.load(workdir, directory.name)
    except FlakebotError as exc:  # a corrupt run is still removed; say why its resources were not read
        pid = running_pid(directory)  # unless its state, as it is, names a live process (a newer flakebot's)
        if pid is not None:
            return None, f"run {directory.name} is still running (pid {pid})"
        logger.warning("could not read %s before removing it: %s", directory, exc.one_line())
        return None, None
    if run.status == "running":
        return run, f"run {run.id} is still running (pid {run.state.get('pid')})"
    try:
        held.enter_context(run.lock())
    except RunError:
        return run, f"run {run.id} is being driven by another process"
    except OSError as exc:  # its directory not writable (remove_tree makes it so): no process could lock it either
        logger.info("run %s not locked before removing it: %s", run.id, exc.strerror)
    return run, None


LONG = " Long: unless the request asks for progress, returns a run handle at once; follow it with `status`."

COMMANDS = [
    Command(
        "runs",
        list_runs,
        mcp="runs",
        hints=Hints("List runs", read_only=True, idempotent=True),
        data=lambda runs: {"runs": runs},
        mcp_description="List runs, newest first, with status and need.",
    ),
    Command(
        "show",
        show,
        mcp="show",
        hints=Hints("Show a run or tool", read_only=True, idempotent=True),
        mcp_description="Show a run (by id) or a catalogued tool (by name): its manifest and USAGE.md.",
    ),
    Command(
        "resume",
        resume_report,
        mcp="resume",
        hints=Hints("Resume a run", idempotent=True, open_world=True),
        long=True,
        changes_catalog=True,
        agent=lambda report: report["result"],
        working="resume {run_id}",
        check=_check_resume,
        mcp_description=f"Continue an interrupted or failed run from its first unfinished stage.{LONG}",
    ),
    Command(
        "clean",
        remove_runs,
        data=lambda removed: {"removed": [str(path) for path in removed]},
        text=lambda data: f"removed {len(data['removed'])} run(s)",
    ),
    Command(
        "status",
        status,
        mcp="status",
        hints=Hints("Status of a run", read_only=True, idempotent=True),
        agent=compact_status,
        doors=frozenset({"mcp", "api"}),
        mcp_description="A run's status (created, running, succeeded, failed, stopped or interrupted) and stage "
        "timeline; once it succeeded, its result (a craft's: the tool's name, how to call it, its usage). Follow a "
        "run handle with it, holding each answer with wait_seconds.",
    ),
]
