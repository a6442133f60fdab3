"""Another machine on this one, for shared catalogs: flakebot in its own mount namespace with an empty /nix.

Machine B runs its steps in one `unshare --mount` namespace where /nix is a fresh tmpfs (Nix starts a new store
and database there), with its own XDG directories and work directory, and cargo bind-mounted over by a trap
that records any call. What B's store holds afterwards and whether cargo ran are judged from outside.
Needs root (mount); the benchmarks use it too.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FLAKEBOT = [sys.executable, "-m", "flakebot"]
DEBIAN_REGISTRY = Path("/usr/share/cargo/registry")


def machine_env(home: Path, registry: Path = DEBIAN_REGISTRY, **extra: str) -> dict[str, str]:
    """A machine's own config, data (catalog), cache and work directories under `home`, its local registry; no
    FLAKEBOT_* of ours."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("FLAKEBOT_")}
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"), ("XDG_CACHE_HOME", "cache")):
        (home / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(home / sub)
    return {
        **env,
        "FLAKEBOT_WORKDIR": str(home / "work"),
        "FLAKEBOT_LOCAL_REGISTRY": str(registry),
        **extra,
    }


@dataclass
class Step:
    """One command machine B runs, with its standard input."""

    argv: list[str]
    stdin: str = ""


def flakebot(*args: str, stdin: str = "") -> Step:
    return Step([*FLAKEBOT, *args], stdin)


@dataclass
class MachineB:
    """What B's steps printed, what its store holds afterwards, and every call of cargo (empty: none)."""

    results: list[subprocess.CompletedProcess[str]]
    store: list[str]
    cargo_calls: str
    home: Path


def on_machine_b(
    home: Path, catalogs: str, steps: list[Step], timeout: float = 600, registry: Path = DEBIAN_REGISTRY
) -> MachineB:
    """Run `steps` as machine B (one namespace, so its store lives through them) trusting `catalogs` (string form)."""
    home.mkdir(parents=True, exist_ok=True)
    trap, calls = home / "cargo-trap", home / "cargo-calls"
    trap.write_text(f'#!/bin/sh\necho "cargo $*" >> {shlex.quote(str(calls))}\nexit 101\n')
    trap.chmod(0o755)
    cargo = Path(shutil.which("cargo") or "/nonexistent").resolve()
    lines = ["set -u", "mount -t tmpfs tmpfs /nix || exit 97"]
    lines += [f"mount --bind {shlex.quote(str(trap))} {shlex.quote(str(cargo))} || exit 98"] if cargo.exists() else []
    for n, step in enumerate(steps):
        (home / f"in{n}").write_text(step.stdin)
        io = f"< {home}/in{n} > {home}/out{n} 2> {home}/err{n}"
        lines.append(f"{shlex.join(step.argv)} {io}; echo $? > {home}/rc{n}")
    lines.append(f"ls -A /nix/store > {home}/store.txt 2>/dev/null || true  # no store: nothing was fetched")
    (home / "machine-b.sh").write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", str(home / "machine-b.sh")],
        env=machine_env(home, registry, FLAKEBOT_CATALOGS=catalogs),
        cwd=home,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"machine B did not start ({done.returncode}): {done.stderr[-2000:]}")
    results = [
        subprocess.CompletedProcess(
            step.argv,
            int((home / f"rc{n}").read_text()),
            (home / f"out{n}").read_text(),
            (home / f"err{n}").read_text(),
        )
        for n, step in enumerate(steps)
    ]
    store = (home / "store.txt").read_text().split()
    return MachineB(results, store, calls.read_text() if calls.exists() else "", home)
