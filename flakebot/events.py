"""Events a pipeline emits; the CLI renders them (rich) or prints them as JSON lines.

Kinds, in the order a run emits them: run_started, stage_started | stage_skipped, progress (any number),
stage_finished | stage_failed, and last run_finished | run_failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Event", "EventSink", "ignore"]


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
