"""The host never follows a link in a tree someone else wrote (flakebot.safefs), judged from outside: a file beyond
the tree keeps its bytes, whatever a dependency's build script, a cloned repository or a shared cache's owner
planted (a link at any position, a link swapped in while the host works, a hard link, a FIFO)."""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.scenarios.gitserve import crate_manifest, write
from benchmarks.scenarios.hostfile_cases import (
    CASES,
    evil_registry,
    flipping,
    index_key,
    linked_repo,
    run_hostfile_cases,
)
from flakebot.agent.acceptance import ACCEPTANCE_TEST, Frozen, write_acceptance_test
from flakebot.config import Settings, load
from flakebot.crates import CrateInfo
from flakebot.deliver import index as signed
from flakebot.deliver import shared
from flakebot.errors import AcquireError, CatalogError, UnsafePath
from flakebot.safefs import Budget, Tree, copy_tree, file_below
from flakebot.source.acquisition import acquire
from flakebot.toolspec import Example, ToolSpec
from tests.conftest import require

SECRET = b"root's own file: must never change\n"


def victim(path: Path) -> Path:
    """A root-owned 0600 file outside every tree, as the attacks aim at."""
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


def untouched(*paths: Path) -> bool:
    return all(p.read_bytes() == SECRET for p in paths)


# ---------------------------------------------------------------- the rules themselves


