"""The locked dependencies as a derivation of their own, through real `nix build`s with the host stand-in: two tools
on the same dependencies share it, it is built once, and each tool's own build compiles only the tool."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
from pathlib import Path

import pytest

from flakebot.nix.flake import PackageResult, package_crate
from flakebot.nix.skeleton import SKELETON_DIR
from tests.fakes.nix_crates import NIX, host_settings, lib_workspace, libc_tool

pytestmark = pytest.mark.slow


def _store(*args: str) -> str:
    return subprocess.run(["nix-store", *args], capture_output=True, text=True, check=True, timeout=60).stdout.strip()


def _deps_derivation(result: PackageResult) -> str:
    """The deps derivation the tool's derivation builds on."""
    tool_drv = _store("--query", "--deriver", result.store_path)
    found = [drv for drv in _store("--query", "--references", tool_drv).split() if drv.endswith("-cargo-deps-0.drv")]
    assert len(found) == 1, found
    return found[0]


def _registered(path: str) -> int:
    argv = [*NIX, "path-info", "--json", "--offline", path]
    info = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout)
    return int(info[0]["registrationTime"])


def _compiled(path: str) -> list[str]:
    """The crates cargo compiled in the build of `path` (from its build log)."""
    return re.findall(r"^\s*Compiling (\S+) ", _store("--read-log", path), re.MULTILINE)


def test_two_tools_on_the_same_dependencies_build_them_once(tmp_path: Path) -> None:
    settings = host_settings(tmp_path)
    # A feature named for this run makes the dependencies' derivation new: this run builds it (a store hit would not)
    features = f"\n[features]\nrun-{secrets.token_hex(6)} = []\n"
    markers = [secrets.token_hex(8) for _ in range(2)]
    first = package_crate(libc_tool(tmp_path / "a", "tally", "0.1.0", markers[0], features), tmp_path / "fa", settings)
    deps_drv = _deps_derivation(first)
    deps_out = _store("--query", "--outputs", deps_drv)
    built_at = _registered(deps_out)
    assert {"libc", "itoa"} <= set(_compiled(deps_out)) and "tally" not in _compiled(deps_out)
    assert _compiled(first.store_path) == ["tally"]  # the dependencies came from their own derivation

    # another tool, another version, the same dependencies
    second = package_crate(libc_tool(tmp_path / "b", "wordy", "2.3.0", markers[1], features), tmp_path / "fb", settings)
    assert _deps_derivation(second) == deps_drv and _registered(deps_out) == built_at  # shared, not built again
    assert _compiled(second.store_path) == ["wordy"]
    assert (tmp_path / "fb" / SKELETON_DIR / "Cargo.lock").read_text() == (
        tmp_path / "fa" / SKELETON_DIR / "Cargo.lock"
    ).read_text()

    for result, marker in zip((first, second), markers, strict=True):
        ran = subprocess.run([result.bin_path], capture_output=True, text=True, timeout=30)
        assert ran.returncode == 0 and ran.stdout == f"{marker} {marker} 7\n"  # its own main.rs and build script


def test_a_workspace_member_is_built_from_its_own_sources_not_the_skeletons(tmp_path: Path) -> None:
    """The deps derivation compiled an empty core-lib; its output leaves it out, so the tool's build compiles the real
    one (a stale empty core-lib would fail app-cli's build, or link the wrong code)."""
    settings = host_settings(tmp_path)
    marker = secrets.token_hex(8)
    result = package_crate(lib_workspace(tmp_path / "ws", marker) / "app", tmp_path / "flake", settings)
    assert {"libc", "itoa", "core-lib"} <= set(_compiled(_store("--query", "--outputs", _deps_derivation(result))))
    assert sorted(_compiled(result.store_path)) == ["app", "core-lib"]
    ran = subprocess.run([result.bin_path], capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0 and ran.stdout == f"{marker} built-{marker}\n"
