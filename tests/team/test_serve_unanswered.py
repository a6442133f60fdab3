"""A task's or detached craft's following that its call's own end could not end (docs/team.md, "A waited craft whose
caller went away"): the call was cut before its answer, and its front was killed, or stopped, before the database
took that end. Real fronts, a real PostgreSQL; the calls posted raw into a 2025-11-25 session (as the SDK's client
would), cancelled by notifications/cancelled. The window is held open by the tenant's lock: the test's two holders
queue around the call's enqueue, so the enqueue goes through and the call's end waits behind the second."""

from __future__ import annotations

import concurrent.futures
import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flakebot.team import db, fronts
from flakebot.team.queue import TENANT_LOCK
from tests.conftest import wait_for
from tests.team.test_front import add_token, post, serving, serving_process
from tests.team.test_serve_followings import LEASE, _because, _posted_unread
from tests.team.test_serve_queue import Session, _audited, rows

pytestmark = pytest.mark.timeout(300)

LOCK = "SELECT pg_advisory_lock(%s, hashtext('acme'))"  # the tenant's lock (queue.lock_tenant's), held by the test


def _waiting(conn: Any) -> list[int]:
    """The backends waiting on an advisory lock (the tenant's: nothing else takes one here)."""
    found = conn.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchall()
    return [int(row["pid"]) for row in found]


@contextlib.contextmanager
def _cut_and_its_end_held(
    url: str, token: str, session: dict[str, str], asked: tuple[int, str], database: str, as_task: bool
) -> Iterator[Any]:
    """A craft of `asked` (its request id in `session`, its need; `as_task`: asked as a task, else detached) cut by
    its client after its enqueue went through but before its answer, its own end (queue.cancel, leave_following)
    waiting on the tenant's lock while the block runs. Yields a connection of the test's."""
    request_id, need = asked
    craft: dict[str, object] = {"name": "craft", "arguments": {"need": need}, **({"task": {}} if as_task else {})}
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": craft}
    with (
        db.connect(database, autocommit=True) as conn,
        db.connect(database, autocommit=True) as first,
        db.connect(database, autocommit=True) as second,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        first.execute(LOCK, (TENANT_LOCK,))
        sock = _posted_unread(url, token, session, body)
        try:
            wait_for(lambda: len(_waiting(conn)) == 1, timeout=30, interval=0.1)  # the enqueue
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}}
            assert post(url, cancel, token, **session).status_code == 202
            time.sleep(0.5)  # the SDK applies a cancel it answered 202 for in its session's own loop
            behind = pool.submit(second.execute, LOCK, (TENANT_LOCK,))  # queued behind the enqueue
            wait_for(lambda: len(_waiting(conn)) == 2, timeout=30, interval=0.1)
            first.execute("SELECT pg_advisory_unlock_all()")
            behind.result(timeout=30)  # the enqueue went through; the call's end waits behind `second` now
            wait_for(lambda: len(_waiting(conn)) == 1, timeout=30, interval=0.1)
            yield conn
        finally:
            second.execute("SELECT pg_advisory_unlock_all()")
            sock.close()


def test_a_task_cut_before_its_answer_whose_front_was_killed_as_it_left_the_job_is_ended_by_a_sweep(
    flakebot_home: Path, database: str
) -> None:
    """alice asks a craft as a task and cancels the call after its enqueue, before its task id was sent; the call's
    end (leaving her job) waits on her tenant's lock when its front is killed (SIGKILL). A task's following named no
    front, so no sweep ended it: her job, of a task id she never learnt, stayed queued for nobody (a worker would
    craft it). It now names its front until the call is answered: the other front's sweep ends it."""
    alice = add_token("alice", "--tenant", "acme")
    with serving(*LEASE, database=database, log=flakebot_home / "two.log"):
        with serving_process(*LEASE, database=database, log=flakebot_home / "one.log") as (one, process):
            session = Session(one, alice).headers
            with _cut_and_its_end_held(one, alice, session, (41, "need a csv deduper"), database, as_task=True):
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=30)
        wait_for(lambda: rows(database)[0]["state"] == "cancelled", timeout=60, interval=0.2)
    assert _because(database) == [("alice", "cancelled", fronts.LOST)]


