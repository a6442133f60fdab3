"""flakebot's own flake.nix and flake.lock: they parse, pin nixos-26.05, and name pyproject's dependencies."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import git

from flakebot.nix.lock import flake_lock
from tests.conftest import REPO, require
from tests.fakes.nix_crates import NIX


def test_flake_nix_parses() -> None:
    require("nix-instantiate")
    result = subprocess.run(
        ["nix-instantiate", "--parse", str(REPO / "flake.nix")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    for needle in ("buildPythonApplication", "mkShell", "genAttrs"):
        assert needle in result.stdout


def test_flake_declares_package_app_and_dev_shell() -> None:
    text = (REPO / "flake.nix").read_text()
    assert 'inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-26.05";' in text
    for needle in (
        "pyproject = true;",
        'mainProgram = "flakebot";',
        "apps = forAllSystems",
        "devShells = forAllSystems",
        "pkgs.cargo pkgs.rustc",
        "pkgs.git",
    ):
        assert needle in text, needle


def test_runtime_dependencies_match_pyproject() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = sorted(re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].lower() for spec in declared)
    match = re.search(r"runtimeDeps = ps: with ps; \[ ([^\]]+) \];", (REPO / "flake.nix").read_text())
    assert match, "flake.nix lists the runtime dependencies in runtimeDeps"
    assert sorted(match.group(1).split()) == wanted


def test_flake_lock_is_the_real_pin_and_consistent_with_flake_nix(tmp_path: Path) -> None:
    require("nix")
    assert json.loads((REPO / "flake.lock").read_text()) == flake_lock()
    copy = tmp_path / "self"
    copy.mkdir()
    for name in ("flake.nix", "flake.lock"):
        shutil.copy(REPO / name, copy / name)
    repo = git.Repo.init(copy)
    repo.git.add("-A")
    repo.close()
    # --no-update-lock-file: nix refuses if flake.lock does not match flake.nix's inputs.
    result = subprocess.run(
        [*NIX, "flake", "metadata", "--offline", "--no-update-lock-file", "--json", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["locks"] == flake_lock()
