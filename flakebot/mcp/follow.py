"""Following long work over MCP without a silent minute: a job's journal relayed as progress.

- A long call that waits for its result follows a detached job (a process of its own session, as the calls that
  do not wait have): each line of its journal, heartbeats included, goes to the client as a progress notification.
  When the client goes away the job goes on, so no run is left `running` with no process.
- `status` with `wait_seconds` holds its answer until the run moves on (flakebot.commands.runs.status, a blocking
  wait the MCP door runs in a worker thread), at most MAX_WAIT_SECONDS: an agent that follows a craft spends a few
  turns on it, not one per poll.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from flakebot.commands.runs import MAX_WAIT_SECONDS

__all__ = ["MAX_WAIT_SECONDS", "JournalReader", "follow_job"]


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
