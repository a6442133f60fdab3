"""Whose is a service started on the team front's machine: the services one tenant may see and act on.

Services run under one name per machine (workdir/services/NAME: their supervisors, ports and state), whichever
catalog their program came from. The front records the tenant whose token started a service
(workdir/team/service-owners/NAME.json, written when its `service_up` started it). A started service is the caller's
when that tenant is the caller's; a service it needs, never started here before, is recorded
as that tenant's too (it runs for that tenant's service, from its catalog). One without a record (started by the
admin's CLI, or before owners were recorded) is everyone's who reads the organisation's catalog when the program it runs is one of that catalog's
versions of its name, and nobody's otherwise. A service never started is left to the verb, which reads the caller's
own catalog. The front answers a service verb about a service not the caller's as the verb answers where no service
was ever started (mcp/front.py), refuses `service_up` of a name the caller's catalog holds but another's service
took, and `services` lists the caller's only.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.errors import FlakebotError, UsageError
from flakebot.fsutil import atomic_write_json

logger = logging.getLogger(__name__)

NAMED = frozenset({"service_down", "service_logs", "service_request", "service_rollback"})  # act on a started one
OWNERS = "service-owners"  # beneath the front's team/ directory: NAME.json, who started service NAME
NOWHERE = "no-services"  # beneath the front's team/ directory: a workdir where no service was ever started


def started_program(settings: Settings, name: str) -> str | None:
    """The store path service `name` was started with (its launch record), None when it was never started here."""
    from flakebot.services.identity import program_of
    from flakebot.services.layout import ServiceDir

    where = ServiceDir.of(name, settings)
    launch = where.read_json(where.launch_file)
    return str(program_of(launch).get("store_path") or "") if launch else None


def is_callers(settings: Settings, name: str, tenant: str) -> bool:
    """Whether service `name` is `tenant`'s (`settings`: its calls'), or was never started here: see the module
    docstring. A name that can name no service is left to the verb's own check (True)."""
    import dataclasses

    from flakebot.deliver.catalog import Catalog, tenant_root

    try:
        started = started_program(settings, name)
    except UsageError:  # not a service name at all: the verb says so itself
        return True
    if started is None:
        return True
    owner = owner_of(settings, name)
    if owner is not None:
        return owner == tenant
    if settings.tenant and Catalog(tenant_root(settings, settings.tenant)).entry(name) is not None:
        return False  # the caller's own entry shadows the organisation's: its view does not hold the started program
    entry = Catalog.open(dataclasses.replace(settings, tenant="")).entry(name)  # the organisation's catalog alone
    return entry is not None and started in {str(v.get("store_path") or "") for v in entry["versions"].values()}


def needed(settings: Settings, name: str) -> list[str]:
    """The services `name` needs, directly or through others, as `up` would start them; [] when the needs cannot be
    read (the verb then says what is wrong)."""
    from flakebot.services import needs

    try:
        return needs.start_order(name, needs.declared(name, settings), settings)
    except FlakebotError:
        return []


def foreign_need(settings: Settings, order: list[str], tenant: str) -> str | None:
    """A service of `order` (what a service needs) that runs here and is not `tenant`'s: `up` would hand the service
    its port (FLAKEBOT_<NEED>_URL), another tenant's data. None when there is none."""
    try:
        return next((need for need in order if not is_callers(settings, need, tenant)), None)
    except FlakebotError:
        return None


def never_started(settings: Settings, names: list[str]) -> list[str]:
    """Those of `names` never started on this machine: the ones a service_up starting them makes its caller's (a
    need started for a tenant's service is that tenant's, as the service is)."""
    fresh = []
    for name in names:
        try:
            if started_program(settings, name) is None:
                fresh.append(name)
        except UsageError:  # no service name: up refuses it
            continue
    return fresh


def refuse_need(name: str, need: str) -> UsageError:
    """`service_up` of a service needing another catalog's service running on this machine."""
    return UsageError(
        f"service {name} needs {need}, which runs on this machine as a service of another catalog",
        fix=f"package a service of your own under another name than {need}, and make {name} need that",
    )


def callers_services(settings: Settings, listed: list[dict[str, Any]], tenant: str) -> list[dict[str, Any]]:
    """`services`' statuses, only the caller's."""
    kept = []
    for status in listed:
        try:
            if is_callers(settings, str(status.get("name") or ""), tenant):
                kept.append(status)
        except FlakebotError as exc:  # an unreadable record: not shown to a tenant (the admin's CLI lists it)
            logger.info("service %s not listed for a tenant: %s", status.get("name"), exc.one_line())
    return kept


def _owner_file(settings: Settings, name: str) -> Path:
    from flakebot.services.layout import checked_name

    return settings.path("workdir") / "team" / OWNERS / f"{checked_name(name)}.json"


def owner_of(settings: Settings, name: str) -> str | None:
    """The tenant whose token started service `name` through the front, None when none did (or it is unreadable)."""
    try:
        owner = json.loads(_owner_file(settings, name).read_text())
    except (OSError, ValueError):
        return None
    tenant = owner.get("tenant") if isinstance(owner, dict) else None
    return tenant if isinstance(tenant, str) else None


def record_owner(settings: Settings, name: str, tenant: str) -> None:
    """Say that `tenant`'s token started service `name` (its service_up found it, or a service it needs, never
    started)."""
    path = _owner_file(settings, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"format": 1, "tenant": tenant})


def refuse_up(name: str) -> UsageError:
    """`service_up` of a name another catalog's service holds on this machine (running services share one name)."""
    return UsageError(
        f"service {name} is taken on this machine by a service of another catalog",
        fix="package your service under another name ('flakebot package-service PATH --name NAME')",
    )
