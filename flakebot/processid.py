"""A process's identity: its pid plus its start time, so a pid the kernel handed to someone else is never taken for it.

A pid alone is not an identity: once a process ends the kernel may give its number to any process or kernel thread.
Whatever flakebot records to find a process again (a long MCP job, a run's owner, a service's supervisor and the
service itself) keeps the pid with the start time of /proc/PID/stat (field 22, clock ticks since boot), and whatever
signals a recorded process checks both first (`signal_if`).
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PF_KTHREAD = 0x00200000  # /proc/PID/stat flags (field 9): a kernel thread is never one of ours


def start_time(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat field 22); None if there is no such
    process, or it is a kernel thread."""
    fields = _stat_fields(pid)
    if fields is None or int(fields[6]) & PF_KTHREAD:
        return None
    return int(fields[19])


def is_running(pid: Any, started: Any) -> bool:
    """Whether `pid` is still the process that started at `started` (start_time's ticks) and has not ended."""
    if not isinstance(pid, int) or not isinstance(started, int) or pid <= 0:
        return False
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X") and start_time(pid) == started


def signal_if(pid: Any, started: Any, signum: int) -> bool:
    """Send `signum` to `pid` only while it is the process that started at `started`; whether it was sent. A
    recorded pid without its start time is never signalled (it may be anyone's by now). The signal goes through a
    pidfd opened before the last check, so no process that took the number between the check and the signal gets
    it (a plain kill(pid) after a check leaves that window open)."""
    if not is_running(pid, started):
        if isinstance(pid, int) and pid > 0 and started is None:
            logger.info("pid %d was recorded without its start time: not signalled", pid)
        return False
    try:
        handle = os.pidfd_open(pid)  # names this process from here on, whatever later takes its number
    except ProcessLookupError:
        return False
    try:
        if not is_running(pid, started):  # checked again with the process held: ended (maybe reused) in between
            return False
        signal.pidfd_send_signal(handle, signum)
    except ProcessLookupError:
        return False
    finally:
        os.close(handle)
    return True


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on: the command name before it may hold spaces and parentheses."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields if len(fields) > 19 else None


__all__ = ["is_running", "signal_if", "start_time"]
