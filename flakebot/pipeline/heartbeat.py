"""Heartbeats: an event at least every HEARTBEAT_SECONDS while a run goes on, saying what it waits on.

A run's own events come at stage and iteration boundaries, minutes apart when one step is long (a model reply, a
cold `nix build`). A client that resets its request timeout on each progress notification (opencode, the TypeScript
SDK's resetTimeoutOnProgress, the Python SDK's read timeout) then gives up in the middle of a healthy run. So every
door that follows a run (the CLI's --json lines, MCP progress, a detached job's journal) wraps its sink here: a thread
sends a `heartbeat` event whenever nothing was sent for `interval` seconds, naming what the run waits on
(flakebot.events.waiting_on) and for how long. Heartbeats are not written to the run's events.jsonl.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from flakebot.events import Activity, Event, EventSink, tracking

__all__ = ["HEARTBEAT_SECONDS", "Heartbeat", "beating", "with_heartbeat"]

HEARTBEAT_SECONDS = 10.0  # well under the 60 s request timeout most clients have
T = TypeVar("T")


def with_heartbeat(work: Callable[[EventSink], T], sink: EventSink, interval: float = HEARTBEAT_SECONDS) -> T:
    """`work(sink')` where sink' is `sink` plus a heartbeat while the work runs (in this thread)."""
    with beating(sink, interval) as beat:
        return work(beat)


@contextmanager
def beating(sink: EventSink, interval: float = HEARTBEAT_SECONDS) -> Iterator[EventSink]:
    """`sink` plus a heartbeat, for the work done inside the block (in this thread)."""
    with tracking() as activity, Heartbeat(sink, activity, interval) as beat:
        yield beat


class Heartbeat:
    """An EventSink passing events on (serialized, as the heartbeat's thread sends too) and beating in between."""

    def __init__(self, sink: EventSink, activity: Activity, interval: float = HEARTBEAT_SECONDS) -> None:
        self.sink = sink
        self.activity = activity
        self.interval = interval
        self.run_id = ""
        self.stage: str | None = None
        self.stage_since = time.monotonic()
        self.last_sent = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="flakebot-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.run_id = event.run_id or self.run_id
            if event.kind == "stage_started":
                self.stage, self.stage_since = event.stage, time.monotonic()
            elif event.kind in ("stage_finished", "stage_failed", "stage_skipped"):
                self.stage = None
            self._send(event)

    def _send(self, event: Event) -> None:
        self.sink(event)
        self.last_sent = time.monotonic()

    def _beat(self) -> None:
        while not self._stop.wait(max(0.2, self.last_sent + self.interval - time.monotonic())):
            with self._lock:
                if time.monotonic() - self.last_sent >= self.interval:
                    self._send(self.beat())

    def beat(self) -> Event:
        """The heartbeat event for now: what the run waits on and for how long."""
        now = time.monotonic()
        waiting = self.activity.current()
        data: dict[str, object] = {"interval": self.interval}
        if self.stage is not None:
            data["stage_seconds"] = round(now - self.stage_since, 1)
        if waiting is not None:
            data.update(waiting_on=waiting.what, waiting_seconds=round(now - waiting.since, 1))
            message = f"waiting on {waiting.what} for {now - waiting.since:.0f}s"
        else:
            message = "working"
        if self.stage is not None:
            message += f" ({self.stage} running for {now - self.stage_since:.0f}s)"
        return Event("heartbeat", self.run_id, self.stage, message, data)
