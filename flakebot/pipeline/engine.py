"""The ordered stages of a run and the machinery that drives them.

A stage is a plain function `stage(ctx) -> Out` (a dataclass from flakebot.stages.outputs, or a dict);
its `to_dict()` is stored under state["outputs"][name] and state.json is rewritten atomically, and synced, as it
finishes (in the one write that starts the next stage). An output with "end_run": true finishes the run there (only
`always` stages still run). A finished stage is skipped on resume, so a crash costs at most the stage it interrupted.
Stages marked `always` (clean) also run after a failure or Ctrl-C.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from flakebot.config import Settings
from flakebot.errors import FlakebotError, Interrupted, RunError, UsageError
from flakebot.events import Event, EventSink, ignore
from flakebot.pipeline.request import RunRequest
from flakebot.pipeline.run import Run, own_process
from flakebot.redact import RedactFilter, redact, redact_text

logger = logging.getLogger(__name__)

T = TypeVar("T")  # a stage output type from flakebot.stages.outputs (it has STAGE and from_dict)

# Pipelines by name; a name may also be a "module:attribute" import path to a list of Stages.
PIPELINES = {
    "craft": "flakebot.stages:CRAFT",
    "package": "flakebot.stages:PACKAGE",
}


@dataclass(frozen=True)
class Stage:
    """One named step of a pipeline."""

    name: str
    func: Callable[[StageContext], Any]  # returns a stage output (outputs.py), a dict, or None
    always: bool = False  # runs even after an earlier stage failed (cleanup)
    # For a finished stage: is what it made still there? When not (clean removed it after a failure or
    # Ctrl-C), a resume runs the stage again, and every stage after it, since they built on its work.
    valid: Callable[[Run], bool] | None = None
    # The settings naming directories it writes besides the run's (catalog_dir), for this run: checked writable
    # before a resume drives any stage, so a read-only catalog is said at once, not after the build before it.
    writes: Callable[[Run], tuple[str, ...]] | None = None


@dataclass
class StageContext:
    """What a stage sees: its run, the settings, and a way to report progress."""

    run: Run
    settings: Settings
    stage: str
    sink: EventSink = ignore
    failed: FlakebotError | None = None  # set for `always` stages running after a failure
    services: dict[str, Any] = field(default_factory=dict)

    def progress(self, message: str, **data: Any) -> None:
        """Report progress within the stage (the CLI shows the latest message)."""
        logger.info("%s: %s", self.stage, message)
        _emit(self.run, self.sink, Event("progress", self.run.id, self.stage, message, data))

    def output(self, stage: str) -> dict[str, Any]:
        """An earlier stage's output as stored (a dict); prefer `get` with the stage's Out type."""
        return self.run.output(stage)

    def get(self, out: type[T]) -> T:
        """An earlier stage's output, typed: ctx.get(AcquireOut)."""
        return out.from_dict(self.run.output(out.STAGE))  # type: ignore[attr-defined, no-any-return]

    @property
    def request(self) -> RunRequest:
        """What the caller asked of this run (flakebot.pipeline.request)."""
        return self.run.request

    def pin_setting(self, key: str, value: Any) -> None:
        """Fix a setting for the rest of the run, resumes included (e.g. the registry search resolved)."""
        self.run.state["settings"][key] = value
        self.run.save()


def run_settings(run: Run, settings: Settings) -> Settings:
    """`settings` with what the run pinned: the flags it started with and what earlier stages resolved
    (so a resume, or a later stage, sees the same values), and the tenant the run was started for (its catalog is
    the one it writes, whoever resumes it: the admin's resume of a tenant's run never catalogues into the
    organisation's catalog every tenant reads). Not the sandbox mode: the caller's current setting wins, so a resume
    runs unsandboxed only when the user says `off` now."""
    pinned = {**run.request.settings, **run.state["settings"], "tenant": run_tenant(run)}
    recorded = pinned.pop("sandbox", settings.sandbox)
    if recorded != settings.sandbox:
        logger.info("run %s recorded sandbox %s; the current setting %s applies", run.id, recorded, settings.sandbox)
    return dataclasses.replace(settings, **pinned)


