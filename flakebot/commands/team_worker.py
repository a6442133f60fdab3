"""worker: a team's worker, crafting the jobs its PostgreSQL queue holds (flakebot.team.worker)."""

from __future__ import annotations

from typing import Annotated, Any

from flakebot import config
from flakebot.commands.common import settings_or_default
from flakebot.commands.table import Command, Hints, Param
from flakebot.errors import UsageError

CLI = frozenset({"cli"})


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
    found = Worker(database, settings_or_default(settings), name or default_name(), lease_seconds=lease)
    return {"worker": found.name, "jobs": found.run(once=once)}


COMMANDS = [Command("worker", worker, doors=CLI, hints=Hints("Work a team's queue", open_world=True))]
