"""`flakebot serve` attacked as a hostile token holder and a careless admin would: the real server in a process of its
own on a free loopback port, raw HTTP (what a client SDK would never send) to 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.scenarios import pileup
from flakebot.mcp.front import REVOKED_SWEEP_SECONDS
from flakebot.team.tokens import MAX_STORE_BYTES
from tests.conftest import require, run_cli
from tests.team.test_front import ACCEPT, INITIALIZE, add_token, post, served_slow_craft, serving

pytestmark = pytest.mark.timeout(180)

SESSION = "2025-11-25"  # the session protocol: the one that offers tasks


def answer(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of a POST's answer, whether sent as JSON or as one SSE event."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return dict(response.json())
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert data, (response.status_code, response.text)
    return dict(json.loads(data[-1]))


def open_session(url: str, token: str) -> dict[str, str]:
    opened = post(url, INITIALIZE, token)
    assert opened.status_code == 200, opened.text
    headers = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": SESSION}
    post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, token, **headers)
    return headers


def rpc(url: str, token: str, session: dict[str, str], method: str, params: dict[str, Any]) -> dict[str, Any]:
    return answer(post(url, {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}, token, **session))


def test_one_tokens_tasks_are_not_found_by_another(
    flakebot_home: Path, workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tasks/list, get, result and cancel answer only the token that started the task: another token could
    otherwise read every task id from tasks/list, then its result, or cancel another agent's craft."""
    require("nix")
    alice, bob = add_token("alice"), add_token("bob")
    craft = served_slow_craft(tmp_path, monkeypatch)
    try:
        with serving() as url:
            mine, theirs = open_session(url, alice), open_session(url, bob)
            started = rpc(url, alice, mine, "tools/call", {"name": "craft", "arguments": craft, "task": {}})
            task_id = started["result"]["task"]["taskId"]
            assert [t["taskId"] for t in rpc(url, alice, mine, "tasks/list", {})["result"]["tasks"]] == [task_id]
            assert rpc(url, bob, theirs, "tasks/list", {})["result"]["tasks"] == []
            for method in ("tasks/get", "tasks/cancel", "tasks/result"):
                refused = rpc(url, bob, theirs, method, {"taskId": task_id})
                assert "no task" in refused["error"]["message"], (method, refused)
            assert rpc(url, alice, mine, "tasks/get", {"taskId": task_id})["result"]["status"] == "working"
    finally:
        pileup.end_jobs(workdir / "mcp-jobs")


def test_a_port_out_of_range_is_one_line_and_nothing_listens(flakebot_home: Path) -> None:
    for port in ("65536", "99999", "-1"):  # 99999 was taken modulo 65536: the server listened on 34463
        refused = run_cli("serve", "--port", port, timeout=60)
        assert refused.returncode == 2, (port, refused.stdout, refused.stderr)
        assert refused.stderr.count("\n") == 1 and "0 to 65535" in refused.stderr and "Fix: " in refused.stderr
        assert "flakebot serve:" not in refused.stdout


