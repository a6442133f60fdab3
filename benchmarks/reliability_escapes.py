"""Sandbox escape attempts (tests.fakes.escape_cases) under bubblewrap, and the same attempts in a plain process for contrast."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from flakebot.sandbox import Sandbox, open_sandbox
from tests.fakes.escape_cases import run_escape_cases

SANDBOXES = {"bubblewrap": "required", "plain process": "off"}


def run(names: list[str] | None = None) -> list[dict[str, Any]]:
    """Every case (or those named) in each sandbox; one row per (case, sandbox)."""
    rows = []
    for label, mode in SANDBOXES.items():
        results = run_escape_cases(_factory(mode), names)
        rows += [{**result, "sandbox": label, "mode": mode} for result in results]
    return rows


def _factory(mode: str) -> Callable[[Path, list[Path]], Sandbox]:
    def factory(workspace: Path, writable: list[Path]) -> Sandbox:
        return open_sandbox(mode, workspace=workspace, writable=writable, timeout=30)

    return factory
