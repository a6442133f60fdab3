"""`flakebot token add|list|revoke`: through the real CLI, each refusal one line with team mode's exit code."""

from __future__ import annotations

from pathlib import Path

from flakebot.team.tokens import TokenStore
from tests.conftest import json_result, run_cli


def test_a_name_has_one_active_token_and_a_revoked_name_can_be_reused(workdir: Path) -> None:
    first = json_result(run_cli("token", "add", "alice", "--json", check=True))
    taken = run_cli("token", "add", "alice")
    assert taken.returncode == 70 and taken.stderr.count("\n") == 1 and "exists already" in taken.stderr
    for bad in (
        ["Alice!"],
        ["bob", "--tenant", "a b"],
        ["bob", "--tenant", "acme\n"],
        ["bob", "--calls-per-minute", "0"],
    ):
        refused = run_cli("token", "add", *bad, "--json")
        assert refused.returncode == 70 and refused.stderr.startswith("error: ") and "Fix: " in refused.stderr, bad
    unknown = run_cli("token", "revoke", "nobody")
    assert unknown.returncode == 70 and "no active token is named 'nobody'" in unknown.stderr
    run_cli("token", "revoke", "alice", check=True)
    second = json_result(run_cli("token", "add", "alice", "--json", check=True))
    assert second["id"] != first["id"] and second["token"] != first["token"]
    listed = json_result(run_cli("token", "list", "--json", check=True))["tokens"]
    assert [(t["name"], t["revoked"] is None) for t in listed] == [("alice", False), ("alice", True)]
    assert all("token" not in t and "sha256" not in t for t in listed)
    # the store says whom it revoked, by identity: the old alice follows no job, the new one is not among them
    assert TokenStore(workdir).revoked() == {first["id"]}
    stored = (workdir / "team/tokens.json").read_text()
    assert first["token"] not in stored and second["token"] not in stored
