"""worker: a team's worker, crafting the jobs its PostgreSQL queue holds (flakebot.team.worker)."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from typing import Annotated, Any

from flakebot import config
from flakebot.commands.common import settings_or_default
from flakebot.commands.table import Command, Hints, Param
from flakebot.errors import RunError, UsageError
from flakebot.events import Event, EventSink

logger = logging.getLogger(__name__)

CLI = frozenset({"cli"})
JOB_MARK = "team-job.json"  # in a run's directory: the job (id and tenant) the run was started for
IN_FLIGHT_POLL = 5.0  # seconds between looks at a run crafting a job's need for another tenant


def worker(
    database: Annotated[
        str,
        Param(
            "The team's PostgreSQL URL (postgresql://USER@HOST/DB), without a password (refused: `ps` shows it). "
            "Empty: FLAKEBOT_DATABASE_URL, else libpq's PGHOST, PGUSER... and ~/.pgpass.",
            cli=("--database",),
            doors=CLI,
        ),
    ] = "",
    *,
    once: Annotated[bool, Param("Work one job, then exit.", cli=("--once",), doors=CLI)] = False,
    lease: Annotated[
        float,
        Param(
            "Seconds a job stays this worker's without a heartbeat (renewed every third of it), 3 to 86400.", doors=CLI
        ),
    ] = 60.0,
    name: Annotated[str, Param("This worker's name in the jobs it holds (default HOST:PID).", doors=CLI)] = "",
    settings: config.Settings | None = None,
) -> dict[str, Any]:
    """Work a team's queue: claim crafts from PostgreSQL and run each as 'flakebot craft' does, sandbox included.

    Workers sharing a work directory resume a killed worker's craft from its first unfinished stage."""
    from flakebot.team import dburl
    from flakebot.team.queue import check_lease
    from flakebot.team.worker import Worker, default_name

    check_lease(lease)
    settings = settings_or_default(settings)
    crafts = functools.partial(_craft_job, settings=settings)
    found = Worker(dburl.chosen(database) or "", crafts, name or default_name(), lease_seconds=lease, subreaper=True)
    return {"worker": found.name, "jobs": found.run(once=once)}


def _craft_job(job: dict[str, Any], sink: EventSink, settings: config.Settings) -> dict[str, Any]:
    """A claimed job's craft, as `flakebot craft` makes it (craft_request: its checks, stages and sandbox); a job
    whose run is recorded (its last worker was lost) resumes that run, when it is in this worker's workdir."""
    from flakebot.commands.craft import craft_request
    from flakebot.commands.runs import resume
    from flakebot.team.queue import job_tenant, tenant_request

    if job["kind"] != "craft":
        raise UsageError(f"this worker does not know jobs of kind {job['kind']!r}", fix="upgrade the worker")
    request = tenant_request(job["kind"], job["request"])  # a row anyone with the database's password may write
    settings = dataclasses.replace(settings, tenant=job_tenant(job["tenant"]))  # crafted into the tenant's catalog
    resumed = _own_run(job, settings)
    if resumed:
        _wait_for_driver(job, resumed, settings)
        logger.info("job %s: resuming its run %s", job["id"], resumed)
        return _published(resume(resumed, sink=sink, settings=settings), settings)
    if not request.fresh:
        _wait_for_in_flight(job["id"], request.need, settings)
    return _published(craft_request(request, sink=_marking(job, sink, settings), settings=settings).to_dict(), settings)


