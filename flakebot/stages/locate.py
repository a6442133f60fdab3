"""The package pipeline's first stage: find the crate to package (a directory, or a crate from a registry)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from flakebot.errors import UsageError
from flakebot.pipeline.engine import StageContext
from flakebot.stages.outputs import LocateOut

logger = logging.getLogger(__name__)

CRATE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")  # crates.io's rule: ASCII, at most 64
ECHOED = 64  # characters of a refused target said back


def locate_stage(ctx: StageContext) -> LocateOut:
    """Where the crate to package is: the PATH given, or CRATE acquired from the registry into the workspace."""
    target = ctx.request.target or ""
    path = check_target(target)
    if path is not None:
        return LocateOut(kind="path", source_dir=str(path.resolve()))
    return _acquire(ctx, target)


def check_target(target: str) -> Path | None:
    """What `target` names: a crate directory (its path), or a crate name for the registry (None); anything else is
    refused. Needs nothing built, so `package` checks it before a run starts too."""
    if not target.strip():
        raise UsageError(
            "nothing to package", fix="give a crate directory or a crate name: flakebot package PATH|CRATE"
        )
    path = Path(target).expanduser()
    shown = target if len(target) <= ECHOED else target[:ECHOED] + "..."
    try:
        is_dir = path.is_dir()
    except OSError:  # a name too long for a file name: no directory, and (CRATE_NAME) no crate either
        is_dir = False
    if is_dir:
        return path
    if "/" in target or target.startswith("."):
        raise UsageError(
            f"{shown} is not a directory", fix="give the directory holding the crate's Cargo.toml, or a crate name"
        )
    if not CRATE_NAME.match(target):
        raise UsageError(
            f"'{shown}' is neither a directory nor a crate name",
            fix="give the directory holding the crate's Cargo.toml, or a crate name (letters, digits, '-' and '_', "
            "at most 64)",
        )
    return None


def _acquire(ctx: StageContext, name: str) -> LocateOut:
    from flakebot.crates.registries import open_registry
    from flakebot.fsutil import remove_tree
    from flakebot.source.acquisition import acquire

    registry = open_registry(ctx.settings, ctx.request.registry)
    crate = registry.get(name)
    if registry.name == "crates-io":  # lock and build it against crates.io (checksummed Cargo.lock), as a craft does
        ctx.pin_setting("registry", "crates-io")
    ctx.progress(f"acquiring {crate.name} {crate.version}")
    workspace = ctx.run.workspace
    if workspace.exists():  # left by an attempt that failed part-way
        remove_tree(workspace)
    origin = acquire(crate, workspace, branch=f"flakebot/package-{crate.name}", settings=ctx.settings, run=ctx.run)
    crate_dir = str(origin["crate_dir"])  # every acquisition method records it, as the acquire stage reads it
    return LocateOut(
        kind="crate",
        source_dir=str(workspace / crate_dir),
        origin=origin,
        workspace=str(workspace),
        crate_dir=crate_dir,
    )
