"""Whose is a service started on the team front's machine: the services one tenant may see and act on.

Services run under one name per machine (workdir/services/NAME: their supervisors, ports and state), whichever
catalog their program came from. The `up` that starts a service records the tenant it ran for in its launch record
(services/owner.py: the front's service_up runs with the caller's tenant, and so do the starts of what the service
needs that it makes; the same lock that serializes the start decides which of two tenants' ups takes a name). A
started service is the caller's when that tenant is the caller's; one without a tenant (started by the admin's CLI)
is everyone's who reads the organisation's catalog when the program it runs is one of that catalog's versions of its
name, and nobody's otherwise. A service never started is left to the verb, which reads the caller's own catalog. The
front answers a service verb about a service not the caller's as the verb answers where no service was ever started
(mcp/front.py), refuses `service_up` of a name the caller's catalog holds but another's service took, and
`services` lists the caller's only.
"""

from __future__ import annotations

import logging
from typing import Any

from flakebot.config import Settings
from flakebot.errors import FlakebotError, UsageError

logger = logging.getLogger(__name__)

NAMED = frozenset({"service_down", "service_logs", "service_request", "service_rollback"})  # act on a started one
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


def owner_of(settings: Settings, name: str) -> str | None:
    """The tenant whose process started service `name` (its launch record), None when none did or it never ran."""
    from flakebot.services.layout import ServiceDir
    from flakebot.services.owner import tenant_of

    where = ServiceDir.of(name, settings)
    return tenant_of(where.read_json(where.launch_file))


def refuse_up(name: str) -> UsageError:
    """`service_up` of a name another catalog's service holds on this machine (running services share one name)."""
    from flakebot.services.owner import taken

    return taken(name)
