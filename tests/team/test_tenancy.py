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


def test_the_runs_whose_tenant_is_remembered_are_bounded(tmp_path: Path) -> None:
    """A front answers runs of every tenant for months: what it remembers of their tenants is bounded (the least
    recently asked forgotten first, and read again when asked again), not one entry per run ever asked."""
    from flakebot.team import tenancy

    runs = [f"20261129-{n // 10000:06d}-{n % 10000:06x}" for n in range(tenancy.RUNS_KEPT + 10)]
    for run_id in runs:
        _run(tmp_path, run_id, {"tenant": "acme"})
        assert started_for(tmp_path, run_id, "acme")
    assert tenancy._run_tenant.cache_info().currsize == tenancy.RUNS_KEPT
    first = tmp_path / "runs" / runs[0] / "state.json"
    first.write_text(json.dumps({"tenant": "globex"}))  # forgotten: read afresh (a test's rewrite, not a run's)
    assert started_for(tmp_path, runs[0], "globex")
    _run(tmp_path, "20261129-999999-abcdef", {"outputs": {}})  # no tenant yet: not remembered as none
    assert not started_for(tmp_path, "20261129-999999-abcdef", "acme")
    _run(tmp_path, "20261129-999999-abcdef", {"tenant": "acme"})
    assert started_for(tmp_path, "20261129-999999-abcdef", "acme")
