"""Services that need others (a declaration's `needs`, as process-compose's depends_on or systemd's Requires+After):
in which order they start, which ones a stop takes with it, and where a dependent finds what it needs.

A dependency's own needs are read where `up` would start it from: its launch.json when it ran here (its recorded
program's declaration, identity.py), else its catalog entry. Every name is resolved and the order computed before
anything starts, so an unknown name or a cycle starts nothing. A dependent reaches each dependency at
`FLAKEBOT_<NAME>_URL` (http://127.0.0.1:PORT), the one port of the host's loopback its network namespace is given
(pasta's -T, forward.py); the ports are the dependencies' at the dependent's start (launch.json `needs`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flakebot.config import Settings
from flakebot.errors import FlakebotError, UsageError
from flakebot.services.catalogued import service_manifest_of
from flakebot.services.declaration import ServiceSpec
from flakebot.services.layout import ServiceDir, all_service_dirs

logger = logging.getLogger(__name__)


def declared(name: str, settings: Settings) -> tuple[str, ...]:
    """What service `name` needs, as the program `up` would start for it declares: its recorded launch's, else the
    catalog's (a UsageError naming the fix when it is neither started here nor catalogued as a service)."""
    where = ServiceDir.of(name, settings)
    launch = where.read_json(where.launch_file)
    if isinstance(launch.get("spec"), dict):
        return ServiceSpec.from_dict(launch["spec"]).needs
    try:
        manifest = service_manifest_of(name, settings)
    except FlakebotError:
        raise UsageError(
            f"service {name} is needed but is neither started here nor a catalogued service",
            fix=f"package it ('flakebot package-service PATH --name {name}'), or remove it from the needs",
        ) from None
    return ServiceSpec.from_dict(manifest["service"]).needs


def start_order(
    name: str, needs: tuple[str, ...], settings: Settings, declared_of: Callable[[str], tuple[str, ...]] | None = None
) -> list[str]:
    """The services `name` (needing `needs`) needs, directly or through others, each after what it needs; `name`
    itself not included. A UsageError for a cycle or an unknown name, before anything starts. `declared_of`: what a
    service needs (default: `declared`, as `up` would start it; export reads the catalog's)."""
    declared_of = declared_of or (lambda need: declared(need, settings))
    order: list[str] = []
    path: list[str] = [name]

    def visit(current: str, wanted: tuple[str, ...]) -> None:
        for need in wanted:
            if need in path:
                cycle = " -> ".join([*path[path.index(need) :], need])
                raise UsageError(
                    f"services need each other in a cycle: {cycle}",
                    fix=f"remove {need} from {current}'s needs (package-service --needs) and package it again",
                )
            if need in order:
                continue
            path.append(need)
            visit(need, declared_of(need))
            path.pop()
            order.append(need)

    visit(name, needs)
    return order


def running(where: ServiceDir) -> bool:
    return where.supervisor_alive() and where.status().get("state") == "running"


def reach(name: str, spec: ServiceSpec, settings: Settings) -> dict[str, int]:
    """The host port of each service `spec` needs, all running (a UsageError naming the first that is not)."""
    ports: dict[str, int] = {}
    for need in spec.needs:
        where = ServiceDir.of(need, settings)
        port = where.status().get("port")
        if not running(where) or not isinstance(port, int):
            raise UsageError(
                f"service {name} needs {need}, which is not running",
                fix=f"'flakebot up {name}' starts what it needs first",
            )
        if port == spec.port:
            raise UsageError(
                f"{need}'s port {port} is {name}'s own port inside its namespace: {name} could not reach it there",
                fix=f"'flakebot down {need}' and 'flakebot up {need} --port OTHER'",
            )
        ports[need] = port
    return ports


def dependents(name: str, settings: Settings) -> list[ServiceDir]:
    """Services whose supervisor runs and whose launch needs `name` directly."""
    found = []
    for where in all_service_dirs(settings):
        launch = where.read_json(where.launch_file)
        if where.name != name and where.supervisor_alive() and name in _needs_of(launch):
            found.append(where)
    return found


def reached_ports(settings: Settings) -> dict[int, tuple[str, str]]:
    """The host ports running services reach as a service they need (launch.json `needs`, the ports at their
    start): port -> (the dependent, the service it reaches there). A start of any other service never takes one:
    the dependent would reach it as the one it needs (after that one's supervisor died, its port is free)."""
    found: dict[int, tuple[str, str]] = {}
    for where in all_service_dirs(settings):
        reached = where.read_json(where.launch_file).get("needs")
        if isinstance(reached, dict) and where.supervisor_alive():
            found.update({port: (where.name, need) for need, port in reached.items() if isinstance(port, int)})
    return found


def _needs_of(launch: dict[str, Any]) -> tuple[str, ...]:
    try:
        return ServiceSpec.from_dict(launch["spec"]).needs if isinstance(launch.get("spec"), dict) else ()
    except (UsageError, TypeError):
        return ()


def in_start_order(services: list[ServiceDir]) -> list[ServiceDir]:
    """`services` (started here) each after the ones among them it needs, by their recorded launches (a cycle
    among recorded launches, which `up` never starts, keeps the rest of the order as listed)."""
    by_name = {where.name: where for where in services}
    order: list[ServiceDir] = []
    seen: set[str] = set()

    def visit(where: ServiceDir) -> None:
        if where.name in seen:
            return
        seen.add(where.name)
        for need in _needs_of(where.read_json(where.launch_file)):
            if need in by_name:
                visit(by_name[need])
        order.append(where)

    for where in services:
        visit(where)
    return order


__all__ = ["declared", "dependents", "in_start_order", "reach", "reached_ports", "running", "start_order"]