def load_stages(pipeline: str) -> list[Stage]:
    target = PIPELINES.get(pipeline, pipeline)
    module_name, _, attr = target.partition(":")
    try:
        stages = getattr(importlib.import_module(module_name), attr or "STAGES")
    except (ImportError, AttributeError) as exc:
        raise RunError(f"unknown pipeline '{pipeline}' ({exc})", fix=f"use one of: {', '.join(PIPELINES)}") from None
    return list(stages)


def stage_names(pipeline: str) -> list[str]:
    return [stage.name for stage in load_stages(pipeline)]


def execute(run: Run, settings: Settings, sink: EventSink = ignore, stop_after: str | None = None) -> Run:
    """Drive `run` through its pipeline's stages, skipping finished ones. Raises on failure, naming the run."""
    try:
        return _drive(run, settings, sink, stop_after)
    except FlakebotError as exc:
        exc.run_id = exc.run_id or run.id  # so a caller can inspect or resume the run that failed
        raise


def _drive(run: Run, settings: Settings, sink: EventSink, stop_after: str | None) -> Run:
    stages = load_stages(run.state["pipeline"])
    names = [s.name for s in stages]
    if stop_after and stop_after not in names:
        raise UsageError(f"unknown stage '{stop_after}'", fix=f"use one of: {', '.join(names)}")
    with run.lock(), _run_log(run), _sigterm_as_interrupt() as stop:
        run.state.update(status="running", **own_process(), stop_after=stop_after)
        run.save()
        mode = run_settings(run, settings).sandbox
        _emit(
            run,
            sink,
            Event("run_started", run.id, data={"stages": names, "need": run.state.get("need", ""), "sandbox": mode}),
        )
        if mode == "off":
            logger.warning(
                "sandbox off (asked for): model-written code runs unisolated on this machine, with network and your files"
            )
        failure: FlakebotError | None = None
        stopped_early = False  # --stop-after: later stages wait for a resume
        done_early = False  # a stage said the run's work is done (e.g. an existing tool reused)
        stale = _first_stale(run, stages)
        ended: list[Event] = []  # a stage's end, written with the next write of state.json (_save)
        try:
            for index, stage in enumerate(stages):
                if stopped_early:
                    continue
                if failure is not None or done_early:
                    if stage.always:
                        _run_stage(run, settings, stage, sink, stop, ended, failed=failure)
                    continue
                if run.stage_status(stage.name) == "finished" and not stage.always and index < stale:
                    if ended:  # a stage ran before this finished one (its earlier run failed): its end first
                        _save(run, sink, ended)
                    _emit(run, sink, Event("stage_skipped", run.id, stage.name, "already finished"))
                else:
                    failure = _run_stage(run, settings, stage, sink, stop, ended)
                done_early = failure is None and bool(run.output(stage.name).get("end_run"))
                stopped_early = stop_after == stage.name and not done_early
            return _finish(run, sink, failure, stopped_early, ended)
        finally:
            if ended:  # an interrupt between two stages: the one that ended is still recorded
                _save(run, sink, ended)


def _first_stale(run: Run, stages: list[Stage]) -> int:
    """Index of the first finished stage whose work is gone (len(stages) if none): it and all later stages run again."""
    for index, stage in enumerate(stages):
        if stage.valid is not None and run.stage_status(stage.name) == "finished" and not stage.valid(run):
            logger.info("stage %s runs again: what it made was removed", stage.name)
            return index
    return len(stages)


def _finish(run: Run, sink: EventSink, failure: FlakebotError | None, stopped_early: bool, ended: list[Event]) -> Run:
    if failure is not None:
        run.state.update(
            status="interrupted" if isinstance(failure, Interrupted) else "failed", error=failure.to_dict()
        )
        _save(run, sink, ended)
        _emit(run, sink, Event("run_failed", run.id, failure.stage, failure.one_line(), failure.to_dict()))
        raise failure
    run.state.update(status="stopped" if stopped_early else "succeeded", error=None)
    _save(run, sink, ended)
    _emit(run, sink, Event("run_finished", run.id, data={"status": run.state["status"]}))
    return run