def _published(result: dict[str, Any], settings: config.Settings) -> dict[str, Any]:
    """The job's result, its tool published first into the tenant's signed cache when the tenant's own file names
    one (`publish_to`): signed with the tenant's key in this worker's catalog (`<catalog_dir>/tenants/T/keys/`,
    made on first use), never a key or a URL from the row (its request holds neither: queue.tenant_request). Only a
    tool of the tenant's own catalog (crafted, or answered from it), never the organisation's nor one installed from
    a shared catalog. A publication that fails fails the job (the tool stays in the tenant's catalog here; the same
    need queued again is answered from it and published again)."""
    from flakebot.deliver.catalog import Catalog
    from flakebot.deliver.publish import publish

    target = settings.tenant_setting("publish_to")
    name, version = str(result.get("name") or ""), str(result.get("version") or "")
    if not target or result.get("status") not in ("crafted", "cached") or not name:
        return result
    own = Catalog.open(settings).own_entry(name)
    if own is None:
        return result  # the organisation's tool: not the tenant's to sign
    if ((own.get("versions") or {}).get(version) or own).get("installed_from"):
        return result  # another catalog's signer vouched for it: not re-signed as the tenant's
    publication = publish(f"{name}@{version}" if version else name, target, settings)
    logger.info("published %s for tenant %s to %s", publication["store_path"], settings.tenant, target)
    kept = ("to", "store_path", "entry_path", "signed_by", "public_key")
    return {**result, "published": {key: publication.get(key) for key in kept}}


def _wait_for_driver(job: dict[str, Any], run_id: str, settings: config.Settings) -> None:
    """Wait while another process still drives the run (its worker stalled past the lease, then went on): resuming
    it now would fail the job that process is finishing. Bounded by what the run itself may take (its edit loop's
    wall time and a nix build); past that, resume says the run is busy and the job fails as before."""
    from flakebot.pipeline.run import Run

    run = Run.load(settings.path("workdir"), run_id)
    if not run.driven():
        return
    logger.warning("job %s: its run %s is still driven by another process; waiting for it to end", job["id"], run_id)
    deadline = time.monotonic() + settings.max_wall_seconds + settings.nix_build_timeout
    while run.driven() and time.monotonic() < deadline:
        time.sleep(1)


def _marking(job: dict[str, Any], sink: EventSink, settings: config.Settings) -> EventSink:
    """`sink`, and as the job's run starts, the job written into the run's directory (JOB_MARK): what says later
    that this run is this job's to resume."""
    from flakebot.pipeline.run import find_run_dir

    def marked(event: Event) -> None:
        if event.kind == "run_started":
            mark = find_run_dir(settings.path("workdir"), event.run_id) / JOB_MARK
            mark.write_text(json.dumps(_job_key(job)))
        sink(event)

    return marked


def _job_key(job: dict[str, Any]) -> dict[str, Any]:
    return {"job": int(job["id"]), "tenant": str(job["tenant"])}


def _own_run(job: dict[str, Any], settings: config.Settings) -> str | None:
    """The run a job's row names when it is this job's to resume: that exact run (not a prefix) in this worker's
    workdir, marked as this job's when it started. A row names any run its writer likes: another job's run (another
    tenant's) is never resumed, its result would land in this job's row; the job is crafted afresh instead."""
    from flakebot.pipeline.run import find_run_dir

    run_id = job["run_id"]
    if not run_id:
        return None
    try:
        directory = find_run_dir(settings.path("workdir"), str(run_id))
        mark = json.loads((directory / JOB_MARK).read_text())
    except (RunError, OSError, ValueError):
        mark, directory = None, None
    if directory is None or directory.name != run_id or mark != _job_key(job):
        logger.warning("job %s: its run %s is not this job's run in this workdir; crafting afresh", job["id"], run_id)
        return None
    return str(run_id)


def _wait_for_in_flight(job_id: int, need: str, settings: config.Settings) -> None:
    """Wait while another run crafts the same need (another tenant's job: needs join only within a tenant), so that
    the catalog answers this job once that run ends, instead of craft's refusal, which names the other run (a run
    id the job's tenant may not see) and fails the job because of another tenant's work."""
    from flakebot.commands.craft import in_flight

    waited = None
    while (run_id := in_flight(need, settings, any_tenant=True)) is not None:
        if run_id != waited:  # the admin's log says why a job stays running without a run of its own
            logger.warning("job %s waits for the run crafting its need (%s)", job_id, run_id)
            waited = run_id
        time.sleep(IN_FLIGHT_POLL)


COMMANDS = [Command("worker", worker, doors=CLI, hints=Hints("Work a team's queue", open_world=True))]
