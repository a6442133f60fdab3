"""The service faults of `make reliability` (benchmarks/reliability/services.py) on a subset, for real: kill -9 of the
service and a failing upgrade each hold, leave nothing running, and render as the report's rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.reliability import section
from tests.conftest import require

pytestmark = pytest.mark.slow


def test_service_faults_hold_and_leave_nothing_running(tmp_path: Path) -> None:
    require("nix", "cargo", "bwrap", "pasta")
    from benchmarks.reliability.services import run_cases

    rows = run_cases(tmp_path, tmp_path / "cache", ("kill -9", "failing upgrade"))
    assert [r["case"] for r in rows] == ["kill -9", "failing upgrade"]
    assert all(r["ok"] and r["strays"] == 0 for r in rows), rows
    assert "exit 43" in rows[1]["outcome"] and "data kept: True" in rows[1]["outcome"]
    services = section("services")
    record = services.load(rows)
    assert services.summarize(record).lines() == [
        "- **Services**: 2 of 2 service faults handled as documented (docs/services.md)."
    ]
    assert any("SIGKILL of the service's own process" in line for line in services.markdown(record))


def test_a_replaced_name_never_gets_the_secret_and_every_secret_key_reaches_the_service(tmp_path: Path) -> None:
    require("nix", "cargo", "bwrap", "pasta", "nsenter")
    from benchmarks.reliability.services import run_cases

    rows = run_cases(tmp_path, tmp_path / "cache", ("replaced name", "secret keys"))
    assert [r["case"] for r in rows] == ["replaced name", "secret keys"]
    assert all(r["ok"] and r["strays"] == 0 for r in rows), rows
    assert rows[0]["outcome"].count("the recorded program") == 3 and "NOT" not in rows[0]["outcome"]
    assert "token, password, api_key" in rows[1]["outcome"] and "holding a secret: 0" in rows[1]["outcome"]
