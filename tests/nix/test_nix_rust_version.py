"""rustc parity with the pinned nixpkgs: the flake's copy of a crafted crate declares the pin's rustc as rust-version,
cargo resolves for it, and a locked crate needing a newer rustc marks the tool not portable. Real cargo on crates of
the tests' registry (clap 2.34.0 declares no rust-version, clap 4.0.32 and clap_lex 0.3.0 declare 1.60.0)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from flakebot.cargo.runner import Cargo
from flakebot.nix import build_inputs, crate
from flakebot.nix import flake as flake_module
from flakebot.nix.crate import inspect_crate, needs_newer_rustc
from flakebot.nix.flake import Choice, Written, _notices, _portability, write_flake
from flakebot.nix.lock import NIXPKGS_BRANCH, PINNED_RUSTC
from tests.fakes.nix_crates import host_settings, manifest, write

CLAP_ANY = 'clap = ">=2, <5"\n'


def _clap_user(root: Path, rust_version: str = "", deps: str = CLAP_ANY) -> Path:
    extra = f'description = "kept as written"\nrust-version = "{rust_version}"\n' if rust_version else ""
    return write(root, {"Cargo.toml": manifest("clapper", extra, deps), "src/main.rs": "fn main() {}\n"})


def _locked_clap(lock: Path) -> str:
    return next(str(p["version"]) for p in build_inputs.lock_packages(lock) if p["name"] == "clap")


def test_cargo_resolves_dependencies_for_the_declared_rust_version(tmp_path: Path) -> None:
    """Flakebot's cargo calls use the MSRV-aware resolver whatever the edition: a crate declaring rustc 1.59 gets
    clap 2 (clap 4 wants 1.60); one declaring the pin's rustc gets clap 4."""
    cargo = Cargo.for_run(host_settings(tmp_path), tmp_path / "target")
    for declared, clap in (("1.59", "2.34.0"), (PINNED_RUSTC, "4.0.32")):
        source = _clap_user(tmp_path / f"c-{declared}", declared)
        result = cargo.run(["generate-lockfile"], source, timeout=300)
        assert result.returncode == 0, result.stderr
        assert _locked_clap(source / "Cargo.lock") == clap, declared


def test_the_flakes_copy_declares_the_given_rustc_whatever_the_crate_said(tmp_path: Path) -> None:
    """write_flake writes rust-version into the flake's copy (the crate's own tree is left as it was), replacing the
    value the model left, and the lock generated for the copy is resolved for it."""
    source = _clap_user(tmp_path / "crafted", "1.40")
    before = (source / "Cargo.toml").read_text()
    out = tmp_path / "flake"
    out.mkdir()
    flake = write_flake(source, out, host_settings(tmp_path), Choice(rust_version="1.59.0"), "", lambda message: None)
    copied = tomllib.loads((out / "Cargo.toml").read_text())
    assert copied["package"]["rust-version"] == "1.59.0" and copied["package"]["description"] == "kept as written"
    assert (source / "Cargo.toml").read_text() == before
    assert _locked_clap(out / "Cargo.lock") == "2.34.0"  # clap 4 needs rustc 1.60
    assert flake.rust_version_replaced == "1.40"
    assert any(n.startswith("rust-version 1.40 in Cargo.toml replaced by ") for n in _notices("", flake))


def test_a_locked_crate_needing_a_newer_rustc_makes_the_tool_not_portable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cargo metadata's rust_version of every locked package against the pin's rustc: with the pin's own (1.95.0)
    clap 4 is fine; against a pin of rustc 1.59 it needs a newer one, and the tool is marked not portable, saying why."""
    source = _clap_user(tmp_path / "clap4", deps='clap = "4"\n')
    settings = host_settings(tmp_path)
    facts = inspect_crate(source, settings)
    assert facts.needs_newer_rustc == []
    # (this registry's lock has placeholder checksums, another reason; none is about rustc)
    assert "rustc" not in _portability("pinned", Written(facts, build_inputs.NativeInputs(), [], []))["portable_reason"]

    for module in (crate, flake_module):  # as if the pin's rustc were 1.59.0
        monkeypatch.setattr(module, "PINNED_RUSTC", "1.59.0")
    older = inspect_crate(source, settings)
    assert older.needs_newer_rustc == ["clap 4.0.32 (rust-version 1.60.0)", "clap_lex 0.3.0 (rust-version 1.60.0)"]
    verdict = _portability("pinned", Written(older, build_inputs.NativeInputs(), [], []))
    assert verdict["portable"] is False
    assert verdict["portable_reason"].split("; ")[-1] == (
        f"locked crates need a newer rustc than nixpkgs {NIXPKGS_BRANCH}'s 1.59.0: "
        "clap 4.0.32 (rust-version 1.60.0), clap_lex 0.3.0 (rust-version 1.60.0)"
    )


def test_rust_versions_compare_as_numbers() -> None:
    meta = {
        "packages": [
            {"name": "a", "version": "1.0.0", "rust_version": "1.100"},
            {"name": "b", "version": "2.0.0", "rust_version": "1.95"},
            {"name": "c", "version": "3.0.0", "rust_version": None},
            {"name": "d", "version": "4.0.0", "rust_version": "1.96.0"},
        ]
    }
    assert needs_newer_rustc(meta, "1.95.0") == ["a 1.0.0 (rust-version 1.100)", "d 4.0.0 (rust-version 1.96.0)"]


def test_a_crafted_lone_package_is_resolved_beside_its_build_with_the_same_facts_and_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crafted crate at its workspace's top whose dependencies are registry crates: its flake is written from
    cargo's --no-deps answer, and the resolution (cargo metadata --locked) comes beside its build: settled, the facts
    are the resolving inspect's (the dependencies' rust-versions too), and a lock cargo cannot hold to is its error."""
    import dataclasses

    from flakebot.errors import NixError

    for module in (crate, flake_module):  # as if the pin's rustc were 1.59.0
        monkeypatch.setattr(module, "PINNED_RUSTC", "1.59.0")
    settings = host_settings(tmp_path)
    source = _clap_user(tmp_path / "clap4", deps='clap = "4"\n')
    resolved = inspect_crate(source, settings)  # locks the crate, as its tests did
    choice = Choice(at_root=True, as_tested=True)
    written = write_flake(source, tmp_path / "flake", settings, choice, "", lambda message: None)
    assert written.resolution is not None and written.facts.needs_newer_rustc == []
    flake_module.settle_resolution(written)
    assert written.facts == dataclasses.replace(resolved, lock_generated=False) and written.resolution is None
    assert resolved.needs_newer_rustc == ["clap 4.0.32 (rust-version 1.60.0)", "clap_lex 0.3.0 (rust-version 1.60.0)"]

    (source / "Cargo.toml").write_text((source / "Cargo.toml").read_text().replace('clap = "4"', 'clap = "2"'))
    stale = write_flake(source, tmp_path / "stale", settings, choice, "", lambda message: None)
    with pytest.raises(NixError, match="cargo cannot resolve clap4 from its Cargo.lock"):
        flake_module.settle_resolution(stale)
