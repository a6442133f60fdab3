"""Toolchain probes remembered across processes (flakebot/probecache.py): each flakebot process below is a real one,
and each probed binary a real program that notes every time it runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flakebot import launcher, probecache
from flakebot.cargo.runner import Cargo, active_toolchain, toolchain_versions
from flakebot.homes import rustup_home
from flakebot.nix import standin
from tests.fakes.spawns import spawns

ASK_REPORT = "import sys; from pathlib import Path; from flakebot.nix import standin; print(standin.rustc_report(Path(sys.argv[1])), end='')"


def _rustc(path: Path, version: str) -> Path:
    """A program answering `-vV` as rustc does, appending a line to runs.log each time it runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = path.parent / "runs.log"
    path.write_text(f"#!/bin/sh\necho run >> {log}\nprintf 'rustc {version}\\nhost: x86_64-unknown-linux-gnu\\n'\n")
    path.chmod(0o755)
    return path


def _runs(rustc: Path) -> int:
    log = rustc.parent / "runs.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def _report_in_new_process(rustc: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", ASK_REPORT, str(rustc)], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout


def test_a_version_report_is_asked_once_across_processes_and_again_when_the_binary_changes(tmp_path: Path) -> None:
    rustc = _rustc(tmp_path / "toolchain" / "bin" / "rustc", "1.95.0")
    assert "rustc 1.95.0" in _report_in_new_process(rustc)
    assert "rustc 1.95.0" in _report_in_new_process(rustc)
    assert _runs(rustc) == 1  # the second process read the record

    before = rustc.stat()
    _rustc(rustc, "1.96.0")  # rewritten in place, same size, its time put back (cp -p, rsync -t): the ctime moves
    os.utime(rustc, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert rustc.stat().st_size == before.st_size
    assert "rustc 1.96.0" in _report_in_new_process(rustc)
    assert _runs(rustc) == 2

    replacement = _rustc(tmp_path / "new" / "rustc", "1.97.0")
    replacement.replace(rustc)  # an update replaces the file: a new inode
    assert "rustc 1.97.0" in _report_in_new_process(rustc)


def test_a_link_to_the_binary_is_keyed_by_what_it_points_at(tmp_path: Path) -> None:
    """A toolchain's `current` link moved to another version: the same path, another binary."""
    old = _rustc(tmp_path / "1.95" / "rustc", "1.95.0")
    new = _rustc(tmp_path / "1.96" / "rustc", "1.96.0")
    link = tmp_path / "current"
    link.symlink_to(old)
    assert "1.95.0" in _report_in_new_process(link)
    link.unlink()
    link.symlink_to(new)
    assert "1.96.0" in _report_in_new_process(link)


def test_a_probe_that_fails_is_not_remembered(tmp_path: Path) -> None:
    rustc = tmp_path / "rustc"
    rustc.write_text(f"#!/bin/sh\necho run >> {tmp_path / 'runs.log'}\nexit 3\n")
    rustc.chmod(0o755)
    probecache.forget()
    for _ in range(2):
        with pytest.raises(subprocess.CalledProcessError):
            standin.rustc_report(rustc)
    assert _runs(rustc) == 2
    assert not probecache.record_path().exists()


def test_an_unreadable_record_costs_a_probe_and_is_written_anew(tmp_path: Path) -> None:
    rustc = _rustc(tmp_path / "bin" / "rustc", "1.95.0")
    probecache.record_path().parent.mkdir(parents=True, exist_ok=True)
    probecache.record_path().write_text("{not json")
    assert "1.95.0" in _report_in_new_process(rustc)
    assert "1.95.0" in _report_in_new_process(rustc)
    assert _runs(rustc) == 1


def test_a_record_another_user_could_write_is_not_believed(tmp_path: Path) -> None:
    """A group- or world-writable record (or one not this user's) could name any sysroot or version: it is ignored,
    the binary asked, and the record written anew as this user's alone."""
    rustc = _rustc(tmp_path / "bin" / "rustc", "1.95.0")
    _report_in_new_process(rustc)
    probecache.record_path().chmod(0o666)
    assert "1.95.0" in _report_in_new_process(rustc)
    assert _runs(rustc) == 2
    assert probecache.record_path().stat().st_mode & 0o777 == 0o600
    assert "1.95.0" in _report_in_new_process(rustc)
    assert _runs(rustc) == 2  # the record written anew is believed


def test_without_a_pin_a_toolchain_file_above_the_directory_asked_from_is_a_new_question(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unpinned (no rustup on PATH to pin with, only its proxies), `rustc --print sysroot` answers what a
    rust-toolchain.toml in or above the directory it runs in (launcher's neutral one) says: one that appears after
    an answer was kept changes it (the real rustup and toolchains)."""
    proxy = shutil.which("rustc")
    toolchains = sorted(toolchain_versions())
    if proxy is None or len(toolchains) < 2:
        pytest.skip(f"needs rustup with two toolchains (installed: {toolchains})")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("rustc", "cargo"):
        (bin_dir / name).symlink_to(os.path.realpath(proxy))  # rustup's proxies, without rustup itself
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("RUSTUP_TOOLCHAIN", raising=False)
    monkeypatch.setenv("RUSTUP_HOME", str(rustup_home()))
    above = Path(launcher.neutral_dir()).parent  # this test's own XDG_STATE_HOME/flakebot
    active_toolchain.cache_clear()
    try:
        (above.parent / "rust-toolchain.toml").write_text(f'[toolchain]\nchannel = "{toolchains[0]}"\n')
        assert standin.rust_sysroot().name == toolchains[0]
        probecache.forget()  # as a new process: only the record
        with spawns() as started:
            assert standin.rust_sysroot().name == toolchains[0]
        assert _sysroot_asked(started) == 0
        (above / "rust-toolchain.toml").write_text(f'[toolchain]\nchannel = "{toolchains[1]}"\n')  # nearer
        probecache.forget()
        assert standin.rust_sysroot().name == toolchains[1]
    finally:
        active_toolchain.cache_clear()


def test_with_the_pin_a_toolchain_file_changes_nothing(tmp_path: Path) -> None:
    """RUSTUP_TOOLCHAIN (Cargo.env's pin) outranks toolchain files: a file naming a toolchain that is not installed
    leaves the answer rustup itself gives there."""
    pinned = standin.rust_sysroot()
    (Path(launcher.neutral_dir()) / "rust-toolchain.toml").write_text('[toolchain]\nchannel = "nightly-1999-01-01"\n')
    probecache.forget()
    assert standin.rust_sysroot() == pinned
    env = launcher.host_env(Cargo(target_dir=Path(os.devnull)).env())
    shown = launcher.run(["rustc", "--print", "sysroot"], env=env, capture_output=True, text=True, timeout=60)
    assert Path(shown.stdout.strip()) == pinned, shown.stderr


def _sysroot_asked(started: list[list[str]]) -> int:
    return sum(argv[1:] == ["--print", "sysroot"] for argv in started)


def test_the_sysroot_is_asked_again_for_rustups_settings_not_for_other_xdg_homes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`rustc --print sysroot` is remembered under what can change its answer: another XDG data or config home (each
    benchmark craft's; a user's other shell) asks nothing again; another rustup setting in the environment does."""
    first = standin.rust_sysroot()
    for name in ("XDG_DATA_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.setenv(name, f"/elsewhere/{name.lower()}")
    probecache.forget()  # as a new process: only the record
    with spawns() as started:
        assert standin.rust_sysroot() == first
    assert _sysroot_asked(started) == 0
    monkeypatch.setenv("RUSTUP_DIST_SERVER", "https://mirror.invalid")  # passed on to rustup, which may read it
    monkeypatch.setattr(launcher, "HOST_PREFIXES", (*launcher.HOST_PREFIXES, "RUSTUP_"))
    probecache.forget()
    with spawns() as started:
        assert standin.rust_sysroot() == first
    assert _sysroot_asked(started) == 1
