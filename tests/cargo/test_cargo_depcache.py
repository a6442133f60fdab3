"""The dependency cache with real cargo in the real sandbox: one crate's dependencies built from its skeleton serve
another crate on the same lock (its first `cargo test` compiles no dependency); another lock is another entry."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from flakebot.cargo.cache_skeleton import NoSkeleton, skeleton_of
from flakebot.cargo.depcache import LoopSeeder, cache_root, dependency_key, evict, seed_target_dir
from flakebot.cargo.runner import Cargo
from flakebot.config import load
from flakebot.sandbox import open_sandbox
from tests.conftest import DEBIAN_REGISTRY, require

# memchr has a build script: its recorded OUT_DIR must survive the copy to another target dir
DEPENDENCIES = '[dependencies]\nmemchr = "2.5.0"\nitoa = "1.0.1"\n'


def make_crate(root: Path, name: str, dependencies: str) -> Path:
    """A binary crate with a committed-style Cargo.lock, the lock made by host cargo against the tests' registry."""
    crate = root / name
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text(
        f'[package]\nname = "{name}"\nversion = "0.1.0"\nedition = "2021"\n\n{dependencies}'
    )
    (crate / "src/main.rs").write_text(f'fn main() {{ println!("{name}"); }}\n#[test]\nfn runs() {{ main() }}\n')
    made = cargo_for(root / "unused-target").run(["generate-lockfile"], crate)
    assert made.returncode == 0, made.stderr
    return crate


def cargo_for(target: Path) -> Cargo:
    return Cargo(target_dir=target, offline=True, registry_dir=DEBIAN_REGISTRY)


def first_test_run(crate: Path, target: Path) -> dict[str, bool]:
    """`cargo test` as the edit loop runs it: each compiled package (by name) and whether cargo found it fresh."""
    sandbox = open_sandbox(
        "required", workspace=crate, writable=[crate, target], readable=[DEBIAN_REGISTRY], adopt=True
    )
    cargo = cargo_for(target)
    result = sandbox.run(cargo.argv("test", "--message-format=json"), cwd=crate, env=cargo.env())
    assert result.ok, result.stderr[-2000:]
    artifacts = [
        json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"reason":"compiler-artifact"')
    ]
    fresh: dict[str, bool] = {}
    for artifact in artifacts:
        name = artifact["target"]["name"]
        fresh[name] = fresh.get(name, True) and artifact["fresh"]
    return fresh


