"""A process tree's own cgroup (flakebot/sandbox/cgroup.py) on this host's real cgroup files: real processes put in
it, bounded by it together, killed and removed with it."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flakebot.sandbox import cgroup
from flakebot.sandbox.cgroup import Group

MIB = 1024 * 1024


@pytest.fixture
def group() -> Iterator[Group]:
    made = Group.create(f"flakebot-test-{secrets.token_hex(4)}", memory_bytes=32 * MIB, max_processes=16)
    if made is None:
        pytest.fail("this host offers a writable cgroup (v1 memory + pids): the service envelope relies on it")
    yield made
    made.remove()


def test_processes_in_the_group_are_bounded_together_and_go_with_it(group: Group) -> None:
    hog = subprocess.run(
        [sys.executable, "-c", "x = bytearray(64 * 1024 * 1024); x[::4096] = b'1' * len(x[::4096])"],
        preexec_fn=group.enter,
        capture_output=True,
    )
    assert hog.returncode == -9 and group.oom_kills() >= 1  # one process past the group's 32 MiB: the OOM killer
    assert 0 < group.peak_bytes() <= 32 * MIB
    forks = subprocess.run(
        ["sh", "-c", "for i in $(seq 40); do sleep 30 >/dev/null 2>&1 & done"],
        preexec_fn=group.enter,
        capture_output=True,
        text=True,
    )
    assert "fork" in forks.stderr.lower() or "resource" in forks.stderr.lower(), forks.stderr
    assert 0 < len(group.pids()) <= 16  # the sleeps that did start, in the group
    group.remove()
    assert group.pids() == [] and not any(path.exists() for path in group.paths)


def test_an_empty_group_left_by_a_killed_owner_is_swept(monkeypatch: pytest.MonkeyPatch, group: Group) -> None:
    monkeypatch.setattr(cgroup, "SWEEP_AGE", -1.0)  # any age: the sweep's rule is its emptiness
    busy = subprocess.Popen(["sleep", "30"], preexec_fn=group.enter)
    try:
        left = Group.create(f"flakebot-test-{secrets.token_hex(4)}", memory_bytes=32 * MIB, max_processes=16)
        assert left is not None
        again = Group.create(f"flakebot-test-{secrets.token_hex(4)}", memory_bytes=32 * MIB, max_processes=16)
        assert again is not None
        assert not any(path.exists() for path in left.paths)  # empty: swept
        assert all(path.exists() for path in group.paths)  # a member: kept
        again.remove()
    finally:
        busy.kill()
        busy.wait()


def test_a_recorded_group_is_trusted_only_as_a_flakebot_cgroup() -> None:
    assert Group.from_dict({"kind": "v1", "paths": ["/sys/fs/cgroup/memory/flakebot-kv-1"]}) is not None
    for paths in (["/etc/flakebot-x"], ["/sys/fs/cgroup/memory/other"], ["/sys/fs/cgroup/memory/../flakebot-x/.."]):
        assert Group.from_dict({"kind": "v1", "paths": paths}) is None
    assert Group.from_dict({"kind": "v3", "paths": ["/sys/fs/cgroup/memory/flakebot-x"]}) is None
    assert Path("/sys/fs/cgroup").is_dir()


def test_tmpfs_pages_a_member_writes_count_against_the_group(group: Group) -> None:
    """A service's /tmp is a tmpfs: what it writes there is memory, held to the same bound."""
    target = Path("/dev/shm") / f"flakebot-test-{secrets.token_hex(4)}"
    try:
        done = subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", "count=64"], preexec_fn=group.enter,
                              capture_output=True)  # fmt: skip
        assert done.returncode != 0 and target.stat().st_size <= 32 * MIB
    finally:
        target.unlink(missing_ok=True)
