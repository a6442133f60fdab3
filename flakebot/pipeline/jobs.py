"""How many long MCP jobs may run at once, and whether a recorded job is still the process it was.

A job is long work an MCP caller starts (craft, improve, package, resume): detached in a process of its own session,
or in the server's worker thread when the caller waits for it. While it runs it has a record beside its journal,
mcp-jobs/ID.job.json: the tool, the MCP session that started it, and the process doing the work as its pid plus
that process's start time (/proc/PID/stat field 22). A pid alone is not an identity: once the job ends the kernel
may give the number to any process or kernel thread, and a record trusting it would read as running forever.

Admission counts the records whose process is still theirs and whose journal (ID.jsonl, when the job has one) does
not end with its result or error yet: a process that wrote its result may take a while to exit, and its caller
already has what it asked for. Finished records are removed. The count is taken under a lock so two servers
cannot both take the last slot: at most `max_jobs` jobs on this machine (this user's state directory) and
`max_session_jobs` per MCP session. A call past either is refused with one line naming the jobs that hold the
slots, before anything is written. There is no queue on purpose: a queued job would be either a waiting process
(the pile-up the cap exists to stop) or a promise held by a server that clients end at will (LangChain's adapters
start and kill one per call), and a queued craft would have no run for `status` to follow. A refusal leaves
nothing behind and costs the caller one retry.

Admission also clears what ended long ago: a job's files (journal, log, task record, the team front's owner record) untouched for KEEP_DAYS are
removed, so mcp-jobs/ does not grow forever (a task's ttl is at most 30 days, so its record has expired by then).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.errors import ConfigError, HostError
from flakebot.fsutil import atomic_write_json
from flakebot.processid import is_running, start_time

logger = logging.getLogger(__name__)

RECORD = ".job.json"
LOCK = ".admission.lock"
KEEP_DAYS = 31


class JobLimit(HostError):
    """A long call refused: as many jobs as max_jobs (or max_session_jobs) are running already."""


# ------------------------------------------------------------ admission


@dataclass(frozen=True)
class Limits:
    """The caps admission enforces, from the settings: on this machine, and per owner (an MCP session; in team mode
    a token, whose cap and words team.admission gives)."""

    machine: int
    session: int
    session_key: str = "max_session_jobs"  # what the refusal tells the caller to raise
    owner: str = "this MCP session"

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(int(bounded(settings, "max_jobs", 1, 256)), int(bounded(settings, "max_session_jobs", 1, 256)))


def bounded(settings: Settings, key: str, low: float, high: float) -> float:
    """A numeric setting, checked against its bounds when it is used (a value outside them is a ConfigError)."""
    value: float = settings.get(key)
    if not low <= value <= high:
        raise ConfigError(f"'{key}' must be between {low:g} and {high:g}, got {value:g}", fix=f"set {key} within them")
    return value


class Admission:
    """A slot taken under the admission lock: `record` writes the job's record once its process exists."""

    def __init__(self, directory: Path, tool: str, session: str) -> None:
        self.directory, self.tool, self.session = directory, tool, session

    def record(self, job_id: str, pid: int) -> Path:
        started = start_time(pid)
        path = self.directory / f"{job_id}{RECORD}"
        record = {"format": 1, "tool": self.tool, "pid": pid, "start_time": started, "session": self.session}
        atomic_write_json(path, {**record, "created": time.time()})
        return path


@contextmanager
def admission(directory: Path, tool: str, session: str, limits: Limits) -> Iterator[Admission]:
    """Hold the admission lock while a job starts; refuse (JobLimit, nothing written) when a cap is reached."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        running = live_records(directory)
        _clear_old(directory, {r["id"] for r in running})
        mine = [r for r in running if r.get("session") == session]
        if len(mine) >= limits.session:
            raise _refused(tool, mine, limits.session, limits.session_key, limits.owner)
        if len(running) >= limits.machine:
            raise _refused(tool, running, limits.machine, "max_jobs", "this machine")
        yield Admission(directory, tool, session)


@contextmanager
def held(directory: Path, job_id: str, tool: str, session: str, limits: Limits) -> Iterator[None]:
    """A slot for work this process does itself (a long call the caller waits for), released when it returns."""
    with admission(directory, tool, session, limits) as admitted:
        path = admitted.record(job_id, os.getpid())
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def live_records(directory: Path) -> list[dict[str, Any]]:
    """The records of jobs still running; a record whose process ended (or whose pid is another's now) goes."""
    live = []
    for path in directory.glob(f"*{RECORD}"):
        record, job_id = _read(path), path.name.removesuffix(RECORD)
        if record is not None and is_running(record.get("pid"), record.get("start_time")) and not _done(path, job_id):
            live.append({**record, "id": job_id})
        else:
            path.unlink(missing_ok=True)
    return sorted(live, key=lambda r: float(r.get("created", 0)))


def _done(record: Path, job_id: str) -> bool:
    """Whether the job's journal ends with its result or error (mcp.server.run_job writes it last)."""
    try:
        last = record.with_name(f"{job_id}.jsonl").read_text().splitlines()[-1:]
        line = json.loads(last[0]) if last else {}
    except (OSError, ValueError):  # no journal (a waited call's slot), or its last line half written
        return False
    return isinstance(line, dict) and ("result" in line or "error" in line)


def _clear_old(directory: Path, running: set[str]) -> None:
    """Remove the files of jobs that ended and were not touched for KEEP_DAYS."""
    cutoff = time.time() - KEEP_DAYS * 86400
    for journal in directory.glob("*.jsonl"):
        job_id = journal.name.removesuffix(".jsonl")
        files = [
            journal,
            journal.with_suffix(".log"),
            directory / f"{job_id}.task.json",
            directory / f"{job_id}.owner.json",
        ]
        try:
            newest = max(path.stat().st_mtime for path in files if path.exists())
        except (OSError, ValueError):  # removed meanwhile
            continue
        if job_id not in running and newest < cutoff:
            for path in files:
                path.unlink(missing_ok=True)
            logger.info("removed the files of job %s (ended over %d days ago)", job_id, KEEP_DAYS)


def _refused(tool: str, running: list[dict[str, Any]], cap: int, key: str, where: str) -> JobLimit:
    held_by = ", ".join(f"{r.get('tool')} {r['id']}" for r in running[:4]) + (" ..." if len(running) > 4 else "")
    logger.warning("refused a %s: %d jobs run on %s (%s %d)", tool, len(running), where, key, cap)
    return JobLimit(
        f"{tool} not started: {len(running)} jobs are running on {where} ({key} = {cap}: {held_by})",
        fix=f"wait for one to finish (follow it with status or tasks/get) and call again, or raise {key}",
        running=[r["id"] for r in running],
    )


def _read(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
