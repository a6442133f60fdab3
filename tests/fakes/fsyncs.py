"""The files a process fsyncs, recorded while the real fsync still runs."""

from __future__ import annotations

import os

import pytest


def recorded_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """From now on, the path of each descriptor os.fsync is given, in order (the real fsync runs after)."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced
