"""`flakebot eval --record`: a run's model replies become a script that replays the same craft."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flakebot.config import Settings
from flakebot.evaluate.suite import load_suite
from flakebot.llm.providers import check_model
from tests.conftest import require, run_cli


@pytest.mark.slow
def test_a_recorded_session_replays_to_the_same_tool(workdir: Path, tmp_path: Path) -> None:
    require("bwrap", "cargo", "nix")
    [need] = load_suite("default").select(["crc32sum"]).needs
    first = run_cli(
        "eval",
        "--only",
        "crc32sum",
        "--model",
        f"scripted:{need.session}",
        "--record",
        str(tmp_path / "rec"),
        "--out",
        str(tmp_path / "a"),
    )
    assert first.returncode == 0, first.stderr[-3000:]
    recorded = tmp_path / "rec/crc32sum.json"
    check_model(f"scripted:{recorded}", Settings())
    script = json.loads(recorded.read_text())
    assert (
        sorted(script["stages"]) == ["choose", "edit", "spec"] and "Recorded from a live run" in script["description"]
    )
    again = run_cli(
        "eval", "--only", "crc32sum", "--model", f"scripted:{recorded}", "--out", str(tmp_path / "b"), "--json"
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.splitlines()[-1])["totals"]["heldout_passed"] == len(need.heldout)
