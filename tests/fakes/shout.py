"""A small spec and a program that meets it (tests/fixtures/shout.*), for crafts whose model work is beside the point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SHOUT_SPEC: dict[str, Any] = json.loads((FIXTURES / "shout.spec.json").read_text())
SHOUT_RS = (FIXTURES / "shout.rs").read_text()


def write_file(path: str, content: str) -> dict[str, Any]:
    """A scripted write_file tool call."""
    return {"name": "write_file", "arguments": {"path": path, "content": content}}


def shout_craft_args(need: str, script: Path | str, spec: Path | str) -> list[str]:
    """`flakebot craft NEED` with a model script and a spec file, as a new crate on csv (registry flags not included)."""
    return ["craft", need, "--model", f"scripted:{script}", "--spec", str(spec), "--crate", "csv", "--mode", "new"]
