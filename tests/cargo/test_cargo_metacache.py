"""One `cargo metadata` per workspace state (cargo/metacache.py): counted through a PATH wrapper of cargo that logs each
call and runs the real cargo underneath."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from flakebot.cargo import metacache
from flakebot.cargo.runner import Cargo
from flakebot.config import Settings

MANIFEST = '[package]\nname = "m"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\nitoa = "1"\n'


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cargo on PATH that appends its subcommand to the returned log, then runs the real cargo."""
    real = shutil.which("cargo")
    assert real is not None
    bin_dir, log = tmp_path / "bin", tmp_path / "cargo.log"
    bin_dir.mkdir()
    wrapper = bin_dir / "cargo"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    log.touch()
    return log


def _metadata_calls(log: Path) -> int:
    return sum(1 for line in log.read_text().splitlines() if " metadata " in f" {line} ")


def _run_tree(tmp_path: Path) -> tuple[Cargo, Path]:
    run_dir = tmp_path / "run"
    crate = run_dir / "workspace"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text(MANIFEST)
    (crate / "src/main.rs").write_text("fn main() {}\n")
    return Cargo.for_run(Settings(registry="local"), run_dir / "target", run_dir), crate


def _targets(answer: str) -> set[str]:
    return {t["name"] for p in json.loads(answer)["packages"] if p["name"] == "m" for t in p["targets"]}


def test_an_unchanged_workspace_asks_cargo_once(tmp_path: Path, counted: Path) -> None:
    cargo, crate = _run_tree(tmp_path)
    args = ["metadata", "--format-version", "1"]
    first = cargo.run(args, crate, timeout=120)
    assert first.returncode == 0, first.stderr
    asked = _metadata_calls(counted)  # the full call, and the sources check's --no-deps one before it
    assert asked == 2 and (crate / "Cargo.lock").is_file()  # the call wrote Cargo.lock: kept for the state after it
    again = cargo.run(args, crate, timeout=120)
    # the full answer was kept; the check's --no-deps one was kept for the tree before Cargo.lock, so it is asked again
    assert again.stdout == first.stdout and _metadata_calls(counted) == asked + 1
    for _ in range(3):
        assert cargo.run(args, crate, timeout=120).stdout == first.stdout
    assert _metadata_calls(counted) == asked + 1
    asked += 1

    (crate / "src/bin").mkdir()
    (crate / "src/bin/other.rs").write_text("fn main() {}\n")  # a new file name: a new target cargo discovers
    found = cargo.run(args, crate, timeout=120)
    assert _metadata_calls(counted) > asked and "other" in _targets(found.stdout)

    asked = _metadata_calls(counted)
    (crate / "Cargo.toml").write_text(MANIFEST.replace('itoa = "1"', 'itoa = "1"\nmemchr = "2"'))
    changed = cargo.run(args, crate, timeout=120)
    assert _metadata_calls(counted) > asked
    assert "memchr" in {d["name"] for p in json.loads(changed.stdout)["packages"] for d in p["dependencies"]}


def test_a_planted_git_source_is_seen_after_an_answer_was_kept(tmp_path: Path, counted: Path) -> None:
    """The sources check runs on the new manifest, not a kept answer: a git dependency added later is refused."""
    cargo, crate = _run_tree(tmp_path)
    assert cargo.run(["metadata", "--format-version", "1"], crate, timeout=120).returncode == 0
    (crate / "Cargo.toml").write_text(MANIFEST + 'evil = { git = "https://evil.example/evil" }\n')
    refused = cargo.run(["metadata", "--format-version", "1"], crate, timeout=120)
    assert refused.returncode == 101 and "evil" in refused.stderr


def test_a_crate_outside_the_runs_tree_is_never_kept(tmp_path: Path, counted: Path) -> None:
    _, crate = _run_tree(tmp_path)
    cargo = Cargo.for_run(
        Settings(registry="local"), tmp_path / "target"
    )  # no run dir: no tree bounds what cargo reads
    hits = metacache.hits
    for _ in range(2):
        assert cargo.call(["metadata", "--format-version", "1", "--no-deps"], crate, timeout=120).returncode == 0
    assert _metadata_calls(counted) == 2 and metacache.hits == hits


