"""Attacks on the package stage's copy of a tree someone else wrote (the workspace the model edited and whose code
ran in the sandbox): nothing outside the tree may reach the flake, whatever git's index still lists."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from flakebot.errors import FlakebotError
from flakebot.nix.flake_files import copy_sources
from tests.fakes.nix_crates import greeter

SECRET = "host secret: never in a flake"


def committed(crate: Path) -> Path:
    """`crate` as a git repository with everything committed (as the edit loop leaves it)."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(crate)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "green"], check=True)
    return crate


def shipped_text(dest: Path) -> str:
    return "".join(p.read_text() for p in dest.rglob("*") if p.is_file() and not p.is_symlink())


def test_a_directory_swapped_for_a_link_after_the_commit_copies_no_host_file(tmp_path: Path) -> None:
    # the index still lists src/main.rs; the work tree's src is now a link to a host directory holding a main.rs
    crate = committed(greeter(tmp_path / "crate"))
    host = tmp_path / "host"
    host.mkdir()
    (host / "main.rs").write_text(SECRET)
    subprocess.run(["rm", "-r", str(crate / "src")], check=True)
    (crate / "src").symlink_to(host)
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(FlakebotError, match="src"):
        copy_sources(crate, dest)
    assert SECRET not in shipped_text(dest)


def test_a_directory_swapped_for_an_ignored_link_after_the_commit_copies_no_host_file(tmp_path: Path) -> None:
    # as above, and the link hidden from `ls-files --others --exclude-standard` by a .gitignore the sandbox wrote
    crate = committed(greeter(tmp_path / "crate"))
    host = tmp_path / "host"
    host.mkdir()
    (host / "main.rs").write_text(SECRET)
    subprocess.run(["rm", "-r", str(crate / "src")], check=True)
    (crate / "src").symlink_to(host)
    (crate / ".gitignore").write_text("/target\nCargo.lock\n/src\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(FlakebotError, match="src"):
        copy_sources(crate, dest)
    assert SECRET not in shipped_text(dest)
