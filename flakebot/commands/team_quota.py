"""quota: a team tenant's quotas in its PostgreSQL queue (crafts in flight, crafts and CPU-seconds per day, its
share of the workers), shown with what it used today, and set by the team's admin. Command line and API only: an
agent never sets a quota (no MCP tool)."""

from __future__ import annotations

from typing import Annotated, Any

from flakebot import config
from flakebot.commands.table import Command, Param
from flakebot.errors import UsageError
from flakebot.team.queue import MAX_QUOTA

CLI_API = frozenset({"cli", "api"})


def quota(
    tenant: Annotated[str, Param("The tenant (as `token add --tenant` names it).", positional=True)],
    *,
    database: Annotated[
        str,
        Param(
            "The team's PostgreSQL URL, without a password (refused: `ps` shows it). Empty: FLAKEBOT_DATABASE_URL, "
            "else libpq's PGHOST, PGUSER... and ~/.pgpass.",
            cli=("--database",),
        ),
    ] = "",
    max_in_flight: Annotated[
        int | None,
        Param("Crafts it may have queued or running at once.", cli=("--max-in-flight",), least=0, most=MAX_QUOTA),
    ] = None,
    max_per_day: Annotated[
        int | None, Param("Crafts it may queue per UTC day.", cli=("--max-per-day",), least=0, most=MAX_QUOTA)
    ] = None,
    cpu_seconds: Annotated[
        int | None,
        Param(
            "CPU-seconds its crafts may take per UTC day, as its workers count them (0: no more crafts today; "
            "--no-cpu-bound lifts it).",
            cli=("--cpu-seconds",),
            least=0,
            most=MAX_QUOTA,
        ),
    ] = None,
    no_cpu_bound: Annotated[bool, Param("Lift the CPU-seconds bound.", cli=("--no-cpu-bound",))] = False,
    shares: Annotated[
        int | None,
        Param("Its share of the workers against other tenants'.", cli=("--shares",), least=1, most=MAX_QUOTA),
    ] = None,
    settings: config.Settings | None = None,
) -> dict[str, Any]:
    """Show a tenant's quotas and what it used today; with options, set those first (the others stay)."""
    from flakebot.team import db, dburl, queue
    from flakebot.team.tokens import check_tenant

    if no_cpu_bound and cpu_seconds is not None:
        raise UsageError("--cpu-seconds and --no-cpu-bound cannot be combined", fix="pass one of them")
    check_tenant(tenant)
    changes: dict[str, int | None] = {
        key: value
        for key, value in (("max_in_flight", max_in_flight), ("max_per_day", max_per_day), ("shares", shares))
        if value is not None
    }
    if no_cpu_bound or cpu_seconds is not None:
        changes["max_cpu_seconds_per_day"] = cpu_seconds  # None: --no-cpu-bound
    with db.connect(dburl.chosen(database) or "") as conn:
        if changes:  # only what was given: another admin's change meanwhile stays
            queue.change_quota(conn, tenant, changes)
        found = {**queue.quota_of(conn, tenant), **({"changed": True} if changes else {})}
    return found


def _quota_text(data: dict[str, Any]) -> str:
    used, cpu = data["used"], data["max_cpu_seconds_per_day"]
    return (
        f"tenant {data['tenant']}{' (changed)' if data.get('changed') else '' if data['known'] else ' (no job yet: the defaults)'}\n"
        f"  in flight  {used['in_flight']} of {data['max_in_flight']}\n"
        f"  today      {used['today']} of {data['max_per_day']} crafts, "
        f"{used['cpu_seconds']:g} CPU-seconds of {cpu if cpu is not None else 'no bound'}\n"
        f"  shares     {data['shares']}"
    )


COMMANDS = [Command("quota", quota, doors=CLI_API, text=_quota_text)]
