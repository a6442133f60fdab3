"""Admission per token: what one principal may start now, whichever session or front it comes through.

Limits, all per token (never per session: a client that opens sessions at will must not multiply its share):
- tool calls per minute, over a sliding window of the last 60 s; a call past it is refused with the seconds until the
  oldest call in the window leaves it (what HTTP's Retry-After says);
- every other request (tools/list, tasks/get, ping, initialize...) per minute, in a window of its own that is
  OTHER_REQUESTS times as wide: an agent lists and polls freely, but no request is free of limits (a flood of
  tools/list each ran the catalog's definitions and wrote an audit line, at network speed);
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
OTHER_REQUESTS = 10  # requests other than tools/call a token may make per tool call it may make


@dataclass(frozen=True)
class Refusal:
    """A call refused: what it was refused for, and how long to wait."""

    reason: str
    retry_after: int  # whole seconds, at least 1


class Admission(Protocol):
    def admit_call(self, principal: Principal, method: str = "tools/call") -> Refusal | None:
        """Count a request of `principal` (a tool call, or another JSON-RPC method), or refuse it (nothing counted)."""
        ...

    def job_owner(self, principal: Principal, machine: Limits) -> tuple[str, Limits]:
        """The owner key long jobs of `principal` are counted under, and the caps (this machine's, its own)."""
        ...


class MemoryAdmission:
    """Admission for one front: each principal's calls of the last minute, in memory."""

    def __init__(self) -> None:
        self._calls: dict[tuple[str, bool], collections.deque[float]] = collections.defaultdict(collections.deque)
        self._lock = threading.Lock()

    def admit_call(self, principal: Principal, method: str = "tools/call") -> Refusal | None:
        now = time.monotonic()
        call = method == "tools/call"
        limit = principal.calls_per_minute * (1 if call else OTHER_REQUESTS)
        with self._lock:
            window = self._calls[principal.id, call]
            while window and window[0] <= now - WINDOW_SECONDS:
                window.popleft()
            if len(window) >= limit:
                wait = max(1, math.ceil(window[0] + WINDOW_SECONDS - now))
                what = "tool calls" if call else "requests other than tool calls"
                reason = (
                    f"token {principal.name!r} made {len(window)} {what} in the last minute "
                    f"(its limit: {limit}); wait {wait} s"
                )
                return Refusal(reason, wait)
            window.append(now)
        return None

    def job_owner(self, principal: Principal, machine: Limits) -> tuple[str, Limits]:
        owner = f"token {principal.name!r}"
        cap = principal.concurrent_crafts
        return f"token:{principal.id}", Limits(machine.machine, cap, "its concurrent crafts (token add)", owner)