def test_no_request_is_free_of_a_tokens_limits(flakebot_home: Path, workdir: Path) -> None:
    """Only tools/call was counted: a token past its calls per minute could still send tools/list (which reads the
    catalog's definitions and writes an audit line) as fast as the network goes. Other requests now have a window of
    their own, ten times as wide; a body nested too deep for the counting parser is the SDK's parse error, not a 500."""
    flood, other = add_token("flood", "--calls-per-minute", "2"), add_token("other")
    listing = {"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {}}
    with serving() as url:
        session = open_session(url, flood)  # initialize counts too: one request of the twenty
        answers = [post(url, listing, flood, **session).status_code for _ in range(25)]
        assert answers[:19] == [200] * 19 and set(answers[19:]) == {429}, answers
        refused = post(url, listing, flood, **session)
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert "requests other than tool calls" in refused.json()["error"]["message"]
        assert post(url, listing, other, **open_session(url, other)).status_code == 200
        headers = {**ACCEPT, "Authorization": f"Bearer {other}", "mcp-protocol-version": "2026-07-28"}
        deep = httpx.post(url, content=b"[" * 5000 + b"]" * 5000, headers=headers, timeout=30)
        assert deep.status_code == 400 and "Parse error" in deep.text, (deep.status_code, deep.text)
    lines = (workdir / "team/audit.jsonl").read_text().splitlines()
    assert len(lines) <= 25  # the listings answered, never the refused ones


def test_a_token_store_others_could_write_is_refused(flakebot_home: Path, workdir: Path) -> None:
    """The store was read through any link and whatever its mode: whoever could write it (a group-writable file, a
    link to a file of theirs) could add the hash of a token of their own. Now serve refuses to start on it (one line,
    exit 70), and a running server refuses every token once it becomes so."""
    token = add_token("alice")
    store = workdir / "team/tokens.json"
    store.chmod(0o664)
    refused = run_cli("serve", "--port", "0", timeout=60)
    assert refused.returncode == 70 and refused.stderr.count("\n") == 1, refused.stderr
    assert "not this user's alone" in refused.stderr and "Fix: " in refused.stderr
    store.chmod(0o600)
    elsewhere = workdir / "planted.json"
    store.rename(elsewhere)
    store.symlink_to(elsewhere)
    linked = run_cli("serve", "--port", "0", timeout=60)
    assert linked.returncode == 70 and "symbolic link" in linked.stderr and linked.stderr.count("\n") == 1
    store.unlink()
    elsewhere.rename(store)
    with serving() as url:
        assert post(url, INITIALIZE, token).status_code == 200
        store.chmod(0o666)
        assert post(url, INITIALIZE, token).status_code == 401  # fails closed, not a 500
        store.chmod(0o600)
        assert post(url, INITIALIZE, token).status_code == 200


def test_a_hostile_token_store_refuses_every_token_once_and_never_answers_500(
    flakebot_home: Path, workdir: Path
) -> None:
    """A store its owner wrote badly (JSON nested past the parser's depth, a limit or a date no number holds, a file
    far too large to be a store) raised out of a request's verify (RecursionError, OverflowError: a 500 and a traceback
    per request) or was read whole. Now each is a store that cannot be read: every token refused (401), said once in
    the log; the store mended, its token verifies again."""
    token = add_token("alice")
    store = workdir / "team/tokens.json"
    good = store.read_text()
    record = json.loads(good)["tokens"][0]
    hostile = {
        "deep": '{"tokens": [' + "[" * 100_000 + "]" * 100_000 + "]}",
        "infinite": json.dumps({"tokens": [{**record, "calls_per_minute": float("inf")}]}),
        "huge": json.dumps({"tokens": [{**record, "created": 10**400}]}),
    }
    log = flakebot_home / "serve.log"
    with serving(log=log) as url:
        assert post(url, INITIALIZE, token).status_code == 200
        for what, text in hostile.items():
            store.write_text(text)  # by its owner, in place (0600 kept)
            assert [post(url, INITIALIZE, token).status_code for _ in range(3)] == [401] * 3, what
            store.write_text(good)
            assert post(url, INITIALIZE, token).status_code == 200, what
        with store.open("r+b") as file:  # sparse: past the largest store read, without writing its bytes
            file.truncate(MAX_STORE_BYTES + 1)
        assert post(url, INITIALIZE, token).status_code == 401
        listed = run_cli("token", "list", timeout=60)
        assert listed.returncode == 70 and listed.stderr.count("\n") == 1 and "too large" in listed.stderr
    said = [line for line in log.read_text().splitlines() if "refusing every token" in line]
    assert len(said) == len(hostile) + 1, said
    assert "too large" in said[-1], said[-1]
    assert "Traceback" not in log.with_suffix(".err").read_text() + log.read_text()


def test_a_token_revoked_by_any_writer_is_refused_at_the_next_request(workdir: Path) -> None:
    """The front re-reads its store when the file or its directory looks changed (inode, mtime, ctime, size). A revoke
    by `flakebot token revoke` in another process (a new file renamed over the old) is refused at the next request; so
    is a hand edit written in place, of the same size, with its mtime put back as it was (cp -p, rsync -t): only its
    ctime tells it, which no writer sets."""
    import os

    alice, bob = add_token("alice"), add_token("bob")
    store = workdir / "team/tokens.json"
    with serving() as url:
        assert post(url, INITIALIZE, alice).status_code == 200 and post(url, INITIALIZE, bob).status_code == 200
        run_cli("token", "revoke", "bob", check=True)
        assert post(url, INITIALIZE, bob).status_code == 401
        before, text = store.stat(), store.read_text()
        data = json.loads(text)
        assert data["tokens"][0]["name"] == "alice" and data["tokens"][0]["revoked"] is None
        edited = text.replace('"revoked": null', '"revoked": 1234', 1)  # alice's record: the first null
        assert len(edited) == len(text) and json.loads(edited)["tokens"][0]["revoked"] == 1234
        with store.open("r+") as file:
            file.write(edited)
        os.utime(store, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert (store.stat().st_size, store.stat().st_mtime_ns, store.stat().st_ino) == (
            before.st_size,
            before.st_mtime_ns,
            before.st_ino,
        )
        assert post(url, INITIALIZE, alice).status_code == 401


async def held_statuses(url: str, flood: str, other: str, run_id: str, count: int) -> tuple[int, int]:
    """`count` calls of `status` holding their answer (wait_seconds) from `flood`, then one plain `status` from
    `other`: how many of the flood's calls had answered when the other's answer came, and how many were sent."""
    import asyncio

    def call(token: str, wait: int) -> Any:
        body = {"name": "status", "arguments": {"run_id": run_id, "wait_seconds": wait}}
        request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": body}
        headers = {**ACCEPT, "Authorization": f"Bearer {token}", "mcp-protocol-version": "2026-07-28"}
        headers["mcp-method"] = "tools/call"
        headers["mcp-name"] = "status"
        meta = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        body["_meta"] = meta
        return client.post(url, json=request, headers=headers)

    async with httpx.AsyncClient(timeout=90, limits=httpx.Limits(max_connections=count + 8)) as client:
        held = [asyncio.create_task(call(flood, 25)) for _ in range(count)]
        await asyncio.sleep(3)  # the held calls reach the server first
        answered = await call(other, 0)
        assert answered.status_code == 200, answered.text
        assert '"run_id"' in answered.text, answered.text
        done = sum(task.done() for task in held)
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        return done, count


def test_one_token_cannot_take_every_thread_a_command_has(
    flakebot_home: Path, workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command's calls share THREADS_PER_COMMAND worker threads (64): one token holding 70 `status` calls (each
    waiting up to 25 s for its run to change) held every one, and another token's `status` waited until they ended.
    Each token now has at most TOKEN_CALLS_AT_ONCE calls in flight; its others wait in its own queue."""
    import asyncio

    require("nix")
    flood, other = add_token("flood"), add_token("other")
    craft = served_slow_craft(tmp_path, monkeypatch)
    try:
        with serving() as url:
            started = rpc(url, flood, open_session(url, flood), "tools/call", {"name": "craft", "arguments": craft})
            run_id = json.loads(started["result"]["content"][0]["text"])["run_id"]
            done, sent = asyncio.run(held_statuses(url, flood, other, run_id, 70))
            assert done == 0 and sent == 70  # the other token's answer came while every held call still waited
    finally:
        pileup.end_jobs(workdir / "mcp-jobs")


def stream_of(url: str, token: str, session: dict[str, str]) -> Callable[[], str]:
    """The session's GET stream, opened now in a thread; what became of it: "ended", or "still open after 20 s"."""
    import threading

    ended: list[str] = []
    headers = {**ACCEPT, **session, "Authorization": f"Bearer {token}", "Accept": "text/event-stream"}

    def listen() -> None:
        try:
            with httpx.stream("GET", url, headers=headers, timeout=httpx.Timeout(30, read=20)) as stream:
                assert stream.status_code == 200
                for _ in stream.iter_bytes():
                    pass
            ended.append("ended")
        except httpx.ReadTimeout:
            ended.append("still open after 20 s")

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()

    def outcome() -> str:
        listener.join(timeout=40)
        return ended[0] if ended else "no answer in 40 s"

    return outcome


def test_revoking_a_token_ends_its_open_sessions(flakebot_home: Path) -> None:
    """A revoked token's next request is 401, but the GET stream its session had open stayed open (server
    notifications for its crafts went on reaching it), and it could not even be closed with the token. Now the
    front ends a revoked principal's sessions within a second or two: the stream ends, the session id is gone."""
    carol, alice = add_token("carol"), add_token("alice")
    with serving() as url:
        ended = stream_of(url, carol, open_session(url, carol))
        other = open_session(url, alice)
        run_cli("token", "revoke", "carol", check=True)
        assert ended() == "ended"
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        assert post(url, listing, alice, **other).status_code == 200  # another token's session goes on


def test_a_store_that_cannot_be_looked_at_refuses_tokens_and_the_sweep_goes_on(
    flakebot_home: Path, workdir: Path
) -> None:
    """The team directory made a file for a moment (or one the server may not search: EACCES, for a server not run as
    root): looking at the store raised NotADirectoryError out of each request's verify (a 500) and out of the sweep
    that ends revoked tokens' sessions, which took the front's task group down with it: every request of any token
    was 500 from then on, the store mended or not, until a restart. Now the store is one that cannot be read: every
    token refused, said once; mended, tokens verify again, and a token revoked later still has its session ended."""
    team = workdir / "team"
    carol, alice = add_token("carol"), add_token("alice")
    log = flakebot_home / "serve.log"
    with serving(log=log) as url:
        session = open_session(url, carol)
        team.rename(workdir / "team.away")
        team.write_text("not a directory")
        team.chmod(0o600)
        time.sleep(REVOKED_SWEEP_SECONDS * 2.5)  # the sweep looks at it too
        assert [post(url, INITIALIZE, alice).status_code for _ in range(3)] == [401] * 3
        team.unlink()
        (workdir / "team.away").rename(team)
        assert post(url, INITIALIZE, alice).status_code == 200
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        assert post(url, listing, carol, **session).status_code == 404  # the sweep ended it while no token was live
        ended = stream_of(url, carol, open_session(url, carol))
        run_cli("token", "revoke", "carol", check=True)
        assert ended() == "ended"  # the sweep goes on
    said = [line for line in log.read_text().splitlines() if "refusing every token" in line]
    assert len(said) == 1 and "is not a directory" in said[0], said
    assert "Traceback" not in log.read_text() + log.with_suffix(".err").read_text()


def test_a_flood_of_refused_calls_does_not_grow_the_audit_without_bound(flakebot_home: Path, workdir: Path) -> None:
    """Each tool call refused at the rate limit was one audit line: a token past its limit could grow the audit at
    the network's speed (a disk filled by 429s). Refusals are audited up to the token's calls per minute a minute."""
    flood = add_token("flood", "--calls-per-minute", "2")
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "list", "arguments": {}}}
    with serving() as url:
        session = open_session(url, flood)
        answers = [post(url, call, flood, **session).status_code for _ in range(40)]
    assert answers[:2] == [200, 200] and set(answers[2:]) == {429}
    records = [json.loads(line) for line in (workdir / "team/audit.jsonl").read_text().splitlines()]
    outcomes = [r["outcome"] for r in records if r["method"] == "tools/call"]
    assert outcomes == ["ok", "ok", "refused", "refused"], outcomes


