"""Hostile model sessions through the real pipeline (tests/fakes/hostile.py): each one contained."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import require
from tests.fakes.hostile import CASES, run_hostile


@pytest.mark.slow
@pytest.mark.parametrize("name", [case.name for case in CASES])
def test_hostile_session_is_contained(name: str, tmp_path: Path) -> None:
    require("bwrap", "cargo", "nix")
    (row,) = run_hostile(tmp_path, [name])
    print(f"{row['case']}: {row['outcome']} ({row['seconds']} s)")
    assert row["contained"], row
