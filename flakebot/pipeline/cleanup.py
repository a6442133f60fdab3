"""Removing what a run created (workspace, target dir, temp files), keeping its audit record; only ever inside the
run's own directory, whatever its state.json lists.

Processes need no record here: sandboxed commands die with flakebot (bubblewrap --die-with-parent, the
whole group killed at their end) and nix builds get a parent-death signal."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from flakebot.fsutil import remove_tree
from flakebot.pipeline.run import Run

logger = logging.getLogger(__name__)

# Kept after a run for audit: the flake, manifest, transcript, state and logs.
KEPT = {
    "flake",
    "state.json",
    "transcript.jsonl",
    "events.jsonl",
    "run.log",
    "edit.json",
    "manifest.json",
    "USAGE.md",
    ".lock",
}


def clean_run(run: Run) -> list[str]:
    """Remove what the run created, keeping the audit record. Returns what was removed."""
    removed = []
    for resource in run.state.get("resources", []):
        if _release(run, resource):
            removed.append(f"{resource['kind']}:{resource.get('path')}")
    for child in sorted(run.dir.iterdir()):
        if child.name not in KEPT and remove_tree(child):
            removed.append(f"path:{child}")
    return removed


def _release(run: Run, resource: dict[str, Any]) -> bool:
    kind = resource.get("kind")
    if kind == "path":
        path = inside_run(run, resource.get("path"))
        return remove_tree(path) if path is not None else False
    return False  # other kinds (forks) are released by the stage that knows how


def inside_run(run: Run, raw: Any) -> Path | None:
    """`raw` as a path inside the run's directory (its parents resolved; a symlink itself is removed, not followed),
    or None, logged: a state.json that lists a path elsewhere must not make clean delete it."""
    path = Path(str(raw or ""))
    if path.is_absolute() and path.name not in ("", ".", ".."):
        resolved = path.parent.resolve() / path.name
        if resolved.is_relative_to(run.dir.resolve()) and resolved != run.dir.resolve():
            return resolved
    logger.warning("not removing %s: it is not inside the run directory %s", raw, run.dir)
    return None
