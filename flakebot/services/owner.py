"""Whose a service started on this machine is: the tenant its launch record names (team mode: the `tenant` setting
of the process that started it; "" the organisation's, the admin's or a lone user's).

Services run under one name per machine, whichever catalog their program came from. The tenant is written into
launch.json by the `up` that starts the service, under the service's control lock, so two tenants starting one name
at once cannot both take it: the second `up` finds the first's launch and is refused here, as any tenant's `up` of a
name another tenant's service holds (running or stopped) is, and so is a start that would need another tenant's
service. Only a first start of a tenant's own service records its starter: an organisation's service stays everyone's
whoever starts it, and a later start keeps whose the service (and its kept state) was. What a tenant may see of services started without a tenant is the team front's rule (mcp/tenantservices.py).
"""

from __future__ import annotations

from typing import Any

from flakebot.config import Settings
from flakebot.errors import UsageError

TENANT = "tenant"  # launch.json's key


def tenant_of(launch: dict[str, Any]) -> str | None:
    """The tenant a launch record names; None when it names none (the admin's start, or one made before launches
    recorded their tenant)."""
    tenant = launch.get(TENANT)
    return tenant if isinstance(tenant, str) and tenant else None


def may_take(name: str, launch: dict[str, Any], settings: Settings) -> None:
    """A process of a tenant (`settings.tenant`) starts service `name` over its last launch `launch` only when no
    other tenant's start recorded it (taken: one line saying so, never its state or port)."""
    owner = tenant_of(launch)
    if settings.tenant and owner is not None and owner != settings.tenant:
        raise taken(name)


def recorded(name: str, earlier: dict[str, Any], settings: Settings) -> str:
    """The tenant a start of service `name` over its last launch `earlier` records: a service that ran here before
    stays whose it was (its state/ is that owner's data: a tenant's restart of the organisation's stopped service, or
    of a service it needs, does not hand it and the state every tenant's agents stored in it to that tenant, and the
    admin's restart of a tenant's does not take it from the tenant). A first start is its starter's when the program
    is of the starter's own catalog; one of the organisation's catalog stays the organisation's, everyone's (else the
    first tenant to ask would take an organisation service's name from every other)."""
    from flakebot.deliver.catalog import Catalog, tenant_root

    if earlier:
        return tenant_of(earlier) or ""
    if settings.tenant and Catalog(tenant_root(settings, settings.tenant)).entry(name) is None:
        return ""
    return settings.tenant


def taken(name: str) -> UsageError:
    """`up` of a name another catalog's service holds on this machine (running services share one name)."""
    return UsageError(
        f"service {name} is taken on this machine by a service of another catalog",
        fix="package your service under another name ('flakebot package-service PATH --name NAME')",
    )
