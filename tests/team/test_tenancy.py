"""Whose a run a queued job's row names is: its own state.json says (tenancy.started_for)."""

from __future__ import annotations

import json
from pathlib import Path

from flakebot.team.tenancy import started_for


def _run(workdir: Path, run_id: str, state: object) -> Path:
    path = workdir / "runs" / run_id / "state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state))
    return path


def test_a_run_is_a_tenants_only_when_its_state_says_so_and_its_tenant_is_read_once(tmp_path: Path) -> None:
    state = _run(tmp_path, "20261129-031900-abcdef", {"tenant": "acme", "outputs": {}})
    _run(tmp_path, "20261129-031901-abcdef", {"outputs": {}})  # made outside the team: no tenant
    _run(tmp_path, "20261129-031902-abcdef", ["not", "a", "state"])
    assert started_for(tmp_path, "20261129-031900-abcdef", "acme")
    assert not started_for(tmp_path, "20261129-031900-abcdef", "globex")
    assert not started_for(tmp_path, "20261129-031901-abcdef", "acme")
    assert not started_for(tmp_path, "20261129-031902-abcdef", "acme")
    assert not started_for(tmp_path, "no-such-run", "acme")
    assert not started_for(tmp_path, "../20261129-031900-abcdef", "acme"), "a row's run id is no path"
    # a run's tenant is written as it starts: a later state.json of the run is not read again for it
    state.write_text(json.dumps({"tenant": "globex"}))
    assert started_for(tmp_path, "20261129-031900-abcdef", "acme")
    assert not started_for(tmp_path, "20261129-031900-abcdef", "globex")
