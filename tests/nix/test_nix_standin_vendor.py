"""The stand-in honours a Cargo.lock with checksums as nixpkgs' importCargoLock does: real nix fetches every crate by
the lock's sha256 from a local crates.io on 127.0.0.1 (flakebot.crates.mirror), unpacks them into one vendor
directory and the host's cargo builds offline against it; a crate whose bytes differ stops the build.
Locks with Debian's placeholder checksums (or crates the local directory source holds at the lock's checksums) keep
building from that directory source."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import git
import pytest

from flakebot.cargo.runner import Cargo
from flakebot.config import Settings
from flakebot.crates.mirror import Mirror, serve_mirror
from flakebot.errors import NixError
from flakebot.nix import build_inputs
from flakebot.nix.flake import nix_run, package_crate
from flakebot.nix.reuse import compiled_crates, dependency_output
from flakebot.nix.standin import ensure_standin
from tests.conftest import DEBIAN_REGISTRY, require
from tests.fakes.nix_crates import greeter, host_settings, json_of, manifest, standin_eval, write

CRATES_IO = "registry+https://github.com/rust-lang/crates.io-index"
CSV_ROWS_MAIN = """\
fn main() {
    if std::env::args().any(|a| a == "--help") {
        println!("csv-rows: counts the records of the CSV on stdin");
        return;
    }
    let records = csv::Reader::from_reader(std::io::stdin()).records().count();
    println!("{records} records");
}
"""


@dataclass
class Crates:
    """csv-rows with a Cargo.lock cargo wrote against the mirror, and the crates that lock names."""

    crate: Path  # a git repository whose .gitignore lists Cargo.lock (as many crates' do): the lock is still packaged
    sources: (
        Path  # the dependencies' folders: what the mirror serves and, with the lock's checksums, a directory source
    )
    checksums: dict[str, str]  # NAME-VERSION -> the sha256 Cargo.lock holds (the mirror's index cksum)


def _dependencies(crate: Path, dest: Path) -> None:
    """Copy the crates csv-rows locks to from Debian's registry, each with a stamp file: this run's .crate files are
    then new to the nix store, which never fetches (or rebuilds from) a fixed-output path it already has."""
    result = Cargo(dest / "target", offline=True, registry_dir=DEBIAN_REGISTRY).run(
        ["generate-lockfile"], crate, timeout=300
    )
    assert result.returncode == 0, result.stderr
    stamp = f"{time.time_ns()} {os.getpid()}\n"
    for package in build_inputs.lock_packages(crate / "Cargo.lock"):
        if package.get("source") == CRATES_IO:
            key = f"{package['name']}-{package['version']}"
            shutil.copytree(DEBIAN_REGISTRY / key, dest / key, ignore=shutil.ignore_patterns(".cargo-checksum.json"))
            (dest / key / ".flakebot-test-stamp").write_text(stamp)
    (crate / "Cargo.lock").unlink()


def _lock_against(mirror: Mirror, crate: Path, cargo_home: Path) -> dict[str, str]:
    """Real cargo with an empty CARGO_HOME writes Cargo.lock from the mirror's sparse index; NAME-VERSION -> checksum."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARGO_")} | {"CARGO_HOME": str(cargo_home)}
    argv = ["cargo", *mirror.cargo_config(), "generate-lockfile"]
    result = subprocess.run(argv, cwd=crate, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    packages = [p for p in build_inputs.lock_packages(crate / "Cargo.lock") if p.get("source") == CRATES_IO]
    return {f"{p['name']}-{p['version']}": str(p["checksum"]) for p in packages}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Crates, Mirror]]:
    """csv-rows, its dependencies served by a mirror on 127.0.0.1, and its lock (no crate downloaded yet)."""
    require("nix")
    crate = write(
        tmp_path / "csv-rows",
        {"Cargo.toml": manifest("csv-rows", 'license = "MIT"\n', 'csv = "1"\n'), "src/main.rs": CSV_ROWS_MAIN},
    )
    write(crate, {".gitignore": "/target\nCargo.lock\n"})
    _dependencies(crate, tmp_path / "sources")
    with serve_mirror([tmp_path / "sources"]) as mirror:
        checksums = _lock_against(mirror, crate, tmp_path / "cargo-home")
        assert sorted(checksums) == sorted(p.name for p in (tmp_path / "sources").iterdir()) and not mirror.downloads
        for key, checksum in checksums.items():  # the same crates as a directory source, as `cargo vendor` writes one
            (tmp_path / "sources" / key / ".cargo-checksum.json").write_text(
                json.dumps({"files": {}, "package": checksum})
            )
        with git.Repo.init(crate) as repo:
            repo.git.add("-A")
            repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "csv-rows"])
        assert "Cargo.lock" not in git.Git(str(crate)).ls_files()
        yield Crates(crate, tmp_path / "sources", checksums), mirror


