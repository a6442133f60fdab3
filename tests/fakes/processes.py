"""The processes a test started, found by process tree: never by name across the machine, where another test run
(another engineer's `kv-store`, another `sleep`) would be counted as this test's.

`own_processes()` makes the test's own process a child subreaper (prctl PR_SET_CHILD_SUBREAPER) while it runs, so a
process that daemonizes or loses its parent (a supervisor `up` started, a `sleep` a service forked in a new session)
is reparented to the test instead of to init: it stays in the test's tree, where the listing finds it.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h

Listing = Callable[[], list[tuple[int, list[str]]]]


@contextmanager
def own_processes() -> Iterator[Listing]:
    """Yield a function listing the live (not zombie) descendants of this process as (pid, argv), but those already
    running when it was entered (a session's fixtures: a git daemon another test started is not this test's)."""
    libc = ctypes.CDLL(None, use_errno=True)
    earlier = {pid for pid, (parent, _) in _table().items() if parent == os.getpid()}
    running = {pid for pid, _ in descendants()}
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    try:
        yield lambda: [(pid, argv) for pid, argv in descendants() if pid not in running]
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        ended = {pid for pid, (parent, state) in _table().items() if parent == os.getpid() and state == "Z"}
        for pid in ended - earlier:  # orphans given to this process that ended: nobody else waits for them
            os.waitpid(pid, os.WNOHANG)


def descendants() -> list[tuple[int, list[str]]]:
    """(pid, argv) of every live process below this one (the parent links of /proc, followed down from here)."""
    below: dict[int, list[int]] = {}
    for pid, (parent, state) in _table().items():
        if state not in ("Z", "X"):
            below.setdefault(parent, []).append(pid)
    found, todo = [], [os.getpid()]
    while todo:
        for child in below.get(todo.pop(), []):
            todo.append(child)
            try:
                argv = Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue  # ended meanwhile
            found.append((child, argv))
    return found


def _table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process the kernel shows."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            table[int(entry)] = (int(fields[1]), fields[0])
    return table


def cmdline(pid: int) -> str:
    """A process's command line as one string ('' once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """The process runs (a zombie or a dead one does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def remove_cgroup(path: Path) -> None:
    """Kill whatever a test's cgroup still holds, then remove it (flakebot's own Group.remove), and see it gone."""
    from flakebot.sandbox.cgroup import Group

    if path.is_dir():
        Group("v1", (path,)).remove()
    assert not path.exists(), f"cgroup {path} left behind"
