"""JSON for programs: one object per line on stdout (no rich: fast commands print it too)."""

from __future__ import annotations

import json
import sys
from typing import Any


def json_line(payload: dict[str, Any]) -> None:
    """One JSON object on one line of stdout."""
    sys.stdout.write(json.dumps(payload, default=str) + "\n")
    sys.stdout.flush()


def json_result(result: Any) -> None:
    """The one result object every --json command prints last (a failure prints an error object instead)."""
    json_line({"result": result})
