"""Events a pipeline emits; the CLI renders them (rich) or prints them as JSON lines.

Kinds, in the order a run emits them: run_started, stage_started | stage_skipped, progress (any number),
stage_finished | stage_failed, and last run_finished | run_failed. A door that follows a run adds `heartbeat` events
in between while a step is long (flakebot.pipeline.heartbeat; never in the run's events.jsonl).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Activity", "Event", "EventSink", "Waiting", "ignore", "tracking", "waiting_on"]


@dataclass
class Event:
    """One thing that happened in a run."""

    kind: str
    run_id: str
    stage: str | None = None
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.kind, **{k: v for k, v in asdict(self).items() if k != "kind"}}


EventSink = Callable[[Event], None]  # where a run's events go: the CLI's live display, JSON lines, an MCP progress


def ignore(_event: Event) -> None:
    """An EventSink that drops everything."""


# ------------------------------------------------------------------ what a run is waiting on, for heartbeats
# A step that may take long (the model's reply, cargo test, nix build) says so with `with waiting_on("..."):`. Outside
# a run followed by a heartbeat (flakebot.pipeline.heartbeat) that is a no-op; inside one, the heartbeat's thread reads
# it to say what flakebot waits on and for how long. The tracker travels in a context variable, so runs in one
# process (the MCP server's worker threads) each see their own.


@dataclass(frozen=True)
class Waiting:
    """One step being waited on: what, and since when (time.monotonic)."""

    what: str
    since: float


class Activity:
    """The steps a run is waiting on, innermost last; read from the heartbeat's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stack: list[Waiting] = []

    def push(self, what: str) -> Waiting:
        step = Waiting(what, time.monotonic())
        with self._lock:
            self._stack.append(step)
        return step

    def pop(self, step: Waiting) -> None:
        with self._lock:
            if step in self._stack:
                self._stack.remove(step)

    def current(self) -> Waiting | None:
        """The innermost step waited on, if any."""
        with self._lock:
            return self._stack[-1] if self._stack else None


_current: ContextVar[Activity | None] = ContextVar("flakebot_activity", default=None)


@contextmanager
def tracking() -> Iterator[Activity]:
    """Track what the code run inside waits on (in this thread and the context it is copied to)."""
    activity = Activity()
    token = _current.set(activity)
    try:
        yield activity
    finally:
        _current.reset(token)


@contextmanager
def waiting_on(what: str) -> Iterator[None]:
    """Mark the code inside as a wait on `what` (a few words: "the model's reply", "cargo test", "nix build")."""
    activity = _current.get()
    if activity is None:
        yield
        return
    step = activity.push(what)
    try:
        yield
    finally:
        activity.pop(step)
