"""outputs/: the files holding a tool call's whole stdout once it passed tool_output_limit, kept under a quota.

A call writes at most `output_file_mb` there (never more than the quota, nor the sandbox's file-size limit): past
it the tool is killed, as at any other limit. After a call that spilled, the least recently used files go until
the directory holds at most `outputs_mb` (a use is the write, or a read the file system recorded: the later of
mtime and atime), the call's own file last of all. So the newest outputs are whole, older ones may be gone: a
result names its file, and says so when the file went before the call returned (another call's eviction).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from flakebot.config import Settings
from flakebot.errors import ConfigError
from flakebot.sandbox.process import MIB, Spill

logger = logging.getLogger(__name__)


def directory(settings: Settings) -> Path:
    return settings.path("workdir") / "outputs"


def spill(settings: Settings) -> Spill:
    """Where a call's stdout goes past tool_output_limit, and how large that file may grow."""
    return Spill(directory(settings), settings.tool_output_limit, per_call_cap(settings))


def per_call_cap(settings: Settings) -> int:
    """Bytes one call's spilled stdout may reach: output_file_mb, within the quota and the sandbox's file limit."""
    return min(_at_least_1(settings, "output_file_mb"), quota(settings), settings.sandbox_file_mb * MIB)


def quota(settings: Settings) -> int:
    """Bytes outputs/ may hold."""
    return _at_least_1(settings, "outputs_mb")


def _at_least_1(settings: Settings, key: str) -> int:
    value: int = settings.get(key)
    if value < 1:
        raise ConfigError(f"'{key}' must be at least 1 (MiB), got {value}", fix=f"set {key} to 1 or more")
    return value * MIB


def settle(settings: Settings, written: str) -> str:
    """After a call that spilled into `written`: keep outputs/ under outputs_mb. Returns a note for the caller when
    `written` itself is gone already (another call's eviction took it), else ''."""
    evict(directory(settings), quota(settings), keep=Path(written))
    if os.path.lexists(written):
        return ""
    return (
        f"the whole stdout was in {written}, removed already to keep outputs/ under outputs_mb "
        f"({settings.outputs_mb} MiB, least recently used first): call again, or raise outputs_mb"
    )


def evict(root: Path, limit_bytes: int, keep: Path) -> list[str]:
    """Remove the least recently used files of `root` until it holds at most `limit_bytes`; `keep` goes last. The
    names removed."""
    files = []
    for entry in os.scandir(root) if root.is_dir() else ():
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:  # removed meanwhile
            continue
        if entry.is_file(follow_symlinks=False):
            files.append((Path(entry.path) == keep, max(info.st_mtime, info.st_atime), info.st_size, entry.path))
    total, removed = sum(size for _, _, size, _ in files), []
    for kept, _, size, path in sorted(files):
        if total <= limit_bytes or kept:
            break
        try:
            os.unlink(path)
        except FileNotFoundError:  # another call evicted it first
            pass
        total -= size
        removed.append(os.path.basename(path))
    if removed:
        logger.info("outputs: removed %d older files to stay under %d MiB", len(removed), limit_bytes // MIB)
    return removed
