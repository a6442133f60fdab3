"""A tree removed early (the edit loop's target dir, while nix builds the package) is gone by the time clean ends, and
clean reports it as it reports what it removed itself, or raises what the removal raised, as it raised it before; a
path outside the run is never removed early."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from flakebot.pipeline.cleanup import clean_run, remove_early
from flakebot.pipeline.request import RunRequest
from flakebot.pipeline.run import Run


def built_run(workdir: Path) -> Run:
    """A run with a workspace and a target dir holding read-only files and directories, as the copy of a Nix-built
    dependency tree is, both registered as acquire registers them."""
    run = Run.create(workdir, "craft", RunRequest(need="n"))
    (run.workspace / "src").mkdir(parents=True)
    (run.workspace / "src/main.rs").write_text("fn main() {}\n")
    deps = run.target_dir / "debug/deps"
    deps.mkdir(parents=True)
    for index in range(50):
        (deps / f"lib{index}.rlib").write_bytes(os.urandom(4096))
    for directory in (deps, deps.parent):
        directory.chmod(0o555)
    for path in (run.workspace, run.target_dir):
        run.register("path", path=str(path))
    return run


def test_clean_reports_a_tree_removed_early_as_removed(workdir: Path) -> None:
    inline, early = built_run(workdir), built_run(workdir)
    remove_early(early, early.target_dir)
    removed = clean_run(early)
    assert not early.target_dir.exists() and not early.workspace.exists()
    assert removed == [r.replace(str(inline.dir), str(early.dir)) for r in clean_run(inline)]
    assert f"path:{early.target_dir}" in removed


def test_a_path_outside_the_run_is_not_removed_early(workdir: Path, tmp_path: Path) -> None:
    run = built_run(workdir)
    outside = tmp_path / "outside"
    outside.mkdir()
    (run.dir / "link").symlink_to(outside)
    remove_early(run, outside)
    remove_early(run, run.dir / "link" / ".")
    clean_run(run)
    assert outside.is_dir()


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    """`path` made immutable (chattr +i: not even root may unlink it) for the block."""
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
        pytest.skip("chattr +i is not available on this file system")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_an_early_removal_that_fails_fails_clean(workdir: Path) -> None:
    run = built_run(workdir)
    with immutable(run.target_dir / "debug/deps/lib7.rlib"):
        remove_early(run, run.target_dir)
        with pytest.raises(PermissionError):
            clean_run(run)
    assert clean_run(run) == [f"path:{run.target_dir}"]  # mended, clean removes what is left
