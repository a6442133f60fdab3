"""The edit loop on the flake's deps derivation (nix/loopdeps.py), through real cargo, nix and bubblewrap: a cold craft
compiles each dependency once, and a hostile build script in the loop cannot change what another craft copies.
Every test salts its dependency set (an empty `[target.'cfg(SALT)'.dependencies]` table), so nix really builds."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest

from benchmarks.perf.craft import salted
from flakebot import config
from flakebot.cargo.cache_skeleton import skeleton_of
from flakebot.cargo.runner import Cargo
from flakebot.nix.loopdeps import NoStoreDeps, build_deps, copy_output, plan
from flakebot.nix.reuse import compiled_crates, dependency_output
from flakebot.sandbox import Sandbox, limits_for, open_sandbox
from tests.conftest import json_result, require, run_cli
from tests.fakes.nix_crates import NIX, write

pytestmark = pytest.mark.slow

SESSION = Path(__file__).resolve().parents[2] / "flakebot/data/sessions/csv-dedup.json"
NIX_STORE = str(Path(NIX[0]).with_name("nix-store"))


def salt_table() -> str:
    return f"[target.'cfg(flakebot_test_{secrets.token_hex(6)})'.dependencies]"


def salted_session(dest: Path) -> Path:
    """The csv-dedup session, its crate given a dependency set of its own (as benchmarks/perf/craft.py salts it)."""
    dest.write_text(SESSION.read_text())
    salted(dest, secrets.token_hex(6))
    return dest


def compiled_since(target: Path) -> set[str]:
    """The packages cargo compiled (or whose build script it ran) in `target` after its seed was copied: those with a
    fingerprint written after the copy's stamp (a fresh unit keeps the copy's date)."""
    stamp = (target / ".dependencies-copied").stat().st_mtime
    return {
        unit.name.rsplit("-", 1)[0]
        for unit in target.glob("*/release/.fingerprint/*")
        if any(f.stat().st_mtime > stamp for f in unit.iterdir())
    }


def test_a_cold_craft_compiles_each_dependency_once(tmp_path: Path, workdir: Path) -> None:
    require("nix", "bwrap", "cargo")
    session = salted_session(tmp_path / "session.json")
    argv = ["craft", "need a CSV deduper", "--model", f"scripted:{session}", "--registry", "local", "--offline"]
    result = json_result(run_cli(*argv, "--json", "--keep", timeout=1500, check=True))
    run_dir = workdir / "runs" / result["run_id"]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any("from the flake's deps derivation" in str(e.get("message", "")) for e in events)
    # one dependency set built for the loop: the model's. The new crate's own (the library alone, which its first edit
    # changes) is never built: its tests first run after that edit
    builds = [e for e in events if str(e.get("message", "")).startswith("building the dependencies once")]
    assert len(builds) == 1, builds

    state = json.loads((run_dir / "state.json").read_text())
    store_path = state["outputs"]["package"]["store_path"]
    deps_out = dependency_output(store_path)
    assert deps_out is not None
    in_deps = [c for c in compiled_crates(deps_out) if c != "flakebot-deps"]  # the skeleton's: built, then tested
    assert {"csv", "csv-core", "clap", "memchr"} <= set(in_deps) and len(in_deps) == len(set(in_deps))
    # the edit loop compiled the crate alone: every dependency's fingerprint is the copied one
    assert compiled_since(run_dir / "target") == {"csv-dedup"}
    # and the package stage built on the same derivation, compiling only the tool
    assert compiled_crates(store_path) == ["csv-dedup"]
    info = subprocess.run([*NIX, "path-info", "--json", deps_out], capture_output=True, text=True, check=True)
    registered = json.loads(info.stdout)[0]["registrationTime"]
    stages = state["stages"]
    assert stages["edit"]["started"] <= registered <= stages["package"]["started"]  # built before the loop, not after


HOSTILE_BUILD = """use std::{env, fs, path::PathBuf};
const STORE: &str = "{store}";
fn main() {
    // OUT_DIR is TARGET/TRIPLE/release/build/PKG-HASH/out: its dependencies are in TARGET/TRIPLE/release/deps
    let release: PathBuf = PathBuf::from(env::var("OUT_DIR").unwrap()).ancestors().nth(3).unwrap().into();
    for entry in fs::read_dir(release.join("deps")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().map_or(false, |e| e == "rlib") {
            fs::write(&path, b"hostile").unwrap();
        }
    }
    let store = PathBuf::from(STORE).join("target");
    let wrote = fs::write(store.join("hostile"), b"x").is_ok();
    let removed = fs::remove_dir_all(store.join("x86_64-unknown-linux-gnu")).is_ok();
    println!("cargo:warning=hostile: store write {wrote}, store remove {removed}");
}
"""


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return digest.hexdigest()


def test_a_hostile_build_script_in_the_loop_cannot_change_the_shared_dependency_build(tmp_path: Path) -> None:
    require("nix", "bwrap", "cargo")
    settings = config.load({"offline": True, "registry": "local", "nixpkgs": "host"})
    manifest = f'[package]\nname = "tally"\nversion = "0.1.0"\nedition = "2021"\n\n{salt_table()}\n\n[dependencies]\nitoa = "1"\n'
    crate = write(tmp_path / "crate", {"Cargo.toml": manifest, "src/main.rs": "fn main() {}\n"})
    host = Cargo.for_run(settings, tmp_path / "scratch")
    assert host.run(["metadata", "--format-version", "1", "--offline"], crate).returncode == 0  # writes Cargo.lock
    loop = plan(settings, host)
    output = build_deps(settings, skeleton_of(crate), crate, tmp_path / "loop-deps")
    before = _tree_digest(output)

    # the model's crate gets a build script that corrupts what it can reach and tries the store
    write(crate, {"build.rs": HOSTILE_BUILD.replace("{store}", str(output))})
    target = tmp_path / "target"
    copy_output(output, target)
    cargo = Cargo.for_run(settings, target)
    cargo.sandbox_registry, cargo.profile = loop.registry, loop.profile()
    sandbox = loop_sandbox(settings, crate, target, host, loop.registry)
    assert sandbox.name == "bubblewrap"
    done = sandbox.run(cargo.argv("build", "--locked"), cwd=crate, env=cargo.env())
    assert "hostile: store write false, store remove false" in done.stderr, done.stderr[-2000:]
    assert {p.read_bytes() for p in target.glob("*/release/deps/libitoa-*.rlib")} == {b"hostile"}  # it did run

    # the store path is as Nix built it, and the next craft's copy of it is whole and fresh
    verified = subprocess.run([NIX_STORE, "--verify-path", str(output)], capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0, verified.stderr
    assert _tree_digest(output) == before
    (crate / "build.rs").unlink()
    other = tmp_path / "other-target"
    copy_output(output, other)
    cargo.target_dir = other
    built = loop_sandbox(settings, crate, other, host, loop.registry).run(
        cargo.argv("build", "--locked", "--message-format=json"), cwd=crate, env=cargo.env()
    )
    assert built.ok, built.stderr[-2000:]
    artifacts = [json.loads(line) for line in built.stdout.splitlines() if '"compiler-artifact"' in line]
    assert {a["package_id"].rsplit("#", 1)[-1] for a in artifacts if not a["fresh"]} == {"tally@0.1.0"}
    assert any(a["fresh"] and "itoa" in a["package_id"] for a in artifacts)


def loop_sandbox(settings: config.Settings, crate: Path, target: Path, host: Cargo, registry: Path) -> Sandbox:
    """The sandbox as the edit stage opens it on the deps derivation: the registry where Nix builds see it."""
    assert host.registry_dir is not None
    return open_sandbox(
        settings.sandbox,
        workspace=crate,
        writable=[crate, target],
        readable=[host.registry_dir],
        cargo_home=host.home,
        adopt=True,
        limits=limits_for(settings),
        binds=[(False, host.registry_dir, registry)],
    )


def test_the_loops_cargo_test_finds_the_dev_dependencies_built(tmp_path: Path) -> None:
    dev = '[dependencies]\nlibc = "0.2"\n\n[dev-dependencies]\nitoa = "1"\n'
    test = '#[test]\nfn formats() { assert_eq!(itoa::Buffer::new().format(7), "7"); }\n'
    artifacts, log = loop_test_on_deps(tmp_path, dev, test)
    assert {a["package_id"].rsplit("#", 1)[-1] for a in artifacts if not a["fresh"]} == {"tally@0.1.0"}
    assert any(a["fresh"] and "itoa" in a["package_id"] for a in artifacts)  # the dev-dependency came built
    assert "cargo test --release" in log and "--no-run" in log  # compiled, not run: the skeleton has no tests


def test_without_dev_dependencies_the_deps_derivation_has_no_check_phase_and_the_loops_cargo_test_finds_all_built(
    tmp_path: Path,
) -> None:
    test = "#[test]\nfn pid() { assert!(unsafe { libc::getpid() } > 0); }\n"
    artifacts, log = loop_test_on_deps(tmp_path, '[dependencies]\nlibc = "0.2"\n', test)
    assert {a["package_id"].rsplit("#", 1)[-1] for a in artifacts if not a["fresh"]} == {"tally@0.1.0"}
    assert any(a["fresh"] and "libc" in a["package_id"] for a in artifacts)
    assert "cargo build --release" in log and "cargo test" not in log


def loop_test_on_deps(tmp_path: Path, dependencies: str, test: str) -> tuple[list[dict[str, Any]], str]:
    """The crate tally (`dependencies`, an integration test `test`) given a dependency set of its own: the loop's
    `cargo test` on a copy of its deps derivation's output (cargo's artifact messages), and that derivation's log."""
    require("nix", "bwrap", "cargo")
    settings = config.load({"offline": True, "registry": "local", "nixpkgs": "host"})
    manifest = f'[package]\nname = "tally"\nversion = "0.1.0"\nedition = "2021"\n\n{salt_table()}\n\n{dependencies}'
    crate = write(tmp_path / "crate", {"Cargo.toml": manifest, "src/main.rs": "fn main() {}\n", "tests/t.rs": test})
    host = Cargo.for_run(settings, tmp_path / "scratch")
    assert host.run(["metadata", "--format-version", "1", "--offline"], crate).returncode == 0
    loop = plan(settings, host)
    output = build_deps(settings, skeleton_of(crate), crate, tmp_path / "loop-deps")
    target = tmp_path / "target"
    copy_output(output, target)
    cargo = Cargo.for_run(settings, target)
    cargo.sandbox_registry, cargo.profile = loop.registry, loop.profile()
    done = loop_sandbox(settings, crate, target, host, loop.registry).run(
        cargo.argv("test", "--locked", "--message-format=json"), cwd=crate, env=cargo.env()
    )
    assert done.ok, done.stderr[-2000:]
    log = subprocess.run([NIX_STORE, "--read-log", str(output)], capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in done.stdout.splitlines() if '"compiler-artifact"' in line], log