def test_a_killed_fronts_unanswered_join_is_ended_and_its_answered_task_kept(
    flakebot_home: Path, database: str
) -> None:
    """carol's task is answered by the first front; alice's detached craft of the same need joins her job there and
    is cut before its run_id was sent, its end waiting on the tenant's lock when the front is killed. alice's
    following, named by no front, was never ended (carol's job counted her as a follower for good); now the sweep
    ends alice's alone (she leaves the job) and keeps carol's, whose task id she got: her task still works."""
    alice, carol = add_token("alice", "--tenant", "acme"), add_token("carol", "--tenant", "acme")
    need = "need a csv deduper"
    with serving(*LEASE, database=database, log=flakebot_home / "two.log") as two:
        with serving_process(*LEASE, database=database, log=flakebot_home / "one.log") as (one, process):
            task = Session(one, carol).ask("tools/call", {"name": "craft", "arguments": {"need": need}, "task": {}})
            task_id = task["result"]["task"]["taskId"]
            session = Session(one, alice).headers
            with _cut_and_its_end_held(one, alice, session, (41, need), database, as_task=False):
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=30)
        with db.connect(database) as conn:

            def swept() -> bool:  # the lost front's row removed: its sweep ended all it was to end
                return conn.execute("SELECT count(*) AS n FROM fronts").fetchone()["n"] == 1  # type: ignore[index]

            wait_for(lambda: swept() and _because(database), timeout=60, interval=0.2)
        assert [r["state"] for r in rows(database)] == ["queued"], _audited(database)
        polled = Session(two, carol).ask("tasks/get", {"taskId": task_id})
        assert polled["result"]["status"] == "working", polled
    assert _because(database) == [("alice", "left", fronts.LOST)]


def test_a_stopping_front_ends_once_more_what_the_database_refused_to_end(flakebot_home: Path, database: str) -> None:
    """alice's task call is cut before its answer and its end is refused twice (its connection cut as it waited:
    the database away, for the front); the front keeps it to try at its next renewal, a third of its lease (200 s)
    away, and is stopped (SIGTERM) first. It went without trying: her job stayed queued until its lease ran out
    (and before, named by no front, for good). Now a stopping front tries once more, and her job is cancelled as
    the front exits."""
    with _a_call_whose_end_was_refused(flakebot_home, database) as (process, log):
        time.sleep(1)
        assert [r["state"] for r in rows(database)] == ["queued"]
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    assert [r["state"] for r in rows(database)] == ["cancelled"], log.read_text()[-3000:]
    assert _audited(database) == [("alice", "enqueued"), ("alice", "cancelled")]


def test_a_stopping_front_that_could_not_end_a_following_in_time_says_so(flakebot_home: Path, database: str) -> None:
    """As above, but the tenant's lock is held as the front stops, so its last try at alice's following waits past
    its 10 s and is given up. The front took the whole list out to try it, so it counted none left and said nothing:
    the log did not tell the admin that her job waits for the front's lease to run out. Now it says one is left; and
    that following still names the front, unanswered, for the sweep."""
    with _a_call_whose_end_was_refused(flakebot_home, database) as (process, log):
        with db.connect(database, autocommit=True) as holder:
            holder.execute(LOCK, (TENANT_LOCK,))
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
    assert "1 following(s) left for this front's lease to end" in log.read_text(), log.read_text()[-3000:]
    assert [r["state"] for r in rows(database)] == ["queued"]
    with db.connect(database) as conn:
        held = conn.execute("SELECT detail->>'answering' AS front FROM audit WHERE action = 'enqueued'").fetchone()
        assert held is not None and held["front"] and _audited(database) == [("alice", "enqueued")]


@contextlib.contextmanager
def _a_call_whose_end_was_refused(flakebot_home: Path, database: str) -> Iterator[tuple[Any, Path]]:
    """A front (--lease 600) and its log: alice's task call cut before its answer, the front's end of it refused
    twice (its connection terminated as it waited on the tenant's lock: the database away, for the front), made
    again once, then given up for now ("not left yet")."""
    alice = add_token("alice", "--tenant", "acme")
    log = flakebot_home / "serve.log"
    with serving_process("--lease", "600", database=database, log=log) as (url, process):
        session = Session(url, alice).headers
        with _cut_and_its_end_held(url, alice, session, (41, "need a csv deduper"), database, as_task=True) as conn:
            cut: set[int] = set()
            for _ in range(2):
                waits = wait_for(lambda: set(_waiting(conn)) - cut, timeout=30, interval=0.1)
                cut.update(waits)
                conn.execute("SELECT pg_terminate_backend(%s)", (min(waits),))
            wait_for(lambda: "not left yet" in log.read_text(), timeout=30, interval=0.2)
        yield process, log
