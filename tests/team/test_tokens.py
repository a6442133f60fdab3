"""`flakebot token add|list|revoke`: through the real CLI, each refusal one line with team mode's exit code."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

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


def test_a_revoked_token_never_verifies_again_while_threads_verify_as_the_store_changes(workdir: Path) -> None:
    """A front verifies in several threads (the event loop, the enqueue's thread, the revocation sweep) while `token
    revoke` rewrites the store. The re-read set the store's three parts one after another: a thread that read an older
    version late could put its tokens back after a newer re-read had noted the file as seen, and a verify in between
    let a token in whose revoke had returned (or named it not revoked). Each verify that begins after a revoke returned
    must refuse that token, and the store must name it revoked; no thread may raise."""
    import random
    import sys
    import threading

    writer, reader = TokenStore(workdir), TokenStore(workdir)  # `token revoke`'s store and the front's: one file
    for number in range(200):  # a store long enough that a re-read takes a while (and a thread may be overtaken)
        writer.add(f"filler-{number}")
    victims = [(f"victim-{n}", *writer.add(f"victim-{n}")) for n in range(100)]
    revoked: set[str] = set()  # the names whose revoke returned
    latest: list[tuple[str, str, str]] = [(victims[0][0], victims[0][1].id, victims[0][2])]
    wrong: list[str] = []
    stop = threading.Event()

    def verify_again_and_again() -> None:
        try:
            while not stop.is_set():
                name, principal_id, token = random.choice(latest[-2:])
                was_revoked = name in revoked  # read before the verify begins
                if reader.verify(token) is not None and was_revoked:
                    wrong.append(f"{name} verified after its revoke returned")
                if was_revoked and principal_id not in reader.revoked():
                    wrong.append(f"{name} not named revoked after its revoke returned")
        except BaseException as exc:  # any exception is a failure of the store, not of this test
            wrong.append(f"{type(exc).__name__}: {exc}")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads switched often: what a busy front's threads do over hours
    threads = [threading.Thread(target=verify_again_and_again) for _ in range(6)]
    try:
        for thread in threads:
            thread.start()
        for name, principal, token in victims:
            latest.append((name, principal.id, token))
            writer.revoke(name)
            revoked.add(name)
            time.sleep(0.002)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        sys.setswitchinterval(interval)
    assert not wrong, wrong[:5]


def test_a_record_the_store_never_writes_refuses_every_token_without_raising(workdir: Path) -> None:
    """A record missing its hash (edited by hand, by the store's owner) raised a KeyError out of a request's verify;
    now the store is malformed: a request's verify refuses, nobody is named revoked, and `active` says it in one line."""
    import json

    import pytest

    from flakebot.errors import TeamError

    store = TokenStore(workdir)
    _, token = store.add("alice")
    path = workdir / "team/tokens.json"
    data = json.loads(path.read_text())
    del data["tokens"][0]["sha256"]
    path.write_text(json.dumps(data))  # its mode kept (0600)
    assert store.verify(token) is None and store.revoked() == set()
    with pytest.raises(TeamError) as raised:
        store.active()
    assert "is malformed" in raised.value.one_line()


def test_a_same_size_rewrite_in_place_within_one_clock_tick_of_a_read_is_seen(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is re-read when its stat changes (inode, times, size). On a filesystem whose times are coarse (whole
    seconds on some; a tick of the kernel's coarse clock on kernels before multigrain timestamps), a rewrite in place
    of the same size soon after a read left the stat as the read saw it, and the front went on verifying the replaced
    token and refusing the new one. A store changed that recently is read again at each look. The coarse times are
    this machine's own, truncated to the second, as such a filesystem reports them."""
    import os
    import types

    from flakebot.team.tokens import PREFIX, _digest

    real_lstat = os.lstat

    def coarse_lstat(path: object) -> object:
        st = real_lstat(path)
        second = 1_000_000_000
        return types.SimpleNamespace(
            st_ino=st.st_ino,
            st_size=st.st_size,
            st_mtime_ns=st.st_mtime_ns // second * second,
            st_ctime_ns=st.st_ctime_ns // second * second,
        )

    store = TokenStore(workdir)
    _, old = store.add("alice")
    path = workdir / "team/tokens.json"
    new = PREFIX + "x" * (len(old) - len(PREFIX))
    text = path.read_text()
    monkeypatch.setattr(os, "lstat", coarse_lstat)
    assert store.verify(old) is not None  # the store read, its stat noted
    with path.open("r+") as handle:  # in place: the same inode and size
        handle.write(text.replace(_digest(old), _digest(new)))
    assert path.stat().st_size == len(text)
    assert store.verify(new) is not None and store.verify(old) is None
