"""Removing trees a model's code wrote: links in them are removed, never followed."""

from __future__ import annotations

import stat
from pathlib import Path

from flakebot.fsutil import remove_tree


def test_remove_tree_leaves_what_a_link_in_it_points_to(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "kept").write_text("x")
    tree = tmp_path / "target"
    (tree / "debug").mkdir(parents=True)
    (tree / "debug/out").symlink_to(private)  # as a build script can leave in its target dir
    assert remove_tree(tree) and not tree.exists()
    assert stat.S_IMODE(private.stat().st_mode) == 0o700 and (private / "kept").is_file()
