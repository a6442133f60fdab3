"""sandbox/ownership.py: the trees handed to the sandbox's uid before each command, as root."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flakebot.sandbox.ownership import _adopt_one, adopt

UID = 2_000_123  # an unused uid, as the sandbox's (bubblewrap.SANDBOX_UID_BASE + pid)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="adopt runs only as root (the sandbox's own uid)")


def test_the_walk_hands_over_every_entry_but_git_links_and_frozen_files(tmp_path: Path) -> None:
    tree = tmp_path / "ws"
    (tree / "src/deep").mkdir(parents=True)
    (tree / ".git").mkdir()
    for rel in ("src/main.rs", "src/deep/mod.rs", ".git/HEAD", "frozen.rs"):
        (tree / rel).write_text("x")
        (tree / rel).chmod(0o600)
    elsewhere = tmp_path / "root-only"
    elsewhere.write_text("secret")
    elsewhere.chmod(0o600)
    (tree / "link").symlink_to(elsewhere)
    assert adopt([tree], UID, skip=[tree / "frozen.rs"]) == 5  # ws, src, src/deep and the two sources
    for rel in ("src", "src/deep", "src/main.rs", "src/deep/mod.rs"):
        st = os.lstat(tree / rel)
        assert st.st_gid == UID and st.st_mode & stat.S_IWGRP, rel
    for path in (tree / ".git/HEAD", tree / "frozen.rs", elsewhere):
        assert os.lstat(path).st_gid != UID and stat.S_IMODE(os.lstat(path).st_mode) == 0o600, path
    assert adopt([tree], UID, skip=[tree / "frozen.rs"]) == 0  # handed over already


def test_an_entry_swapped_for_a_link_after_it_was_looked_at_is_not_what_gets_widened(tmp_path: Path) -> None:
    """The walk looks at an entry, then changes it: a sandboxed process of the same uid that swapped it for a link
    to a root-only file in between must not have that file made group-writable (chmod follows links)."""
    secret = tmp_path / "secret"
    secret.write_text("root only")
    secret.chmod(0o600)
    looked = tmp_path / "main.rs"
    looked.write_text("fn main() {}")
    looked.chmod(0o644)
    st = os.lstat(looked)
    looked.unlink()
    looked.symlink_to(secret)  # swapped between the walk's lstat and its change
    assert _adopt_one(str(looked), st, UID) == 0
    assert (os.lstat(secret).st_gid, stat.S_IMODE(os.lstat(secret).st_mode)) == (0, 0o600)
    other = tmp_path / "other.rs"  # another file put at the name: not the entry looked at either
    other.write_text("x")
    other.chmod(0o600)
    looked.unlink()
    os.link(other, looked)
    os.unlink(other)
    assert _adopt_one(str(looked), st, UID) == 0
    assert stat.S_IMODE(os.lstat(looked).st_mode) == 0o600


SWAPPER = """
import os, sys
ws, outside = sys.argv[1], sys.argv[2]
os.symlink(outside, ws + "/link")
while True:  # ws/d: a directory, then a link to the root-only directory outside, and back
    os.rename(ws + "/d", ws + "/held")
    os.rename(ws + "/link", ws + "/d")
    os.rename(ws + "/d", ws + "/link")
    os.rename(ws + "/held", ws + "/d")
"""


def test_a_directory_swapped_for_a_link_while_the_walk_runs_does_not_lead_it_outside(tmp_path: Path) -> None:
    """adopt runs while other sandboxed commands run (the examples beside cargo test, each example beside the others):
    a process of the sandbox's uid that swaps a directory of the workspace for a link to a root-only directory after
    the walk looked at it, and before the walk lists it, must not have that directory's files widened."""
    outside = tmp_path / "etc"
    outside.mkdir(mode=0o700)
    secret = outside / "shadow"
    secret.write_text("root only")
    secret.chmod(0o600)
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    for i in range(40):  # siblings listed before d's turn: the window between d's lstat and its listing
        (ws / f"s{i}").mkdir()
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(ws), str(outside)])
    try:
        while not (ws / "link").is_symlink() and swapper.poll() is None:
            time.sleep(0.01)  # the swapper started
        for _ in range(2000):
            adopt([ws], UID)
            assert (os.lstat(secret).st_gid, stat.S_IMODE(os.lstat(secret).st_mode)) == (0, 0o600)
            assert (os.lstat(outside).st_gid, stat.S_IMODE(os.lstat(outside).st_mode)) == (0, 0o700)
    finally:
        swapper.kill()
        swapper.wait()
