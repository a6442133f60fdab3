"""Packaging as pipeline stages: `flakebot package PATH|CRATE` (no model) and the craft pipeline's package stage.

The package pipeline: source (a directory as given, or a crate acquired from a registry into the
run's workspace) -> package (flake in the run's flake/, nix build, smoke run) -> clean.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from flakebot.errors import NixError
from flakebot.pipeline.engine import StageContext

logger = logging.getLogger(__name__)


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