def test_package_writes_its_flake_only_beneath_a_grant_root(
    flakebot_home: Path, workdir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`package`'s `out` was any directory the server's user may make (new or empty, its parents made too; an earlier
    flakebot flake there removed): a token holder wrote beyond the grant roots the docs promise. Over the front it
    must now lie beneath a grant root (the directory serve started in, --grant-root), by call and by task alike."""
    token = add_token("alice")
    outside = tmp_path_factory.mktemp("elsewhere") / "made-by-a-caller"
    target = str(Path(__file__).parents[1] / "fixtures/kv-service")
    arguments = {"target": target, "out": str(outside), "detach": True}
    granted = tmp_path_factory.mktemp("granted")
    try:
        with serving("--grant-root", str(granted)) as url:
            session = open_session(url, token)
            called = rpc(url, token, session, "tools/call", {"name": "package", "arguments": arguments})
            text = json.loads(called["result"]["content"][0]["text"])
            assert called["result"]["isError"] and "outside every grant root" in text["error"], text
            tasked = rpc(url, token, session, "tools/call", {"name": "package", "arguments": arguments, "task": {}})
            assert "outside every grant root" in tasked["error"]["message"], tasked
            inside = {**arguments, "out": str(granted / "flake-out")}  # beneath the server's --grant-root: taken
            taken = rpc(url, token, session, "tools/call", {"name": "package", "arguments": inside})
            assert "grant root" not in taken["result"]["content"][0]["text"], taken
    finally:
        pileup.end_jobs(workdir / "mcp-jobs")
    assert not outside.exists()


def test_one_tokens_sessions_cannot_take_every_session_of_the_front(flakebot_home: Path) -> None:
    """The SDK holds at most 10,000 sessions on a front, every token's together, each kept 30 idle minutes: one token
    opening sessions at its request rate would fill them and every other tenant's initialize would get 503. A token
    holds at most SESSIONS_PER_TOKEN open sessions: its next initialize is 429 with Retry-After and one line saying
    why; another token still opens its own, and one ended (DELETE) makes room again."""
    from flakebot.mcp.front import SESSIONS_PER_TOKEN

    flood, other = add_token("flood"), add_token("other", "--tenant", "globex")
    with serving() as url:
        opened = [post(url, INITIALIZE, flood) for _ in range(SESSIONS_PER_TOKEN)]
        refused = post(url, INITIALIZE, flood)
        theirs = post(url, INITIALIZE, other)
        ended = httpx.delete(
            url,
            headers={"Authorization": f"Bearer {flood}", "mcp-session-id": opened[0].headers["mcp-session-id"],
                     "mcp-protocol-version": SESSION},
            timeout=30,
        )  # fmt: skip
        again = post(url, INITIALIZE, flood)
    assert [r.status_code for r in opened] == [200] * SESSIONS_PER_TOKEN
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0, refused.text
    message = refused.json()["error"]["message"]
    assert "sessions" in message and "Fix:" in message and "mcp-session-id" not in refused.headers, message
    assert theirs.status_code == 200 and ended.status_code == 200 and again.status_code == 200, (ended, again.text)


def test_a_tokens_session_cap_is_exact_under_concurrent_initializes(flakebot_home: Path) -> None:
    """SESSIONS_PER_TOKEN + 36 initializes of one token sent at once over HTTP: exactly SESSIONS_PER_TOKEN open a
    session, every other is 429 with Retry-After (checked before the SDK registers a session, a cap counted from the
    sessions already registered let every initialize in flight through)."""
    from flakebot.mcp.front import SESSIONS_PER_TOKEN

    flood = add_token("flood")  # 100 initializes: well within its 1,200 requests other than tool calls a minute

    async def initialize_all(url: str) -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        headers = {**ACCEPT, "Authorization": f"Bearer {flood}"}
        async with httpx.AsyncClient(headers=headers, timeout=60, limits=limits) as http:
            return list(
                await asyncio.gather(*(http.post(url, json=INITIALIZE) for _ in range(SESSIONS_PER_TOKEN + 36)))
            )

    with serving() as url:
        answers = asyncio.run(initialize_all(url))
        after = post(url, INITIALIZE, flood)  # the cap holds afterwards too
    codes = collections.Counter(r.status_code for r in answers)
    assert codes == {200: SESSIONS_PER_TOKEN, 429: 36}, codes
    opened = {r.headers["mcp-session-id"] for r in answers if r.status_code == 200}
    assert len(opened) == SESSIONS_PER_TOKEN
    assert all(int(r.headers["retry-after"]) > 0 for r in answers if r.status_code == 429)
    assert after.status_code == 429, after.text
