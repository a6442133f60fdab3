"""One bound on a whole process tree: its own cgroup, with a total memory limit and a process count.

Per-process limits (RLIMIT_DATA, RLIMIT_NPROC; SandboxLimits.prlimit_argv) bound each process, not the tree: 512
processes under a 64 MiB RLIMIT_DATA may hold 32 GiB. A cgroup bounds them together: the kernel charges every
process in it (and the tmpfs pages they write), and past the memory limit its OOM killer ends one of them.

Where the host offers one: cgroup v2 (a unified hierarchy whose parent enables memory and pids), else cgroup v1's
memory and pids controllers, each mounted writable under /sys/fs/cgroup. The group is made beneath the cgroup of the
process creating it (so its own limits still apply above), named by its caller; a process joins it between fork and
exec (`enter`, a preexec_fn), so nothing it starts is ever outside. Where no cgroup is writable, `create` returns
None and says once in the log that only the per-process limits hold.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")
NAME = re.compile(r"^flakebot-[A-Za-z0-9_-]{1,100}$")
SWEEP_AGE = 120.0  # seconds an empty group is left before a sweep removes it
_warned: list[bool] = []


@dataclass(frozen=True)
class Group:
    """A cgroup made for one process tree: `kind` v2 (one directory) or v1 (a memory and a pids directory)."""

    kind: str
    paths: tuple[Path, ...]

    @classmethod
    def create(cls, name: str, *, memory_bytes: int, max_processes: int) -> Group | None:
        """The cgroup `name` with these limits (a group left by a dead owner is emptied and reused); None where the
        host has no writable cgroup (logged once)."""
        if not NAME.match(name):
            raise ValueError(f"not a flakebot cgroup name: {name}")
        for make in (_v2, _v1):
            try:
                group = make(name)
                if group is not None:
                    group.kill_all()
                    group._limit(memory_bytes, max_processes)
                    return group
            except OSError as exc:
                logger.debug("cgroup %s not made (%s): %s", name, make.__name__, exc)
        if not _warned:
            _warned.append(True)
            logger.warning(
                "no writable cgroup (v2 with memory and pids, or v1 memory and pids): a service's memory and "
                "processes are bounded per process only (RLIMIT_DATA, RLIMIT_NPROC)"
            )
        return None

    @classmethod
    def from_dict(cls, data: Any) -> Group | None:
        """A group a record names (status.json), or None unless every path is a flakebot cgroup under ROOT."""
        if not isinstance(data, dict) or data.get("kind") not in ("v1", "v2"):
            return None
        paths = data.get("paths")
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
            return None
        found = tuple(Path(p) for p in paths)
        for path in found:
            if not path.is_relative_to(ROOT) or ".." in path.parts or not NAME.match(path.name):
                return None
        return cls(data["kind"], found)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "paths": [str(p) for p in self.paths]}

    def describe(self, memory_bytes: int, max_processes: int) -> str:
        return f"cgroup {self.kind}: {memory_bytes >> 20} MiB and {max_processes} processes for the whole service"

    def enter(self) -> None:
        """Move the calling process into the group (between fork and exec: a Popen preexec_fn)."""
        for path in self.paths:
            (path / "cgroup.procs").write_text("0")

    def pids(self) -> list[int]:
        found: set[int] = set()
        for path in self.paths:
            try:
                found.update(int(line) for line in (path / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                continue
        return sorted(found)

    def oom_kills(self) -> int:
        """How many processes the kernel killed for passing the group's memory limit."""
        name = "memory.events" if self.kind == "v2" else "memory.oom_control"
        return _field(self.paths[0] / name, "oom_kill")

    def peak_bytes(self) -> int:
        """The most memory the group held at once (0 where the kernel does not keep it)."""
        name = "memory.peak" if self.kind == "v2" else "memory.max_usage_in_bytes"
        try:
            return int((self.paths[0] / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    def kill_all(self, timeout: float = 5.0) -> None:
        """SIGKILL every process in the group until it is empty (membership is their identity: no pid guessed)."""
        end = time.monotonic() + timeout
        while (pids := self.pids()) and time.monotonic() < end:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)

    def remove(self) -> None:
        """Kill what is left in the group and remove it."""
        self.kill_all()
        for path in self.paths:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while the last killed process is being reaped
                    time.sleep(0.02)
            else:
                logger.warning("cgroup %s could not be removed", path)

    def _limit(self, memory_bytes: int, max_processes: int) -> None:
        if self.kind == "v2":
            (self.paths[0] / "memory.max").write_text(str(memory_bytes))
            swap = self.paths[0] / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")
            (self.paths[0] / "pids.max").write_text(str(max_processes))
            return
        memory, pids = self.paths
        (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
        memsw = memory / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            memsw.write_text(str(memory_bytes))  # swap counted too: the limit is memory plus swap
        (pids / "pids.max").write_text(str(max_processes))


def _own(controller: str) -> str:
    """This process's cgroup path for `controller` ('' for v2's unified line) from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(",") or (not controller and not names):
            return path
    return "/"


def _v2(name: str) -> Group | None:
    for mount in (ROOT, ROOT / "unified"):
        controllers = mount / "cgroup.controllers"
        if not controllers.exists() or not {"memory", "pids"} <= set(controllers.read_text().split()):
            continue
        parent = mount / _own("").lstrip("/")
        if not {"memory", "pids"} <= set((parent / "cgroup.subtree_control").read_text().split()):
            (parent / "cgroup.subtree_control").write_text("+memory +pids")
        _sweep(parent)
        path = parent / name
        path.mkdir(exist_ok=True)
        return Group("v2", (path,))
    return None


def _v1(name: str) -> Group | None:
    paths: list[Path] = []
    for controller in ("memory", "pids"):
        mount = ROOT / controller
        if not (mount / "cgroup.procs").exists():
            return None
        parent = mount / _own(controller).lstrip("/")
        parent = parent if parent.is_dir() else mount
        _sweep(parent)
        path = parent / name
        path.mkdir(exist_ok=True)
        paths.append(path)
    return Group("v1", tuple(paths))


def _sweep(parent: Path) -> None:
    """Remove the empty flakebot groups in `parent` older than SWEEP_AGE: what an owner killed with SIGKILL left (a
    live service's group has members; a stopped one's is removed at its stop, made again at its next start)."""
    for path in parent.glob("flakebot-*"):
        try:
            if time.time() - path.stat().st_mtime > SWEEP_AGE and not (path / "cgroup.procs").read_text().strip():
                path.rmdir()
                logger.info("removed the empty cgroup %s", path)
        except OSError:
            continue  # taken again, or removed by another sweep


def _field(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            words = line.split()
            if len(words) == 2 and words[0] == key:
                return int(words[1])
    except (OSError, ValueError):
        pass
    return 0


__all__ = ["Group"]