ANYHOW_DEBIAN = (
    "224afbd727c3d6e4b90103ece64b8d1b67fbb1973b1046c2281eed3f3803f800"  # Debian's registry keeps crates.io's
)
OTHER = "ab" * 32


def _lock_text(*packages: tuple[str, str, str, str]) -> str:
    """A version 4 Cargo.lock of the tool and (name, version, source, checksum) packages ("" leaves a field out)."""
    text = 'version = 4\n\n[[package]]\nname = "tool"\nversion = "0.1.0"\n'
    for name, version, source, checksum in packages:
        text += f'\n[[package]]\nname = "{name}"\nversion = "{version}"\n'
        text += f'source = "{source}"\n' if source else ""
        text += f'checksum = "{checksum}"\n' if checksum else ""
    return text


def _vendor_dir(tmp_path: Path, lock: str, attr: str) -> subprocess.CompletedProcess[str]:
    """`nix eval` of `attr` of the stand-in's buildRustPackage with cargoLock.lockFileContents = lock."""
    require("nix")
    standin = ensure_standin(host_settings(tmp_path))
    src = greeter(tmp_path / "greeter")
    call = f'pkgs.rustPlatform.buildRustPackage {{ pname = "tool"; version = "0.1.0"; src = {src}; cargoLock.lockFileContents = {json.dumps(lock)}; }}'
    return standin_eval(standin, f"let p = {call}; in {attr}")


@pytest.mark.parametrize(
    ("packages", "vendored"),
    [
        ([("anyhow", "1.0.69", CRATES_IO, OTHER), ("csv", "1.1.6", CRATES_IO, OTHER)], ["anyhow-1.0.69", "csv-1.1.6"]),
        ([("anyhow", "1.0.69", CRATES_IO, OTHER), ("csv", "1.1.6", CRATES_IO, "Could not get crate checksum")], None),
        ([("anyhow", "1.0.69", CRATES_IO, OTHER), ("csv", "1.1.6", CRATES_IO, "")], None),
        ([("anyhow", "1.0.69", CRATES_IO, ANYHOW_DEBIAN)], None),
        ([("tool-helper", "0.1.0", "", "")], None),
    ],
    ids=["all-checksummed", "debian-placeholder", "no-checksum", "all-in-the-local-source", "no-registry-crates"],
)
def test_the_lock_decides_between_fetching_and_the_local_source(
    tmp_path: Path, packages: list[tuple[str, str, str, str]], vendored: list[str] | None
) -> None:
    expression = 'if p.flakebotVendorDir == "" then null else { inherit (p.flakebotVendorDir) name crates; }'
    found = json_of(_vendor_dir(tmp_path, _lock_text(*packages), expression))
    if vendored is None:
        assert found is None, "the local directory source, as before"
        return
    assert isinstance(found, dict) and found["name"] == "cargo-vendor-dir"
    lines = [line.split() for line in found["crates"].splitlines()]
    assert [f"{name}-{version}" for name, version, _, _ in lines] == vendored
    assert all(sha == OTHER and path.endswith(f"-crate-{name}-{version}.tar.gz") for name, version, sha, path in lines)


def test_a_version_1_lock_has_its_checksums_in_metadata(tmp_path: Path) -> None:
    lock = f'[[package]]\nname = "anyhow"\nversion = "1.0.69"\nsource = "{CRATES_IO}"\n\n[metadata]\n"checksum anyhow 1.0.69 ({CRATES_IO})" = "{OTHER}"\n'
    crates = json_of(_vendor_dir(tmp_path, lock, "p.flakebotVendorDir.crates"))
    assert isinstance(crates, str) and crates.startswith(f"anyhow 1.0.69 {OTHER} /nix/store/")


