"""Flake rendering: licences, native inputs, the pinned lock, and a rendered flake.nix that real nix parses."""

from __future__ import annotations

import base64
import json
import re
import subprocess
from pathlib import Path

import pytest

from flakebot.nix import build_inputs, command, licenses
from flakebot.nix.crate import CrateFacts
from flakebot.nix.flake_files import nix_str, render_flake
from flakebot.nix.lock import PINNED_NIXPKGS, flake_lock
from tests.conftest import FIXTURES, require


@pytest.mark.parametrize(
    ("expression", "names", "unknown"),
    [
        ("MIT OR Apache-2.0", ["mit", "asl20"], []),
        ("MIT/Apache-2.0", ["mit", "asl20"], []),
        ("(MIT OR Apache-2.0) AND Unicode-DFS-2016", ["mit", "asl20", "unicode-dfs-2016"], []),
        ("GPL-3.0+", ["gpl3Plus"], []),
        ("GPL-2.0", ["gpl2Only"], []),
        ("Apache-2.0 WITH LLVM-exception", ["asl20", "llvm-exception"], []),
        ("mit or unlicense", ["mit", "unlicense"], []),
        ("LicenseRef-Proprietary", [], ["LicenseRef-Proprietary"]),
        ("", [], []),
    ],
)
def test_spdx_expressions_map_to_lib_licenses(expression: str, names: list[str], unknown: list[str]) -> None:
    assert licenses.nix_licenses(expression) == (names, unknown)


def test_native_inputs_follow_the_crates_in_the_lock() -> None:
    found = build_inputs.native_inputs(["libc", "openssl-sys", "pkg-config", "libgit2-sys", "onig_sys", "prost-build"])
    assert found.native_build_inputs == ["pkg-config", "protobuf"]
    assert found.build_inputs == ["libgit2", "oniguruma", "openssl"]
    assert found.env == {"RUSTONIG_SYSTEM_LIBONIG": "true"}
    assert found.because["openssl"] == ["openssl-sys"]
    assert build_inputs.native_inputs(["serde", "clap"]).to_dict() == {
        "nativeBuildInputs": [],
        "buildInputs": [],
        "env": {},
        "because": {},
    }


def test_a_library_alone_still_gets_pkg_config() -> None:
    # libsqlite3-sys finds sqlite through pkg-config even when the pkg-config crate is not in the lock.
    assert build_inputs.native_inputs(["libsqlite3-sys"]).native_build_inputs == ["pkg-config"]


def test_flake_lock_pins_a_real_nixos_26_05_node() -> None:
    # The node is copied from a public flake.lock (cited in flakebot/nix/lock.py); the older fixture pins are not it.
    older = json.loads((FIXTURES / "nixpkgs-pins.json").read_text())
    lock = flake_lock()
    locked = lock["nodes"]["nixpkgs"]["locked"]
    assert locked == PINNED_NIXPKGS and locked not in older.values()
    assert re.fullmatch(r"[0-9a-f]{40}", locked["rev"])
    assert re.fullmatch(r"sha256-[A-Za-z0-9+/]{43}=", locked["narHash"])
    assert len(base64.b64decode(locked["narHash"].removeprefix("sha256-"))) == 32
    assert locked["lastModified"] > max(pin["lastModified"] for pin in older.values())
    assert lock["nodes"]["nixpkgs"]["original"] == {
        "owner": "NixOS",
        "repo": "nixpkgs",
        "ref": "nixos-26.05",
        "type": "github",
    }
    assert lock["nodes"]["root"] == {"inputs": {"nixpkgs": "nixpkgs"}} and lock["version"] == 7


def _facts(**extra: object) -> CrateFacts:
    base = {
        "pname": "tool",
        "version": "1.2.3",
        "bin_name": "tool-cli",
        "description": "",
        "license": "MIT",
        "homepage": "https://example.org/t",
    }
    return CrateFacts(**{**base, **extra})  # type: ignore[arg-type]


def _parse(text: str, tmp_path: Path) -> str:
    require("nix-instantiate")
    path = tmp_path / "flake.nix"
    path.write_text(text)
    result = subprocess.run(["nix-instantiate", "--parse", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_rendered_flake_with_every_section_parses(tmp_path: Path) -> None:
    facts = _facts(
        cargo_build_flags=["-p", "tool", "--bin", "tool-cli"],
        cargo_test_flags=["-p", "tool"],
        git_dependencies=["gitdep-0.1.0", "hashed-0.2.0"],
    )
    native = build_inputs.native_inputs(["openssl-sys", "onig_sys", "bindgen"])
    learned = {"hashed-0.2.0": "sha256-q23e50NvLHqX65cy9itYMhPtlAKjGImm1xKw5ZMql/A="}
    text = render_flake(
        facts,
        'Prints "quotes", ${interpolation} and \\ backslashes',
        native,
        ["mit", "asl20"],
        ["LicenseRef-X"],
        learned,
    )
    parsed = _parse(text, tmp_path)
    assert "rustPlatform" in parsed and "buildRustPackage" in parsed
    for needle in (
        'cargoBuildFlags = [ "-p" "tool" "--bin" "tool-cli" ];',
        'cargoTestFlags = [ "-p" "tool" ];',
        "nativeBuildInputs = with pkgs; [ rustPlatform.bindgenHook pkg-config ];",
        "buildInputs = with pkgs; [ oniguruma openssl ];",
        '"RUSTONIG_SYSTEM_LIBONIG" = "true";',
        '"gitdep-0.1.0" = lib.fakeHash;',
        '"hashed-0.2.0" = "sha256-q23e50NvLHqX65cy9itYMhPtlAKjGImm1xKw5ZMql/A=";',
        "license = with lib.licenses; [ mit asl20 ];",
        'mainProgram = "tool-cli";',
        'program = "${self.packages.${system}.default}/bin/tool-cli";',
        'inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-26.05";',
        '"Prints \\"quotes\\", \\${interpolation} and \\\\ backslashes"',
    ):
        assert needle in text, needle


def test_minimal_flake_parses_and_omits_empty_sections(tmp_path: Path) -> None:
    text = render_flake(_facts(homepage=""), "", build_inputs.native_inputs([]), [], [])
    _parse(text, tmp_path)
    for absent in (
        "cargoBuildFlags",
        "nativeBuildInputs",
        "buildInputs",
        "outputHashes",
        "env =",
        "license =",
        "homepage",
    ):
        assert absent not in text
    assert 'description = "tool 1.2.3";' in text


def test_nix_str_escapes_what_nix_interprets() -> None:
    assert nix_str('a"b') == '"a\\"b"'
    assert nix_str("${x}") == '"\\${x}"'
    assert nix_str("a\nb\\") == '"a\\nb\\\\"'


def test_a_pinned_flake_is_run_with_plain_nix_and_no_machine_paths(tmp_path: Path) -> None:
    """The command a pinned build's manifest hands on names `nix` from PATH and the flake, nothing else of this machine."""
    require("nix")
    argv = command.run_argv(tmp_path / "flake", "pinned", None)
    assert argv[0] == "nix" and "--override-input" not in argv and argv[-1] == str(tmp_path / "flake")
