"""The front's metrics, in Prometheus' text exposition format (version 0.0.4): tool calls per tool and outcome (every
end: answered, refused, cancelled) and the latency of those that ran, refusals by reason, and (with a database) the
queue's jobs by state. Counted in this front's memory
since it started, as Prometheus expects of a process it scrapes; the queue's depth is read from the database at
each scrape, so every front reports the one queue.
"""

from __future__ import annotations

import re
import threading
from collections import defaultdict
from collections.abc import Mapping

BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0)  # seconds: a list answers in ms, a waited craft in minutes
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_TOOLS = 1000  # distinct tool labels kept; past it (callers name tools at will) a call counts as "other"
# a tool name as MCP shapes one; any other name a caller sends (up to the body's 4 MB, repeated in every bucket line
# of every scrape) counts as "other"
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
# how a tool call ended, the audit's words: answered (ok, or an error: its result's or a JSON-RPC error), refused
# before any work (the rate limit's 429, a quota, the token's concurrent crafts), or cancelled before its answer
OUTCOMES = ("ok", "error", "refused", "cancelled")


class Metrics:
    """Counters of one front; safe to update from the server's worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tools: set[str] = set()  # the tool labels counted so far (at most MAX_TOOLS, and "other")
        self._calls: dict[tuple[str, str], int] = defaultdict(int)
        self._buckets: dict[str, list[int]] = defaultdict(lambda: [0] * len(BUCKETS))
        self._sums: dict[str, float] = defaultdict(float)
        self._counts: dict[str, int] = defaultdict(int)
        self._refusals: dict[str, int] = defaultdict(int)

    def call(self, tool: str, outcome: str, seconds: float) -> None:
        """A tools/call that ended (`outcome`: one of OUTCOMES) after `seconds`; a refused one ran for none, and is
        counted but not timed."""
        if outcome not in OUTCOMES:  # a label's values stay the few a scraper expects
            raise ValueError(f"unknown tool call outcome {outcome!r}")
        with self._lock:
            if not TOOL_NAME.fullmatch(tool) or (tool not in self._tools and len(self._tools) >= MAX_TOOLS):
                tool = "other"
            self._tools.add(tool)
            self._calls[(tool, outcome)] += 1
            if outcome == "refused":
                return
            buckets = self._buckets[tool]
            for i, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    buckets[i] += 1
            self._sums[tool] += seconds
            self._counts[tool] += 1

    def refused(self, reason: str) -> None:
        """A call refused before its work: `reason` is rate_limit, quota, job_limit, sessions."""
        with self._lock:
            self._refusals[reason] += 1

    def render(self, depth: Mapping[str, int] | None) -> str:
        """The exposition text; `depth`: jobs per queue state (None: no database, no queue metric)."""
        lines = [
            "# HELP flakebot_tool_calls_total Tool calls, by tool and how they ended (ok, error, refused, cancelled).",
            "# TYPE flakebot_tool_calls_total counter",
        ]
        with self._lock:
            for (tool, outcome), n in sorted(self._calls.items()):
                lines.append(f'flakebot_tool_calls_total{{tool="{_label(tool)}",outcome="{outcome}"}} {n}')
            lines += [
                "# HELP flakebot_tool_call_seconds Time a tool call ran (answered or cancelled; not refused), by tool.",
                "# TYPE flakebot_tool_call_seconds histogram",
            ]
            for tool in sorted(self._counts):
                label = _label(tool)
                for bound, n in zip(BUCKETS, self._buckets[tool], strict=True):
                    lines.append(f'flakebot_tool_call_seconds_bucket{{tool="{label}",le="{bound:g}"}} {n}')
                lines.append(f'flakebot_tool_call_seconds_bucket{{tool="{label}",le="+Inf"}} {self._counts[tool]}')
                lines.append(f'flakebot_tool_call_seconds_sum{{tool="{label}"}} {self._sums[tool]:.6f}')
                lines.append(f'flakebot_tool_call_seconds_count{{tool="{label}"}} {self._counts[tool]}')
            lines += [
                "# HELP flakebot_refusals_total Calls refused before any work, by reason.",
                "# TYPE flakebot_refusals_total counter",
            ]
            for reason in sorted({"rate_limit", "quota", "job_limit", *self._refusals}):
                lines.append(f'flakebot_refusals_total{{reason="{reason}"}} {self._refusals.get(reason, 0)}')
        if depth is not None:
            lines += [
                "# HELP flakebot_queue_jobs Jobs in the team queue, by state.",
                "# TYPE flakebot_queue_jobs gauge",
            ]
            lines += [f'flakebot_queue_jobs{{state="{state}"}} {n}' for state, n in sorted(depth.items())]
        return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    """A label value escaped as the format says (a tool name is a catalog name, but never trust it)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