def _run_stage(
    run: Run,
    settings: Settings,
    stage: Stage,
    sink: EventSink,
    stop: threading.Event,
    ended: list[Event],
    failed: FlakebotError | None = None,
) -> FlakebotError | None:
    """Run one stage and record its outcome; returns the error that ended it, if any. A stage that finished leaves its
    end in `ended`: state.json gets it with the next stage's start, one durable write at the boundary, not two."""
    record = run.state["stages"].setdefault(stage.name, {})
    if failed is None and stop.is_set():  # stopped meanwhile (cleanup stages still run)
        return _interrupted(run, sink, stage.name, record, ended)
    record.update(status="running", started=time.time(), attempts=record.get("attempts", 0) + 1, error=None)
    # alone, a start lost to a machine's crash leaves the stage pending, run again as if running: not synced then
    _save(run, sink, ended, durable=False)
    _emit(run, sink, Event("stage_started", run.id, stage.name))
    ctx = StageContext(run, run_settings(run, settings), stage.name, sink, failed)
    try:
        output = _stored(stage.func(ctx))
    except FlakebotError as exc:
        exc.stage = exc.stage or stage.name
        return _stage_failed(run, sink, stage.name, record, exc, ended)
    except OSError as exc:  # the machine's trouble (a read-only catalog, a full disk): one line, the run resumable
        trouble = _host_trouble(exc, run)
        if trouble is None:
            raise
        trouble.stage = stage.name
        return _stage_failed(run, sink, stage.name, record, trouble, ended)
    except KeyboardInterrupt:
        return _interrupted(run, sink, stage.name, record, ended)
    if failed is None and stop.is_set():  # the interrupt was raised where it was swallowed (a __del__)
        return _interrupted(run, sink, stage.name, record, ended)
    record.update(status="finished", finished=time.time())
    record["seconds"] = round(record["finished"] - record["started"], 3)
    run.state["outputs"][stage.name] = output
    ended.append(Event("stage_finished", run.id, stage.name, data={"seconds": record["seconds"]}))
    return None


def _save(run: Run, sink: EventSink, ended: list[Event], *, durable: bool = True) -> None:
    """Write state.json, then announce the stage ends it is the first to hold (held back till then: whoever reads
    state.json on a stage_finished finds that stage finished there). Durable when it holds one: a resume skips it."""
    run.save(durable=durable or bool(ended))
    for event in ended:
        _emit(run, sink, event)
    ended.clear()


def _interrupted(run: Run, sink: EventSink, stage: str, record: dict[str, Any], ended: list[Event]) -> FlakebotError:
    record.setdefault("started", time.time())
    stopped = Interrupted("interrupted", fix=f"continue with 'flakebot resume {run.id}'", stage=stage)
    return _stage_failed(run, sink, stage, record, stopped, ended)


def _host_trouble(exc: OSError, run: Run) -> FlakebotError | None:
    """A stage's OSError as the HostError it is (a read-only file system, a full disk, a denied write), naming the
    resume that continues the run once it is mended; None for any other OSError (a bug: its traceback)."""
    import errno

    from flakebot import preflight
    from flakebot.errors import HostError

    trouble = preflight.host_error(exc)
    if trouble is None and exc.errno in (errno.EACCES, errno.EPERM):
        trouble = HostError(f"permission denied: cannot write {exc.filename or 'a file flakebot writes'}")
    if trouble is not None:
        trouble.fix = f"make it writable (or free space), then 'flakebot resume {run.id}'"
    return trouble


def _stored(output: Any) -> dict[str, Any]:
    """What state.json keeps of a stage's output."""
    if output is None:
        return {}
    return dict(output) if isinstance(output, dict) else dict(output.to_dict())


def _stage_failed(
    run: Run, sink: EventSink, name: str, record: dict[str, Any], exc: FlakebotError, ended: list[Event]
) -> FlakebotError:
    record.update(status="failed", finished=time.time(), error=exc.to_dict())
    record["seconds"] = round(record["finished"] - record["started"], 3)
    _save(run, sink, ended)
    logger.info("stage %s failed: %s", name, exc.one_line())  # the caller reports it; run.log keeps it
    _emit(run, sink, Event("stage_failed", run.id, name, exc.one_line(), exc.to_dict()))
    return exc


