"""The dependency skeleton the flake's deps derivation builds from (real cargo, offline against Debian's registry):
no source of the crate in it, equal for tools on the same dependencies, a lock cargo accepts as it is."""

from __future__ import annotations

import logging
import secrets
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest

from flakebot.cargo.runner import Cargo
from flakebot.config import Settings
from flakebot.nix.crate import inspect_crate
from flakebot.nix.skeleton import SKELETON_DIR, SOLE_NAME, Skeleton, write_skeleton
from tests.fakes.nix_crates import host_settings, lib_workspace, libc_tool, write


def _skeleton(crate: Path, settings: Settings) -> Skeleton | None:
    return write_skeleton(crate, inspect_crate(crate, settings), settings)


def _files(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): p.read_text() for p in sorted(directory.rglob("*")) if p.is_file()}


def _cargo_locked(directory: Path, settings: Settings) -> subprocess.CompletedProcess[str]:
    """`cargo metadata --locked` on the skeleton: cargo takes its lock as it is (nix builds it with --frozen)."""
    with tempfile.TemporaryDirectory() as scratch:
        cargo = Cargo.for_run(settings, Path(scratch) / "target")
        return cargo.run(["metadata", "--format-version", "1", "--locked", "--offline"], directory, timeout=120)


def test_two_tools_on_the_same_dependencies_get_the_same_skeleton_without_their_sources(tmp_path: Path) -> None:
    settings = host_settings(tmp_path)
    markers = [secrets.token_hex(8) for _ in range(2)]
    first = libc_tool(tmp_path / "a", "csv-tally", "0.1.0", markers[0])
    second = libc_tool(tmp_path / "b", "word-count", "0.4.2", markers[1])
    skeletons = [_skeleton(first, settings), _skeleton(second, settings)]
    assert skeletons[0] == skeletons[1] and skeletons[0] is not None
    assert skeletons[0].local_names == sorted({SOLE_NAME, SOLE_NAME.replace("-", "_")})
    files = [_files(first / SKELETON_DIR), _files(second / SKELETON_DIR)]
    assert files[0] == files[1]  # names, versions, comments and key order do not count
    assert set(files[0]) == {"Cargo.toml", "Cargo.lock", "src/lib.rs", "build.rs"}
    assert files[0]["src/lib.rs"] == "" and files[0]["build.rs"] == "fn main() {}\n"
    assert not any(marker in text for marker in markers for text in files[0].values())
    assert "csv-tally" not in files[0]["Cargo.lock"] and f'name = "{SOLE_NAME}"' in files[0]["Cargo.lock"]
    assert _cargo_locked(first / SKELETON_DIR, settings).returncode == 0


def test_other_dependency_features_give_another_skeleton(tmp_path: Path) -> None:
    settings = host_settings(tmp_path)
    plain = libc_tool(tmp_path / "a", "tally", "0.1.0", "x")
    featured = libc_tool(tmp_path / "b", "tally", "0.1.0", "x", '\n[features]\nwide = ["libc/extra_traits"]\n')
    assert _skeleton(plain, settings) and _skeleton(featured, settings)
    assert _files(plain / SKELETON_DIR)["Cargo.toml"] != _files(featured / SKELETON_DIR)["Cargo.toml"]


def test_workspace_members_keep_their_names_with_dummy_targets(tmp_path: Path) -> None:
    marker = secrets.token_hex(8)
    settings = host_settings(tmp_path)
    ws = lib_workspace(tmp_path / "ws", marker)
    facts = inspect_crate(ws, settings, member="app")
    skeleton = write_skeleton(ws, facts, settings)
    assert skeleton is not None and skeleton.build_flags == ["-p", "app"]  # no --bin: the skeleton has no binaries
    assert skeleton.local_names == ["app", "core-lib", "core_lib"]
    files = _files(ws / SKELETON_DIR)
    assert set(files) == {
        "Cargo.toml",
        "Cargo.lock",
        "app/Cargo.toml",
        "app/src/lib.rs",
        "core-lib/Cargo.toml",
        "core-lib/src/lib.rs",
        "core-lib/build.rs",
    }
    assert not any(marker in text for text in files.values())
    app = tomllib.loads(files["app/Cargo.toml"])
    assert app["package"]["version"] == "0.0.0" and app["dependencies"]["core-lib"] == {"path": "../core-lib"}
    assert _cargo_locked(ws / SKELETON_DIR, settings).returncode == 0


