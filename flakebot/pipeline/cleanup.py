"""Removing what a run created (workspace, target dir, temp files), keeping its audit record.

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
        if _release(resource):
            removed.append(f"{resource['kind']}:{resource.get('path')}")
    for child in sorted(run.dir.iterdir()):
        if child.name not in KEPT and remove_tree(child):
            removed.append(f"path:{child}")
    return removed


def _release(resource: dict[str, Any]) -> bool:
    kind = resource.get("kind")
    if kind == "path":
        return remove_tree(Path(resource["path"]))
    return False  # other kinds (forks) are released by the stage that knows how
