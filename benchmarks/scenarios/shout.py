"""A small spec and a program that meets it (shout.spec.json, shout.rs beside this file), for crafts whose model work
is beside the point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent
SHOUT_SPEC: dict[str, Any] = json.loads((FIXTURES / "shout.spec.json").read_text())
SHOUT_RS = (FIXTURES / "shout.rs").read_text()


def write_file(path: str, content: str) -> dict[str, Any]:
    """A scripted write_file tool call."""
    return {"name": "write_file", "arguments": {"path": path, "content": content}}


def shout_craft_args(need: str, script: Path | str, spec: Path | str) -> list[str]:
    """`flakebot craft NEED` with a model script and a spec file, as a new crate on csv (registry flags not included)."""
    return ["craft", need, "--model", f"scripted:{script}", "--spec", str(spec), "--crate", "csv", "--mode", "new"]


def shout_script(tmp_path: Path) -> Path:
    """A scripted model for the shout tool: its spec, one edit writing the program."""
    spec_turn = {"tool_calls": [{"name": "submit_spec", "arguments": SHOUT_SPEC}]}
    script = tmp_path / "shout-script.json"
    script.write_text(
        json.dumps(
            {
                "format": 1,
                "stages": {"spec": [spec_turn], "edit": [{"tool_calls": [write_file("src/main.rs", SHOUT_RS)]}]},
            }
        )
    )
    return script
