"""Where pipeline events go: JSON lines for programs, the live table for people (cli/livetable.py, imported only
when drawn: rich costs a JSON craft, an agent's, 20 ms of start-up), or nowhere with -q."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from flakebot.cli.jsonout import json_line as json_line  # re-exported: the commands print JSON through live
from flakebot.cli.jsonout import json_result as json_result
from flakebot.events import Event, EventSink, tracking
from flakebot.pipeline.heartbeat import Heartbeat

if TYPE_CHECKING:
    from flakebot.cli.livetable import LiveStages

STATUS_STYLE = {
    "pending": ("·", "dim"),
    "running": ("▶", "bold cyan"),
    "finished": ("✔", "green"),
    "skipped": ("↷", "dim green"),
    "failed": ("✘", "bold red"),
}

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class JsonEvents:
    """An EventSink printing each event as a JSON line."""

    def __call__(self, event: Event) -> None:
        json_line(event.to_dict())

    def __enter__(self) -> JsonEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class Quiet:
    """An EventSink for -q: no progress at all (errors and the result still print)."""

    def __call__(self, event: Event) -> None:
        return None

    def __enter__(self) -> Quiet:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@contextmanager
def event_sink(as_json: bool, title: str = "", quiet: bool = False) -> Iterator[EventSink]:
    """Where a command's run events go (JSON lines, the live table, or nowhere with -q), with a heartbeat while a
    step is long."""
    shown: JsonEvents | LiveStages | Quiet
    if as_json or quiet:
        shown = JsonEvents() if as_json else Quiet()
    else:
        from flakebot.cli.livetable import LiveStages

        shown = LiveStages(title)
    with shown, tracking() as activity, Heartbeat(shown, activity) as sink:
        if not isinstance(shown, JsonEvents | Quiet):
            shown.activity = activity  # the table says what the run waits on
        yield sink


def age(seconds_ago: float) -> str:
    """A short human age: 42s, 5m, 3h, 2d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds_ago >= size:
            return f"{int(seconds_ago // size)}{unit}"
    return f"{int(seconds_ago)}s"
