"""Removing what runs created: workspaces, target dirs, temp files, whole run directories.

Processes need no record here: sandboxed commands die with flakebot (bubblewrap --die-with-parent, the
whole group killed at their end) and nix builds get a parent-death signal."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from flakebot.errors import FlakebotError
from flakebot.fsutil import remove_tree
from flakebot.pipeline.run import Run, find_run_dir, runs_dir

logger = logging.getLogger(__name__)

# Kept after a run for audit: the flake, manifest, transcript, state and logs.
KEPT = {"flake", "state.json", "transcript.jsonl", "events.jsonl", "run.log", "manifest.json", "USAGE.md", ".lock"}


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


def _release_forks(run: Run) -> None:
    from flakebot import config
    from flakebot.source.remote import release_run_forks

    release_run_forks(run, config.load())


def remove_runs(workdir: Path, run_id: str | None) -> list[Path]:
    """Remove one run directory (by id) or all of them (run_id None), releasing their resources first."""
    directories = [find_run_dir(workdir, run_id)] if run_id else sorted(p for p in runs_dir(workdir).glob("*") if p.is_dir())
    for directory in directories:
        try:
            run = Run.load(workdir, directory.name)
            _release_forks(run)
            clean_run(run)
        except FlakebotError as exc:  # a corrupt run is still removed; say why its resources were not read
            logger.warning("could not read %s before removing it: %s", directory, exc.one_line())
        remove_tree(directory)
    return directories