@pytest.mark.slow
def test_a_second_crate_on_the_same_lock_compiles_no_dependency(tmp_path: Path) -> None:
    require("bwrap", "cargo")
    settings = load()
    first, second = make_crate(tmp_path, "first-tool", DEPENDENCIES), make_crate(tmp_path, "second-tool", DEPENDENCIES)

    built = seed_target_dir(settings, cargo_for(tmp_path / "t1"), first, tmp_path / "t1", isolated=True)
    os.utime(cache_root(settings) / built.key, (0, 0))  # long unused, for eviction
    hit = seed_target_dir(settings, cargo_for(tmp_path / "t2"), second, tmp_path / "t2", isolated=True)
    assert (cache_root(settings) / built.key).stat().st_mtime > time.time() - 600, "a hit marks the entry used"
    assert (built.status, hit.status) == ("built", "hit") and built.key == hit.key, (built, hit)
    assert [p.name for p in cache_root(settings).iterdir()] == [built.key], "one entry, no temp dir left"
    assert not list((cache_root(settings) / built.key).rglob("*deps_skeleton*")), "the skeleton's own outputs dropped"

    fresh = first_test_run(second, tmp_path / "t2")
    assert {"memchr", "itoa", "build-script-build"} <= fresh.keys(), fresh
    assert {name: ok for name, ok in fresh.items() if name != "second-tool"} == dict.fromkeys(
        [n for n in fresh if n != "second-tool"], True
    ), f"a dependency was compiled again: {fresh}"
    assert fresh["second-tool"] is False, "the crate itself is compiled (the skeleton's outputs never stand in for it)"

    grown = make_crate(tmp_path, "grown-tool", DEPENDENCIES + 'ryu = "1.0.2"\n')  # an improvement adds a dependency
    more = seed_target_dir(settings, cargo_for(tmp_path / "t3"), grown, tmp_path / "t3", isolated=True)
    assert more.status == "built" and more.key != built.key
    reused = {p.name: p.stat().st_mtime_ns for p in (cache_root(settings) / built.key / "debug/deps").glob("lib*.rlib")}
    again = {p.name: p.stat().st_mtime_ns for p in (cache_root(settings) / more.key / "debug/deps").glob("lib*.rlib")}
    assert reused and reused.items() <= again.items(), "the new entry was built on the old one: memchr, itoa not redone"
    assert any(name.startswith("libryu-") for name in again.keys() - reused.keys())

    lone = make_crate(tmp_path, "lone-tool", '[dependencies]\nitoa = "1.0.1"\n')  # no entry is all within its lock
    assert seed_target_dir(settings, cargo_for(tmp_path / "t4"), lone, tmp_path / "t4", isolated=True).status == "built"
    (own,) = (tmp_path / "t4/debug/deps").glob("libitoa-*.rlib")
    assert own.stat().st_mtime_ns not in reused.values(), "built from nothing, not on an entry holding memchr"

    # the model's own cargo run came before the first test (a new crate's first test waits for its first edit): what
    # it wrote, a link out included, goes, and the first seed is a fresh copy, not skipped for a dir in use
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "t5/debug").mkdir(parents=True)
    (tmp_path / "t5/debug/deps").symlink_to(outside, target_is_directory=True)
    seeder = LoopSeeder(settings, cargo_for(tmp_path / "t5"), first, tmp_path / "t5")
    assert seeder.seed(isolated=True).status == "hit"
    assert not (tmp_path / "t5/debug/deps").is_symlink() and list((tmp_path / "t5/debug/deps").glob("libitoa-*.rlib"))
    assert list(outside.iterdir()) == []
    shutil.rmtree(tmp_path / "t5")

    # the model adds a dependency mid-loop: the next cargo test starts from a fresh copy of the new set's entry
    seeder = LoopSeeder(settings, cargo_for(tmp_path / "t5"), first, tmp_path / "t5")
    assert seeder.seed(isolated=True).status == "hit" and seeder.refresh() is None
    (tmp_path / "t5/debug/planted-by-the-loop").write_text("x")
    (first / "Cargo.toml").write_text((grown / "Cargo.toml").read_text().replace("grown-tool", "first-tool"))
    assert cargo_for(tmp_path / "t5").run(["generate-lockfile"], first).returncode == 0
    again = seeder.refresh()
    assert again is not None and (again.status, again.key) == ("hit", more.key)
    assert list((tmp_path / "t5/debug/deps").glob("libryu-*.rlib"))
    assert not (tmp_path / "t5/debug/planted-by-the-loop").exists(), "a fresh copy, not a merge into the loop's dir"
    (first / "Cargo.toml").write_text((second / "Cargo.toml").read_text().replace("second-tool", "first-tool"))
    assert cargo_for(tmp_path / "t5").run(["generate-lockfile"], first).returncode == 0
    assert (seeder.refresh() or built).key == built.key  # back to the first set: its entry again
    (tmp_path / "t5/debug/planted-by-the-loop").write_text("x")
    (first / "Cargo.toml").write_text((first / "Cargo.toml").read_text().replace('itoa = "1.0.1"\n', ""))
    assert cargo_for(tmp_path / "t5").run(["generate-lockfile"], first).returncode == 0
    assert seeder.refresh() is None, "a dependency removed, no entry for the rest: the loop's cargo handles it"
    assert (tmp_path / "t5/debug/planted-by-the-loop").exists()

    cold = first_test_run(first, tmp_path / "cold")  # the same crate without the cache compiles every dependency
    assert cold["memchr"] is False and "itoa" not in cold

    # a cache over its limit: storing the next entry evicts the ones unused for over an hour, and keeps the new one
    for entry in cache_root(settings).iterdir():
        os.utime(entry, (time.time() - 7200, time.time() - 7200))
    small = dataclasses.replace(settings, dependency_cache_mb=1)
    last = make_crate(tmp_path, "last-tool", '[dependencies]\nryu = "1.0.2"\n')
    stored = seed_target_dir(small, cargo_for(tmp_path / "t6"), last, tmp_path / "t6", isolated=True)
    assert stored.status == "built" and [p.name for p in cache_root(settings).iterdir()] == [stored.key]


def test_the_key_follows_the_dependency_set_not_the_crate(tmp_path: Path) -> None:
    require("cargo")
    cargo = cargo_for(tmp_path / "target")
    one, same = make_crate(tmp_path, "one", DEPENDENCIES), make_crate(tmp_path, "same", DEPENDENCIES)
    other = make_crate(tmp_path, "other", '[dependencies]\nitoa = "1.0.1"\n')
    featured = make_crate(tmp_path, "featured", DEPENDENCIES.replace('"2.5.0"', '{ version = "2.5.0", features = [] }'))
    key = dependency_key(skeleton_of(one), cargo)
    assert dependency_key(skeleton_of(same), cargo) == key
    (same / "build.rs").write_text("fn main() {}\n")  # a build script with no build-dependencies changes nothing
    assert dependency_key(skeleton_of(same), cargo) == key
    assert dependency_key(skeleton_of(other), cargo) != key
    assert dependency_key(skeleton_of(featured), cargo) != key, "what the manifest asks of a dependency is in the key"
    cargo.features = ["extra"]
    assert dependency_key(skeleton_of(one), cargo) != key