def test_the_sources_check_reuses_a_plain_no_deps_answer_offline(tmp_path: Path, counted: Path) -> None:
    """Offline, `metadata --no-deps` (the acquire stage's) and the sources check's `metadata --no-deps --offline` are
    one question: cargo is asked once."""
    cargo, crate = _run_tree(tmp_path)
    plain = cargo.call(["metadata", "--format-version", "1", "--no-deps"], crate, timeout=120)
    checked = cargo.call(["metadata", "--format-version", "1", "--no-deps", "--offline"], crate, timeout=120)
    assert plain.returncode == checked.returncode == 0 and plain.stdout == checked.stdout
    assert _metadata_calls(counted) == 1


def test_a_tree_too_big_to_walk_cheaply_asks_cargo(
    tmp_path: Path, counted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cargo, crate = _run_tree(tmp_path)
    monkeypatch.setattr(metacache, "MAX_ENTRIES", 20)
    for i in range(20):
        (crate / f"data-{i}.txt").write_text("x")
    for _ in range(2):
        assert cargo.call(["metadata", "--format-version", "1", "--no-deps"], crate, timeout=120).returncode == 0
    assert _metadata_calls(counted) == 2


def _package(answer: str) -> tuple[str, str]:
    meta = json.loads(answer)
    return meta["packages"][0]["name"], meta["packages"][0]["version"]


def test_a_manifest_linked_to_another_file_of_the_tree_is_not_answered_stale(tmp_path: Path, counted: Path) -> None:
    """Cargo.toml a symbolic link to a file of another name: cargo reads that file, so its edit is a new answer."""
    cargo, crate = _run_tree(tmp_path)
    (crate / "Cargo.toml").unlink()
    (crate / "notes.txt").write_text(MANIFEST)
    (crate / "Cargo.toml").symlink_to("notes.txt")
    args = ["metadata", "--format-version", "1", "--no-deps"]
    first = cargo.call(args, crate, timeout=120)
    assert first.returncode == 0, first.stderr
    assert _package(first.stdout) == ("m", "0.1.0")
    (crate / "notes.txt").write_text(MANIFEST.replace('name = "m"', 'name = "other"').replace("0.1.0", "6.6.6"))
    now = cargo.call(args, crate, timeout=120)
    assert now.returncode == 0, now.stderr
    assert _package(now.stdout) == ("other", "6.6.6")


def test_a_member_inside_a_git_directory_has_its_targets_seen(tmp_path: Path, counted: Path) -> None:
    """Names inside a directory called .git count when a package lives there: cargo discovers its targets."""
    cargo, crate = _run_tree(tmp_path)
    member = crate / ".git/hidden"
    (member / "src").mkdir(parents=True)
    (member / "Cargo.toml").write_text('[package]\nname = "hidden"\nversion = "0.1.0"\nedition = "2021"\n')
    (member / "src/main.rs").write_text("fn main() {}\n")
    (crate / "Cargo.toml").write_text(
        MANIFEST + 'hidden = { path = ".git/hidden" }\n\n[workspace]\nmembers = [".git/hidden"]\n'
    )
    args = ["metadata", "--format-version", "1", "--no-deps"]
    first = cargo.call(args, crate, timeout=120)
    assert first.returncode == 0, first.stderr
    (member / "src/bin").mkdir()
    (member / "src/bin/undeclared.rs").write_text("fn main() {}\n")
    now = cargo.call(args, crate, timeout=120)
    targets = {t["name"] for p in json.loads(now.stdout)["packages"] if p["name"] == "hidden" for t in p["targets"]}
    assert "undeclared" in targets


def test_a_member_outside_the_runs_tree_is_not_answered_stale(tmp_path: Path, counted: Path) -> None:
    """A workspace member in the run's target dir (which the sandbox writes, and the digest does not walk): cargo reads
    its manifest, so an answer naming it is not kept."""
    cargo, crate = _run_tree(tmp_path)
    outside = cargo.target_dir / "evil"
    (outside / "src").mkdir(parents=True)
    (outside / "src/main.rs").write_text("fn main() {}\n")
    evil = '[package]\nname = "evil"\nversion = "0.1.0"\nedition = "2021"\nworkspace = "../../workspace"\n'
    (outside / "Cargo.toml").write_text(evil)
    (crate / "Cargo.toml").write_text(MANIFEST + '\n[workspace]\nmembers = ["../target/evil"]\n')
    args = ["metadata", "--format-version", "1", "--no-deps"]
    first = cargo.run(args, crate, timeout=120)
    assert first.returncode == 0, first.stderr
    assert ("evil", "0.1.0") in {(p["name"], p["version"]) for p in json.loads(first.stdout)["packages"]}
    (outside / "Cargo.toml").write_text(evil.replace("0.1.0", "6.6.6"))
    now = cargo.run(args, crate, timeout=120)
    assert ("evil", "6.6.6") in {(p["name"], p["version"]) for p in json.loads(now.stdout)["packages"]}


def test_a_cargo_config_above_the_calls_directory_is_part_of_the_state(
    tmp_path: Path, counted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cargo reads .cargo/config.toml in every directory above its working directory (a temporary one): one written
    there after an answer was kept (a [patch] of a dependency) changes what cargo answers, so it is a new key."""
    import tempfile

    temp = tmp_path / "tmp"
    (temp / ".cargo").mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    cargo, crate = _run_tree(tmp_path)
    args = ["metadata", "--format-version", "1"]
    first = cargo.run(args, crate, timeout=120)
    assert first.returncode == 0, first.stderr
    locked = next(p["version"] for p in json.loads(first.stdout)["packages"] if p["name"] == "itoa")
    patched = tmp_path / "itoa"
    (patched / "src").mkdir(parents=True)
    (patched / "src/lib.rs").write_text("")
    (patched / "Cargo.toml").write_text(f'[package]\nname = "itoa"\nversion = "{locked}"\nedition = "2021"\n')
    (temp / ".cargo/config.toml").write_text(f'[patch.crates-io]\nitoa = {{ path = "{patched}" }}\n')
    now = cargo.run(args, crate, timeout=120)
    assert now.returncode == 0, now.stderr
    assert {p["source"] for p in json.loads(now.stdout)["packages"] if p["name"] == "itoa"} == {None}  # the patch


def test_a_file_whose_bytes_spell_the_next_entry_is_not_that_entry(tmp_path: Path, counted: Path) -> None:
    """A file of a counted name (`config`) cargo does not read, whose bytes end as the digest's record of a next entry
    would: without lengths in the digest, the tree with that file alone and the tree with the entry itself (a new
    bin target) gave one key."""
    cargo, crate = _run_tree(tmp_path)
    (crate / "src/bin").mkdir()
    args = ["metadata", "--format-version", "1", "--no-deps"]
    (crate / "src/bin/config").write_bytes(b"x\0src/bin/extra.rs\0" + str(0o100000).encode())
    first = cargo.call(args, crate, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "extra" not in _targets(first.stdout)
    (crate / "src/bin/config").write_bytes(b"x")
    (crate / "src/bin/extra.rs").write_text("")
    now = cargo.call(args, crate, timeout=120)
    assert "extra" in _targets(now.stdout)


def test_a_file_name_that_is_not_utf8_is_walked(tmp_path: Path, counted: Path) -> None:
    """Cargo takes a tree with a file name that is not UTF-8 in it; so does the digest (no exception out of the call)."""
    cargo, crate = _run_tree(tmp_path)
    (crate / os.fsdecode(b"notes-\xff.txt")).write_text("")
    args = ["metadata", "--format-version", "1", "--no-deps"]
    for _ in range(2):
        assert cargo.call(args, crate, timeout=120).returncode == 0
    assert _metadata_calls(counted) == 1


def test_a_huge_file_of_a_counted_name_is_not_read_whole(tmp_path: Path, counted: Path) -> None:
    """A file named `config` cargo never reads, of hundreds of MB (sparse: no disk): the digest would read it into
    memory on every call; past metacache.READ_LIMIT the tree is not kept and cargo is asked."""
    cargo, crate = _run_tree(tmp_path)
    with open(crate / "src/config", "wb") as big:
        big.truncate(300 * 1024 * 1024)
    args = ["metadata", "--format-version", "1", "--no-deps"]
    for _ in range(2):
        assert cargo.call(args, crate, timeout=120).returncode == 0
    assert _metadata_calls(counted) == 2
