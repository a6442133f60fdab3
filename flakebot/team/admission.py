"""Admission per token: what one principal may start now, whichever session or front it comes through.

Two limits, both per token (never per session: a client that opens sessions at will must not multiply its share):
- tool calls per minute, over a sliding window of the last 60 s; a call past it is refused with the seconds until the
  oldest call in the window leaves it (what HTTP's Retry-After says);
- concurrent long jobs (craft, improve, package, resume, service_up): pipeline.jobs counts their records per owner
  under its lock, so here a token only names its owner key and its cap (jobs of one token across sessions, and
  across fronts sharing the workdir, count together).

`Admission` is the seam: `MemoryAdmission` holds the windows of one front in memory; a version shared by several
fronts (PostgreSQL) implements the same two methods.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from flakebot.pipeline.jobs import Limits
from flakebot.team.tokens import Principal

WINDOW_SECONDS = 60.0


@dataclass(frozen=True)
class Refusal:
    """A call refused: what it was refused for, and how long to wait."""

    reason: str
    retry_after: int  # whole seconds, at least 1


class Admission(Protocol):
    def admit_call(self, principal: Principal) -> Refusal | None:
        """Count a tool call of `principal`, or refuse it (nothing counted)."""
        ...

    def job_owner(self, principal: Principal, machine: Limits) -> tuple[str, Limits]:
        """The owner key long jobs of `principal` are counted under, and the caps (this machine's, its own)."""
        ...


class MemoryAdmission:
    """Admission for one front: each principal's calls of the last minute, in memory."""

    def __init__(self) -> None:
        self._calls: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
        self._lock = threading.Lock()

    def admit_call(self, principal: Principal) -> Refusal | None:
        now = time.monotonic()
        with self._lock:
            window = self._calls[principal.id]
            while window and window[0] <= now - WINDOW_SECONDS:
                window.popleft()
            if len(window) >= principal.calls_per_minute:
                wait = max(1, math.ceil(window[0] + WINDOW_SECONDS - now))
                reason = (
                    f"token {principal.name!r} made {len(window)} tool calls in the last minute "
                    f"(its limit: {principal.calls_per_minute}); wait {wait} s"
                )
                return Refusal(reason, wait)
            window.append(now)
        return None

    def job_owner(self, principal: Principal, machine: Limits) -> tuple[str, Limits]:
        owner = f"token {principal.name!r}"
        cap = principal.concurrent_crafts
        return f"token:{principal.id}", Limits(machine.machine, cap, "its concurrent crafts (token add)", owner)