def test_a_path_patch_keeps_the_dependencies_with_thelibc_tool(tmp_path: Path) -> None:
    """A path package outside the members may be what registry crates build on: no skeleton, one derivation."""
    settings = host_settings(tmp_path)
    crate = libc_tool(tmp_path / "a", "tally", "0.1.0", "x", '\n[patch.crates-io]\nitoa = { path = "vendor/itoa" }\n')
    write(
        crate, {"vendor/itoa/Cargo.toml": '[package]\nname = "itoa"\nversion = "1.0.9"\n', "vendor/itoa/src/lib.rs": ""}
    )
    assert _skeleton(crate, settings) is None and not (crate / SKELETON_DIR).exists()


def test_the_same_skeleton_again_takes_cargos_lock_from_the_cache_held_to_the_same_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The edit loop's stub and then the package stage (or another tool on the same dependencies) write one skeleton:
    cargo relocks it once, and the cached lock is one cargo accepts as it is. A cached lock that pins other registry
    crates, or does not parse, is not used: cargo is asked again."""
    import shutil

    from flakebot.nix.skeleton import RELOCKED_DIR

    settings = host_settings(tmp_path)
    crate = libc_tool(tmp_path / "loop-stub", "tally", "0.1.0", secrets.token_hex(8))
    assert _skeleton(crate, settings) is not None
    copies = []
    for name in ("package-flake", "other-tool", "third-tool"):
        shutil.copytree(crate, tmp_path / name, ignore=shutil.ignore_patterns(SKELETON_DIR))
        copies.append((tmp_path / name, inspect_crate(tmp_path / name, settings)))

    def no_cargo(*_: object, **__: object) -> None:
        raise AssertionError("cargo relocked a skeleton it relocked before")

    monkeypatch.setattr(Cargo, "run", no_cargo)
    assert write_skeleton(copies[0][0], copies[0][1], settings) is not None
    monkeypatch.undo()
    assert _files(copies[0][0] / SKELETON_DIR) == _files(crate / SKELETON_DIR)
    assert _cargo_locked(copies[0][0] / SKELETON_DIR, settings).returncode == 0

    (cached,) = (tmp_path / "cache" / RELOCKED_DIR).glob("*.lock")
    good = cached.read_text()
    assert 'name = "libc"' in good
    cached.write_text(good.replace('name = "libc"\nversion = "', 'name = "libc"\nversion = "9'))  # another libc
    assert write_skeleton(copies[1][0], copies[1][1], settings) is not None
    assert _files(copies[1][0] / SKELETON_DIR) == _files(crate / SKELETON_DIR) and cached.read_text() == good
    cached.write_bytes(b"\xff\xfe not a lock")  # nor is one that does not parse
    assert write_skeleton(copies[2][0], copies[2][1], settings) is not None
    assert _files(copies[2][0] / SKELETON_DIR) == _files(crate / SKELETON_DIR) and cached.read_text() == good


def test_the_loops_stub_asked_for_its_members_alone_gets_the_flake_a_resolving_inspect_gives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The stub's flake (own_stub) asks cargo `--no-deps` alone, one call: its facts and skeleton are those a resolving
    inspect of the same stub gives, but for what only resolution says (the dependencies' rust-versions)."""
    import dataclasses
    import shutil

    from flakebot.cargo.cache_skeleton import skeleton_of
    from flakebot.nix.flake import Choice, write_flake
    from flakebot.nix.loopdeps import write_stub

    settings = host_settings(tmp_path)
    crate = libc_tool(tmp_path / "crate", "tally", "0.1.0", secrets.token_hex(8))
    inspect_crate(crate, settings)  # writes Cargo.lock
    stub = tmp_path / "stub"
    write_stub(stub, skeleton_of(crate), build_script=True)
    shutil.copytree(stub, tmp_path / "resolved")
    resolved = inspect_crate(tmp_path / "resolved", settings, label="stub")
    skeleton = write_skeleton(tmp_path / "resolved", resolved, settings)
    with caplog.at_level(logging.DEBUG, logger="flakebot.cargo.runner"):
        written = write_flake(stub, tmp_path / "flake", settings, Choice(own_stub=True), "", lambda _: None)
    asked = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cargo (host): metadata")]
    # one call on the stub's flake; its skeleton's relock was cached by the resolved one's
    assert asked == [f"cargo (host): metadata --format-version 1 --no-deps {tmp_path / 'flake'}"]
    assert written.facts == dataclasses.replace(resolved, needs_newer_rustc=[])
    assert written.skeleton == skeleton and skeleton is not None
    assert _files(tmp_path / "flake" / SKELETON_DIR) == _files(tmp_path / "resolved" / SKELETON_DIR)


