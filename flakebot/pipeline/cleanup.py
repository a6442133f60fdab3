"""Removing what a run created (workspace, target dir, temp files), keeping its audit record; only ever inside the
run's own directory, whatever its state.json lists.

Processes need no record here: sandboxed commands die with flakebot (bubblewrap --die-with-parent, the
whole group killed at their end) and nix builds get a parent-death signal."""

from __future__ import annotations

import logging
import threading
import time
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


class _Removal:
    """One tree being removed on a thread of its own; wait() gives whether it was there, or raises what the removal
    raised."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._outcome: list[bool | Exception] = []
        # not a daemon: a process that ends before clean waits (at its exit) for the tree to be gone, not half-gone
        self._thread = threading.Thread(target=self._remove, name=f"remove-{path.name}")
        self._thread.start()

    def _remove(self) -> None:
        try:
            self._outcome.append(remove_tree(self.path))
        except Exception as exc:  # raised again by wait(), in clean, as clean itself would have raised it
            self._outcome.append(exc)

    def wait(self) -> bool:
        waited = time.monotonic()
        self._thread.join()
        logger.debug("waited %.3f s for the removal of %s begun early", time.monotonic() - waited, self.path)
        outcome = self._outcome[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


_EARLY: dict[Path, _Removal] = {}  # by path: removals begun before clean, which waits for them


def remove_early(run: Run, path: Path) -> None:
    """Begin removing `path`, a resource of the run that no later stage reads, on a thread while the run waits on a
    build: its unlinks (the edit loop's target dir: 50 MB in 600 files, 0.06-0.15 s) wait on the disk, not on the
    interpreter. clean_run waits for it where it would have removed it, and counts it removed the same way."""
    inside = inside_run(run, str(path))
    if inside is not None and inside not in _EARLY:
        _EARLY[inside] = _Removal(inside)


def clean_run(run: Run) -> list[str]:
    """Remove what the run created, keeping the audit record. Returns what was removed."""
    removed = []
    for resource in run.state.get("resources", []):
        if _release(run, resource):
            removed.append(f"{resource['kind']}:{resource.get('path')}")
    for child in sorted(run.dir.iterdir()):
        if child.name not in KEPT and _remove(child):
            removed.append(f"path:{child}")
    return removed


def _release(run: Run, resource: dict[str, Any]) -> bool:
    kind = resource.get("kind")
    if kind == "path":
        path = inside_run(run, resource.get("path"))
        return _remove(path) if path is not None else False
    return False  # other kinds (forks) are released by the stage that knows how


def _remove(path: Path) -> bool:
    """remove_tree(path), or the wait for its removal begun early (True when the tree was there then)."""
    early = _EARLY.pop(path.parent.resolve() / path.name, None)
    return early.wait() if early is not None else remove_tree(path)


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