def test_a_second_crate_on_the_same_dependencies_takes_the_indexed_output_and_a_forged_index_is_not_followed(
    tmp_path: Path,
) -> None:
    """The index (cache_dir/deps-derivations: one GC root per set) spares a later craft the stub and the nix call; a
    link there that leaves the Nix store is not followed: the set is built again and the index points into the store."""
    from flakebot.nix.loopdeps import StoreSeeder, derivations_dir

    require("nix", "bwrap", "cargo")
    settings = config.load(
        {"offline": True, "registry": "local", "nixpkgs": "host", "cache_dir": str(tmp_path / "cache")}
    )
    salt = salt_table()
    host = Cargo.for_run(settings, tmp_path / "scratch")
    loop = plan(settings, host)

    def seed(name: str) -> tuple[str, list[str], Path]:
        manifest = (
            f'[package]\nname = "{name}"\nversion = "0.1.0"\nedition = "2021"\n\n{salt}\n\n[dependencies]\nitoa = "1"\n'
        )
        crate = write(tmp_path / name, {"Cargo.toml": manifest, "src/main.rs": "fn main() {}\n"})
        assert host.run(["metadata", "--format-version", "1", "--offline"], crate).returncode == 0
        said: list[str] = []
        work = tmp_path / f"{name}-loop-deps"
        seeded = StoreSeeder(settings, crate, tmp_path / f"{name}-target", work, loop, said.append).seed(isolated=True)
        assert seeded.status == "store", seeded.detail
        return seeded.detail, said, work

    detail, said, _ = seed("first")
    assert said and detail.endswith(", copied")
    (root,) = derivations_dir(settings).iterdir()
    output = Path(os.readlink(root))
    assert output.parent == Path("/nix/store")

    detail, said, work = seed("second")
    assert said == [] and detail == f"{output.name}, indexed, copied"
    assert not work.exists()  # no stub crate, no flake, no nix call
    assert any((tmp_path / "second-target").glob("*/release/deps/libitoa-*.rlib"))

    forged = write(tmp_path / "forged", {"target/x86_64-unknown-linux-gnu/release/deps/libitoa-0.rlib": "forged"})
    forged_out = tmp_path / f"{output.name}"
    forged.rename(forged_out)
    root.unlink()
    root.symlink_to(forged_out)
    detail, said, _ = seed("third")
    assert said and detail == f"{output.name}, copied"  # built (a store hit in Nix), not taken from the forged link
    assert Path(os.readlink(root)) == output
    assert b"forged" not in b"".join(p.read_bytes() for p in (tmp_path / "third-target").rglob("libitoa-*.rlib"))


def test_a_lock_the_manifest_has_moved_past_gets_no_deps_derivation_after_a_refused_build(tmp_path: Path) -> None:
    """The stub's skeleton lock is flakebot's rename of the crate's. A crate whose manifest names a dependency its lock
    does not (the model added it by hand, before the next cargo test) gets its deps build refused by cargo --frozen at
    once; cargo's relock then locks another registry crate, so there is no deps derivation (the loop builds the
    dependencies itself), as when cargo relocked first."""
    require("nix", "cargo")
    settings = config.load({"offline": True, "registry": "local", "nixpkgs": "host"})
    manifest = '[package]\nname = "tally"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\nlibc = "0.2"\n'
    crate = write(tmp_path / "crate", {"Cargo.toml": manifest, "src/main.rs": "fn main() {}\n"})
    host = Cargo.for_run(settings, tmp_path / "scratch")
    assert host.run(["metadata", "--format-version", "1", "--offline"], crate).returncode == 0  # its lock
    (crate / "Cargo.toml").write_text(manifest + 'itoa = "1"\n')
    with pytest.raises(NoStoreDeps, match="cannot relock the skeleton"):
        build_deps(settings, skeleton_of(crate), crate, tmp_path / "loop-deps")
