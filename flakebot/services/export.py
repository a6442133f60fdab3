"""`flakebot export NAME --nixos|--oci|--deploy-rs`: the catalogued service in the form another engine takes."""

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
) -> dict[str, Any]:
    """Write `target` for catalogued service `ref` into `out`; what was written and what its check found."""
    manifest = service_manifest_of(ref, settings)
    if target == "deploy-rs":
        from flakebot.services.deployrs import host_attr

        host_attr(host)  # a bad --host is refused before anything is made
    with export_dir(out, force=force) as into:
        if target == "oci":
            from flakebot.services.oci import export_oci

            return {"target": target, **export_oci(manifest, into, settings)}
        if target == "deploy-rs":
            from flakebot.services.deployrs import export_deploy_rs

            return {"target": target, **export_deploy_rs(manifest, into, host, settings, run_check=run_check)}
        from flakebot.services.nixos import export_nixos

        return {"target": target, **export_nixos(manifest, into, run_check=run_check)}