def _emit(run: Run, sink: EventSink, event: Event) -> None:
    event = dataclasses.replace(event, message=redact_text(event.message), data=redact(event.data))
    with open(run.events_path, "a") as handle:
        handle.write(json.dumps(event.to_dict(), default=str) + "\n")
    sink(event)


@contextmanager
def _run_log(run: Run) -> Iterator[None]:
    """Send the library's log records to the run's run.log while it is driven."""
    handler = logging.FileHandler(run.log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactFilter())
    handler.setLevel(logging.DEBUG)
    root = logging.getLogger("flakebot")
    previous = root.level
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > logging.DEBUG:
        root.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)
        handler.close()


@contextmanager
def _sigterm_as_interrupt() -> Iterator[threading.Event]:
    """SIGTERM ends a run like Ctrl-C: the stage is marked interrupted and clean runs. The event it gives is set when
    SIGTERM came: the KeyboardInterrupt raised where the signal lands can fall inside a __del__ (a Popen collected
    meanwhile) that swallows it, and the stage then ran on to its end; the event makes the stop stick (the running
    stage is marked interrupted when it returns, and no later one starts)."""
    stop = threading.Event()
    previous = signal.getsignal(signal.SIGTERM)

    def raise_interrupt(signum: int, frame: Any) -> None:
        stop.set()
        if callable(previous):  # an outer handler (a team worker's) is told too: it tells a cancel's from its stop
            previous(signum, frame)
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGTERM, raise_interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield stop
        return
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)


def start(
    pipeline: str,
    workdir: Path,
    settings: Settings,
    request: RunRequest | None = None,
    sink: EventSink = ignore,
    stop_after: str | None = None,
) -> Run:
    """Create a run for `pipeline` asking `request` and drive it."""
    names = stage_names(pipeline)  # fail before creating a directory for an unknown pipeline or stage
    if stop_after and stop_after not in names:
        raise UsageError(f"unknown stage '{stop_after}'", fix=f"use one of: {', '.join(names)}")
    run = Run.create(workdir, pipeline, request, tenant=settings.tenant)
    return execute(run, settings, sink, stop_after)


def resume(
    workdir: Path, run_id: str, settings: Settings, sink: EventSink = ignore, stop_after: str | None = None
) -> Run:
    """Continue a run from its first unfinished stage."""
    run = Run.load(workdir, run_id)
    check_tenant(run, settings)
    if run.status == "succeeded":
        return run
    check_writes(run, settings)
    return execute(run, settings, sink, stop_after)


def run_tenant(run: Run) -> str:
    """The tenant a run was started for ("" the organisation's or a lone user's; a run made before runs recorded
    theirs is the organisation's)."""
    tenant = run.state.get("tenant") or ""
    return tenant if isinstance(tenant, str) else ""


def check_tenant(run: Run, settings: Settings) -> None:
    """A process of one tenant (the `tenant` setting) resumes only that tenant's runs: another's would work, and
    catalogue, for a tenant the caller is not. The admin (no tenant) resumes anyone's, into the run's own catalog."""
    if settings.tenant and settings.tenant != run_tenant(run):
        raise RunError(
            f"run {run.id} was not started for tenant {settings.tenant}",
            fix="resume it without the tenant setting (the admin's CLI): it catalogues into its own tenant's catalog",
        )


def check_writes(run: Run, settings: Settings) -> None:
    """The run's own directory (its lock and state.json are written first) and the directories its unfinished stages
    will write (Stage.writes) can be written, before any stage runs (HostError otherwise; the run is left as it was,
    to resume once they can)."""
    from flakebot import preflight

    fix = f"make {run.dir} writable, then 'flakebot resume {run.id}'"
    preflight.check_writable_dir(run.dir, f"run {run.id}'s directory", fix=fix)
    for stage in load_stages(run.state["pipeline"]):
        if stage.writes is not None and run.stage_status(stage.name) != "finished":
            for setting in stage.writes(run):
                preflight.check_writable_dir(settings.path(setting), setting)