def _settings(home: Path, crates: Crates, mirror: Mirror) -> Settings:
    """Host nixpkgs fetching from the mirror. flakebot's own cargo steps run offline against a directory source in
    host mode; it must be one that holds the lock's checksums (Debian's registry does not), so it is `sources`."""
    return Settings(
        workdir=str(home / "work"),
        cache_dir=str(home / "cache"),
        catalog_dir=str(home / "catalog"),
        nixpkgs="host",
        registry=str(crates.sources),
        cratesio_static_url=mirror.url + "/",
    )


@pytest.mark.slow
def test_a_checksummed_lock_is_fetched_by_checksum_and_built_offline(
    served: tuple[Crates, Mirror], tmp_path: Path
) -> None:
    crates, mirror = served
    before = len(mirror.requests)  # cargo read the index for the lock
    result = package_crate(crates.crate, tmp_path / "flake", _settings(tmp_path, crates, mirror))
    fetched = sorted(r.path for r in mirror.requests[before:])
    assert fetched == sorted(f"/crates/{k.rsplit('-', 1)[0]}/{k}.crate" for k in crates.checksums), (
        "one download per lock package"
    )
    assert sorted(mirror.downloads) == sorted(crates.checksums)
    lock = (tmp_path / "flake" / "Cargo.lock").read_text()
    assert all(f'checksum = "{sha}"' in lock for sha in crates.checksums.values()), "the crate's own (git-ignored) lock"
    assert result.main_program == "csv-rows" and "csv-rows: counts" in result.smoke["output_head"]
    # the deps derivation's crates, vendored as nixpkgs vendors them, are the tool build's too: it compiles only itself
    deps_output = dependency_output(result.store_path)
    assert deps_output and "csv" in compiled_crates(deps_output) and compiled_crates(result.store_path) == ["csv-rows"]
    ran = nix_run(result, [], _settings(tmp_path, crates, mirror), input="a,b\n1,2\n3,4\n")
    assert ran.returncode == 0 and ran.stdout == "2 records\n", ran.stderr


@pytest.mark.slow
def test_a_crate_whose_bytes_differ_fails_with_a_hash_mismatch(served: tuple[Crates, Mirror], tmp_path: Path) -> None:
    crates, mirror = served
    mirror.corrupt.add("memchr-2.5.0")
    with pytest.raises(NixError) as failed:
        package_crate(crates.crate, tmp_path / "flake", _settings(tmp_path, crates, mirror))
    with urllib.request.urlopen(f"{mirror.url}/crates/memchr/memchr-2.5.0.crate", timeout=30) as response:
        got = hashlib.sha256(response.read()).hexdigest()
    expected = crates.checksums["memchr-2.5.0"]
    assert got != expected and "memchr-2.5.0" in mirror.downloads, "nix fetched the crate (it was new to the store)"
    assert failed.value.message == (
        f"nix build of csv-rows failed: crate memchr 2.5.0 does not match its Cargo.lock checksum: expected sha256 {expected}, got {got}"
    )
    assert "cratesio_static_url" in (failed.value.fix or "")
    assert not (tmp_path / "flake").exists(), "package_crate removed the half-made flake"


@pytest.mark.slow
def test_a_crate_the_server_lacks_points_at_the_setting(served: tuple[Crates, Mirror], tmp_path: Path) -> None:
    crates, _ = served
    with serve_mirror([p for p in crates.sources.iterdir() if p.name != "memchr-2.5.0"]) as lacking:
        with pytest.raises(NixError) as failed:
            package_crate(crates.crate, tmp_path / "flake", _settings(tmp_path, crates, lacking))
    url = f"{lacking.url}/crates/memchr/memchr-2.5.0.crate"
    assert failed.value.message.startswith(
        f"nix build of csv-rows failed: error: unable to download '{url}': HTTP error 404"
    )
    assert "cratesio_static_url" in (failed.value.fix or "") and not (tmp_path / "flake").exists()
