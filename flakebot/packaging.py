"""Packaging as pipeline stages: `flakebot package PATH|CRATE` (no model) and the craft pipeline's package stage.

The package pipeline: source (a directory as given, or a crate acquired from a registry into the
run's workspace) -> package (flake in the run's flake/, nix build, smoke run) -> clean.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from flakebot.errors import NixError, UsageError
from flakebot.pipeline import Stage, StageContext

logger = logging.getLogger(__name__)


def source_stage(ctx: StageContext) -> dict[str, Any]:
    """Where the crate to package is: the PATH given, or CRATE acquired from the registry into the workspace."""
    target = str(ctx.options.get("target") or "")
    if not target:
        raise UsageError("nothing to package", fix="give a crate directory or a crate name: flakebot package PATH|CRATE")
    path = Path(target).expanduser()
    if path.is_dir():
        return {"kind": "path", "source_dir": str(path.resolve())}
    if "/" in target or target.startswith("."):
        raise UsageError(f"{target} is not a directory", fix="give the directory holding the crate's Cargo.toml, or a crate name")
    return _acquire(ctx, target)


def _acquire(ctx: StageContext, name: str) -> dict[str, Any]:
    from flakebot.crates.stage import open_registry
    from flakebot.fsutil import remove_tree
    from flakebot.source import acquire

    crate = open_registry(ctx.settings, ctx.options.get("registry")).get(name)
    ctx.progress(f"acquiring {crate.name} {crate.version}")
    workspace = ctx.run.workspace
    if workspace.exists():  # left by an attempt that failed part-way
        remove_tree(workspace)
    origin = acquire(crate, workspace, branch=f"flakebot/package-{crate.name}", settings=ctx.settings, run=ctx.run)
    return {"kind": "crate", "source_dir": str(workspace / origin.get("crate_dir", "")), "origin": origin, "workspace": str(workspace)}


def package_only_stage(ctx: StageContext) -> dict[str, Any]:
    """Build the flake for the package pipeline (binary from --bin, or the crate's only/default one)."""
    from flakebot.nix.flake import package_crate

    source = Path(ctx.output("source")["source_dir"])
    result = package_crate(source, ctx.run.flake_dir, ctx.settings, bin_name=ctx.options.get("bin") or None, progress=ctx.progress)
    return result.to_dict()


def package_stage(ctx: StageContext) -> dict[str, Any]:
    """The craft pipeline's package stage: the edited workspace as a flake in the run's flake/, built and smoke-run."""
    from flakebot.nix.flake import package_crate

    acquired = ctx.output("acquire")
    crate_dir = acquired.get("crate_dir") or (acquired.get("origin") or {}).get("crate_dir", "")
    spec = ctx.output("spec")
    if not spec.get("name"):
        raise NixError("the spec stage gave the tool no name", fix="run the spec stage again (flakebot resume)")
    result = package_crate(
        ctx.run.workspace / crate_dir,
        ctx.run.flake_dir,
        ctx.settings,
        prefer_bin=spec["name"],
        description=str(spec.get("summary") or ""),
        progress=ctx.progress,
    )
    return result.to_dict()


def clean_stage(ctx: StageContext) -> dict[str, Any]:
    """Remove the workspace and temp files a package run made; the flake and its GC root stay."""
    from flakebot.cleanup import clean_run

    removed = clean_run(ctx.run)
    return {"removed": removed}


STAGES = [
    Stage("source", source_stage),
    Stage("package", package_only_stage),
    Stage("clean", clean_stage, always=True),
]
