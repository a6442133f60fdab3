"""The sandbox every command that runs model-written code goes through (cargo build and test, the built tool).

    process.py     Sandbox protocol, CommandResult, limits, running one command (timeout, output cap, no leftovers);
                   at_once: calls on a pool whose commands die when the caller is interrupted
    bubblewrap.py  BwrapSandbox: the bubblewrap command line, mounts, the unprivileged uid for root
    ownership.py   adopt(): flakebot's writable trees handed to that uid's group before each command
    probed.py      bubblewrap programs whose probe passed (this process, and this boot; kept by probecache), so
                   each is probed once
    cgroup.py      Group: a process tree's own cgroup (v2, else v1 memory + pids): total memory, process count
    __init__.py    open_sandbox(): the kind of sandbox a mode asks for

May import flakebot.config, flakebot.errors.

    open_sandbox(mode, workspace=..., writable=[...]) -> Sandbox
        BwrapSandbox   bubblewrap: read-only system and toolchain, writable workspace + target dir only,
                       private /tmp and HOME, no network, own PID/IPC/UTS namespaces, a process limit
        PlainSandbox   a plain process with the same timeout and output cap (bubblewrap missing, or mode "off")

Every command gets a wall-clock timeout (the whole process tree is killed), an output cap (head + tail
kept), a minimal environment (no API keys), per-process limits through prlimit (processes, data memory,
file size; in plain mode too), a disk watch (killed when the workspace's file system grows by more than
`disk_mb` while it runs), and leaves no process behind. Under bubblewrap /tmp and HOME are size-limited
tmpfs, /nix/store is read-only, of /etc only what toolchains need is bound (bubblewrap.ETC_ALLOWED), the
sandbox holds no capabilities at all, and `frozen` files (the acceptance test) are bound read-only over the
writable workspace.

Process limit: RLIMIT_NPROC is not enforced for real root (the kernel exempts uid 0, even inside a user
namespace mapped to it). So as root, with `adopt` (flakebot's own trees: the run's workspace and target dir,
its scratch directories, the staged copies a crafted tool writes) the command drops to an unused uid with no
capabilities under `prlimit --nproc`, and the writable trees (and the sources of writable binds) are handed to that
uid's group before each command (sandbox/ownership.py). Without `adopt` nothing is changed: the command keeps the
caller's uid with every capability dropped. As a normal user, bubblewrap's user namespace plus `prlimit --nproc`
inside it limits the sandbox alone. /tmp and HOME are mode 1777 so compilers find a temporary directory.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from flakebot.errors import SandboxError
from flakebot.sandbox import probed
from flakebot.sandbox.bubblewrap import BwrapSandbox, real_root
from flakebot.sandbox.process import MAX_PROCESSES, CommandResult, PlainSandbox, Sandbox, SandboxLimits, execute

if TYPE_CHECKING:  # a type only: the supervisor imports this module, never config (benchmarks S5: its memory)
    from flakebot.config import Settings

logger = logging.getLogger(__name__)

__all__ = [
    "MODES",
    "BwrapSandbox",
    "CommandResult",
    "PlainSandbox",
    "Sandbox",
    "SandboxLimits",
    "execute",
    "limits_for",
    "open_sandbox",
    "real_root",
]

MODES = ("auto", "required", "off")
PERMISSIONS = ("READ_WRITE", "READ_ONLY")


def open_sandbox(
    mode: str,
    *,
    workspace: Path,
    writable: list[Path],
    permission: str = "READ_WRITE",
    timeout: float = 600,
    output_cap: int = 200_000,
    readable: Sequence[Path] = (),
    max_processes: int = MAX_PROCESSES,
    frozen: Sequence[Path] = (),
    limits: SandboxLimits | None = None,
    cargo_home: Path | None = None,
    workspace_at: Path | None = None,
    binds: Sequence[tuple[bool, Path, Path]] = (),
    cargo_git: Path | None = None,
    adopt: bool = False,
) -> Sandbox:
    """The sandbox for commands in `workspace`: bubblewrap when usable; "auto" falls back to a plain process
    with a warning, "off" is a plain process by request (warned on every call). `limits` (see limits_for)
    replaces timeout, output_cap and max_processes when given. `cargo_home`: flakebot's CARGO_HOME, whose
    fetched crates (registry/) the sandbox reads, read-only, for offline builds; `cargo_git`: the run's own view of
    its git/ (only the checkouts the workspace's Cargo.lock names). `adopt`: the writable dirs are flakebot's own
    and may be handed to the sandbox's unprivileged uid (see the module docstring). `workspace_at` and `binds`
    (bubblewrap only): where the workspace appears inside, and (writable, source, destination) binds over it."""
    if mode not in MODES:
        raise SandboxError(f"unknown sandbox mode '{mode}'", fix=f"use one of: {', '.join(MODES)}")
    if permission not in PERMISSIONS:
        raise SandboxError(f"unknown sandbox permission '{permission}'", fix=f"use one of: {', '.join(PERMISSIONS)}")
    limits = limits or SandboxLimits(timeout=timeout, output_cap=output_cap, max_processes=max_processes)
    if not Path(workspace).is_dir():
        raise SandboxError(
            f"workspace {workspace} is not a directory",
            fix="acquire the crate first (flakebot craft ... runs the acquire stage)",
        )
    if mode == "off":
        logger.warning(
            "sandbox off: model-written code runs as a plain process with full access to this machine and the network"
        )
        return PlainSandbox(limits, name="off")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return _without_bwrap(
            mode, limits, "bubblewrap (bwrap) is not installed", "install bubblewrap (apt-get install bubblewrap)"
        )
    sandbox = BwrapSandbox(
        bwrap,
        Path(workspace),
        [Path(p) for p in writable],
        limits,
        read_only=permission == "READ_ONLY",
        readable=readable,
        frozen=frozen,
        cargo_home=cargo_home,
        workspace_at=workspace_at,
        binds=binds,
        cargo_git=cargo_git,
        adopt=adopt,
    )
    working, overhead = probed.known_working(bwrap)
    if working:  # it made a sandbox before (probed.py: in this process, or this boot under the same conditions)
        sandbox.start_overhead = overhead
        return sandbox
    problem = sandbox.probe()
    if problem:
        return _without_bwrap(mode, limits, f"bubblewrap cannot create a sandbox here ({problem})", _userns_fix())
    probed.remember(bwrap, sandbox.start_overhead)
    return sandbox


def limits_for(settings: Settings, timeout: float | None = None) -> SandboxLimits:
    """The sandbox limits the settings ask for (`timeout` overrides command_timeout)."""
    return SandboxLimits(
        timeout=timeout or settings.command_timeout,
        output_cap=settings.output_cap,
        memory_mb=settings.sandbox_memory_mb,
        file_mb=settings.sandbox_file_mb,
        disk_mb=settings.sandbox_disk_mb,
    )


def _without_bwrap(mode: str, limits: SandboxLimits, problem: str, fix: str) -> Sandbox:
    if mode == "required":
        raise SandboxError(
            f"sandbox required, but {problem}", fix=f"{fix}, or pass --sandbox off to run without isolation (unsafe)"
        )
    logger.warning(
        "%s: commands run as plain processes (timeout and output cap only, no isolation). Fix: %s", problem, fix
    )
    return PlainSandbox(limits, name="plain")


def _userns_fix() -> str:
    return (
        "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces>0, "
        "or on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0)"
    )
