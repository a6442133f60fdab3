"""Bubblewrap programs whose probe passed, remembered so a sandbox is probed once, not before every command.

In this process (an MCP server runs many tool calls), and across processes (each `flakebot run` is one): kept by
probecache (its record, read only when it is this user's own file), valid while the machine's boot, the bwrap file,
the user, its user namespace and seccomp state, and the kernel's user-namespace settings are the ones it was made
under. Skipping a probe cannot loosen anything: a sandbox that fails after all fails its command with bubblewrap's
error; it never falls back to a plain process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from flakebot import probecache

# Kernel settings that decide whether bubblewrap can make its namespaces (absent ones read as "").
USERNS_SETTINGS = (
    "/proc/sys/kernel/random/boot_id",
    "/proc/sys/user/max_user_namespaces",
    "/proc/sys/kernel/unprivileged_userns_clone",
    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
)


def known_working(bwrap: str) -> tuple[bool, float | None]:
    """Whether `bwrap` passed a probe here (this process, or an earlier one under the same conditions), and the
    start overhead it measured then."""
    kept = probecache.recalled(_key(bwrap))
    if kept is None:
        return False, None
    try:
        overhead = json.loads(kept)
    except ValueError:
        overhead = None
    return True, overhead if isinstance(overhead, float) else None


def remember(bwrap: str, start_overhead: float | None) -> None:
    """Record that `bwrap` passed its probe (the record is a cache: failing to write it only costs a probe later)."""
    probecache.keep(_key(bwrap), json.dumps(start_overhead))


def _key(bwrap: str) -> str:
    """The probe's key: the conditions it passed under, and the bwrap file's stamp (an upgrade is probed again)."""
    conditions = {
        "euid": os.geteuid(),
        "kernel": [_read(name) for name in USERNS_SETTINGS],
        # the user namespace this process is in, and whether a seccomp filter holds it (containers, sandboxes)
        "userns": _link("/proc/self/ns/user"),
        "seccomp": [line for line in _read("/proc/self/status").splitlines() if line.startswith("Seccomp")],
    }
    return probecache.key(["bwrap probe", bwrap, conditions], [bwrap])


def _link(name: str) -> str:
    try:
        return os.readlink(name)
    except OSError:
        return ""


def _read(name: str) -> str:
    try:
        return Path(name).read_text().strip()
    except OSError:
        return ""
