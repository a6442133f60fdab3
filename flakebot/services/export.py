"""`flakebot export NAME --nixos|--oci|--deploy-rs`: the catalogued service in the form another engine takes.

Outbound network goes with it when the user asks (`--network`) or when the service last ran with it here (its
launch.json, flakebot's own record of `up --network`): the unit then has no IP filter and the image's label says
`outbound`; otherwise both stay closed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.services.catalogued import service_manifest_of
from flakebot.services.exportfiles import export_dir

TARGETS = ("nixos", "oci", "deploy-rs")


def export_service(
    ref: str,
    target: str,
    out: Path,
    settings: Settings,
    *,
    host: str = "server",
    force: bool = False,
    run_check: bool = True,
    network: bool = False,
) -> dict[str, Any]:
    """Write `target` for catalogued service `ref` into `out`; what was written and what its check found."""
    manifest = service_manifest_of(ref, settings)
    network = network or recorded_network(manifest["name"], settings)
    needed = needed_ports(manifest, settings)  # before anything is made: a need not catalogued is refused
    if target == "deploy-rs":
        from flakebot.services.deployrs import host_attr

        host_attr(host)  # a bad --host is refused before anything is made
    with export_dir(out, force=force) as into:
        if target == "oci":
            from flakebot.services.oci import export_oci

            return {"target": target, **export_oci(manifest, into, settings, network=network)}
        if target == "deploy-rs":
            from flakebot.services.deployrs import export_deploy_rs

            return {
                "target": target,
                **export_deploy_rs(manifest, into, host, settings, run_check=run_check, network=network, needed=needed),
            }
        from flakebot.services.nixos import export_nixos

        return {
            "target": target,
            **export_nixos(manifest, into, run_check=run_check, network=network, needed=needed),
        }


def needed_ports(manifest: dict[str, Any], settings: Settings) -> dict[str, int]:
    """The catalogued port of each service `manifest` needs: the port its own module listens on by default, which
    the check gives the dependent's module as the needed module would. A need not catalogued is a CatalogError."""
    from flakebot.errors import CatalogError
    from flakebot.services.declaration import ServiceSpec
    from flakebot.services.needs import start_order

    ports = {}
    for need in ServiceSpec.from_dict(manifest["service"]).needs:
        try:
            ports[need] = ServiceSpec.from_dict(service_manifest_of(need, settings)["service"]).port
        except CatalogError as exc:
            if exc.details.get("reason") == "not_a_service":  # the name is a tool's: "package it" would be refused
                raise CatalogError(
                    f"service {manifest['name']} needs {need}, which is a tool, not a service",
                    fix=f"package {manifest['name']} again without '--needs {need}', or with the name of the service "
                    "it needs",
                ) from None
            if exc.details.get("reason") != "unknown":  # there, but unreadable: its own words
                raise
            raise CatalogError(
                f"service {manifest['name']} needs {need}, which is not a catalogued service here",
                fix=f"package it first ('flakebot package-service PATH --name {need}'), then export both",
            ) from None
    # what those need in turn, from the catalog too: a cycle would be units that Require each other (up refuses it)
    start_order(
        manifest["name"],
        tuple(ports),
        settings,
        lambda need: ServiceSpec.from_dict(service_manifest_of(need, settings)["service"]).needs,
    )
    return ports


def recorded_network(name: str, settings: Settings) -> bool:
    """Whether service `name` last ran here with outbound network (its launch.json: only `up --network` writes it)."""
    from flakebot.services.forward import outbound_network
    from flakebot.services.layout import ServiceDir

    where = ServiceDir.of(name, settings)
    return outbound_network(where.read_json(where.launch_file))
