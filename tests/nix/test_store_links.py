"""Links in a deps derivation's output (nix/loopdeps.py): whoever can add a path to the Nix store chooses what it holds,
so the index entry and the copy into the loop's target dir never follow a link out of the store. Each attack is a real
store path (`nix-store --add`), judged from outside: the planted host file is not in the loop's target dir."""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import pytest

from flakebot.errors import UnsafePath
from flakebot.nix.loopdeps import copy_output, indexed
from tests.conftest import require

PLANTED = b"planted on the host " + secrets.token_hex(4).encode()


def add_to_store(path: Path) -> Path:
    done = subprocess.run(["nix-store", "--add", str(path)], capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def host_dir(tmp_path: Path) -> Path:
    host = tmp_path / "host"
    (host / "release").mkdir(parents=True)
    (host / "planted").write_bytes(PLANTED)
    (host / "release" / "planted").write_bytes(PLANTED)
    (host / "target").mkdir()
    (host / "target" / "planted").write_bytes(PLANTED)
    return host


def deps_output(tmp_path: Path, build: dict[str, str | Path]) -> Path:
    """A store path named like a deps output: `build` maps a relative path to file text or (Path) a link target."""
    top = tmp_path / "made" / f"x{secrets.token_hex(4)}-cargo-deps-0"
    for rel, what in build.items():
        path = top / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(what, Path):
            path.symlink_to(what)
        else:
            path.write_text(what)
    top.mkdir(parents=True, exist_ok=True)
    return add_to_store(top)


def index_entry(tmp_path: Path, output: Path) -> Path:
    root = tmp_path / "cache" / "deps-derivations" / secrets.token_hex(8)
    root.parent.mkdir(parents=True, exist_ok=True)
    root.symlink_to(output)
    return root


def planted_in(target: Path) -> bool:
    return any(p.is_file() and not p.is_symlink() and p.read_bytes() == PLANTED for p in target.rglob("*"))


def seed_from_index(root: Path, target: Path) -> str:
    """What StoreSeeder does with an index entry: take it when it names a deps output, copy it; the outcome in a word."""
    output = indexed(root)
    if output is None:
        return "not taken"
    try:
        copy_output(output, target)
    except UnsafePath:
        return "refused"
    return "copied"


def test_a_store_path_whose_target_links_to_a_host_dir_is_not_copied(tmp_path: Path) -> None:
    require("nix-store")
    host = host_dir(tmp_path)
    root = index_entry(tmp_path, deps_output(tmp_path, {"target": host}))
    target = tmp_path / "loop-target"
    assert seed_from_index(root, target) in ("not taken", "refused")
    assert not planted_in(target) if target.exists() else True


@pytest.mark.parametrize(
    "variant",
    ["deeper link", "relative link out", "store path itself a link", "entry through another link", "hard link entry"],
)
def test_link_variants_never_bring_a_host_file_into_the_loop(tmp_path: Path, variant: str) -> None:
    require("nix-store")
    host = host_dir(tmp_path)
    target = tmp_path / "loop-target"
    if variant == "deeper link":
        root = index_entry(tmp_path, deps_output(tmp_path, {"target/x/release": host, "target/x/ok": "ok"}))
    elif variant == "relative link out":
        # ../../.. from the output's target/ climbs out of the store path into /nix/store and beyond
        rel = Path(os.path.relpath(host, "/nix/store/x/target"))
        root = index_entry(tmp_path, deps_output(tmp_path, {"target/up": rel, "target/ok": "ok"}))
    elif variant == "store path itself a link":
        made = tmp_path / "made2" / f"x{secrets.token_hex(4)}-cargo-deps-0"
        made.parent.mkdir()
        made.symlink_to(host)
        root = index_entry(tmp_path, add_to_store(made))
    elif variant == "entry through another link":
        hop = tmp_path / "hop-cargo-deps-0"
        hop.symlink_to(host)
        root = index_entry(tmp_path, hop)
    else:
        root = tmp_path / "cache" / "deps-derivations" / "hard"
        root.parent.mkdir(parents=True)
        os.link(host / "planted", root)
    assert seed_from_index(root, target) in ("not taken", "refused"), variant
    assert not target.exists() or not planted_in(target)
    assert (host / "planted").read_bytes() == PLANTED  # and the host file is left as it was


def test_an_honest_output_is_copied_with_its_inner_links(tmp_path: Path) -> None:
    require("nix-store")
    output = deps_output(
        tmp_path, {"target/release/deps/liba.rlib": "rlib", "target/release/liba.rlib": Path("deps/liba.rlib")}
    )
    root = index_entry(tmp_path, output)
    target = tmp_path / "loop-target"
    assert seed_from_index(root, target) == "copied"
    assert (target / "release/deps/liba.rlib").read_text() == "rlib"
    assert os.readlink(target / "release/liba.rlib") == "deps/liba.rlib"
    assert os.access(target / "release/deps/liba.rlib", os.W_OK)


def test_the_seeder_refuses_a_forged_entry_and_drops_it(tmp_path: Path) -> None:
    """StoreSeeder itself (the edit loop's seeder): the index names a store path whose target/release/x links to a host
    dir; the loop gets no copy (the seed is skipped, said why) and the entry is gone, so the next seed builds the set."""
    from flakebot import config
    from flakebot.cargo.cache_skeleton import skeleton_of
    from flakebot.nix.loopdeps import Plan, StoreSeeder, _key, derivations_dir, index_key

    require("nix-store")
    host = host_dir(tmp_path)
    crate = tmp_path / "crate"
    (crate / "src").mkdir(parents=True)
    (crate / "src/main.rs").write_text("fn main() {}\n")
    (crate / "Cargo.toml").write_text(
        '[package]\nname = "c"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\nitoa = "1"\n'
    )
    source = "registry+https://github.com/rust-lang/crates.io-index"
    (crate / "Cargo.lock").write_text(
        f'version = 3\n\n[[package]]\nname = "c"\nversion = "0.1.0"\ndependencies = ["itoa"]\n\n'
        f'[[package]]\nname = "itoa"\nversion = "1.0.11"\nsource = "{source}"\nchecksum = "{"0" * 64}"\n'
    )
    settings = config.load({"cache_dir": str(tmp_path / "cache")})
    plan = Plan(registry=Path("/flakebot/registry"), triple="x86_64-unknown-linux-gnu", builds_with="test")
    root = derivations_dir(settings) / index_key(_key(skeleton_of(crate)), plan)
    root.parent.mkdir(parents=True)
    root.symlink_to(deps_output(tmp_path, {"target/release/x": host, "target/release/ok": "ok"}))
    target = tmp_path / "loop-target"
    seeded = StoreSeeder(settings, crate, target, tmp_path / "work", plan).seed(isolated=True)
    assert seeded.status == "skipped" and "symbolic link" in seeded.detail, seeded
    assert not target.exists() or not planted_in(target)
    assert not os.path.lexists(root)


def test_the_seeder_keys_a_manifest_and_lock_it_has_read_before_without_parsing_them_again(tmp_path: Path) -> None:
    """StoreSeeder.refresh before each of the loop's `cargo test`: the same manifest, lock and build.rs give the key
    they gave (no TOML parsed); bytes that differ are read again, and only a new dependency set is seeded."""
    from flakebot import config
    from flakebot.cargo.cache_skeleton import read_inputs
    from flakebot.nix.loopdeps import Plan, StoreSeeder

    crate = tmp_path / "crate"
    (crate / "src").mkdir(parents=True)
    (crate / "src/main.rs").write_text("fn main() {}\n")
    manifest = '[package]\nname = "c"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\n'
    (crate / "Cargo.toml").write_text(manifest)
    (crate / "Cargo.lock").write_text('version = 3\n\n[[package]]\nname = "c"\nversion = "0.1.0"\n')
    settings = config.load({"cache_dir": str(tmp_path / "cache")})
    plan = Plan(registry=Path("/flakebot/registry"), triple="x86_64-unknown-linux-gnu", builds_with="test")
    seeder = StoreSeeder(settings, crate, tmp_path / "target", tmp_path / "work", plan)
    assert seeder.seed(isolated=True).status == "skipped"  # no dependencies yet: nothing to build
    key = seeder.key
    assert key and seeder.keyed_inputs == read_inputs(crate)
    assert seeder.refresh() is None

    (crate / "Cargo.toml").write_text(manifest + "# the model's comment\n")  # other bytes, the same dependency set
    assert seeder.refresh() is None and seeder.key == key
    assert seeder.keyed_inputs == read_inputs(crate), "the new bytes are known to give the same key"

    (crate / "build.rs").write_text("fn main() {}\n")  # no build-dependencies: the build script is not the deps'
    assert seeder.refresh() is None and seeder.key == key
    (crate / "Cargo.toml").write_text(manifest + "\n[build-dependencies]\n")  # a table the key holds: seeded again
    again = seeder.refresh()
    assert again is not None and again.status == "skipped" and seeder.key not in ("", key)
    key = seeder.key

    (crate / "Cargo.toml").write_text(manifest.replace("[dependencies]", "[dependencies]\nitoa ="))  # not TOML
    assert seeder.refresh() is None and seeder.key == key, "a manifest that does not parse leaves cargo to say why"
