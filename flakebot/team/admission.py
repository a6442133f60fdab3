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

`Admission` is the seam: `MemoryAdmission` holds the windows of one front in memory; `SharedAdmission` (fronts with
a team database) counts calls per minute in PostgreSQL, so several fronts count a token's calls together.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from flakebot.errors import FlakebotError
from flakebot.pipeline.jobs import Limits
from flakebot.team.frontqueue import FrontQueue
from flakebot.team.idtokens import concurrent_crafts_set_by
from flakebot.team.tokens import Principal

logger = logging.getLogger(__name__)

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


def prune_windows(windows: dict[Any, collections.deque[float]], now: float) -> None:
    """Drop the windows whose last call left the minute: a principal seen once (JWT subjects are unbounded) would
    otherwise keep its entry for the front's life."""
    for key in [key for key, window in windows.items() if not window or window[-1] <= now - WINDOW_SECONDS]:
        del windows[key]


class MemoryAdmission:
    """Admission for one front: each principal's calls of the last minute, in memory (a principal's entry dropped
    once a minute passed without its calls: prune_windows, at most once a minute)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._calls: dict[tuple[str, bool], collections.deque[float]] = collections.defaultdict(collections.deque)
        self._lock = threading.Lock()
        self._clock = clock
        self._pruned = clock()

    def admit_call(self, principal: Principal, method: str = "tools/call") -> Refusal | None:
        now = self._clock()
        call = method == "tools/call"
        limit = principal.calls_per_minute * (1 if call else OTHER_REQUESTS)
        with self._lock:
            if now - self._pruned >= WINDOW_SECONDS:
                prune_windows(self._calls, now)
                self._pruned = now
            window = self._calls[principal.id, call]
            while window and window[0] <= now - WINDOW_SECONDS:
                window.popleft()
            if len(window) >= limit:
                wait = max(1, math.ceil(window[0] + WINDOW_SECONDS - now))
                return refusal(principal, len(window), wait, call=call)
            window.append(now)
        return None

    def job_owner(self, principal: Principal, machine: Limits) -> tuple[str, Limits]:
        owner = f"token {principal.name!r}"
        cap = principal.concurrent_crafts
        given = f"its concurrent crafts ({concurrent_crafts_set_by(principal.id)})"
        return f"token:{principal.id}", Limits(machine.machine, cap, given, owner)


def refusal(principal: Principal, calls: int, wait: float, *, call: bool = True) -> Refusal:
    """The refusal of a request past its token's window: tool calls against its calls per minute, other requests
    against OTHER_REQUESTS times that."""
    seconds = max(1, math.ceil(wait))
    what = "tool calls" if call else "requests other than tool calls"
    limit = principal.calls_per_minute * (1 if call else OTHER_REQUESTS)
    reason = f"token {principal.name!r} made {calls} {what} in the last minute (its limit: {limit}); wait {seconds} s"
    return Refusal(reason, seconds)


class SharedAdmission(MemoryAdmission):
    """Admission for fronts sharing a team database: a token's calls per minute counted there, so every front counts
    them together. If the database does not answer, this front counts alone (in memory) until it does: a call is
    never refused, nor let through uncounted, for the database's sake."""

    def __init__(self, queue: FrontQueue, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self.queue = queue

    def admit_call(self, principal: Principal, method: str = "tools/call") -> Refusal | None:
        if method != "tools/call":  # the wider window of other requests: this front's own count
            return super().admit_call(principal, method)
        try:
            refused = self.queue.admit_call(principal.id, principal.calls_per_minute, WINDOW_SECONDS)
        except FlakebotError as exc:
            logger.warning("calls of %s counted by this front alone: %s", principal.name, exc.one_line())
            return super().admit_call(principal)
        return refusal(principal, *refused) if refused is not None else None
