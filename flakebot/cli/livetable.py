"""The live table people see while a run works: one row per stage with its status, elapsed time and latest note."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from flakebot.cli.consoles import console
from flakebot.cli.live import SPINNER, STATUS_STYLE
from flakebot.events import Activity, Event
from flakebot.modeltext import one_line


class LiveStages:
    """An EventSink drawing a live table: one row per stage with status, elapsed time and latest progress."""

    def __init__(self, title: str = "") -> None:
        self.title = title
        self.rows: dict[str, dict[str, Any]] = {}
        # get_renderable: every refresh draws anew, so a running stage's clock and spinner tick between events
        self.live = Live(console=console(), refresh_per_second=4, transient=False, get_renderable=self._render)
        self.started = False
        self.activity: Activity | None = None  # what the run waits on now (the model's reply): the running row says so

    def __enter__(self) -> LiveStages:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started:
            self.live.refresh()
            self.live.__exit__(None, None, None)
            console().print()

    def __call__(self, event: Event) -> None:
        if event.kind == "heartbeat" and not self.started:
            return
        if not self.started:  # draw nothing until the run really starts, so early errors stay one line
            self.started = True
            self.live.__enter__()
        if event.kind == "run_started":
            for name in event.data.get("stages", []):
                self.rows.setdefault(name, {"status": "pending", "note": ""})
        elif event.stage:
            row = self.rows.setdefault(event.stage, {"status": "pending", "note": ""})
            self._update(row, event)
        self.live.refresh()

    def _update(self, row: dict[str, Any], event: Event) -> None:
        if event.kind == "stage_started":
            row.update(status="running", started=event.time, note="")
        elif event.kind == "stage_skipped":
            row.update(status="skipped", note=event.message)
        elif event.kind in ("progress", "heartbeat"):
            row["note"] = event.message
        elif event.kind == "stage_finished":
            row.update(status="finished", seconds=event.data.get("seconds"))
        elif event.kind == "stage_failed":
            row.update(status="failed", note=event.message, seconds=time.time() - row.get("started", event.time))

    def _render(self) -> Group:
        table = Table.grid(padding=(0, 2))
        for name, row in self.rows.items():
            mark, style = STATUS_STYLE[row["status"]]
            seconds = row.get("seconds")
            if seconds is None and row["status"] == "running":
                seconds = time.time() - row["started"]
                mark = SPINNER[int(seconds * 4) % len(SPINNER)]
            elapsed = f"{seconds:6.1f}s" if seconds is not None else " " * 7
            note = self._waiting() if row["status"] == "running" else None
            table.add_row(
                Text(mark, style=style),
                Text(name, style=style),
                Text(elapsed, style="dim"),
                Text(note or one_line(row["note"], 100)),  # notes quote model text (a spec's summary)
            )
        parts: list[Any] = [Text(self.title, style="bold")] if self.title else []
        return Group(*parts, table)

    def _waiting(self) -> str | None:
        """What the run waits on, from the moment it starts waiting, ticking each second: "waiting on the model's
        reply (groq/...) (12 s)" (a heartbeat event comes only after HEARTBEAT_SECONDS of silence)."""
        waiting = self.activity.current() if self.activity is not None else None
        if waiting is None:
            return None
        return f"waiting on {one_line(waiting.what, 80)} ({time.monotonic() - waiting.since:.0f} s)"
