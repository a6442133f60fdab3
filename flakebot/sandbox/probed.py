"""Bubblewrap programs whose probe passed, remembered so a sandbox is probed once, not before every command.

In this process (an MCP server runs many tool calls), and across processes (each `flakebot run` is one): a record
in the cache directory, valid while the machine's boot, the bwrap file, the user, its user namespace and seccomp
state, and the kernel's user-namespace settings are the ones it was made under. Skipping a probe cannot loosen
anything: a sandbox that fails after all fails its command with bubblewrap's error; it never falls back to a
plain process.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from flakebot.homes import cache_home

logger = logging.getLogger(__name__)

# Kernel settings that decide whether bubblewrap can make its namespaces (absent ones read as "").
USERNS_SETTINGS = (
    "/proc/sys/kernel/random/boot_id",
    "/proc/sys/user/max_user_namespaces",
    "/proc/sys/kernel/unprivileged_userns_clone",
    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
)

# bwrap path -> the start overhead its probe measured
_WORKING: dict[str, float | None] = {}


def known_working(bwrap: str) -> tuple[bool, float | None]:
    """Whether `bwrap` passed a probe here (this process, or an earlier one under the same conditions), and the
    start overhead it measured then."""
    if bwrap in _WORKING:
        return True, _WORKING[bwrap]
    try:
        record = json.loads(_record_path().read_text())
    except (OSError, ValueError):
        return False, None
    if not isinstance(record, dict) or record.get("conditions") != _conditions(bwrap):
        return False, None
    overhead = record.get("start_overhead_s")
    _WORKING[bwrap] = overhead if isinstance(overhead, float) else None
    return True, _WORKING[bwrap]


def remember(bwrap: str, start_overhead: float | None) -> None:
    """Record that `bwrap` passed its probe (the record is a cache: failing to write it only costs a probe later)."""
    _WORKING[bwrap] = start_overhead
    path = _record_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text(json.dumps({"conditions": _conditions(bwrap), "start_overhead_s": start_overhead}))
        partial.replace(path)
    except OSError as exc:
        logger.debug("could not record the sandbox probe in %s: %s", path, exc)


def _record_path() -> Path:
    return cache_home() / f"bwrap-probe-{os.geteuid()}.json"


def _conditions(bwrap: str) -> dict[str, object]:
    stat = os.stat(bwrap)
    return {
        "bwrap": bwrap,
        "file": [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns],
        "euid": os.geteuid(),
        "kernel": [_read(name) for name in USERNS_SETTINGS],
        # the user namespace this process is in, and whether a seccomp filter holds it (containers, sandboxes)
        "userns": _link("/proc/self/ns/user"),
        "seccomp": [line for line in _read("/proc/self/status").splitlines() if line.startswith("Seccomp")],
    }


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