def test_no_skeleton_for_dependencies_outside_the_registry(tmp_path: Path) -> None:
    crate = tmp_path / "crate"
    crate.mkdir()
    (crate / "Cargo.toml").write_text(
        '[package]\nname = "c"\nversion = "0.1.0"\n\n[dependencies]\nh = { path = "../h" }\n'
    )
    with pytest.raises(NoSkeleton, match="no Cargo.lock"):
        skeleton_of(crate)
    (crate / "Cargo.lock").write_text("version = 3\n")
    with pytest.raises(NoSkeleton, match="path or git dependency"):
        skeleton_of(crate)
    shutil.rmtree(crate)


def fake_entry(root: Path, name: str, mib: int, used_hours_ago: float) -> Path:
    """A cache entry of `mib` MiB, last used `used_hours_ago` hours ago (as a hit or a store sets it)."""
    entry = root / name
    (entry / "debug").mkdir(parents=True)
    (entry / "debug/libdep.rlib").write_bytes(b"x" * (mib << 20))
    when = time.time() - used_hours_ago * 3600
    os.utime(entry, (when, when))
    return entry


def test_storing_an_entry_evicts_the_least_recently_used_beyond_the_limit(tmp_path: Path) -> None:
    oldest, older = fake_entry(tmp_path, "a", 3, 50), fake_entry(tmp_path, "b", 3, 40)
    recent, stored = fake_entry(tmp_path, "c", 3, 0.5), fake_entry(tmp_path, "d", 3, 0)
    (tmp_path / ".build-1234").mkdir()  # a build in progress is not an entry

    assert evict(tmp_path, 0, keep=stored) == []  # no limit
    assert evict(tmp_path, 7 << 20, keep=stored) == ["a", "b"]  # 12 MiB: the two oldest go, 6 MiB left
    assert sorted(p.name for p in tmp_path.iterdir()) == [".build-1234", "c", "d"], "renamed away and removed"
    # over the limit still, but the others were used in the last hour (a copy of them may be running) or just stored
    assert evict(tmp_path, 1 << 20, keep=stored) == [] and recent.is_dir() and stored.is_dir()
    os.utime(recent, (time.time() - 7200, time.time() - 7200))
    assert evict(tmp_path, 1 << 20, keep=stored) == ["c"] and not oldest.exists() and not older.exists()


def test_the_loop_seeder_parses_a_manifest_and_lock_only_when_their_bytes_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before every `cargo test` the seeder looks at the dependency set: bytes equal to those that gave its key give
    it again without parsing the TOML (a lock of a few hundred packages), as the store seeder does; other bytes are
    parsed, and the same set keeps the key and the entry."""
    import tomllib

    require("cargo")
    crate = tmp_path / "crate"
    (crate / "src").mkdir(parents=True)
    (crate / "src/main.rs").write_text("fn main() {}\n")
    manifest = '[package]\nname = "c"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\nitoa = "1.0.1"\n'
    (crate / "Cargo.toml").write_text(manifest)
    lock = 'version = 3\n\n[[package]]\nname = "c"\nversion = "0.1.0"\ndependencies = ["itoa"]\n\n'
    lock += '[[package]]\nname = "itoa"\nversion = "1.0.1"\nsource = "registry+https://github.com/rust-lang/crates.io-index"\n'
    (crate / "Cargo.lock").write_text(lock)
    cargo = cargo_for(tmp_path / "target")
    seeder = LoopSeeder(load(), cargo, crate, tmp_path / "target")
    seeder.key, seeder.packages = dependency_key(skeleton_of(crate), cargo), skeleton_of(crate).packages()  # as seeded
    parsed: list[str] = []
    loads = tomllib.loads

    def counted(text: str, **kwargs: object) -> dict[str, object]:
        parsed.append(text)
        return loads(text, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tomllib, "loads", counted)
    assert seeder.refresh() is None and len(parsed) == 2  # the manifest and the lock, once
    assert seeder.refresh() is None and seeder.refresh() is None and len(parsed) == 2, "the same bytes parsed again"

    (crate / "Cargo.toml").write_text(manifest + "# the model's comment\n")  # other bytes, the same set
    key = seeder.key
    assert seeder.refresh() is None and seeder.key == key and len(parsed) == 4
    assert seeder.refresh() is None and len(parsed) == 4
