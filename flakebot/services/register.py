"""A crate as a catalogued service: flakebot's package pipeline (flake, nix build, smoke run), then the catalog with
a manifest saying kind "service" and the service's declaration (port variable, inner port, health check, stop)."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.deliver.catalog import Catalog, show_tool
from flakebot.deliver.versions import VERSION_RE
from flakebot.errors import CatalogError, NixError
from flakebot.services.declaration import ServiceSpec
from flakebot.services.layout import checked_name
from flakebot.services.lifecycle import Examples, check_lifecycle

MANIFEST_FORMAT = 1
KIND = "service"


def package_service(
    target: str,
    spec: ServiceSpec,
    settings: Settings,
    *,
    name: str | None = None,
    bin_name: str | None = None,
    overrides: dict[str, Any] | None = None,
    examples: Examples | None = None,
) -> dict[str, Any]:
    """Package the crate at `target` (a directory or a crate name), check its lifecycle (with `examples`) and
    catalog it as a service; its catalog entry. A service whose lifecycle fails is not catalogued (NixError)."""
    from flakebot import api

    if name is not None:  # before any build: a name `up` would refuse is refused here
        checked_name(name, fix="pass --name with lower-case letters, digits, '-' and '_'")
    # the flake carries the service's outputs beside its package: declaration, NixOS module, OCI image
    outputs = {"name": name, "spec": spec.to_dict()}
    request = api.RunRequest(target=target, bin=bin_name, settings=overrides or {}, service_flake=outputs)
    built = api.COMMANDS["package_request"](request, settings=settings)  # the package command, from the table
    name = checked_name(name or built.main_program, fix="pass --name NAME (lower-case letters, digits, '-', '_')")
    report = check_lifecycle(Path(built.bin_path), spec, settings, examples)
    if not report.ok:
        raise NixError(
            f"service {name} failed its lifecycle check: {report.first_problem()}",
            fix="a service must answer its health check, exit 0 on SIGTERM and keep its state in $STATE_DIRECTORY; "
            "its output: " + report.last_output(),
            lifecycle=report.to_dict(),
            flake_dir=built.flake_dir,
        )
    manifest = {**service_manifest(name, built.to_dict(), spec), "lifecycle": report.steps}
    if examples is not None:
        manifest["lifecycle_examples"] = examples.to_dict()  # as a crafted service keeps them: an upgrade checks them
    return Catalog.open(settings).add(
        name,
        need=f"service {name}",
        flake_dir=Path(built.flake_dir),
        manifest=manifest,
        usage_md=usage_markdown(manifest),
        store_path=built.store_path,
        run_id=built.run_id,
        origin={"kind": "package", "target": target},
        dependencies_path=built.dependencies_path,
        version=catalog_version(built.to_dict().get("version")),
    )


def catalog_version(crate_version: Any) -> str | None:
    """A service is catalogued under its crate's version (0.2.0 beside 0.1.0, so `up NAME@0.2.0` can upgrade and
    `rollback` go back); None (the catalog's own numbering) when the crate's version is no plain X.Y.Z."""
    text = str(crate_version or "")
    return text if VERSION_RE.match(text) else None


def service_manifest(name: str, package: dict[str, Any], spec: ServiceSpec) -> dict[str, Any]:
    argv: list[str] = package.get("nix_run_argv") or []
    return {
        "format": MANIFEST_FORMAT,
        "kind": KIND,
        "name": name,
        "summary": f"{package.get('pname', name)} {package.get('version', '')}: a service on port {spec.port}",
        "version": package.get("version", ""),
        "package": package.get("pname", ""),
        "flake_ref": package.get("flake_ref", ""),
        "nix_run": shlex.join(argv) + " -- ARGS" if argv else "",
        "nix_run_argv": argv,
        "store_path": package.get("store_path", ""),
        "main_program": package.get("main_program", name),
        "nixpkgs_mode": package.get("nixpkgs_mode", ""),
        "portable": bool(package.get("portable", False)),
        "portable_reason": package.get("portable_reason", ""),
        "service": spec.to_dict(),
        "built_at": time.time(),
    }


def usage_markdown(manifest: dict[str, Any]) -> str:
    spec = manifest["service"]
    health = spec["health"]
    check = f"GET {health['path']}" if health["kind"] == "http" else "a TCP connect"
    return (
        f"# {manifest['name']} (service)\n\n"
        f"Listens on ${spec['port_env']} (port {spec['port']} in its own network namespace), keeps its state in "
        f"$STATE_DIRECTORY; healthy when {check} succeeds.\n\n"
        f"    flakebot up {manifest['name']}          # prints the 127.0.0.1 port\n"
        f"    flakebot services\n    flakebot logs {manifest['name']}\n    flakebot down {manifest['name']}\n"
    )


def service_manifest_of(ref: str, settings: Settings) -> dict[str, Any]:
    """The manifest of catalogued service `ref` (NAME or NAME@VERSION); a CatalogError when it is a tool."""
    tool = show_tool(ref, settings)
    manifest: dict[str, Any] = tool["manifest"]
    if manifest.get("kind") != KIND or "service" not in manifest:
        raise CatalogError(
            f"'{ref}' is a tool, not a service: it has no service declaration",
            fix="run a tool with 'flakebot run', or catalog a service with 'flakebot package-service PATH'",
        )
    found = {**manifest, "catalog_version": tool.get("version", "")}
    if tool.get("installed_from"):  # the shared catalog and signer it came from: part of what `up` records
        found["catalog_installed_from"] = tool["installed_from"]
    return found
