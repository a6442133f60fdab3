"""Hostile model sessions through the real pipeline (benchmarks/scenarios/hostile.py): each one contained."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.scenarios.hostile import CASES, run_hostile
from tests.conftest import require


@pytest.mark.slow
@pytest.mark.parametrize("name", [case.name for case in CASES])
def test_hostile_session_is_contained(name: str, tmp_path: Path) -> None:
    require("bwrap", "cargo", "nix")
    (row,) = run_hostile(tmp_path, [name])
    print(f"{row['case']}: {row['outcome']} ({row['seconds']} s)")
    assert row["contained"], row
