"""A service's resource envelope: the bounds the supervisor holds it to, beyond what bubblewrap isolates.

memory, processes  its own cgroup (flakebot.sandbox.cgroup): sandbox_memory_mb for all its processes together,
                   max_processes of them; where the host has no writable cgroup, per process only (RLIMIT_DATA,
                   RLIMIT_NPROC), said once in the supervisor's log and in status.json's `envelope`
disk               its state directory's allocated blocks (each inode once and at least INODE_BYTES, holes not
                   counted; a state nested past MAX_DEPTH or unreadable is not measured and held as over), measured every
                   DISK_EVERY seconds while it runs and before each start: past sandbox_disk_mb the service is
                   stopped and `failed`, and refused a start until the state is back under it; one file is
                   bounded as it is written by RLIMIT_FSIZE (sandbox_file_mb, never more than the quota)
/tmp               a tmpfs of tmp_mb (bubblewrap), its pages charged to the cgroup
log                service.log rotated at 1 MiB, one older file kept (logfile.py)
identity           its supervisor and its service recorded as pid + start time (flakebot.processid): nothing
                   signals a recorded pid that is no longer that process
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flakebot.fsutil import sha256_hex
from flakebot.sandbox import SandboxLimits
from flakebot.sandbox.cgroup import Group

if TYPE_CHECKING:  # a type only: the supervisor imports this module, never config (benchmarks S5: its memory)
    from flakebot.config import Settings

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
DISK_EVERY = 0.5  # seconds between two measures of the state directory while the service runs
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def launch_limits(settings: Settings) -> dict[str, Any]:
    """The limits a launch records (SandboxLimits fields): what `up`, an upgrade and the lifecycle check run under."""
    return {
        "memory_mb": settings.sandbox_memory_mb,
        "file_mb": min(settings.sandbox_file_mb, settings.sandbox_disk_mb),  # one file never past the quota
        "disk_mb": settings.sandbox_disk_mb,
    }


def group_for(root: Path, limits: SandboxLimits) -> Group | None:
    """The service's own cgroup (named by its directory, so two workdirs' services never share one)."""
    digest = sha256_hex(str(root.resolve()).encode())[:12]
    return Group.create(
        f"flakebot-{root.name[:40]}-{digest}", memory_bytes=limits.memory_mb * MIB, max_processes=limits.max_processes
    )


INODE_BYTES = 4096  # the least one entry is charged: an inode, and a block once it holds anything
MAX_DEPTH = 128  # directories within directories the measure enters; a deeper state is not measured, and refused


class Unmeasured(Exception):
    """The state cannot be measured (nested too deep, a directory the supervisor cannot read): held as over quota."""


def state_bytes(state: Path, limit: int | None = None) -> int:
    """The disk the state directory takes: allocated blocks of every entry under it, each entry at least INODE_BYTES
    (an empty file still takes an inode: a million of them are not free; a million names of one file are not free
    either), a hard-linked file's data once, holes not counted
    (a sparse file's apparent size is not its cost). Walked beneath directory descriptors, one level at a time (no
    recursion: any depth is walked in the same memory), never following a link; an entry that goes away under the
    walk is not counted (the service may be renaming files), and the walk ends as soon as the total passes `limit`
    (its time bounded by the quota, not by how many entries the service made). Unmeasured past MAX_DEPTH levels or
    for a directory that cannot be read."""
    try:
        root = os.open(state, _DIR_FLAGS)
    except FileNotFoundError:
        return 0
    seen: set[tuple[int, int]] = set()
    total = max(os.fstat(root).st_blocks * 512, INODE_BYTES)
    stack: list[tuple[int, Iterator[os.DirEntry[str]]]] = []  # the directories being listed, outermost first
    try:
        stack.append((root, os.scandir(root)))
        while stack:
            fd, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                _close(*stack.pop())
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # gone since it was listed
            blocks = info.st_blocks * 512
            if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                if (info.st_dev, info.st_ino) in seen:
                    blocks = 0  # its data counted at its first name; this name still costs its entry
                seen.add((info.st_dev, info.st_ino))
            total += max(blocks, INODE_BYTES)
            if limit is not None and total > limit:
                return total
            if not stat.S_ISDIR(info.st_mode):
                continue
            if len(stack) >= MAX_DEPTH:
                raise Unmeasured(f"its state nests directories more than {MAX_DEPTH} deep")
            try:
                child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                    continue  # removed, or swapped for a link or a file, since it was listed: never followed
                raise Unmeasured(f"{entry.name} in its state cannot be read ({exc.strerror})") from None
            try:
                stack.append((child, os.scandir(child)))
            except BaseException:
                os.close(child)
                raise
    except BaseException:
        if not stack:
            os.close(root)
        raise
    finally:
        while stack:
            _close(*stack.pop())
    return total


def _close(fd: int, entries: Iterator[os.DirEntry[str]]) -> None:
    entries.close()  # type: ignore[attr-defined]
    os.close(fd)


def over_quota(state: Path, disk_mb: int) -> str:
    """Why the state directory is past its quota (or cannot be measured: held as past it), or '' while it is under
    it."""
    try:
        used = state_bytes(state, limit=disk_mb * MIB)
    except (Unmeasured, OSError) as exc:
        return (
            f"disk quota: {exc} ({state}; not measured, so not started: remove what it does not need, then start "
            "it again)"
        )
    if used <= disk_mb * MIB:
        return ""
    return (
        f"disk quota: its state holds {used / MIB:.1f} MiB or more, more than sandbox_disk_mb = {disk_mb} MiB "
        f"({state}; kept as it is: remove what it does not need, or raise sandbox_disk_mb, then start it again)"
    )


__all__ = ["DISK_EVERY", "INODE_BYTES", "MAX_DEPTH", "group_for", "launch_limits", "over_quota", "state_bytes"]
