"""Following long work over MCP in few turns and without a silent minute: a status that waits, and a job's journal
relayed as progress.

- `status` with `wait_seconds` holds its answer until the run's status or stage changes (a change answers once it
  has settled, so a burst of short stages is one answer) or the run ends, at most MAX_WAIT_SECONDS: an agent that
  follows a craft spends a few turns on it, not one per poll.
- A long call that waits for its result follows a detached job (a process of its own session, as the calls that
  do not wait have): each line of its journal, heartbeats included, goes to the client as a progress notification.
  When the client goes away the job goes on, so no run is left `running` with no process.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

__all__ = ["MAX_WAIT_SECONDS", "JournalReader", "follow_job", "wait_seconds", "waited_status"]

MAX_WAIT_SECONDS = 50.0  # so a client's 60 s request timeout holds
SETTLE_SECONDS = 2.0  # a change answers once nothing more changed for this long
POLL_SECONDS = 0.5
ENDED = ("succeeded", "failed", "stopped", "interrupted")


def wait_seconds(args: dict[str, Any]) -> float:
    """`wait_seconds` as given (null, absent and 0 alike: no wait), bounded to 0..MAX_WAIT_SECONDS."""
    given = args.get("wait_seconds")
    try:
        seconds = float(given or 0)
    except (TypeError, ValueError):
        seconds = 0.0
    return max(0.0, min(seconds, MAX_WAIT_SECONDS))


async def waited_status(read: Callable[[], dict[str, Any]], seconds: float) -> dict[str, Any]:
    """`read()` (a run's status report) once the run ended or its status or stage changed, or `seconds` passed."""
    report = await anyio.to_thread.run_sync(read)
    deadline = time.monotonic() + seconds
    changed_at: float | None = None
    while report["status"] not in ENDED and time.monotonic() < deadline:
        if changed_at is not None and time.monotonic() - changed_at >= SETTLE_SECONDS:
            break
        await anyio.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        before, report = _where(report), await anyio.to_thread.run_sync(read)
        if _where(report) != before:
            changed_at = time.monotonic()
    return report


def _where(report: dict[str, Any]) -> tuple[Any, ...]:
    """Where a run is: its status and each stage's status."""
    return (report.get("status"), tuple((s.get("name"), s.get("status")) for s in report.get("stages", [])))


class JournalReader:
    """A job's journal read as it grows: the whole lines written since the last read."""

    def __init__(self, journal: Path) -> None:
        self.journal = journal
        self.offset = 0

    def new_lines(self) -> list[dict[str, Any]]:
        try:
            with self.journal.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        whole = data[: data.rfind(b"\n") + 1]  # a last line still being written waits for the next read
        self.offset += len(whole)
        lines = []
        for raw in whole.splitlines():
            try:
                lines.append(json.loads(raw))
            except ValueError:
                continue
        return lines


async def follow_job(
    process: subprocess.Popen[bytes], journal: Path, on_line: Callable[[dict[str, Any]], Awaitable[None]]
) -> dict[str, Any] | None:
    """Relay a detached job's journal lines to `on_line` until its result ({result} or {error}), which is returned;
    None when the process ended without one."""
    reader = JournalReader(journal)
    while True:
        ended = process.poll() is not None  # before reading: a job that ended wrote its last line already
        for line in reader.new_lines():
            if "result" in line or "error" in line:
                return line
            await on_line(line)
        if ended:
            return None
        await anyio.sleep(0.1)
