"""Run.checkpoint: state.json saved at every edit-loop step, its fsync on a thread of its own, never landing after a
later save, and never making a removed run's directory again."""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from flakebot import fsutil
from flakebot.pipeline import checkpoint as checkpoints
from flakebot.pipeline.run import Run


@pytest.fixture
def run(tmp_path: Path) -> Run:
    return Run.create(tmp_path / "work", "craft")


def held_writes(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[tuple[str, dict[str, Any]]]]:
    """From now on, each write of state.json on the checkpoint thread sets the event returned, then waits until
    flush() is called; the list gets (thread name, the state written) of every write, in order."""
    holding, release, written = threading.Event(), threading.Event(), list[tuple[str, dict[str, Any]]]()
    real_write, real_flush = fsutil.atomic_write_text, checkpoints.LatestWrite.flush

    def write(path: Path, text: str, **kwargs: Any) -> None:
        if threading.current_thread().name == "checkpoint":
            holding.set()
            release.wait()
        written.append((threading.current_thread().name, json.loads(text)))
        real_write(path, text, **kwargs)

    def flush(self: checkpoints.LatestWrite) -> None:
        release.set()
        real_flush(self)

    monkeypatch.setattr(fsutil, "atomic_write_text", write)
    monkeypatch.setattr(checkpoints, "atomic_write_text", write)
    monkeypatch.setattr(checkpoints.LatestWrite, "flush", flush)
    return holding, written


def state_on_disk(run: Run) -> dict[str, Any]:
    return dict(json.loads((run.dir / "state.json").read_text()))


def test_a_checkpoint_is_synced_on_its_own_thread_and_reaches_the_file(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[tuple[str, str]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append((threading.current_thread().name, os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    run.state["usage"] = {"total_tokens": 960}
    run.checkpoint()
    checkpoints.flush(run.dir / "state.json")
    assert state_on_disk(run)["usage"] == {"total_tokens": 960}
    assert [name for name, path in synced if ".state.json." in path] == ["checkpoint"], synced


def test_a_save_after_a_checkpoint_is_never_overwritten_by_it(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint's write is held until the save asks for it: the save waits, then writes the newer state."""
    _holding, written = held_writes(monkeypatch)
    run.state["usage"] = {"total_tokens": 1}
    run.checkpoint()
    run.state["usage"] = {"total_tokens": 2}
    run.save()
    assert [(name, state["usage"]["total_tokens"]) for name, state in written] == [
        ("checkpoint", 1),
        ("MainThread", 2),
    ]
    assert state_on_disk(run)["usage"] == {"total_tokens": 2}
    assert Run.load(run.dir.parent.parent, run.id).state["usage"] == {"total_tokens": 2}


def test_only_the_latest_checkpoint_waiting_is_written(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    holding, written = held_writes(monkeypatch)
    for tokens in (1, 2, 3):
        run.state["usage"] = {"total_tokens": tokens}
        run.checkpoint()
        assert holding.wait(5)  # the first is being written: the next two wait, and the third replaces the second
    checkpoints.flush(run.dir / "state.json")
    assert [state["usage"]["total_tokens"] for _name, state in written] == [1, 3]
    assert state_on_disk(run)["usage"] == {"total_tokens": 3}


def test_loading_a_run_reads_its_last_checkpoint(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    held_writes(monkeypatch)
    run.state["usage"] = {"total_tokens": 7}
    run.checkpoint()
    assert Run.load(run.dir.parent.parent, run.id).state["usage"] == {"total_tokens": 7}


def test_a_checkpoint_never_makes_a_removed_run_again(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """`flakebot clean` removed the run while its checkpoint waited: the directory stays gone."""
    held_writes(monkeypatch)
    run.checkpoint()
    shutil.rmtree(run.dir)
    checkpoints.flush(run.dir / "state.json")
    assert not run.dir.exists()


def test_a_checkpoint_that_could_not_be_written_is_raised_by_the_next_save(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(path: Path, text: str, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoints, "atomic_write_text", full)
    run.checkpoint()
    with pytest.raises(OSError, match="No space left"):
        run.save()
    run.save()  # raised once: the disk has room again, the state is written
    assert state_on_disk(run)["id"] == run.id


def test_a_checkpoint_whose_thread_cannot_start_is_written_at_once_and_wedges_nothing(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No thread to be had (another run's fork bomb at the uid's process limit, memory): the checkpoint is written by
    the caller, as before the thread; before, the writer stayed busy with no thread to end it, so the next save (and
    Run.load) waited forever."""

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    run.state["usage"] = {"total_tokens": 5}
    run.checkpoint()
    assert state_on_disk(run)["usage"] == {"total_tokens": 5}
    writer = checkpoints._WRITERS.get((run.dir / "state.json").absolute())
    assert writer is None or not writer.busy  # checked before any flush: on the old code a flush never returns
    run.state["usage"] = {"total_tokens": 6}
    run.save()
    assert state_on_disk(run)["usage"] == {"total_tokens": 6}
