"""package-service: a crate as a catalogued service: the package pipeline (flake, nix build, smoke run), its
lifecycle checked, then the catalog with a manifest saying kind "service" and the service's declaration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flakebot.commands.packaging import package_request
from flakebot.config import Settings
from flakebot.deliver.catalog import Catalog
from flakebot.errors import NixError
from flakebot.pipeline.request import RunRequest
from flakebot.services.catalogued import catalog_version, service_manifest, usage_markdown
from flakebot.services.declaration import ServiceSpec
from flakebot.services.layout import checked_name
from flakebot.services.lifecycle import Examples, check_lifecycle


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
    if name is not None:  # before any build: a name `up` would refuse is refused here
        checked_name(name, fix="pass --name with lower-case letters, digits, '-' and '_'")
    # the flake carries the service's outputs beside its package: declaration, NixOS module, OCI image
    outputs = {"name": name, "spec": spec.to_dict()}
    request = RunRequest(target=target, bin=bin_name, settings=overrides or {}, service_flake=outputs)
    built = package_request(request, settings=settings)
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
