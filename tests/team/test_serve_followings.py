"""Attacks on a waited craft's following of its queued job (docs/team.md, "A waited craft whose caller went away"):
each end of the call before its job's retracts that call's own following, whatever ended it. Real fronts, a real
PostgreSQL, the MCP SDK's client over HTTP."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from flakebot.team import audit, db, fronts
from flakebot.team.dburl import ENV as DATABASE_ENV
from flakebot.team.idtokens import LEEWAY_SECONDS
from flakebot.team.queue import TENANT_LOCK
from tests.conftest import FLAKEBOT, wait_for
from tests.team.conftest import Cluster
from tests.team.test_front import add_token, post, serving, serving_process
from tests.team.test_jwt import AUDIENCE, ISSUER, claims
from tests.team.test_serve_queue import Session, _audited, _waited_craft_given_up, call, handle_of, metrics, rows

pytestmark = pytest.mark.timeout(300)


def test_a_waited_craft_whose_jwt_expired_while_it_waited_is_followed_to_its_end(
    flakebot_home: Path, database: str, workdir: Path, tmp_path: Path
) -> None:
    """carol's JWT expires while her craft (wait: true) waits on its job. Her call then read the job as her token no
    longer could: "no job 'job-1' (unknown here...)", an error raised, not a cancel, so her following was never
    retracted and the job, hers alone, stayed queued for nobody; and the call was not audited at all. The call was
    admitted while her token was valid (an HTTP request is authorised as it arrives): now it follows the job to its
    end as the principal it was admitted as, and is audited so. (A revoked static token's followings the front's look
    ends: tests/team/test_serve_queue.py.)"""
    from tests.team.test_worker import worker

    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key_file = flakebot_home / "idp.pem"
    key_file.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    add_token("alice", "--tenant", "acme")
    expires = int(time.time()) - LEEWAY_SECONDS + 6  # valid for the next ~6 s, the front's leeway counted
    carol = jwt.encode(claims(exp=expires), private, algorithm="RS256")
    options = ["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, "--jwt-key", str(key_file)]
    with (
        serving(*options, log=flakebot_home / "serve.log", database=database) as url,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        waited = pool.submit(call, url, carol, "craft", {"need": "need a csv deduper", "wait": True})
        wait_for(lambda: rows(database), timeout=30, interval=0.2)
        time.sleep(max(0.0, expires + LEEWAY_SECONDS - time.time()) + 3)  # expired, and polled since
        assert not waited.done(), waited.result()
        assert [r["state"] for r in rows(database)] == ["queued"], _audited(database)
        with worker(database, tmp_path / "worker.log", model="scripted:/nonexistent.json") as proc:
            assert proc.wait(timeout=120) == 0, (tmp_path / "worker.log").read_text()
        answer = waited.result(timeout=60)
        assert answer["is_error"] and answer["type"] == "ScriptError", answer  # the job's own end, not the token's
    assert _audited(database) == [("carol@example.test", "enqueued")]
    crafts = [r for r in audit.read(workdir) if r["method"] == "tools/call" and r["tool"] == "craft"]
    assert [r["principal"] for r in crafts] == ["carol@example.test"], crafts


def test_a_sessions_request_id_in_use_is_refused_so_its_waited_craft_can_still_be_cancelled(
    flakebot_home: Path, database: str
) -> None:
    """alice's session waits on a craft as request 7 and, while it waits, asks `list` as request 7 too (MCP: an id is
    never reused in a session; a client numbering every request 1 does). The SDK kept one request per id: the second
    took the first's place and left with its answer, so when the waited craft's stream closed, the cancel flakebot
    sends for request 7 found nothing to cancel; the call went on waiting for nobody and the job, alice's alone, stayed
    queued. Now a request whose id another open request of the session holds is refused in one line (another
    principal posting into the session is the SDK's 404, as before), and the waited craft's end leaves its job."""
    alice, mallory = add_token("alice", "--tenant", "acme"), add_token("mallory", "--tenant", "acme")
    with (
        serving(database=database, log=flakebot_home / "serve.log") as url,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        session = Session(url, alice)
        waited = pool.submit(_waited_craft_given_up, url, alice, "need a csv deduper", session.headers, 6)
        wait_for(lambda: rows(database), timeout=30, interval=0.2)
        reused = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "list", "arguments": {}}}
        assert post(url, reused, mallory, **session.headers).status_code == 404
        refused = post(url, {**reused, "id": "7"}, alice, **session.headers)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert "request id 7 is in use" in error["message"] and "Fix: " in error["message"], error
        assert "result" in session.ask("tools/call", {"name": "list", "arguments": {}})  # an id of its own: answered
        waited.result(60)
        wait_for(lambda: rows(database)[0]["state"] == "cancelled", timeout=30, interval=0.2)
    assert _audited(database) == [("alice", "enqueued"), ("alice", "cancelled")]


@pytest.mark.parametrize("protocol", ["2026-07-28", "2025-11-25"])
def test_a_call_whose_client_went_away_is_still_audited(
    flakebot_home: Path, database: str, workdir: Path, protocol: str
) -> None:
    """A tool call is audited as it is answered, so a call cancelled first (its client closed the connection, and
    for a session's request flakebot.mcp.gone's cancel) left no record at all: a client could make any long call (a
    craft, a tool's run) vanish from the audit by going away before its answer. Now it is audited, outcome
    `cancelled`, under the principal it was admitted as."""
    alice = add_token("alice", "--tenant", "acme")
    with serving(database=database, log=flakebot_home / "serve.log") as url:
        session = Session(url, alice).headers if protocol == "2025-11-25" else None
        _waited_craft_given_up(url, alice, "need a csv deduper", session)
        wait_for(lambda: rows(database)[0]["state"] == "cancelled", timeout=30, interval=0.2)
    crafts = [r for r in audit.read(workdir) if r["method"] == "tools/call" and r["tool"] == "craft"]
    assert [(r["principal"], r["outcome"]) for r in crafts] == [("alice", "cancelled")], crafts


LEASE = ("--lease", "3")  # the shortest a front takes: a lost front's followings end within seconds


def _held(url: str, token: str, need: str) -> None:
    """A craft called with wait: true, held until its front goes away (no worker: the job cannot end first)."""
    with contextlib.suppress(httpx.HTTPError):  # the front was killed mid-answer
        _waited_craft_given_up(url, token, need, None, 120)


def _because(database: str) -> list[tuple[str, str, str | None]]:
    """Who left, cancelled or retracted a following of a job, and why."""
    with db.connect(database) as conn:
        said = conn.execute(
            "SELECT principal, action, detail->>'because' AS because FROM audit "
            "WHERE action IN ('left', 'cancelled', 'retracted') ORDER BY id"
        ).fetchall()
    return [(a["principal"], a["action"], a["because"]) for a in said]


@contextlib.contextmanager
def _killed_while_a_craft_waits(
    pool: concurrent.futures.ThreadPoolExecutor, database: str, log: Path, token: str, need: str
) -> Iterator[str]:
    """A front of its own (a short lease) where `token`'s craft of `need` waits (wait: true, on `pool`), its job
    queued; SIGKILLed as the block ends, the waited call's end then collected. The front's URL."""
    with serving_process(*LEASE, database=database, log=log) as (url, front):
        held = pool.submit(_held, url, token, need)
        wait_for(lambda: rows(database), timeout=30, interval=0.2)
        yield url
        front.send_signal(signal.SIGKILL)
        front.wait(timeout=30)
    held.result(timeout=30)


def test_a_killed_fronts_waited_craft_is_ended_by_another_fronts_sweep(flakebot_home: Path, database: str) -> None:
    """alice's craft waits (wait: true) on the first front, which is then killed (SIGKILL): nobody ended the call's
    following, so her job, hers alone, stayed queued for nobody (a worker would have crafted it). Now the front's
    lease runs out and the second front's sweep ends that following as the call's own end would: the job is
    cancelled, within seconds of the short lease."""
    alice = add_token("alice", "--tenant", "acme")
    with (
        serving(*LEASE, database=database, log=flakebot_home / "two.log"),
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        with _killed_while_a_craft_waits(pool, database, flakebot_home / "one.log", alice, "need a csv deduper"):
            pass
        wait_for(lambda: rows(database)[0]["state"] == "cancelled", timeout=30, interval=0.2)
    assert _because(database) == [("alice", "cancelled", fronts.LOST)]


def test_a_killed_fronts_waited_craft_leaves_a_job_a_task_still_follows(flakebot_home: Path, database: str) -> None:
    """carol follows alice's job by a task on the second front when the first, where alice's craft waits, is killed.
    A task outlives its front by design: the sweep ends alice's following only, and the job goes on for carol."""
    alice, carol = add_token("alice", "--tenant", "acme"), add_token("carol", "--tenant", "acme")
    need = "need a csv deduper"
    with (
        serving(*LEASE, database=database, log=flakebot_home / "two.log") as two,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        with _killed_while_a_craft_waits(pool, database, flakebot_home / "one.log", alice, need):
            task = Session(two, carol).ask("tools/call", {"name": "craft", "arguments": {"need": need}, "task": {}})
            assert task["result"]["task"]["taskId"] == f"job-{rows(database)[0]['id']}", task
        wait_for(lambda: _because(database), timeout=30, interval=0.2)
        assert [r["state"] for r in rows(database)] == ["queued"]
    assert _because(database) == [("alice", "left", fronts.LOST)]


def test_a_waited_craft_whose_every_front_was_killed_is_stopped_by_its_worker(
    flakebot_home: Path, database: str, tmp_path: Path
) -> None:
    """alice's craft waits on the only front, which is then killed (SIGKILL), and a worker claims her job. Only live
    fronts swept lost fronts: with none left, the worker crafted her job to its end for nobody. Now the worker sweeps
    too (once its own looks at the database have held for a whole lease): her following ends as a lost front's, the
    job, hers alone, is cancelled, and the worker stops its craft (a model reply that would take minutes)."""
    from tests.team.test_worker import job_row, worker

    alice = add_token("alice", "--tenant", "acme")
    slow = tmp_path / "slow.json"  # the craft's first model call answers after five minutes: it runs until stopped
    slow.write_text(json.dumps({"format": 1, "turns": [{"fault": {"kind": "slow", "seconds": 300}, "content": "-"}]}))
    log = tmp_path / "worker.log"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with _killed_while_a_craft_waits(pool, database, flakebot_home / "one.log", alice, "need a csv deduper"):
            pass
        job_id = int(rows(database)[0]["id"])
        with worker(database, log, model=f"scripted:{slow}") as proc:
            wait_for(lambda: job_row(database, job_id)["state"] != "queued", timeout=30, interval=0.2)
            assert proc.wait(timeout=30) == 0, log.read_text()  # --once: its one job ended, cancelled
    assert job_row(database, job_id)["state"] == "cancelled"
    assert _because(database) == [("alice", "cancelled", fronts.LOST)]
    assert '"state": "cancelled"' in log.read_text().splitlines()[-1], log.read_text()


def test_a_database_away_longer_than_a_lease_takes_no_live_front_for_lost(
    flakebot_home: Path, postgres: Cluster, database: str
) -> None:
    """The database stops for longer than the fronts' lease, then starts again: every lease in it ran out meanwhile.
    A lease is a time, so the first front back would have taken the other, still live, for lost and ended its waited
    calls' followings; a front sweeps only once its own renewals have held for a whole lease, by when every live
    front has renewed: neither is taken for lost, and no following is ended as a lost front's. alice's waited call
    ended with the database (its error said so) while its own following's end could not be written: it is written
    once the database answers, and her job, hers alone, is cancelled (it stayed queued for nobody)."""
    alice = add_token("alice", "--tenant", "acme")
    logs = [flakebot_home / "one.log", flakebot_home / "two.log"]
    with (
        serving(*LEASE, database=database, log=logs[0]) as one,
        serving(*LEASE, database=database, log=logs[1]),
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        held = pool.submit(call, one, alice, "craft", {"need": "need a csv deduper", "wait": True})
        wait_for(lambda: rows(database), timeout=30, interval=0.2)
        with db.connect(database) as conn:
            known = {row["id"] for row in conn.execute("SELECT id FROM fronts").fetchall()}
        assert len(known) == 2
        postgres.ctl("-m", "fast", "stop")
        try:
            time.sleep(2 * float(LEASE[1]))  # every lease ran out
        finally:
            postgres.ctl("start")
        time.sleep(3 * float(LEASE[1]))  # each front renewed, and could have swept after a whole lease of renewals
        with db.connect(database) as conn:
            assert {row["id"] for row in conn.execute("SELECT id FROM fronts").fetchall()} == known
        assert held.result(timeout=60)["type"] == "HostError"  # the call itself ended: the database was away
        wait_for(lambda: rows(database)[0]["state"] == "cancelled", timeout=30, interval=0.2)
    assert _because(database) == [("alice", "cancelled", None)]
    assert not [log for log in logs if "lease had run out" in log.read_text()]


@contextlib.contextmanager
def _tenant_locked(database: str, tenant: str) -> Iterator[None]:
    """The tenant's enqueue lock (queue.enqueue's) held by the test: a craft of the tenant waits in its enqueue."""
    with db.connect(database) as conn:
        conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (TENANT_LOCK, tenant))
        yield


def _enqueue_waiting(database: str) -> bool:
    with db.connect(database) as conn:
        waiting = conn.execute("SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        return bool(waiting.fetchone()["n"])  # type: ignore[index]


def _posted_unread(url: str, token: str, headers: dict[str, str], body: dict[str, object]) -> socket.socket:
    """`body` POSTed to the front on a connection of its own whose answer nobody reads (closing it: the client
    gone)."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    lines = [
        f"POST {parts.path} HTTP/1.1",
        f"Host: {parts.netloc}",
        f"Authorization: Bearer {token}",
        "Accept: application/json, text/event-stream",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
    return sock


def _task_call_cancelled(
    url: str,
    token: str,
    session: dict[str, str],
    asked: tuple[int, str],
    how: str,
    database: str,
    log: Path,
    as_task: bool = True,
) -> None:
    """A craft asked as a task (`asked`: its request id in `session`, its need; `as_task` False: a plain detached
    craft) cancelled while its enqueue waits on the tenant's lock (`how`: by notifications/cancelled, or by its
    connection closed), the lock let go once the front took the cancel (for a connection closed, the front's `log`
    says so)."""
    request_id, need = asked
    craft: dict[str, object] = {"name": "craft", "arguments": {"need": need}, **({"task": {}} if as_task else {})}
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": craft}
    with _tenant_locked(database, "acme"):
        sock = _posted_unread(url, token, session, body)
        wait_for(lambda: _enqueue_waiting(database), timeout=30, interval=0.1)
        if how == "notification":
            params = {"requestId": request_id, "reason": "the agent changed its mind"}
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}
            assert post(url, cancel, token, **session).status_code == 202
        else:
            sock.close()
            wait_for(lambda: f"request {request_id} cancelled, its client went away" in log.read_text())
        time.sleep(0.5)  # the SDK applies a cancel it answered 202 for in its session's own loop
    sock.close()


def _two_crafts_cancelled_before_their_answers(
    flakebot_home: Path, database: str, workdir: Path, how: str, as_task: bool
) -> None:
    """alice's craft cancelled (`how`) before its answer, hers alone: cancelled; then one carol follows too: alice
    leaves it, it goes on for carol. Both of alice's calls audited and counted `cancelled`. `as_task`: asked as a
    task (else detached: no wait, no task)."""
    alice, carol = add_token("alice", "--tenant", "acme"), add_token("carol", "--tenant", "acme")
    log = flakebot_home / "serve.log"
    with serving(database=database, log=log) as url:
        session = Session(url, alice).headers
        shared = call(url, carol, "craft", {"need": "need a word counter"})["run_id"]
        _task_call_cancelled(url, alice, session, (41, "need a csv deduper"), how, database, log, as_task=as_task)
        wait_for(lambda: len(_audited(database)) == 3, timeout=30, interval=0.2)  # carol's, alice's enqueue and end
        _task_call_cancelled(url, alice, session, (42, "need a word counter"), how, database, log, as_task=as_task)
        wait_for(lambda: len(_audited(database)) == 5, timeout=30, interval=0.2)
        states = {handle_of(r): r["state"] for r in rows(database)}
        assert states == {shared: "queued", "job-2": "cancelled"}, (states, _audited(database))
        scraped = metrics(url, add_token("prometheus", "--grant", "metrics")).text
        assert 'flakebot_tool_calls_total{tool="craft",outcome="cancelled"} 2' in scraped, scraped
    assert _audited(database) == [
        ("carol", "enqueued"),
        ("alice", "enqueued"),
        ("alice", "cancelled"),
        ("alice", "joined"),
        ("alice", "left"),
    ]
    crafts = [r for r in audit.read(workdir) if r["method"] == "tools/call" and r["tool"] == "craft"]
    assert [(r["principal"], r["outcome"]) for r in crafts][1:] == [("alice", "cancelled")] * 2, crafts


@pytest.mark.parametrize("how", ["notification", "disconnect"])
def test_a_task_call_cancelled_before_its_answer_leaves_its_job(
    flakebot_home: Path, database: str, workdir: Path, how: str
) -> None:
    """alice asks a craft as a task (tools/call with `task`: its answer is the task id she then polls) and cancels
    the call (notifications/cancelled, or she closes the connection: flakebot.mcp.gone's cancel) after its craft was
    enqueued but before its CreateTaskResult was sent. She never learnt the task id, yet her following was kept: the
    job, hers alone, stayed queued for nobody (a worker would still craft it). Now the call's end retracts its own
    following, as a waited craft's does: her job alone is cancelled; one carol follows too goes on for carol."""
    _two_crafts_cancelled_before_their_answers(flakebot_home, database, workdir, how, as_task=True)


def test_fronts_stalled_together_past_a_lease_take_none_of_them_for_lost(flakebot_home: Path, database: str) -> None:
    """Both fronts stall together past their lease (SIGSTOP: a paused VM they share, a host frozen), alice's craft
    waiting on the second. The first resumed renews its own lease, which nobody swept (every front was stalled), and
    its renewals had held for a whole lease before the stall: it swept at once and took the second, resumed a moment
    later, for lost, cancelling alice's job while her call still waited on a live front. A renewal that comes later
    than the lease's renewals should is a stall of the front itself, as the database away is: the front sweeps only
    once its renewals have held for a whole lease again, by when every live front has renewed."""
    alice = add_token("alice", "--tenant", "acme")
    lease = float(LEASE[1])
    logs = [flakebot_home / "one.log", flakebot_home / "two.log"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # outermost: its call ends with the fronts
        with (
            serving_process(*LEASE, database=database, log=logs[0]) as (_, one),
            serving_process(*LEASE, database=database, log=logs[1]) as (two, front),
        ):
            held = pool.submit(_held, two, alice, "need a csv deduper")
            wait_for(lambda: rows(database), timeout=30, interval=0.2)
            time.sleep(2 * lease)  # each front's renewals have held for a whole lease: either may sweep
            for stalled in (one, front):
                stalled.send_signal(signal.SIGSTOP)
            try:
                time.sleep(2 * lease)  # both leases ran out
            finally:
                one.send_signal(signal.SIGCONT)
                time.sleep(lease / 2)  # the first renews (and swept, before), the second not yet resumed
                front.send_signal(signal.SIGCONT)
            time.sleep(2 * lease)  # the second renewed; the first could have swept since, after a whole lease
            assert [r["state"] for r in rows(database)] == ["queued"], _because(database)
            assert not held.done()
    held.result(timeout=30)
    assert _because(database) == []
    assert not [log for log in logs if "lease had run out" in log.read_text()]


def test_a_worker_stalled_with_the_front_takes_it_for_lost_no_sooner_than_a_front_would(
    flakebot_home: Path, database: str, tmp_path: Path
) -> None:
    """A worker sweeps lost fronts under a front's guard: the worker and the front stall together past the front's
    lease (SIGSTOP: a host frozen), and the worker, resumed a moment before the front, finds the front's lease run
    out. Its look came late: a stall of its own, so it sweeps nothing for a whole lease, by when the front renewed.
    The front's row is the one it had, and it never says its lease had run out."""
    from tests.team.test_worker import LEASE as WORKER_LEASE
    from tests.team.test_worker import listening, worker

    log = flakebot_home / "one.log"
    with (
        serving_process(*LEASE, database=database, log=log) as (_, front),
        worker(database, tmp_path / "worker.log", model="scripted:/nonexistent.json", once=False) as proc,
    ):
        wait_for(lambda: listening(database), timeout=60, interval=0.2)
        with db.connect(database) as conn:
            known = conn.execute("SELECT id FROM fronts").fetchall()
        time.sleep(1.5 * float(WORKER_LEASE))  # the worker's looks have held for a whole lease: it may sweep
        for stalled in (front, proc):
            stalled.send_signal(signal.SIGSTOP)
        try:
            time.sleep(1.5 * float(LEASE[1]))  # the front's lease ran out
        finally:
            proc.send_signal(signal.SIGCONT)
            time.sleep(1.5)  # the worker looks again (every third of its lease), the front not yet resumed
            front.send_signal(signal.SIGCONT)
        time.sleep(float(LEASE[1]) / 2)  # the front renewed
        with db.connect(database) as conn:
            assert conn.execute("SELECT id FROM fronts").fetchall() == known
        assert proc.poll() is None
    assert "lease had run out" not in log.read_text()


@pytest.mark.parametrize("lease", ["0", "-1", "2.9", "nan", "inf", "1e300", "86401"])
def test_a_lease_out_of_range_is_one_line_with_a_fix(flakebot_home: Path, database: str, lease: str) -> None:
    """`serve --lease` took any float at least 3: nan (no comparison holds), inf and 1e300 reached PostgreSQL, whose
    "interval out of range" the front told the admin as the database refusing ("call again in a minute", exit 5, a
    fix that never works), and a lease of a year kept a killed front's waited crafts running for nobody that long.
    Now a lease from 3 s to a day is taken, anything else is a usage error, in one line with a fix, before the
    database is asked anything."""
    done = subprocess.run(
        [*FLAKEBOT, "serve", "--port", "0", "--lease", lease],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, DATABASE_ENV: database},
    )
    said = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(said) == 1, done.stderr
    assert (
        said[0].startswith(f"error: --lease {float(lease):g} is ") and "Fix: pass --lease from 3 to 86400" in said[0]
    ), said
    with db.connect(database) as conn:
        assert conn.execute("SELECT count(*) AS n FROM fronts").fetchone() == {"n": 0}


def test_a_front_whose_role_may_not_hold_a_lease_says_so_at_start(flakebot_home: Path, database: str) -> None:
    """The fronts' role was given the grants of schema 6 (no `fronts` table then) and the owner brought the database
    to 7: the front's first lease was refused, and the admin's terminal said what an agent is told, "the team database
    refused this request now ... call again in a minute", which never works. Now it says the lease was refused, why,
    and the grant that fixes it."""
    from tests.team.test_queue import FRONT_GRANTS, _role

    db.connect(database).close()
    done = subprocess.run(
        [*FLAKEBOT, "serve", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, DATABASE_ENV: _role(database, FRONT_GRANTS)},
    )
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 5 and "refused this front's lease: permission denied for table fronts" in last, last
    assert "Fix: give this role SELECT, INSERT, UPDATE, DELETE on fronts" in last and "[REDACTED]" in last, last


def test_a_front_swept_while_stalled_recovers_and_its_new_calls_are_its_own(flakebot_home: Path, database: str) -> None:
    """The second front stalls (SIGSTOP) past its lease while alice's craft waits on it; the first, live, sweeps it:
    her job, hers alone, is cancelled, as for a killed front. Resumed, the second finds its lease taken (it says so in
    its log, no traceback), answers her call with the job's end, and holds its lease again: bob's craft waited on it
    since is followed as any, through the first front's sweeps."""
    alice, bob = add_token("alice", "--tenant", "acme"), add_token("bob", "--tenant", "acme")
    lease = float(LEASE[1])
    logs = [flakebot_home / "one.log", flakebot_home / "two.log"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        with (
            serving_process(*LEASE, database=database, log=logs[0]),
            serving_process(*LEASE, database=database, log=logs[1]) as (two, front),
        ):
            first = pool.submit(call, two, alice, "craft", {"need": "need a csv deduper", "wait": True})
            wait_for(lambda: rows(database), timeout=30, interval=0.2)
            front.send_signal(signal.SIGSTOP)
            try:
                wait_for(lambda: rows(database)[0]["state"] == "cancelled", timeout=30, interval=0.2)
            finally:
                front.send_signal(signal.SIGCONT)
            assert first.result(timeout=60)["is_error"]  # the job's end as alice now sees it
            wait_for(lambda: "lease had run out" in logs[1].read_text(), timeout=30, interval=0.2)
            second = pool.submit(_held, two, bob, "need a word counter")
            wait_for(lambda: len(rows(database)) == 2, timeout=30, interval=0.2)
            time.sleep(3 * lease)  # the first front swept every third of a lease since
            assert [r["state"] for r in rows(database)] == ["cancelled", "queued"], _because(database)
            assert not second.done()
        second.result(timeout=30)
    assert _because(database) == [("alice", "cancelled", fronts.LOST)]
    served = [log.read_text().split("Shutting down")[0] for log in logs]  # (a stop cuts bob's call: uvicorn's trace)
    assert not [text for text in served if "Traceback" in text or "failed; started again" in text]


def _answered_or_cut(url: str, token: str, need: str) -> None:
    """A craft called with wait: true, however it ends (its answer, the database away, its front stopping)."""
    with contextlib.suppress(Exception):
        call(url, token, "craft", {"need": need, "wait": True})


def test_a_database_restart_within_a_lease_ends_no_following(
    flakebot_home: Path, postgres: Cluster, database: str
) -> None:
    """The database restarts (fast: every connection cut) while two fronts hold a lease and alice's craft waits on
    the first, a task of carol's following the same job on the second. Each front's next renewal reconnects; no
    lease runs out, so no sweep ends anything and neither front says its lease had run out. (alice's call itself
    may end with the cut connection: its own following's end is the call's, not a lost front's.)"""
    alice, carol = add_token("alice", "--tenant", "acme"), add_token("carol", "--tenant", "acme")
    need = "need a csv deduper"
    logs = [flakebot_home / "one.log", flakebot_home / "two.log"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with (
            serving(*LEASE, database=database, log=logs[0]) as one,
            serving(*LEASE, database=database, log=logs[1]) as two,
        ):
            held = pool.submit(_answered_or_cut, one, alice, need)
            wait_for(lambda: rows(database), timeout=30, interval=0.2)
            Session(two, carol).ask("tools/call", {"name": "craft", "arguments": {"need": need}, "task": {}})
            postgres.restart()
            time.sleep(3 * float(LEASE[1]))  # renewed since, and either could have swept
            assert [r["state"] for r in rows(database)] == ["queued"], _because(database)
        held.result(timeout=30)
    assert fronts.LOST not in [because for _, _, because in _because(database)]
    assert not [log for log in logs if "lease had run out" in log.read_text()]


@pytest.mark.parametrize("how", ["notification", "disconnect"])
def test_a_task_call_answered_keeps_its_following_whatever_comes_after(
    flakebot_home: Path, database: str, how: str
) -> None:
    """alice asks a craft as a task and gets its task id; she then cancels that request (too late: it was answered)
    and asks the same need as a task again, a call cancelled before its answer (it joined the job, then retracted its
    own following). Neither may end the following her first call holds: she learnt that task id and polls it. The
    job stays queued for her; her task still reads `working`."""
    alice = add_token("alice", "--tenant", "acme")
    log = flakebot_home / "serve.log"
    need = "need a csv deduper"
    with serving(database=database, log=log) as url:
        session = Session(url, alice)
        created = session.ask("tools/call", {"name": "craft", "arguments": {"need": need}, "task": {}})
        task_id = created["result"]["task"]["taskId"]
        late = {"requestId": session.next, "reason": "too late"}
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": late}
        assert post(url, cancel, alice, **session.headers).status_code == 202
        _task_call_cancelled(url, alice, session.headers, (41, need), how, database, log)
        wait_for(lambda: len(_audited(database)) == 3, timeout=30, interval=0.2)
        assert [r["state"] for r in rows(database)] == ["queued"], _audited(database)
        polled = session.ask("tasks/get", {"taskId": task_id})
        assert polled["result"]["status"] == "working", polled
    assert _audited(database) == [("alice", "enqueued"), ("alice", "joined"), ("alice", "retracted")]


def test_a_task_call_a_stopping_front_cut_before_its_answer_leaves_its_job(flakebot_home: Path, database: str) -> None:
    """alice asks a craft as a task; its enqueue waits (the tenant's lock) while the front stops (SIGTERM), and the
    stop cuts the call after its job was queued, before its CreateTaskResult. A stopping front left the call's
    following to its lease, but a task's following names no front: no sweep ever ends it, and the job, alice's alone,
    of a task id she never learnt, stayed queued for nobody. Now a stopping front ends a cut task call's following
    as any front does (a waited call's it still leaves to its lease). And the call, whose enqueue returned after the
    front's task group ended, logged a traceback ("This task group is not active", from its job's watcher): a
    stopping front now refuses such late work in one line."""
    alice = add_token("alice", "--tenant", "acme")
    log = flakebot_home / "serve.log"
    craft = {"name": "craft", "arguments": {"need": "need a csv deduper"}, "task": {}}
    body = {"jsonrpc": "2.0", "id": 41, "method": "tools/call", "params": craft}
    with serving_process(database=database, log=log) as (url, process):
        session = Session(url, alice).headers
        with _tenant_locked(database, "acme"):
            sock = _posted_unread(url, alice, session, body)
            wait_for(lambda: _enqueue_waiting(database), timeout=30, interval=0.1)
            process.send_signal(signal.SIGTERM)
            # the front's own tasks ended, the SDK's sessions ending: the call is cut as its enqueue returns
            wait_for(lambda: "session manager shutting down" in log.read_text(), timeout=30, interval=0.2)
        process.wait(timeout=30)
        sock.close()
    assert _audited(database) == [("alice", "enqueued"), ("alice", "cancelled")], log.read_text()[-3000:]
    assert [r["state"] for r in rows(database)] == ["cancelled"]
    said = log.read_text()
    assert "Traceback" not in said, said[-3000:]  # "This task group is not active", from the call's watcher
    assert "a call refused: this front is stopping" in said, said[-3000:]


@pytest.mark.parametrize("how", ["notification", "disconnect"])
def test_a_detached_craft_cancelled_before_its_answer_leaves_its_job(
    flakebot_home: Path, database: str, workdir: Path, how: str
) -> None:
    """alice asks a craft (no wait, no task: its answer is the job's run_id) and cancels the call after its craft was
    enqueued (the enqueue, a worker thread, runs to its end) but before its answer. The call then returned with no
    await left, so the SDK dropped its answer for the cancelled request: she never learnt the run_id, yet her
    following was kept (the job, hers alone, queued for nobody), and the call was audited and counted `ok`. Now,
    as a task call's, its end retracts its own following (her job alone is cancelled; one carol follows goes on for
    carol), and it is counted and audited `cancelled`."""
    _two_crafts_cancelled_before_their_answers(flakebot_home, database, workdir, how, as_task=False)


def _read_waiting(database: str) -> bool:
    """Whether a read of the jobs table waits on the test's lock of it."""
    with db.connect(database) as conn:
        waiting = conn.execute("SELECT count(*) AS n FROM pg_locks WHERE relation = 'jobs'::regclass AND NOT granted")
        return bool(waiting.fetchone()["n"])  # type: ignore[index]


def test_a_call_cancelled_while_its_thread_ran_is_counted_and_audited_cancelled(
    flakebot_home: Path, database: str, workdir: Path
) -> None:
    """alice asks `status` of her job and cancels the call while its read of the row runs (the table locked: a worker
    thread the cancel waits for). The call then returned with no await left: the SDK dropped its answer, as it does
    for a cancelled request, while the front audited and counted the call `ok`, an answer nobody got. Now it is
    `cancelled`, as any call ended before its answer."""
    alice = add_token("alice", "--tenant", "acme")
    with serving(database=database) as url:
        job = call(url, alice, "craft", {"need": "need a csv deduper"})["run_id"]
        session = Session(url, alice).headers
        asked = {"name": "status", "arguments": {"run_id": job}}
        body = {"jsonrpc": "2.0", "id": 41, "method": "tools/call", "params": asked}
        time.sleep(1)  # the front's kept read of the row (ROW_FRESH) gone stale: the status reads the table
        with db.connect(database) as conn, conn.transaction():
            conn.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
            sock = _posted_unread(url, alice, session, body)
            wait_for(lambda: _read_waiting(database), timeout=30, interval=0.1)
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 41}}
            assert post(url, cancel, alice, **session).status_code == 202
            time.sleep(0.5)  # the SDK applies a cancel it answered 202 for in its session's own loop
        scraper = add_token("prometheus", "--grant", "metrics")

        def scraped() -> str | None:
            text = metrics(url, scraper).text
            return text if 'flakebot_tool_calls_total{tool="status",outcome="cancelled"} 1' in text else None

        text = wait_for(scraped, timeout=30)
        sock.close()
    assert 'tool="status",outcome="ok"' not in text, text
    statuses = [r["outcome"] for r in audit.read(workdir) if r["method"] == "tools/call" and r["tool"] == "status"]
    assert statuses == ["cancelled"], statuses


def test_a_front_whose_sweep_waits_on_a_tenants_lock_still_renews_its_own_lease(
    flakebot_home: Path, database: str
) -> None:
    """A front (`--lease 3`) sweeps a lost front whose waited following is of tenant acme, while another process
    holds acme's lock (as one stalled inside a transaction does, up to db.IDLE_IN_TRANSACTION). The sweep ran in the
    lease loop, on the front's one connection, so it held up the front's own renewals: its lease ran out, and any
    other sweeper would have taken this live front for lost (its waited calls' jobs cancelled). Now the sweep waits
    on a connection of its own, beside the renewals, and the front's lease stays held; the lost front's following
    ends once the lock is free."""
    from flakebot.team import queue
    from tests.team.test_queue import craft

    with serving(*LEASE, database=database, log=flakebot_home / "serve.log"):
        with db.connect(database, autocommit=True) as conn, db.connect(database, autocommit=True) as holder:
            live = wait_for(lambda: conn.execute("SELECT id FROM fronts").fetchall(), timeout=30, interval=0.2)
            conn.execute(  # a front of the same lease, lost later (once the lock is held)
                "INSERT INTO fronts (id, lease_until, lease_seconds) VALUES ('lost', now() + interval '1 minute', 3)"
            )
            job = queue.enqueue(
                conn, "acme", "alice", craft("need a csv deduper"), principal_id="id-alice", front="lost"
            )
            time.sleep(4)  # the live front's renewals held for its lease: it sweeps at each renewal now
            with holder.transaction():
                holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext('acme'))", (TENANT_LOCK,))
                conn.execute("UPDATE fronts SET lease_until = now() - interval '1 second' WHERE id = 'lost'")
                wait_for(  # the live front's sweep claimed it, and waits on acme's lock
                    lambda: conn.execute(
                        "SELECT lease_until = '-infinity' AS claimed FROM fronts WHERE id = 'lost'"
                    ).fetchone()["claimed"],
                    timeout=10,
                    interval=0.1,
                )
                time.sleep(5)  # longer than the live front's lease
                held = conn.execute(
                    "SELECT lease_until > now() AS held FROM fronts WHERE id = %s", (live[0]["id"],)
                ).fetchone()
                assert held == {"held": True}, "the live front's lease ran out while its sweep waited"
            wait_for(lambda: queue.get(conn, job.job_id, "acme")["state"] == "cancelled", timeout=10, interval=0.2)


def test_a_front_whose_call_waits_on_a_tenants_lock_still_renews_its_own_lease(
    flakebot_home: Path, database: str
) -> None:
    """alice's detached craft waits on her tenant's lock (another process holds it, as one stalled in a transaction
    does) on the front's one connection, where its lease was renewed too: the renewal waited behind the call, and
    the live front's lease (`--lease 3`) ran out for any sweeper to take it for lost. Now the lease is renewed on a
    connection of its own; the call goes on once the lock is free."""
    alice = add_token("alice", "--tenant", "acme")
    with (
        serving(*LEASE, database=database, log=flakebot_home / "serve.log") as url,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
        db.connect(database, autocommit=True) as conn,
        db.connect(database, autocommit=True) as holder,
    ):
        live = wait_for(lambda: conn.execute("SELECT id FROM fronts").fetchall(), timeout=30, interval=0.2)
        with holder.transaction():
            holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext('acme'))", (TENANT_LOCK,))
            detached = pool.submit(call, url, alice, "craft", {"need": "need a csv deduper"})
            wait_for(  # the craft's enqueue waits on acme's lock
                lambda: conn.execute(
                    "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
                ).fetchone()["n"],
                timeout=30,
                interval=0.1,
            )
            time.sleep(5)  # longer than the front's lease
            held = conn.execute("SELECT lease_until > now() AS held FROM fronts WHERE id = %s", (live[0]["id"],))
            assert held.fetchone() == {"held": True}, "the live front's lease ran out while a call waited"
        assert not detached.result(timeout=30)["is_error"]
