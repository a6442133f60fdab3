"""The package stage of both pipelines: the crate as a flake in the run's flake/, built by nix and smoke-run.

craft:   the edited workspace (the crate at AcquireOut.crate_dir), preferring the binary named like the tool
package: the crate the locate stage found (`flakebot package PATH|CRATE`), binary from --bin or the default
"""

from __future__ import annotations

import logging
from pathlib import Path

from flakebot.errors import NixError
from flakebot.nix.lock import PINNED_RUSTC
from flakebot.pipeline.engine import StageContext
from flakebot.stages.outputs import AcquireOut, LocateOut, PackageOut, SpecOut

logger = logging.getLogger(__name__)


def package_only_stage(ctx: StageContext) -> PackageOut:
    """Build the flake for the package pipeline (binary from --bin, or the crate's only/default one)."""
    from flakebot.nix.flake import package_crate

    source = Path(ctx.get(LocateOut).source_dir)
    # --out: outside the run, so clean keeps it
    out = Path(ctx.request.out) if ctx.request.out else ctx.run.flake_dir
    result = package_crate(
        source,
        out,
        ctx.settings,
        bin_name=ctx.request.bin or None,
        progress=ctx.progress,
        strict_smoke=ctx.request.strict_smoke,
        service=ctx.request.service_flake,
    )
    return PackageOut.of(result)


def package_stage(ctx: StageContext) -> PackageOut:
    """The craft pipeline's package stage: the edited workspace as a flake in the run's flake/, built and smoke-run."""
    from flakebot.nix.flake import package_crate
    from flakebot.pipeline.cleanup import remove_early

    crate_dir = ctx.get(AcquireOut).crate_dir
    at_top = crate_dir.strip("/") in ("", ".")
    spec = ctx.get(SpecOut)
    if not spec.name:
        raise NixError("the spec stage gave the tool no name", fix="run the spec stage again (flakebot resume)")
    result = package_crate(
        crate_in(ctx.run.workspace, crate_dir),
        ctx.run.flake_dir,
        ctx.settings,
        prefer_bin=spec.name,
        all_bins=True,  # the tool's package is the tool: a second binary the spec asked for ships too
        rust_version=PINNED_RUSTC,  # cargo resolves for the rustc users build with; the model's value is not kept
        description=spec.summary,
        progress=ctx.progress,
        strict_smoke=ctx.request.strict_smoke,
        # craft --service: the flake carries the service's outputs as package-service's does
        service={"name": spec.name, "spec": spec.service["declaration"]} if spec.service else None,
        as_tested=True,  # what the tests passed on ships: the model's .gitignore decides nothing
        at_root=at_top,  # the workspace's top is its cargo workspace's root: nothing above it is the tool's
        # the edit loop's cargo builds are no later stage's: removed while nix builds (its unlinks then take nothing
        # from the host steps before the build), unless --keep
        at_build=None if ctx.request.keep else lambda: remove_early(ctx.run, ctx.run.target_dir),
    )
    return PackageOut.of(result)


def crate_in(workspace: Path, crate_rel: str) -> Path:
    """The crate's directory in the run's workspace, reached through real directories only (safefs): the sandbox ran
    there, and a crate directory it swapped for a link would have the host package whatever directory the link names."""
    from flakebot.safefs import Tree

    if crate_rel.strip("/") not in ("", "."):
        with Tree(workspace) as tree, tree.subtree(crate_rel):  # UnsafePath: a link (or no directory) on the way
            pass
    return workspace / crate_rel