def test_paths_leaving_the_tree_are_refused_with_the_path_and_the_rule(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    for rel, rule in [("../x", "dotdot"), ("a/../../x", "dotdot"), ("/etc/passwd", "absolute"), ("", "empty")]:
        with pytest.raises(UnsafePath) as caught:
            tree.write_text(rel, "x")
        assert caught.value.details["rule"] == rule, rel
    (tmp_path / "out").symlink_to("/")
    with pytest.raises(UnsafePath) as caught:
        tree.read_bytes("out/etc/hostname")
    assert caught.value.details == {"path": str(tmp_path / "out"), "rule": "link"}
    assert "symbolic link" in caught.value.one_line() and "Fix:" in caught.value.one_line()


def test_a_link_swapped_in_while_the_host_writes_is_never_followed(tmp_path: Path) -> None:
    """Check-then-use is what an attacker races: a directory flips between real and a link out, thousands of times,
    while the host writes beneath it. Every write lands inside or is refused; none lands outside."""
    outside, tree_root = tmp_path / "outside", tmp_path / "tree"
    outside.mkdir()
    (tree_root / "dir").mkdir(parents=True)
    stop, flipper = flipping(tree_root / "dir", outside)
    tree, refused = Tree(tree_root), 0
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            try:
                tree.write_text("dir/file", "x", parents=False)
                with tree.lock("dir/.lock"):
                    pass
            except (UnsafePath, FileNotFoundError):
                refused += 1
    finally:
        stop.set()
        flipper.join()
    assert list(outside.iterdir()) == [], "a write followed the swapped-in link"
    assert refused, "the race never hit: the test proves nothing"


def test_reads_and_locks_refuse_a_fifo_without_hanging(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    tree = Tree(tmp_path)
    for use in (lambda: tree.read_bytes("pipe"), lambda: tree.lock("pipe").__enter__()):
        with pytest.raises(UnsafePath) as caught:
            use()
        assert caught.value.details["rule"] == "not-a-file"


def test_streamed_writes_removals_and_link_reads_never_go_through_a_planted_name(tmp_path: Path) -> None:
    """What a tool's writable copy is copied back with (flakebot.deliver.writelayer): a stream written over a
    symlink and a hard link replaces the name, keeps the mode asked (no set-id bit); unlink never removes a
    directory, rmdir never a full one; reads refuse a link or a FIFO."""
    outside, root = victim(tmp_path / "outside.txt"), tmp_path / "tree"
    root.mkdir()
    (root / "soft").symlink_to(outside)
    os.link(outside, root / "hard")
    tree = Tree(root)
    source = tmp_path / "source.bin"
    source.write_bytes(b"new\n" * 100_000)
    for name in ("soft", "hard"):
        with source.open("rb") as stream:
            tree.write_from(name, stream, mode=0o4755, times_ns=(1, 2_000_000_000), parents=False)
        assert (root / name).read_bytes() == source.read_bytes() and not (root / name).is_symlink()
        assert (root / name).stat().st_mode & 0o7777 == 0o755 and (root / name).stat().st_mtime_ns == 2_000_000_000
    assert untouched(outside) and sorted(os.listdir(root)) == ["hard", "soft"]
    (root / "full").mkdir()
    (root / "full" / "f").write_text("x")
    (root / "up").symlink_to(tmp_path)
    with pytest.raises(IsADirectoryError):
        tree.unlink("full")
    with pytest.raises(OSError):
        tree.rmdir("full")
    with pytest.raises(UnsafePath):
        tree.unlink("up/outside.txt")
    with pytest.raises(UnsafePath):
        tree.mkdir("up/new", parents=False)
    os.mkfifo(root / "pipe")
    for rel in ("pipe", "up/outside.txt", "soft2"):
        with pytest.raises((UnsafePath, FileNotFoundError)):
            with tree.open_read(rel):
                pass
    assert tree.readlink("up") == str(tmp_path) and untouched(outside) and (root / "full" / "f").exists()
    assert not (tmp_path / "new").exists()


def test_a_named_file_below_a_root_is_the_file_itself_never_a_link(tmp_path: Path) -> None:
    """file_below: what the example run and the smoke run bind the directory of (cargo's JSON, a build's bin/)."""
    root, outside = tmp_path / "target", victim(tmp_path / "outside.txt")
    (root / "debug").mkdir(parents=True)
    (root / "debug" / "tool").write_text("#!/bin/sh\n")
    (root / "debug" / "link").symlink_to(outside)
    (root / "up").symlink_to(tmp_path)
    (tmp_path / "via").symlink_to(root)
    assert file_below(root, root / "debug" / "tool") == root / "debug" / "tool"
    assert file_below(tmp_path / "via", tmp_path / "via" / "debug" / "tool") == root / "debug" / "tool"
    refused = {
        "debug/link": "link",
        "up/outside.txt": "link",
        "debug": "not-a-file",
        "../outside.txt": "outside",
        "sh": "outside",
    }
    for named, rule in refused.items():
        path = Path(named) if named == "sh" else Path(os.path.normpath(root / named))
        with pytest.raises(UnsafePath) as caught:
            file_below(root, path)
        assert caught.value.details["rule"] == rule, named
    assert untouched(outside)


# ---------------------------------------------------------------- the dependency cache


@pytest.mark.slow
def test_a_dependency_build_script_cannot_make_the_host_write_outside_the_cache(tmp_path: Path) -> None:
    require("bwrap", "cargo")
    from flakebot.cargo.depcache import ENTRY_INFO, cache_root, seed_target_dir
    from flakebot.cargo.runner import Cargo

    target = victim(tmp_path / "root-owned-0600")
    registry = evil_registry(tmp_path, target)
    crate = tmp_path / "tool"
    write(
        crate,
        {"Cargo.toml": crate_manifest("tool", "0.1.0", 'evil-build = "0.1.0"\n'), "src/main.rs": "fn main() {}\n"},
    )
    cargo = Cargo(target_dir=tmp_path / "t", offline=True, registry_dir=registry)
    assert cargo.run(["generate-lockfile"], crate).returncode == 0

    seeded = seed_target_dir(load(), cargo, crate, tmp_path / "t", isolated=True)

    assert untouched(target), f"the host wrote through the build script's link: {target.read_bytes()!r} {seeded}"
    assert seeded.status == "built", seeded
    info = cache_root(load()) / seeded.key / ENTRY_INFO
    assert info.is_file() and not info.is_symlink(), "the entry's info is flakebot's own file, the link replaced"


# ---------------------------------------------------------------- a forked repository


SPEC = ToolSpec(name="linked", summary="s", usage="linked", examples=[Example(args=[], stdout="")])


def test_a_cloned_link_out_of_the_tree_is_refused_at_acquisition(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    url = linked_repo(tmp_path, outside)
    dest = tmp_path / "workspace"
    with pytest.raises(AcquireError) as caught:
        acquire(CrateInfo(name="linked", version="0.1.0", repository=url), dest, branch="b", settings=Settings())
    assert "tests" in caught.value.message and str(outside) in caught.value.message
    assert not dest.exists() and list(outside.iterdir()) == []


def test_the_acceptance_test_is_never_written_through_a_link(tmp_path: Path) -> None:
    """What a sandboxed step could leave in the crate (the same shapes the clone is refused for), at each position."""
    outside = tmp_path / "outside"
    outside.mkdir()
    crate = tmp_path / "crate"
    crate.mkdir()
    (crate / "tests").symlink_to(outside)
    with pytest.raises(UnsafePath):
        write_acceptance_test(SPEC, crate)
    assert list(outside.iterdir()) == []

    (crate / "tests").unlink()
    (crate / "tests").mkdir()
    target, hard = victim(tmp_path / "linked-to"), victim(tmp_path / "hard-linked")
    for plant in (
        lambda p: p.symlink_to(target),  # the file's own name a link
        lambda p: os.link(hard, p),  # a hard link to a file outside: written through in place, it would change
        lambda p: os.mkfifo(p),  # a FIFO: a blocking write would hang the host
    ):
        path = crate / ACCEPTANCE_TEST
        path.unlink(missing_ok=True)
        plant(path)
        digests = write_acceptance_test(SPEC, crate)
        assert path.is_file() and not path.is_symlink() and path.stat().st_nlink == 1
        assert Frozen(crate, digests).changed() == []
    assert untouched(target, hard)
    (crate / ACCEPTANCE_TEST).unlink()
    os.mkfifo(crate / ACCEPTANCE_TEST)
    frozen = Frozen(crate, {})
    frozen.digests[ACCEPTANCE_TEST] = digests[ACCEPTANCE_TEST]
    assert frozen.changed() == [ACCEPTANCE_TEST], "a FIFO reads as changed, without hanging the check"


# ---------------------------------------------------------------- a shared catalog directory


def catalog_entry(tmp_path: Path) -> dict[str, object]:
    directory = tmp_path / "catalog-entry"
    write(directory, {"manifest.json": '{"summary": "s"}', "USAGE.md": "# t\n", "flake/flake.nix": "{}\n"})
    return {"name": "tool", "version": "0.1.0", "need": "a tool", "dir": str(directory)}


RECORD = {
    "store_path": "/nix/store/00000000000000000000000000000000-tool",
    "entry_path": "/nix/store/11111111111111111111111111111111-flakebot-entry-tool-0.1.0",
    "nar_hash": "sha256-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
    "paths": 1,
    "closure_size": 1,
    "published_at": 1.0,
}


def cache_with(root: Path, plants: dict[str, Callable[[Path], object]]) -> str:
    """A file:// cache whose owner planted `plants` (path under the cache's flakebot/ directory: how it is made)."""
    for rel, plant in plants.items():
        path = root / shared.PREFIX / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        plant(path)
    return root.as_uri()


@pytest.fixture
def key() -> shared.IndexKey:
    require("nix")
    return index_key()  # type: ignore[no-any-return]


def tool_version(url: str, key: shared.IndexKey, name: str = "tool") -> str:
    """The version the cache's signed index lists for `name` (verified against the publisher's key)."""
    raw = shared.read_index(url)
    assert raw is not None
    return str(signed.verify(raw, url, key.trusted).tools[name]["version"])


def test_planted_links_in_a_shared_cache_never_reach_outside(tmp_path: Path, key: shared.IndexKey) -> None:
    target, hard, outside = victim(tmp_path / "root-owned-0600"), victim(tmp_path / "hard-linked"), tmp_path / "outside"
    outside.mkdir()
    entry = catalog_entry(tmp_path)
    refused: dict[str, dict[str, Callable[[Path], object]]] = {
        "lock-link": {".lock": lambda p: p.symlink_to(target)},
        "tools-link": {"tools": lambda p: p.symlink_to(outside)},
        "tool-dir-link": {"tools/tool": lambda p: p.symlink_to(outside)},  # the link one level down
        "lock-fifo": {".lock": os.mkfifo},
        "index-fifo": {"index.json": os.mkfifo},  # a blocking read would hang publish
        "index-link": {"index.json": lambda p: p.symlink_to(target)},  # never read through (nor written)
    }
    for case, plants in refused.items():
        with pytest.raises((UnsafePath, CatalogError)):  # the index unusable is the catalog's error
            shared.add_entry(cache_with(tmp_path / case, plants), entry, RECORD, key)
        assert untouched(target, hard) and list(outside.iterdir()) == [], case

    replaced: dict[str, dict[str, Callable[[Path], object]]] = {
        "index-hard": {"index.json": lambda p: os.link(other_index, p)},  # replaced by rename, never written in place
        "lock-hard": {".lock": lambda p: os.link(hard, p)},  # locked, never truncated or written
        "old-link": {"tools/tool/.0.1.0.old": lambda p: p.symlink_to(outside)},  # removed as a link, never entered
    }
    empty_index = '{"format": 1, "tools": {}}'
    other_index = tmp_path / "another-cache-index.json"  # a file outside holding a valid index, hard-linked in
    other_index.write_text(empty_index)
    for case, plants in replaced.items():
        url = cache_with(tmp_path / case, plants)
        shared.add_entry(url, entry, RECORD, key)
        assert untouched(target, hard) and list(outside.iterdir()) == [], case
        assert tool_version(url, key) == "0.1.0", case
    assert other_index.read_text() == empty_index


def test_a_whole_shared_cache_link_is_refused(tmp_path: Path, key: shared.IndexKey) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / shared.PREFIX).symlink_to(outside)
    with pytest.raises(UnsafePath):
        shared.add_entry((tmp_path / "cache").as_uri(), catalog_entry(tmp_path), RECORD, key)
    assert list(outside.iterdir()) == []


def test_a_fifo_or_link_where_the_host_reads_a_manifest_is_refused_without_hanging(tmp_path: Path) -> None:
    """A sandboxed build can leave Cargo.toml or Cargo.lock as a FIFO (main blocked on it for good) or a link to a
    host file; the host's reads between sandboxed steps (the dependency cache's skeleton, the source allow-list)
    refuse it at once."""
    from flakebot.cargo.cache_skeleton import NoSkeleton, skeleton_of
    from flakebot.cargo.sources import lock_refusal

    crate = tmp_path / "crate"
    write(crate, {"Cargo.toml": crate_manifest("crate", "0.1.0"), "src/lib.rs": ""})
    os.mkfifo(crate / "Cargo.lock")
    started = time.monotonic()
    assert "not a regular file" in lock_refusal(crate / "Cargo.lock", ())
    with pytest.raises(NoSkeleton):
        skeleton_of(crate)
    (crate / "Cargo.lock").unlink()
    (crate / "Cargo.lock").write_text("")
    (crate / "Cargo.toml").rename(crate / "real.toml")
    os.mkfifo(crate / "Cargo.toml")
    with pytest.raises(NoSkeleton):
        skeleton_of(crate)
    (crate / "Cargo.lock").unlink()
    (crate / "Cargo.lock").symlink_to(victim(tmp_path / "root-owned-0600"))
    assert "symbolic link" in lock_refusal(crate / "Cargo.lock", ())
    assert time.monotonic() - started < 5


def test_flakebot_publish_into_a_cache_with_planted_links_leaves_the_host_alone(tmp_path: Path) -> None:
    """The real command: `flakebot publish TOOL --to file:///cache` (nix copy, then the entry and index) into a
    cache whose owner planted flakebot/.lock as a link to a root-owned file: one line, exit 2, the file unchanged.
    Then a hard link at the lock: published, the file unchanged."""
    require("nix")
    from flakebot import config
    from flakebot.deliver.catalog import Catalog
    from tests.conftest import run_cli

    (tmp_path / "note.txt").write_text("a published note\n")
    added = subprocess.run(["nix-store", "--add", str(tmp_path / "note.txt")], capture_output=True, text=True)
    assert added.returncode == 0, added.stderr
    (tmp_path / "flake").mkdir()
    manifest = {"name": "note", "summary": "a note", "main_program": "note", "store_path": added.stdout.strip()}
    Catalog.open(config.load()).add(
        "note",
        need="need a note",
        flake_dir=tmp_path / "flake",
        manifest=manifest,
        usage_md="# note\n",
        store_path=added.stdout.strip(),
        run_id="test",
        origin={},
    )
    target = victim(tmp_path / "root-owned-0600")

    linked = cache_with(tmp_path / "linked-cache", {".lock": lambda p: p.symlink_to(target)})
    done = run_cli("publish", "note", "--to", linked)
    assert done.returncode == 2, done.stderr
    assert "flakebot/.lock: is a symbolic link" in done.stderr and "Fix:" in done.stderr
    assert untouched(target)

    hard = cache_with(tmp_path / "hard-cache", {".lock": lambda p: os.link(target, p)})
    done = run_cli("publish", "note", "--to", hard)
    assert done.returncode == 0, done.stderr
    assert untouched(target)
    assert b'\\"note\\"' in (shared.read_index(hard) or b""), "the signed index lists the tool"


@pytest.mark.slow
def test_every_host_file_attack_of_the_reliability_report_is_contained(tmp_path: Path) -> None:
    """The cases `make reliability` counts (benchmarks/scenarios/hostfile_cases.py), each in a child process."""
    rows = run_hostfile_cases(tmp_path)
    assert {row["case"] for row in rows} >= {c.name for c in CASES if not c.needs}
    assert [row for row in rows if not row["contained"]] == []


def test_a_cache_without_an_index_reads_as_nothing_published_and_a_missing_cache_says_so(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="does not exist"):
        shared.read_index((tmp_path / "no-such-cache").as_uri())
    assert shared.read_index(tmp_path.as_uri()) is None
    with pytest.raises(FileNotFoundError):
        Tree(tmp_path / "no-such-tree")


def _allocated(path: Path) -> int:
    return int(
        subprocess.run(["du", "-s", "--block-size=1", str(path)], capture_output=True, text=True).stdout.split()[0]
    )


def test_a_bounded_copy_keeps_holes_and_hard_links_and_stops_at_its_budget(tmp_path: Path) -> None:
    """A service's state copied for an upgrade: 1 GiB apparent of a sparse file and 100 names of one file take
    what the source takes, not their apparent size; dense data past the budget ends the copy (EDQUOT) without
    writing much past it."""
    mib = 1024 * 1024
    source = tmp_path / "state"
    source.mkdir()
    with open(source / "sparse", "wb") as sparse:
        sparse.seek(300 * mib)
        sparse.write(b"middle")
        sparse.truncate(1024 * mib)
    (source / "one").write_bytes(os.urandom(mib))
    for n in range(100):
        os.link(source / "one", source / f"name-{n}")
    copy_tree(source, tmp_path / "copy", budget=Budget(4 * mib, "the copy"))
    copied = tmp_path / "copy"
    assert (copied / "sparse").stat().st_size == 1024 * mib and _allocated(copied) <= _allocated(source) + mib
    with open(copied / "sparse", "rb") as read:
        read.seek(300 * mib)
        assert read.read(6) == b"middle"
    assert (copied / "name-42").stat().st_ino == (copied / "one").stat().st_ino
    assert (copied / "name-42").read_bytes() == (source / "one").read_bytes()
    (source / "dense").write_bytes(os.urandom(8 * mib))
    with pytest.raises(OSError, match="more than 4 MiB") as refused:
        copy_tree(source, tmp_path / "over", budget=Budget(4 * mib, "the copy"))
    assert refused.value.errno == errno.EDQUOT
    assert _allocated(tmp_path / "over") <= 4 * mib


@pytest.mark.slow  # each entry is reached from the root again (no link followed on the way): depth squared opens
def test_a_tree_deeper_than_pythons_recursion_limit_is_walked_and_copied(tmp_path: Path) -> None:
    # a service's state 1,100 directories deep ended a recursive walk with RecursionError (an upgrade's copy of it
    # included), an error no caller expected
    source = tmp_path / "source"
    source.mkdir()
    fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(1100):  # beneath descriptors: the whole path is longer than PATH_MAX
            os.mkdir("d", dir_fd=fd)
            fd, parent = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
            os.close(parent)
        os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        with Tree(source) as tree:
            found = [rel for rel, _ in tree.walk()]
        assert len(found) == 1 + 1100 + 1 and found[-1] == "d/" * 1100 + "leaf"
        copy_tree(source, tmp_path / "copy", budget=Budget(1 << 20, "the copy"))
        with Tree(tmp_path / "copy") as tree:
            assert [rel for rel, _ in tree.walk()] == found
    finally:  # GNU rm: pytest's own clean-up of old temp dirs recurses too
        os.close(fd)
        subprocess.run(["rm", "-rf", str(source), str(tmp_path / "copy")], check=True)


def test_a_subtree_is_reached_through_real_directories_only(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "Cargo.toml").write_text("host's\n")
    (tmp_path / "ws/tool").mkdir(parents=True)
    (tmp_path / "ws/tool/Cargo.toml").write_text("the crate's\n")
    (tmp_path / "ws/swapped").symlink_to(host)
    with Tree(tmp_path / "ws") as tree:
        with tree.subtree("tool") as crate:
            assert crate.read_text("Cargo.toml") == "the crate's\n"
        with pytest.raises(UnsafePath, match="swapped: is a symbolic link"):
            tree.subtree("swapped")
