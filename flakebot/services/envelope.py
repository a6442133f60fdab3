"""A service's resource envelope: the bounds the supervisor holds it to, beyond what bubblewrap isolates.

memory, processes  its own cgroup (flakebot.sandbox.cgroup): sandbox_memory_mb for all its processes together,
                   max_processes of them; where the host has no writable cgroup, per process only (RLIMIT_DATA,
                   RLIMIT_NPROC), said once in the supervisor's log and in status.json's `envelope`
disk               its state directory's allocated blocks (each inode once, holes not counted), measured every
                   DISK_EVERY seconds while it runs and before each start: past sandbox_disk_mb the service is
                   stopped and `failed`, and refused a start until the state is back under it; one file is
                   bounded as it is written by RLIMIT_FSIZE (sandbox_file_mb, never more than the quota)
/tmp               a tmpfs of tmp_mb (bubblewrap), its pages charged to the cgroup
log                service.log rotated at 1 MiB, one older file kept (logfile.py)
identity           its supervisor and its service recorded as pid + start time (flakebot.processid): nothing
                   signals a recorded pid that is no longer that process
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.errors import UnsafePath
from flakebot.safefs import Tree
from flakebot.sandbox import SandboxLimits
from flakebot.sandbox.cgroup import Group

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
DISK_EVERY = 0.5  # seconds between two measures of the state directory while the service runs


def launch_limits(settings: Settings) -> dict[str, Any]:
    """The limits a launch records (SandboxLimits fields): what `up`, an upgrade and the lifecycle check run under."""
    return {
        "memory_mb": settings.sandbox_memory_mb,
        "file_mb": min(settings.sandbox_file_mb, settings.sandbox_disk_mb),  # one file never past the quota
        "disk_mb": settings.sandbox_disk_mb,
    }


def group_for(root: Path, limits: SandboxLimits) -> Group | None:
    """The service's own cgroup (named by its directory, so two workdirs' services never share one)."""
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]
    return Group.create(
        f"flakebot-{root.name[:40]}-{digest}", memory_bytes=limits.memory_mb * MIB, max_processes=limits.max_processes
    )


def state_bytes(state: Path) -> int:
    """The disk the state directory takes: allocated blocks of every entry under it, a hard-linked file once, holes
    not counted (a sparse file's apparent size is not its cost). Walked through safefs: nothing there is followed."""
    seen: set[tuple[int, int]] = set()
    total = 0
    with Tree(state) as tree:
        for _, info in tree.walk():
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            total += info.st_blocks * 512
    return total


def over_quota(state: Path, disk_mb: int) -> str:
    """Why the state directory is past its quota, or '' while it is under it (or cannot be measured just now: the
    service may be renaming files under the walk; the next measure counts them)."""
    try:
        used = state_bytes(state)
    except (UnsafePath, OSError):
        return ""
    if used <= disk_mb * MIB:
        return ""
    return (
        f"disk quota: its state holds {used / MIB:.1f} MiB, more than sandbox_disk_mb = {disk_mb} MiB "
        f"({state}; kept as it is: remove what it does not need, or raise sandbox_disk_mb, then start it again)"
    )


__all__ = ["DISK_EVERY", "group_for", "launch_limits", "over_quota", "state_bytes"]
