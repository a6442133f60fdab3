"""The machine's trouble is named as such: a full disk is a HostError (exit 5), never a model error, measured on a
real small file system (a tmpfs mounted for the test: root only, as CI runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flakebot import preflight
from flakebot.errors import HostError


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)]).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_the_hosts_trouble(small_disk: Path) -> None:
    with pytest.raises(OSError) as caught:
        (small_disk / "big").write_bytes(b"x" * 1024 * 1024)
    trouble = preflight.host_error(caught.value)
    assert isinstance(trouble, HostError) and trouble.exit_code == 5 and "disk is full" in trouble.message
    with pytest.raises(HostError, match="MiB free"):
        preflight.check_free_space(small_disk, least_mb=1)


def test_other_write_errors_stay_the_callers() -> None:
    with pytest.raises(OSError) as caught:
        Path("/nonexistent/dir/file").write_text("x")
    assert preflight.host_error(caught.value) is None


def test_a_directory_in_a_missing_parent_is_checked_at_its_nearest_ancestor(tmp_path: Path) -> None:
    preflight.check_writable_dir(tmp_path / "not" / "yet", "workdir")  # creatable: fine
    (tmp_path / "file").write_text("x")
    with pytest.raises(HostError, match="not a directory"):
        preflight.check_writable_dir(tmp_path / "file", "catalog_dir")


RACE = """
import sys
from pathlib import Path
from flakebot import preflight
base = Path(sys.argv[1])
for i in range(300):
    preflight.check_could_be_dir(base / str(i) / "work", "workdir")
    preflight.check_writable_dir(base / str(i) / "work", "workdir")
"""


def test_concurrent_flakebots_making_one_workdir_never_see_it_vanish(tmp_path: Path) -> None:
    """Four crafts started at once on a fresh home all check, then make, the same work directory: one's check must
    not remove the directory another has just made (seen as "workdir ... is not writable (File exists)")."""
    racers = [
        subprocess.Popen([sys.executable, "-c", RACE, str(tmp_path)], stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    errors = [racer.communicate(timeout=120)[1] for racer in racers]
    assert [racer.returncode for racer in racers] == [0] * 4, [e[-500:] for e in errors]
    assert not list(tmp_path.glob("*/.flakebot-probe-*")), "a probe directory was left behind"
