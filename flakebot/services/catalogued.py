"""A service's catalog entry: the manifest saying kind "service" with the service's declaration (port variable, inner
port, health check, stop), its USAGE.md, the version it is catalogued under, and the manifest read back for `up`."""

from __future__ import annotations

import shlex
import time
from typing import Any

from flakebot.config import Settings
from flakebot.deliver.catalog import show_tool
from flakebot.deliver.versions import VERSION_RE
from flakebot.errors import CatalogError
from flakebot.services.declaration import ServiceSpec

MANIFEST_FORMAT = 1
KIND = "service"


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
    """The manifest of catalogued service `ref` (NAME or NAME@VERSION); a UsageError when NAME can name no service,
    a CatalogError when no service has it or it is a tool."""
    from flakebot.deliver.versions import parse_ref
    from flakebot.services.layout import checked_name

    name = checked_name(ref.partition("@")[0], fix="use a catalogued service's name: 'flakebot list' shows them")
    parse_ref(ref)
    try:
        tool = show_tool(ref, settings)
    except CatalogError as exc:
        if exc.details.get("reason") != "unknown":
            raise
        raise CatalogError(
            f"no service '{name}' in the catalog",
            fix="'flakebot list' shows the catalogued services (kind service); "
            "catalog one with 'flakebot package-service PATH' or 'flakebot craft --service'",
            reason="unknown",
        ) from None
    manifest: dict[str, Any] = tool["manifest"]
    if manifest.get("kind") != KIND or "service" not in manifest:
        raise CatalogError(
            f"'{ref}' is a tool, not a service: it has no service declaration",
            fix="run a tool with 'flakebot run', or catalog a service with 'flakebot package-service PATH'",
            reason="not_a_service",
        )
    found = {**manifest, "catalog_version": tool.get("version", "")}
    if tool.get("installed_from"):  # the shared catalog and signer it came from: part of what `up` records
        found["catalog_installed_from"] = tool["installed_from"]
    return found
