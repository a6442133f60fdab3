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

STORE = Path("/nix/store")
DEPS_DERIVATION_SUFFIX = "-cargo-deps-0.drv"  # pname "cargo-deps", version "0" in templates/flake.nix.j2
_COMPILING = re.compile(r"^\s*Compiling (\S+) ", re.MULTILINE)


def dependency_derivation(store_path: str, deriver: str = "") -> str | None:
    """The deps derivation the derivation of `store_path` (`deriver` when the build named it, else the store's deriver)
    builds on (None: its dependencies built with it)."""
    tool = deriver or _nix_store("--query", "--deriver", store_path)
    read = _derivation(tool)
    inputs = read[1] if read is not None else _nix_store("--query", "--references", tool).split()
    found = [drv for drv in inputs if drv.endswith(DEPS_DERIVATION_SUFFIX)]
    return found[0] if found else None


def dependency_output(store_path: str, deriver: str = "") -> str | None:
    """The output path of the deps derivation `store_path` was built on (None: none)."""
    drv = dependency_derivation(store_path, deriver)
    if not drv:
        return None
    read = _derivation(drv)
    return (read[0].get("out") if read is not None else None) or _nix_store("--query", "--outputs", drv)


# The head of a .drv file (Nix's ATerm): Derive([("out","/nix/store/…","",""),…],[("/nix/store/….drv",["out"]),…],…
# Output names, store paths and output names hold no quote or backslash, so the two lists read unambiguously.
_DERIVE = re.compile(
    r'Derive\(\[(?P<outputs>(?:\("[^"\\]*","[^"\\]*","[^"\\]*","[^"\\]*"\),?)*)\],'
    r'\[(?P<inputs>(?:\("[^"\\]*",\[(?:"[^"\\]*",?)*\]\),?)*)\]'
)
_OUTPUT = re.compile(r'\("([^"\\]*)","([^"\\]*)"')
_INPUT = re.compile(r'\("([^"\\]*)",\[')
DERIVATION_HEAD = 1 << 20  # bytes read of a .drv: its outputs and input derivations come first


def _derivation(drv: str) -> tuple[dict[str, str], list[str]] | None:
    """({output name: path}, input derivations) of a derivation in the store, read from its file: what
    `nix-store --query --outputs/--references` would answer, without a process. None when the file is not in the
    store or not in that form (a newer format): then the store is asked."""
    path = Path(drv)
    if not (path.is_relative_to(STORE) and path.name.endswith(".drv")):
        return None
    try:
        with path.open("rb") as file:
            head = file.read(DERIVATION_HEAD).decode(errors="replace")
    except (OSError, UnicodeDecodeError):
        return None
    found = _DERIVE.match(head)
    if found is None:
        return None
    outputs = {name: out for name, out in _OUTPUT.findall(found["outputs"]) if out}
    return outputs, _INPUT.findall(found["inputs"])


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
