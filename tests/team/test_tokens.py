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


def test_only_the_grant_named_exactly_is_given_and_a_revoked_ones_grant_does_not_pass_on(workdir: Path) -> None:
    """`--grant` takes the names of tokens.GRANTS exactly (no case or look-alike variant); a grant written into the store
    by hand is read through the same allow list, so `token list` shows what the front honours; a revoked token's grant
    is not its name's: the new token under that name holds only what it was given."""
    import json

    for variant in ("Metrics", "METRICS", "metrics ", "ｍetrics", "metrics\u200b", "metrics,admin", ""):
        refused = run_cli("token", "add", "eve", "--grant", variant)
        assert refused.returncode == 70 and refused.stderr.count("\n") == 1 and "Fix: " in refused.stderr, variant
    run_cli("token", "add", "prometheus", "--grant", "metrics", check=True)
    run_cli("token", "revoke", "prometheus", check=True)
    again = json_result(run_cli("token", "add", "prometheus", "--json", check=True))
    assert again["grants"] == [], again
    store = workdir / "team/tokens.json"
    data = json.loads(store.read_text())
    data["tokens"][-1]["grants"] = ["Metrics", "metrics\u200b", "admin"]
    store.write_text(json.dumps(data))  # by the store's owner, its mode kept (0600)
    listed = json_result(run_cli("token", "list", "--json", check=True))["tokens"]
    assert [(t["revoked"] is None, t["grants"]) for t in listed] == [(False, ["metrics"]), (True, [])], listed
    assert TokenStore(workdir).principals()[-1].grants == ()
