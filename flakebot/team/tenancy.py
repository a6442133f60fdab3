"""Whose is a detached job of the team front: its tenant and principal, recorded beside its journal when it starts
(mcp-jobs/ID.owner.json), so a tenant sees only its own tasks and the runs its jobs made.

A run made any other way (the CLI, `flakebot mcp`, before this record existed) belongs to no tenant: no token sees
it. The queue's jobs carry their tenant in their row (flakebot.team.frontqueue.FrontQueue.runs_of).
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

from flakebot.fsutil import atomic_write_json
from flakebot.team.tokens import Principal

logger = logging.getLogger(__name__)

OWNER = ".owner.json"


def record(directory: Path, job_id: str, principal: Principal) -> None:
    """Say that job `job_id` (its journal's stem) was started by `principal`."""
    owner = {"format": 1, "tenant": principal.tenant, "principal": principal.name, "principal_id": principal.id}
    atomic_write_json(directory / f"{job_id}{OWNER}", owner)


def tenant_of(directory: Path, job_id: str) -> str | None:
    """The tenant of a job's record, None when it has none (not started by the team front) or it is unreadable."""
    try:
        owner = json.loads((directory / f"{job_id}{OWNER}").read_text())
    except (OSError, ValueError):
        return None
    tenant = owner.get("tenant") if isinstance(owner, dict) else None
    return tenant if isinstance(tenant, str) else None


def runs_of(directory: Path, tenant: str) -> set[str]:
    """The runs the tenant's detached jobs work in: the run id each job's journal names first."""
    runs = set()
    for path in directory.glob(f"*{OWNER}") if directory.is_dir() else []:
        job_id = path.name.removesuffix(OWNER)
        if tenant_of(directory, job_id) != tenant:
            continue
        run_id = _first_run(directory / f"{job_id}.jsonl")
        if run_id:
            runs.add(run_id)
    return runs


def _first_run(journal: Path) -> str | None:
    try:
        lines = journal.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:  # the last line, half written
            break
        if isinstance(event, dict) and isinstance(event.get("run_id"), str) and event["run_id"]:
            return str(event["run_id"])
    return None


def started_for(workdir: Path, run_id: str, tenant: str) -> bool:
    """Whether the run a queued job's row names was started for `tenant` (its state.json says so, as a worker
    crafting for the row's tenant writes it): a row is anyone's with the database's password, and its run id could
    name another tenant's run here. A run this machine lacks, or one of another shape, is nothing to read: False."""
    from flakebot.pipeline.run import RUN_ID

    if not RUN_ID.fullmatch(run_id):
        return False
    try:
        return _run_tenant(str(workdir), run_id) == tenant
    except LookupError:
        return False


RUNS_KEPT = 4096  # runs whose tenant a front remembers (the least recently asked forgotten first)


@functools.lru_cache(maxsize=RUNS_KEPT)
def _run_tenant(workdir: str, run_id: str) -> str:
    """The tenant a run's state.json names, read once per run while it is among the RUNS_KEPT last asked (a front
    answers status and runs from many runs; a run's tenant is written as it starts and never changes). LookupError
    when it names none yet or cannot be read: not remembered, so a run that starts later is read again."""
    from flakebot.pipeline.run import runs_dir

    try:
        state = json.loads((runs_dir(Path(workdir)) / run_id / "state.json").read_text())
    except (OSError, ValueError):
        raise LookupError(run_id) from None
    if not isinstance(state, dict) or not isinstance(state.get("tenant"), str):
        raise LookupError(run_id)
    return str(state["tenant"])
