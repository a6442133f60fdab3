"""worker: a team's worker, crafting the jobs its PostgreSQL queue holds (flakebot.team.worker)."""

from __future__ import annotations

import functools
import logging
import time
from typing import Annotated, Any

from flakebot import config
from flakebot.commands.common import settings_or_default
from flakebot.commands.table import Command, Hints, Param
from flakebot.errors import RunError, UsageError
from flakebot.events import EventSink

logger = logging.getLogger(__name__)

CLI = frozenset({"cli"})
IN_FLIGHT_POLL = 5.0  # seconds between looks at a run crafting a job's need for another tenant


def worker(
    database: Annotated[
        str,
        Param(
            "The team's PostgreSQL URL (postgresql://USER@HOST/DB). Empty: libpq's PGHOST, PGUSER... and ~/.pgpass, "
            "which keep a password off the command line.",
            cli=("--database",),
            doors=CLI,
        ),
    ] = "",
    *,
    once: Annotated[bool, Param("Work one job, then exit.", cli=("--once",), doors=CLI)] = False,
    lease: Annotated[
        float,
        Param("Seconds a job stays this worker's without a heartbeat (renewed every third of it).", doors=CLI),
    ] = 60.0,
    name: Annotated[str, Param("This worker's name in the jobs it holds (default HOST:PID).", doors=CLI)] = "",
    settings: config.Settings | None = None,
) -> dict[str, Any]:
    """Work a team's queue: claim crafts from PostgreSQL and run each as 'flakebot craft' does, sandbox included.

    Workers sharing a work directory resume a killed worker's craft from its first unfinished stage."""
    from flakebot.team.worker import Worker, default_name

    if lease < 3:
        raise UsageError(f"--lease {lease:g} is too short to renew", fix="pass --lease 3 or more (seconds)")
    settings = settings_or_default(settings)
    crafts = functools.partial(_craft_job, settings=settings)
    found = Worker(database, crafts, name or default_name(), lease_seconds=lease)
    return {"worker": found.name, "jobs": found.run(once=once)}


def _craft_job(job: dict[str, Any], sink: EventSink, settings: config.Settings) -> dict[str, Any]:
    """A claimed job's craft, as `flakebot craft` makes it (craft_request: its checks, stages and sandbox); a job
    whose run is recorded (its last worker was lost) resumes that run, when it is in this worker's workdir."""
    from flakebot.commands.craft import craft_request
    from flakebot.commands.runs import resume
    from flakebot.pipeline.request import RunRequest
    from flakebot.pipeline.run import find_run_dir

    if job["kind"] != "craft":
        raise UsageError(f"this worker does not know jobs of kind {job['kind']!r}", fix="upgrade the worker")
    if job["run_id"]:
        try:
            find_run_dir(settings.path("workdir"), job["run_id"])
        except RunError:
            logger.warning("job %s: its run %s is not in this workdir; crafting afresh", job["id"], job["run_id"])
        else:
            logger.info("job %s: resuming its run %s", job["id"], job["run_id"])
            return resume(job["run_id"], sink=sink, settings=settings)
    request = RunRequest.from_dict(job["request"])
    if not request.fresh:
        _wait_for_in_flight(job["id"], request.need, settings)
    return craft_request(request, sink=sink, settings=settings).to_dict()


def _wait_for_in_flight(job_id: int, need: str, settings: config.Settings) -> None:
    """Wait while another run crafts the same need (another tenant's job: needs join only within a tenant), so that
    the catalog answers this job once that run ends, instead of craft's refusal, which names the other run (a run
    id the job's tenant may not see) and fails the job because of another tenant's work."""
    from flakebot.commands.craft import in_flight

    waited = None
    while (run_id := in_flight(need, settings)) is not None:
        if run_id != waited:  # the admin's log says why a job stays running without a run of its own
            logger.warning("job %s waits for the run crafting its need (%s)", job_id, run_id)
            waited = run_id
        time.sleep(IN_FLIGHT_POLL)


COMMANDS = [Command("worker", worker, doors=CLI, hints=Hints("Work a team's queue", open_world=True))]