def test_the_loops_stub_gets_its_lock_renamed_as_cargo_relocks_it_and_a_stale_one_goes_to_cargo(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The stub's skeleton lock is flakebot's rename of the crate's, no cargo call: byte for byte what cargo's relock of
    the same skeleton writes, and one cargo takes as it is (--locked, as the deps build's --frozen). A lock the crate's
    manifest has moved past (the model added a dependency by hand) is renamed all the same (the build refuses it):
    cargo's relock of it then locks other registry crates, so there is no deps derivation, as before."""
    import shutil

    from flakebot.cargo.cache_skeleton import skeleton_of
    from flakebot.nix.flake import Choice, write_flake
    from flakebot.nix.loopdeps import write_stub
    from flakebot.nix.skeleton import relocked_otherwise

    settings = host_settings(tmp_path)
    crate = libc_tool(tmp_path / "crate", "word-tally", "0.3.1", secrets.token_hex(8))
    inspect_crate(crate, settings)  # writes Cargo.lock
    write_stub(tmp_path / "stub", skeleton_of(crate), build_script=True)
    with caplog.at_level(logging.DEBUG, logger="flakebot.cargo.runner"):
        written = write_flake(
            tmp_path / "stub", tmp_path / "flake", settings, Choice(own_stub=True), "", lambda _: None
        )
    asked = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cargo (host): metadata")]
    assert asked == [f"cargo (host): metadata --format-version 1 --no-deps {tmp_path / 'flake'}"]  # no relock
    assert written.skeleton is not None and written.skeleton.renamed
    renamed = (tmp_path / "flake" / SKELETON_DIR / "Cargo.lock").read_text()
    assert _cargo_locked(tmp_path / "flake" / SKELETON_DIR, settings).returncode == 0

    shutil.copytree(crate, tmp_path / "cargos", ignore=shutil.ignore_patterns(SKELETON_DIR))
    assert _skeleton(tmp_path / "cargos", settings) is not None  # cargo relocks this one (nothing cached)
    assert (tmp_path / "cargos" / SKELETON_DIR / "Cargo.lock").read_text() == renamed
    assert relocked_otherwise(tmp_path / "flake", written.skeleton, settings) is False  # cargo writes the same

    stale = tmp_path / "stale"
    shutil.copytree(tmp_path / "stub", stale / "stub")
    manifest = stale / "stub" / "Cargo.toml"
    manifest.write_text(manifest.read_text().replace("[dependencies]\n", '[dependencies]\nmemchr = "2"\n'))
    again = write_flake(stale / "stub", stale / "flake", settings, Choice(own_stub=True), "", lambda _: None)
    assert again.skeleton is not None and again.skeleton.renamed
    assert 'name = "memchr"' not in (stale / "flake" / SKELETON_DIR / "Cargo.lock").read_text()
    assert _cargo_locked(stale / "flake" / SKELETON_DIR, settings).returncode != 0  # what the build's --frozen says
    assert relocked_otherwise(stale / "flake", again.skeleton, settings) is None
