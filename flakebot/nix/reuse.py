"""What a tool's nix build reused, read back from the store: the deps derivation it was built on and the crates a
build compiled (so a test or a benchmark can show that a second tool on the same dependencies compiled only itself).

    dependency_derivation(store_path) -> the cargo-deps .drv the tool's derivation builds on, or None
    compiled_crates(store_path)       -> the crates cargo compiled in the build of store_path (its build log)
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from flakebot import launcher
from flakebot.errors import NixError
from flakebot.nix import command

DEPS_DERIVATION_SUFFIX = "-cargo-deps-0.drv"  # pname "cargo-deps", version "0" in templates/flake.nix.j2
_COMPILING = re.compile(r"^\s*Compiling (\S+) ", re.MULTILINE)


def dependency_derivation(store_path: str) -> str | None:
    """The deps derivation the derivation of `store_path` builds on (None: its dependencies built with it)."""
    tool = _nix_store("--query", "--deriver", store_path)
    found = [drv for drv in _nix_store("--query", "--references", tool).split() if drv.endswith(DEPS_DERIVATION_SUFFIX)]
    return found[0] if found else None


def dependency_output(store_path: str) -> str | None:
    """The output path of the deps derivation `store_path` was built on (None: none)."""
    drv = dependency_derivation(store_path)
    return _nix_store("--query", "--outputs", drv) if drv else None


def compiled_crates(store_path: str) -> list[str]:
    """The crates cargo compiled, in order, in the build that made `store_path` (from the build log nix kept)."""
    return _COMPILING.findall(_nix_store("--read-log", store_path))


def _nix_store(*args: str) -> str:
    program = str(Path(command.nix_program()).with_name("nix-store"))
    result = launcher.run([program, *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        raise NixError(
            f"nix-store {' '.join(args)} failed: {lines[-1] if lines else 'no output'}",
            fix="check that the path was built on this machine and its build log kept (keep-build-log)",
        )
    return result.stdout.strip()
