"""Sandbox escape attempts (benchmarks.scenarios.escape_cases) under bubblewrap, the same attempts in a plain process for
contrast, and hostile model sessions through the real pipeline (benchmarks.scenarios.hostile)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.scenarios.escape_cases import run_escape_cases
from benchmarks.scenarios.hostile import CASES as HOSTILE_CASES
from benchmarks.scenarios.hostile import run_hostile
from flakebot.sandbox import Sandbox, open_sandbox

SANDBOXES = {"bubblewrap": "required", "plain process": "off"}


def run(root: Path, names: list[str] | None = None) -> list[dict[str, Any]]:
    """Every case (or those named) in each sandbox, then the hostile sessions (or those named); one row each."""
    rows = []
    for label, mode in SANDBOXES.items():
        results = run_escape_cases(_factory(mode), names)
        rows += [{**result, "sandbox": label, "mode": mode} for result in results]
    hostile = [c.name for c in HOSTILE_CASES if names is None or c.name in names]
    return rows + (run_hostile(root / "hostile", hostile) if hostile else [])


def _factory(mode: str) -> Callable[[Path, list[Path]], Sandbox]:
    def factory(workspace: Path, writable: list[Path]) -> Sandbox:
        # the edit loop's sandbox: flakebot's own trees, handed to the unprivileged uid (as root)
        return open_sandbox(mode, workspace=workspace, writable=writable, timeout=30, adopt=True)

    return factory
