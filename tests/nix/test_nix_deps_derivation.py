"""The locked dependencies as a derivation of their own, through real `nix build`s with the host stand-in: two tools
on the same dependencies share it, it is built once, and each tool's own build compiles only the tool."""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

import pytest

from flakebot.nix.flake import package_crate
from flakebot.nix.reuse import compiled_crates, dependency_derivation, dependency_output
from flakebot.nix.skeleton import SKELETON_DIR
from tests.fakes.nix_crates import NIX, host_settings, lib_workspace, libc_tool
from tests.fakes.spawns import spawns

pytestmark = pytest.mark.slow


NIX_STORE = [str(Path(NIX[0]).with_name("nix-store"))]


def _registered(path: str) -> int:
    argv = [*NIX, "path-info", "--json", "--offline", path]
    info = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout)
    return int(info[0]["registrationTime"])


def _store(*args: str) -> str:
    return subprocess.run([*NIX_STORE, *args], capture_output=True, text=True, check=True, timeout=60).stdout.strip()


def test_two_tools_on_the_same_dependencies_build_them_once(tmp_path: Path) -> None:
    settings = host_settings(tmp_path)
    # A feature named for this run makes the dependencies' derivation new: this run builds it (a store hit would not)
    features = f"\n[features]\nrun-{secrets.token_hex(6)} = []\n"
    markers = [secrets.token_hex(8) for _ in range(2)]
    first = package_crate(libc_tool(tmp_path / "a", "tally", "0.1.0", markers[0], features), tmp_path / "fa", settings)
    deps_drv, deps_out = dependency_derivation(first.store_path), dependency_output(first.store_path)
    assert deps_drv and deps_out
    # read from the derivations' files, as the store answers it, and without a process when the build named the drv
    tool_drv = _store("--query", "--deriver", first.store_path)
    assert deps_drv in _store("--query", "--references", tool_drv).split()
    assert _store("--query", "--outputs", deps_drv) == deps_out
    with spawns() as started:
        assert dependency_output(first.store_path, tool_drv) == deps_out
    assert started == []
    built_at = _registered(deps_out)
    assert {"libc", "itoa"} <= set(compiled_crates(deps_out)) and "tally" not in compiled_crates(deps_out)
    assert compiled_crates(first.store_path) == ["tally"]  # the dependencies came from their own derivation
    # A build input, not in the tool's closure: a GC root beside the tool's keeps it for the next craft on them
    assert first.dependencies_path == deps_out
    roots = subprocess.run([*NIX_STORE, "--query", "--roots", deps_out], capture_output=True, text=True, check=True)
    assert f"{tmp_path / 'fa' / 'result-deps'} -> {deps_out}" in roots.stdout.splitlines(), roots.stdout

    # another tool, another version, the same dependencies
    second = package_crate(libc_tool(tmp_path / "b", "wordy", "2.3.0", markers[1], features), tmp_path / "fb", settings)
    assert (
        dependency_derivation(second.store_path) == deps_drv and _registered(deps_out) == built_at
    )  # shared, not built again
    assert compiled_crates(second.store_path) == ["wordy"]
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
    assert {"libc", "itoa", "core-lib"} <= set(compiled_crates(dependency_output(result.store_path) or ""))
    assert sorted(compiled_crates(result.store_path)) == ["app", "core-lib"]
    ran = subprocess.run([result.bin_path], capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0 and ran.stdout == f"{marker} built-{marker}\n"
