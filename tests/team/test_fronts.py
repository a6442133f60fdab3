"""Fronts' leases on a real PostgreSQL (flakebot.team.fronts): a front whose lease ran out has its waited calls'
followings ended by another front's sweep, through queue.cancel's usual rules; a task's following is kept. A lease
is run out here by writing its time, as a lost front leaves it: no test sleeps a lease away."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from flakebot.team import db, fronts, queue
from tests.conftest import wait_for
from tests.team.test_queue import craft

LEASE = 30.0


@pytest.fixture
def conn(database: str) -> Iterator[Any]:
    with db.connect(database, autocommit=True) as connection:
        yield connection


def lapse(conn: Any, front: str) -> None:
    """`front`'s lease ran out a second ago (it was killed, and nobody renewed it since)."""
    conn.execute("UPDATE fronts SET lease_until = now() - interval '1 second' WHERE id = %s", (front,))


def actions(conn: Any) -> list[tuple[str, str, Any]]:
    rows = conn.execute(
        "SELECT principal, action, detail->>'because' AS because FROM audit "
        "WHERE action IN ('left', 'cancelled', 'retracted') ORDER BY id"
    ).fetchall()
    return [(r["principal"], r["action"], r["because"]) for r in rows]


def state(conn: Any, job_id: int) -> str:
    row = queue.get(conn, job_id, "acme")
    assert row is not None
    return str(row["state"])


def test_a_lost_fronts_waited_following_ends_its_job_when_none_other_follows_it(conn: Any) -> None:
    lost, live = "front-a", "front-b"
    assert not fronts.hold(conn, lost, LEASE) and fronts.hold(conn, lost, LEASE)  # made, then renewed
    fronts.hold(conn, live, LEASE)
    alone = queue.enqueue(conn, "acme", "alice", craft("need a csv deduper"), principal_id="id-alice", front=lost)
    elsewhere = queue.enqueue(conn, "acme", "alice", craft("need a word counter"), principal_id="id-alice", front=live)
    assert fronts.sweep(conn) == []  # every lease held: nothing is lost
    lapse(conn, lost)
    changed = fronts.sweep(conn)
    assert [row["id"] for row in changed] == [alone.job_id]
    assert (state(conn, alone.job_id), state(conn, elsewhere.job_id)) == ("cancelled", "queued")
    assert actions(conn) == [("alice", "cancelled", fronts.LOST)]
    assert fronts.sweep(conn) == [] and actions(conn) == [("alice", "cancelled", fronts.LOST)]  # once
    assert not fronts.hold(conn, lost, LEASE)  # it comes back: told that it was taken for lost


def test_a_lost_fronts_waited_following_leaves_a_job_a_task_or_another_front_still_follows(conn: Any) -> None:
    """alice waited on the lost front for two jobs: carol follows one by a task (no front: it outlives any), alice
    herself the other by a waited call on a live front. Each goes on; only the lost front's followings end."""
    lost, live = "front-a", "front-b"
    fronts.hold(conn, lost, LEASE)
    fronts.hold(conn, live, LEASE)
    shared = queue.enqueue(conn, "acme", "alice", craft("need a csv deduper"), principal_id="id-alice", front=lost)
    queue.enqueue(conn, "acme", "carol", craft("need a csv deduper"), principal_id="id-carol")  # her task
    twice = queue.enqueue(conn, "acme", "alice", craft("need a word counter"), principal_id="id-alice", front=lost)
    queue.enqueue(conn, "acme", "alice", craft("need a word counter"), principal_id="id-alice", front=live)
    lapse(conn, lost)
    fronts.sweep(conn)
    assert (state(conn, shared.job_id), state(conn, twice.job_id)) == ("queued", "queued")
    assert actions(conn) == [("alice", "left", fronts.LOST), ("alice", "retracted", fronts.LOST)]
    assert conn.execute("SELECT id FROM fronts").fetchall() == [{"id": live}]
    lapse(conn, live)  # the live front stops too, and its lease runs out: alice's last following of the second job ends
    fronts.sweep(conn)
    assert state(conn, twice.job_id) == "cancelled" and state(conn, shared.job_id) == "queued"
    assert actions(conn)[-1] == ("alice", "cancelled", fronts.LOST)
    assert conn.execute("SELECT id FROM fronts").fetchall() == []


def test_a_sweeper_takes_no_front_for_lost_whose_lease_ran_out_within_a_stall_it_could_not_see(
    conn: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker (lease 24 s, a look every 8 s) and a front (lease 3 s) paused together 3.5 s: the worker's look comes
    late by under a sixth of its lease, so its guard holds, while the front's lease ran out and it renews only as it
    resumes. The worker's sweep came first and took the live front for lost (with --lease 60 and fronts' 30 s, as
    the defaults are, a pause of 25 s did the same); a sweeper now takes only fronts whose lease ran out longer ago
    than the stall it cannot see (half its lease)."""
    clock = [1000.0]
    monkeypatch.setattr(fronts.time, "monotonic", lambda: clock[0])
    guard = fronts.SweepGuard(24.0, "worker w1")
    for _ in range(4):  # its looks held on time for a whole lease
        clock[0] += guard.pause()
        assert guard.held() == (clock[0] - 1008.0 >= 24.0)
    assert guard.held()
    fronts.hold(conn, "front-a", 3.0)
    job = queue.enqueue(conn, "acme", "alice", craft("need a csv deduper"), principal_id="id-alice", front="front-a")
    clock[0] += guard.pause() + 3.5  # paused: its look is 3.5 s late, the front's lease ran out 1 s before now
    conn.execute("UPDATE fronts SET lease_until = now() - interval '1 second'")
    assert guard.held(), "a stall of 3.5 s is within what the guard takes as on time"
    assert fronts.sweep(conn, grace=guard.grace) == [] and state(conn, job.job_id) == "queued"
    assert fronts.hold(conn, "front-a", 3.0)  # it resumes: renewed, never taken for lost
    conn.execute("UPDATE fronts SET lease_until = now() - make_interval(secs => %s)", (guard.grace + 1,))
    assert [row["id"] for row in fronts.sweep(conn, grace=guard.grace)] == [job.job_id]  # killed: past the grace


def test_a_lease_that_was_renewed_before_the_sweep_keeps_its_followings(conn: Any) -> None:
    """A front stalled past its lease that renews before any sweep is live again: nothing of it ends."""
    fronts.hold(conn, "front-a", LEASE)
    job = queue.enqueue(conn, "acme", "alice", craft("need a csv deduper"), principal_id="id-alice", front="front-a")
    lapse(conn, "front-a")
    assert fronts.hold(conn, "front-a", LEASE)
    assert fronts.sweep(conn) == [] and state(conn, job.job_id) == "queued" and actions(conn) == []


def test_a_waited_call_a_front_takes_after_its_lease_ran_out_is_not_swept_as_the_lost_fronts(database: str) -> None:
    """A front stalled past its lease (SIGSTOP, its VM paused) and resumed before anyone swept it takes a waited
    craft before its lease loop renews (a request that waited in its socket's backlog). That call's following named a
    front whose lease had run out, so the next sweep ended it as a lost front's and cancelled alice's job while her
    call waited on a live front. A waited call's enqueue now renews its front's lease with it."""
    from flakebot.pipeline.request import RunRequest
    from flakebot.team.frontqueue import FrontQueue
    from flakebot.team.tokens import Principal

    alice = Principal("alice", "id-alice", "acme", calls_per_minute=60, concurrent_crafts=2, created=0.0)
    front = FrontQueue(database, LEASE)
    front.connect()
    try:
        with db.connect(database, autocommit=True) as conn:
            lapse(conn, front.front)  # stalled past its lease; nobody swept it yet
            job = front.enqueue(alice, RunRequest(need="need a csv deduper"), waited=True).job_id
            assert fronts.sweep(conn) == []
            assert state(conn, job) == "queued" and actions(conn) == []
    finally:
        front.close()


@contextlib.contextmanager
def _sweeping_behind_the_tenants_lock(database: str) -> Iterator[list[list[dict[str, Any]]]]:
    """A sweep on a connection of its own, held up at its first cancel: the test holds acme's lock (a cancel's, as an
    enqueue's) until the block ends. What it changed, once it ended."""
    import threading

    from tests.team.test_serve_followings import _enqueue_waiting, _tenant_locked

    changed: list[list[dict[str, Any]]] = []

    def sweeper() -> None:
        with db.connect(database, autocommit=True) as own:
            changed.append(fronts.sweep(own))

    thread = threading.Thread(target=sweeper)
    with _tenant_locked(database, "acme"):
        thread.start()
        wait_for(lambda: _enqueue_waiting(database), timeout=30, interval=0.05)  # the sweep waits in its cancel
        yield changed
    thread.join(timeout=30)
    assert changed, "the sweep did not end"


def test_a_front_renewing_inside_a_sweeps_window_is_told_it_was_swept(conn: Any, database: str) -> None:
    """front-a stalled past its lease and renews in the window between a sweep's finding it lost and the end of its
    followings (the sweep waits on the tenant's lock here). The sweep only read the lease, so the renewal held: the
    front was told nothing, and its caller's job was cancelled under it. Now the sweep claims the front's row in the
    statement that finds it lost: the renewal finds it claimed, and says so (the front holds a lease again under a
    new identity); the following is ended as the lost front's, and the claimed row removed."""
    fronts.hold(conn, "front-a", LEASE)
    job = queue.enqueue(conn, "acme", "alice", craft("need a csv deduper"), principal_id="id-alice", front="front-a")
    lapse(conn, "front-a")
    with _sweeping_behind_the_tenants_lock(database) as changed:
        assert not fronts.hold(conn, "front-a", LEASE)  # its row claimed: neither renewed nor made again
    assert [row["id"] for row in changed[0]] == [job.job_id]
    assert state(conn, job.job_id) == "cancelled" and actions(conn) == [("alice", "cancelled", fronts.LOST)]
    assert conn.execute("SELECT id FROM fronts").fetchall() == []


def test_a_front_swept_while_it_stalled_holds_a_lease_again_and_its_later_calls_are_its_own(database: str) -> None:
    """A FrontQueue swept as lost (its renewal inside the sweep's window): hold_lease says so and the front holds a
    lease under a new identity; a waited call it takes then names that identity, and the sweep, ending, ends only
    the lost identity's following."""
    from flakebot.pipeline.request import RunRequest
    from flakebot.team.frontqueue import FrontQueue
    from flakebot.team.tokens import Principal

    alice = Principal("alice", "id-alice", "acme", calls_per_minute=60, concurrent_crafts=2, created=0.0)
    front = FrontQueue(database, LEASE)
    front.connect()
    try:
        with db.connect(database, autocommit=True) as conn:
            first = front.enqueue(alice, RunRequest(need="need a csv deduper"), waited=True).job_id
            lost = front.front
            lapse(conn, lost)
            with _sweeping_behind_the_tenants_lock(database):
                assert not front.hold_lease() and front.front != lost
                assert front.hold_lease()  # held again, as the new identity
            later = front.enqueue(alice, RunRequest(need="need a word counter"), waited=True).job_id
            assert (state(conn, first), state(conn, later)) == ("cancelled", "queued")
            assert fronts.sweep(conn) == [] and actions(conn) == [("alice", "cancelled", fronts.LOST)]
            assert conn.execute("SELECT id FROM fronts").fetchall() == [{"id": front.front}]
    finally:
        front.close()


def test_two_fronts_sweeping_one_lost_front_at_once_end_each_following_once(conn: Any, database: str) -> None:
    """Two live fronts sweep the same lost front at the same moment (each on its own connection): every following is
    ended once (one audit row each), a job two of the lost front's callers followed cancelled once, and the lost
    front's row removed."""
    import threading

    fronts.hold(conn, "lost", LEASE)
    queue.set_quota(conn, "acme", max_in_flight=100, max_per_day=100)
    jobs = []
    for n in range(20):
        need = f"need a csv deduper number {n}"
        for who in ("alice", "bob"):
            jobs.append(queue.enqueue(conn, "acme", who, craft(need), principal_id=f"id-{who}", front="lost").job_id)
    lapse(conn, "lost")
    start = threading.Barrier(2)
    changed: list[list[dict[str, Any]]] = []

    def sweeper() -> None:
        with db.connect(database, autocommit=True) as own:
            start.wait()
            changed.append(fronts.sweep(own))

    threads = [threading.Thread(target=sweeper) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(changed) == 2
    assert sorted(action for _, action, _ in actions(conn)) == ["cancelled"] * 20 + ["left"] * 20
    assert {state(conn, job) for job in jobs} == {"cancelled"}
    assert conn.execute("SELECT id FROM fronts").fetchall() == []


def test_a_sweep_counts_no_revoked_follower_and_ends_nothing_for_one(conn: Any) -> None:
    """alice's token was revoked (the sweeping front's store says so) and bob follows the same job, both by waited
    calls on the lost front: bob's is the last live following, so the job is cancelled as his, and nothing is written
    for alice (a revoked token follows nothing: the front's look ends hers)."""
    fronts.hold(conn, "lost", LEASE)
    job = queue.enqueue(conn, "acme", "alice", craft("need a csv deduper"), principal_id="id-alice", front="lost")
    queue.enqueue(conn, "acme", "bob", craft("need a csv deduper"), principal_id="id-bob", front="lost")
    lapse(conn, "lost")
    assert [row["id"] for row in fronts.sweep(conn, revoked={"id-alice"})] == [job.job_id]
    assert state(conn, job.job_id) == "cancelled" and actions(conn) == [("bob", "cancelled", fronts.LOST)]


def test_a_sweeper_with_a_shorter_lease_takes_no_front_for_lost_before_that_fronts_own_lease(database: str) -> None:
    """The database was away longer than every front's lease (each ran out); back, a live front renews within a
    third of its own lease. A `flakebot worker --lease 3` beside fronts of `--lease 20` swept after its own looks
    held for 3 s: it took the live front for lost (its caller's job cancelled under it), though the docs only asked
    for a longer worker lease and nothing refused a shorter one. A front's row now says its lease, and a sweeper
    takes a front for lost only once its own looks have held for that front's lease: the front of 3 s is swept, the
    front of 20 s is not, and renews."""
    from flakebot.pipeline.request import RunRequest
    from flakebot.team.frontqueue import FrontQueue
    from flakebot.team.tokens import Principal
    from flakebot.team.worker import FrontSweeps, Worker

    alice = Principal("alice", "id-alice", "acme", calls_per_minute=60, concurrent_crafts=2, created=0.0)
    slow, quick = FrontQueue(database, 20.0), FrontQueue(database, 3.0)
    slow.connect()
    quick.connect()
    sweeps = FrontSweeps(Worker(database, crafts=lambda job, sink: {}, lease_seconds=3.0))
    try:
        with db.connect(database, autocommit=True) as conn:
            live = slow.enqueue(alice, RunRequest(need="need a csv deduper"), waited=True).job_id
            lost = quick.enqueue(alice, RunRequest(need="need a word counter"), waited=True).job_id
            lapse(conn, slow.front)  # the database was away: both leases ran out
            lapse(conn, quick.front)
            sweeps.start()
            wait_for(lambda: state(conn, lost) == "cancelled", timeout=15)
            assert state(conn, live) == "queued"  # the same sweep used to take it too
            assert slow.hold_lease()  # it renews, within a third of its lease: it was live, never swept
            assert state(conn, live) == "queued"
    finally:
        sweeps.stop()
        slow.close()
        quick.close()


def test_a_front_a_sweeper_claimed_and_died_on_is_swept_by_the_next_whatever_its_lease(conn: Any) -> None:
    """A sweep claimed a front of a day's lease (its row at -infinity) and died before ending its followings: the
    next sweep, by a sweeper whose own looks held for 3 s only, ends them and removes the row (the claim already
    said the front is over: no renewal of it can come)."""
    fronts.hold(conn, "front-a", 86400.0)
    job = queue.enqueue(conn, "acme", "alice", craft("need a csv deduper"), principal_id="id-alice", front="front-a")
    conn.execute(f"UPDATE fronts SET lease_until = {fronts.SWEPT} WHERE id = 'front-a'")  # claimed, then it died
    assert [row["id"] for row in fronts.sweep(conn, held_for=3.0)] == [job.job_id]
    assert state(conn, job.job_id) == "cancelled" and conn.execute("SELECT id FROM fronts").fetchall() == []


def test_a_lost_fronts_task_following_ends_until_its_id_was_answered_and_never_after(database: str) -> None:
    """A task's or detached craft's following named no front: a front killed after its enqueue but before the call
    sent the job's id (or whose end of that following the database refused) left it for nobody to end, the job,
    alice's alone, queued for nobody. It now names its front until the call is answered (FrontQueue.answered): a
    sweep ends it before, as a waited call's, and never after, even as a join of another principal's job. A front
    already claimed by a sweep cannot answer: the call fails, and the sweep ends the following."""
    from flakebot.errors import HostError
    from flakebot.pipeline.request import RunRequest
    from flakebot.team.frontqueue import FrontQueue
    from flakebot.team.tokens import Principal

    alice = Principal("alice", "id-alice", "acme", calls_per_minute=60, concurrent_crafts=4, created=0.0)
    carol = Principal("carol", "id-carol", "acme", calls_per_minute=60, concurrent_crafts=4, created=0.0)
    front = FrontQueue(database, LEASE)
    front.connect()
    try:
        with db.connect(database, autocommit=True) as conn:
            unanswered = front.enqueue(alice, RunRequest(need="need a csv deduper"))
            answered = front.enqueue(alice, RunRequest(need="need a word counter"))
            front.answered(alice, answered)
            shared = front.enqueue(carol, RunRequest(need="need a json linter"))
            front.answered(carol, shared)
            joined = front.enqueue(alice, RunRequest(need="need a json linter"))  # alice's join, never answered
            late = front.enqueue(alice, RunRequest(need="need a log tailer"))
            assert joined.joined and joined.job_id == shared.job_id
            lapse(conn, front.front)
            assert fronts.sweep(conn)  # claimed: its unanswered followings ended
            with pytest.raises(HostError):
                front.answered(alice, late)  # too late: its caller is told nothing of the job
            states = [state(conn, e.job_id) for e in (unanswered, answered, shared, late)]
            assert states == ["cancelled", "queued", "queued", "cancelled"], actions(conn)
            assert actions(conn) == [
                ("alice", "cancelled", fronts.LOST),
                ("alice", "left", fronts.LOST),
                ("alice", "cancelled", fronts.LOST),
            ]
    finally:
        front.close()


def test_a_lost_fronts_unanswered_join_of_a_job_its_caller_follows_by_an_answered_task_is_retracted_alone(
    conn: Any,
) -> None:
    """alice follows a job by a task answered through a live front, and joins it again through a front lost before
    that join was answered (and once more by a waited call there): the sweep ends the lost front's two followings
    alone (`retracted`), never the task whose id she got; the job goes on, and a second sweep changes nothing."""
    lost, live = "front-a", "front-b"
    fronts.hold(conn, lost, LEASE)
    fronts.hold(conn, live, LEASE)
    need = craft("need a csv deduper")
    task = queue.enqueue(conn, "acme", "alice", need, principal_id="id-alice", answering=live)
    assert queue.answered(conn, live, LEASE, "acme", "alice", "id-alice", task.job_id, task.following)
    queue.enqueue(conn, "acme", "alice", need, principal_id="id-alice", answering=lost)  # never answered
    queue.enqueue(conn, "acme", "alice", need, principal_id="id-alice", front=lost)  # a waited call there
    lapse(conn, lost)
    fronts.sweep(conn)
    assert state(conn, task.job_id) == "queued"
    assert actions(conn) == [("alice", "retracted", fronts.LOST)] * 2
    assert fronts.sweep(conn) == [] and len(actions(conn)) == 2


def test_an_answered_row_forged_by_another_principal_or_before_the_following_keeps_no_unanswered_following(
    conn: Any,
) -> None:
    """The role workers use may INSERT audit rows of any action. An `answered` row naming alice's unanswered
    following, written by carol (another principal of her tenant), or written before that following existed (its
    id guessed ahead, as a replay would), kept it from the lost front's sweep: her job, whose id she never got, ran
    for nobody. The sweep now takes only an `answered` row of the following's own principal, written after it."""
    lost = "front-a"
    fronts.hold(conn, lost, LEASE)
    forged = queue.enqueue(conn, "acme", "alice", craft("need a csv deduper"), principal_id="id-alice", answering=lost)
    assert queue.answered(
        conn, lost, LEASE, "acme", "carol", "id-carol", forged.job_id, forged.following
    )  # carol's, not alice's
    ahead = queue.enqueue(conn, "acme", "alice", craft("need a word counter"), principal_id="id-alice", answering=lost)
    assert queue.answered(
        conn, lost, LEASE, "acme", "alice", "id-alice", ahead.job_id, ahead.following
    )  # answered, as it should be
    guessed = int(conn.execute("SELECT max(id) AS n FROM audit").fetchone()["n"]) + 2  # the join's id, written first
    assert queue.answered(conn, lost, LEASE, "acme", "alice", "id-alice", ahead.job_id, guessed)
    join = queue.enqueue(conn, "acme", "alice", craft("need a word counter"), principal_id="id-alice", answering=lost)
    assert join.following == guessed and join.joined
    lapse(conn, lost)
    fronts.sweep(conn)
    assert (state(conn, forged.job_id), state(conn, ahead.job_id)) == ("cancelled", "queued")
    assert actions(conn) == [("alice", "cancelled", fronts.LOST), ("alice", "retracted", fronts.LOST)]


def test_an_enqueue_waiting_on_its_tenants_lock_holds_no_lock_on_its_fronts_row(database: str) -> None:
    """Every enqueue through a front renews its lease with it; one that renewed first and then waited on its
    tenant's lock (held up to 15 s by a process stalled in a transaction) held its front's row all that time, and the
    front's own renewals, on their own connection, waited behind it. The tenant's lock is taken first: the row is
    free while the enqueue waits, and the front's renewal goes through at once."""
    import concurrent.futures

    from flakebot.pipeline.request import RunRequest
    from flakebot.team.frontqueue import FrontQueue
    from flakebot.team.tokens import Principal

    alice = Principal("alice", "id-alice", "acme", calls_per_minute=60, concurrent_crafts=4, created=0.0)
    front = FrontQueue(database, LEASE)
    front.connect()
    try:
        with (
            concurrent.futures.ThreadPoolExecutor(1) as pool,  # left last: the holder's lock goes with its connection
            db.connect(database, autocommit=True) as holder,
            db.connect(database, autocommit=True) as renewal,
        ):
            holder.execute("SELECT pg_advisory_lock(%s, hashtext('acme'))", (queue.TENANT_LOCK,))
            asked = pool.submit(front.enqueue, alice, RunRequest(need="need a csv deduper"))
            waiting = "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            wait_for(lambda: holder.execute(waiting).fetchone()["n"] == 1, timeout=30, interval=0.1)
            renewal.execute("SET lock_timeout = '2s'")
            assert fronts.renew(renewal, front.front, LEASE)  # not behind the waiting enqueue
            holder.execute("SELECT pg_advisory_unlock_all()")
            assert not asked.result(timeout=30).joined
    finally:
        front.close()


class _AcknowledgementLost:
    """A front's connection to the database whose first transaction the database commits, after which the connection
    drops before its answer reaches the front: closed, and psycopg.OperationalError raised from the commit, as libpq
    raises it for a server gone between the COMMIT and its reply. `drops`: shared by every connection so wrapped
    (the front's own reconnection too), how many such losses are left."""

    def __init__(self, conn: Any, drops: list[int]) -> None:
        self._conn, self._drops, self._depth = conn, drops, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        import psycopg

        self._depth += 1
        try:
            with self._conn.transaction() as transaction:
                yield transaction
        finally:
            self._depth -= 1
        if self._depth == 0 and self._drops[0] > 0:  # committed: its acknowledgement never arrives
            self._drops[0] -= 1
            self._conn.close()
            raise psycopg.OperationalError("server closed the connection unexpectedly")


@pytest.mark.parametrize("waited", [True, False], ids=["waited", "task"])
def test_an_enqueue_whose_acknowledgement_was_lost_is_sent_again_as_one_following_its_calls_end_ends(
    database: str, monkeypatch: pytest.MonkeyPatch, waited: bool
) -> None:
    """The database committed a call's enqueue and the connection dropped before its answer: the front makes its
    connection again and sends the enqueue again (FrontQueue._call). That wrote a second following: the call held
    only the second, so its end (a waited call whose client went away, a task's before its id was sent) retracted it
    alone, and the job, alice's alone, went on for nobody until the front's loss. The call's key now finds the first
    send's following: one following, and the call's end cancels the job."""
    from flakebot.pipeline.request import RunRequest
    from flakebot.team.frontqueue import FrontQueue
    from flakebot.team.tokens import Principal

    alice = Principal("alice", "id-alice", "acme", calls_per_minute=60, concurrent_crafts=2, created=0.0)
    connect, drops = db.connect, [0]
    monkeypatch.setattr(db, "connect", lambda *args, **kwargs: _AcknowledgementLost(connect(*args, **kwargs), drops))
    front = FrontQueue(database, LEASE)
    front.connect()
    try:
        with connect(database, autocommit=True) as conn:
            drops[0] = 1
            enqueued = front.enqueue(alice, RunRequest(need="need a csv deduper"), waited=waited)
            assert drops == [0]  # the first send was committed, then its answer lost
            rows = conn.execute(
                "SELECT id, job FROM audit WHERE action IN ('enqueued', 'joined') ORDER BY id"
            ).fetchall()
            assert rows == [{"id": enqueued.following, "job": enqueued.job_id}]
            assert (enqueued.joined, enqueued.state, enqueued.front) == (False, "queued", front.front)
            ended = front.cancel(alice, enqueued.job_id, following=enqueued.following)  # the call's end
            assert ended is not None and ended["state"] == "cancelled"
            assert state(conn, enqueued.job_id) == "cancelled" and actions(conn) == [("alice", "cancelled", None)]
    finally:
        front.close()


class _SweptAfterCommit(_AcknowledgementLost):
    """A lost acknowledgement (as _AcknowledgementLost) after which, before the front sends the enqueue again, another
    front takes this one for lost and sweeps it (its lease run out while the database was away): the first send's
    following is ended before the resend looks for it."""

    def __init__(self, conn: Any, drops: list[int], sweep: list[Any]) -> None:
        super().__init__(conn, drops)
        self._sweep = sweep

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        try:
            with super().transaction() as transaction:
                yield transaction
        except Exception:
            if self._sweep:
                self._sweep.pop()()
            raise


@pytest.mark.parametrize("retracted", [True, False], ids=["retracted", "claimed-only"])
@pytest.mark.parametrize("waited", [True, False], ids=["waited", "task"])
def test_an_enqueue_sent_again_after_its_front_was_swept_gets_a_live_following_not_the_swept_one(
    database: str, monkeypatch: pytest.MonkeyPatch, waited: bool, retracted: bool
) -> None:
    """The first send committed, its acknowledgement was lost, and before the resend the front was swept as lost: its
    row claimed and (`retracted`) its following retracted, the job (alice's alone) cancelled; or the sweep's
    retractions still to come. The resend finds the front's row claimed, takes a new identity and enqueues again with
    the same key: it must not hand back the swept identity's following (of a cancelled job, or one the sweep is about
    to end: a waited call would report 'cancelled' for a craft nobody cancelled), but queue the craft afresh, held by
    the front's new identity, which the sweep leaves alone."""
    from flakebot.pipeline.request import RunRequest
    from flakebot.team.frontqueue import FrontQueue
    from flakebot.team.tokens import Principal

    alice = Principal("alice", "id-alice", "acme", calls_per_minute=60, concurrent_crafts=2, created=0.0)
    connect, drops, sweep = db.connect, [0], []  # type: ignore[var-annotated]
    monkeypatch.setattr(
        db, "connect", lambda *args, **kwargs: _SweptAfterCommit(connect(*args, **kwargs), drops, sweep)
    )
    front = FrontQueue(database, LEASE)
    front.connect()
    try:
        with connect(database, autocommit=True) as conn:
            lost = front.front

            def swept() -> None:
                lapse(conn, lost)
                if retracted:
                    assert [row["state"] for row in fronts.sweep(conn)] == ["cancelled"]
                else:  # claimed in the sweep's first statement; its retractions not yet run
                    conn.execute(f"UPDATE fronts SET lease_until = {fronts.SWEPT} WHERE id = %s", (lost,))

            drops[0], sweep[:] = 1, [swept]
            enqueued = front.enqueue(alice, RunRequest(need="need a csv deduper"), waited=waited)
            assert drops == [0] and sweep == [] and front.front != lost  # committed, lost, swept, a new identity
            fronts.sweep(conn)  # the sweep's retractions done (or nothing left to do)
            assert (enqueued.state, enqueued.front) == ("queued", front.front)
            assert state(conn, enqueued.job_id) == "queued"
            ended = front.cancel(alice, enqueued.job_id, following=enqueued.following)  # the call's end
            assert ended is not None and ended["state"] == "cancelled"
    finally:
        front.close()


class _AwayAfterCommit(_AcknowledgementLost):
    """A lost acknowledgement (as _AcknowledgementLost), then the database away for the resend too: each of the next
    `away` transactions (shared, as `drops`) fails as it begins, its connection closed, as libpq fails a statement
    sent to a server gone."""

    def __init__(self, conn: Any, drops: list[int], away: list[int]) -> None:
        super().__init__(conn, drops)
        self._away = away

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        import psycopg

        if self._away[0] > 0 and self._drops[0] == 0:
            self._away[0] -= 1
            self._conn.close()
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        with super().transaction() as transaction:
            yield transaction


@pytest.mark.parametrize("swept", [False, True], ids=["renewed", "swept-first"])
@pytest.mark.parametrize("shared", [False, True], ids=["alone", "shared"])
@pytest.mark.parametrize("waited", [True, False], ids=["waited", "task"])
def test_an_enqueue_whose_every_send_failed_after_the_first_committed_ends_that_following_at_the_next_renewal(
    flakebot_home: Any, database: str, monkeypatch: pytest.MonkeyPatch, waited: bool, shared: bool, swept: bool
) -> None:
    """The database committed a call's enqueue, the connection dropped before its answer, and the resend failed too
    (the database away longer): the call fails, its caller never got the job's id, and the following the first send
    wrote was held by no call (only the front's loss ended it: the job, alice's alone, queued for nobody). Now the
    front remembers the call's key and, at its next renewal once the database answers (TeamMCP.end_unended), ends
    that following as the call's end would: the job cancelled when alice alone followed it; `shared`, bob's following
    of it (a task answered) untouched and the job goes on for him. Once: the front's sweep as lost, after (`renewed`)
    or before (`swept-first`: its end then finds it ended), ends nothing again."""
    from flakebot import config
    from flakebot.errors import HostError
    from flakebot.mcp.front import TeamMCP
    from flakebot.pipeline.request import RunRequest
    from flakebot.team.admission import MemoryAdmission
    from flakebot.team.frontqueue import FrontQueue
    from flakebot.team.tokens import Principal, TokenStore

    alice = Principal("alice", "id-alice", "acme", calls_per_minute=60, concurrent_crafts=2, created=0.0)
    connect, drops, away = db.connect, [0], [0]
    monkeypatch.setattr(db, "connect", lambda *args, **kwargs: _AwayAfterCommit(connect(*args, **kwargs), drops, away))
    settings = config.load()
    front = FrontQueue(database, LEASE)
    front.connect()
    team = TeamMCP(settings, [], TokenStore(settings.path("workdir")), MemoryAdmission(), front)
    need = RunRequest(need="need a csv deduper")
    try:
        with connect(database, autocommit=True) as conn:
            theirs = queue.enqueue(conn, "acme", "bob", need, principal_id="id-bob") if shared else None
            drops[0], away[0] = 1, 1
            with pytest.raises(HostError, match="does not answer"):
                front.enqueue(alice, need, waited=waited)
            assert (drops, away) == ([0], [0])  # the first send committed, its answer lost; the resend failed
            mine = conn.execute(
                "SELECT id, job FROM audit WHERE action IN ('enqueued', 'joined') AND principal = 'alice'"
            ).fetchall()
            assert len(mine) == 1  # one following, held by no call
            job = mine[0]["job"]
            assert state(conn, job) == "queued"

            def sweep() -> None:  # the front taken for lost by another's sweep
                lapse(conn, front.front)
                fronts.sweep(conn)

            if swept:
                sweep()
            team.end_unended()  # the next renewal: the database answers
            because = fronts.LOST if swept else None
            if shared:
                assert theirs is not None and theirs.job_id == job
                assert state(conn, job) == "queued" and actions(conn) == [("alice", "left", because)]
            else:
                assert state(conn, job) == "cancelled" and actions(conn) == [("alice", "cancelled", because)]
            assert team.unended() == 0  # nothing left for the stop to try or count
            done = actions(conn)
            team.end_unended()
            if not swept:
                sweep()
            assert actions(conn) == done
            if theirs is not None:  # bob still follows it, alone
                ended = queue.cancel(conn, job, "acme", "bob", "id-bob", following=theirs.following)
                assert ended is not None and ended["state"] == "cancelled"
    finally:
        front.close()


@contextlib.contextmanager
def _front_cut(database: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any, list[int], list[int]]]:
    """A front whose connections (db.connect's) lose a commit's acknowledgement (`drops`) and then fail as a send
    begins (`away`), with the real connect for the test's own look at the database."""
    from flakebot.team.frontqueue import FrontQueue

    connect, drops, away = db.connect, [0], [0]
    monkeypatch.setattr(db, "connect", lambda *args, **kwargs: _AwayAfterCommit(connect(*args, **kwargs), drops, away))
    front = FrontQueue(database, LEASE)
    front.connect()
    try:
        yield front, connect, drops, away
    finally:
        front.close()


def test_an_enqueue_whose_every_send_failed_before_any_committed_ends_nothing(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither send reached a commit: the call's key has no row, and the front's try at its following ends nothing
    (bob's job of the same need, queued meanwhile, goes on) and forgets the call."""
    from flakebot.errors import HostError
    from flakebot.pipeline.request import RunRequest
    from flakebot.team.tokens import Principal

    alice = Principal("alice", "id-alice", "acme", calls_per_minute=60, concurrent_crafts=2, created=0.0)
    bob = Principal("bob", "id-bob", "acme", calls_per_minute=60, concurrent_crafts=2, created=0.0)
    with _front_cut(database, monkeypatch) as (front, connect, drops, away), connect(database, autocommit=True) as conn:
        away[0] = 2
        with pytest.raises(HostError, match="does not answer"):
            front.enqueue(alice, RunRequest(need="need a csv deduper"), waited=True)
        assert front.unsent() == 1
        theirs = front.enqueue(bob, RunRequest(need="need a csv deduper"), waited=True)
        assert front.end_unsent(()) == [] and front.unsent() == 0
        assert state(conn, theirs.job_id) == "queued" and actions(conn) == []


def test_enqueues_the_database_refused_keep_nothing_to_end(database: str) -> None:
    """The database answers but refuses every send (read-only after a failover): each send rolled back, nothing of it
    committed, so the front keeps no key of those calls. Before, each refused call was kept as a maybe-committed
    send (FrontQueue._unsent), one more per call for as long as the database refused (a flood of calls grew it
    without bound), each counted by the stop as a following left and tried again at every renewal, though none was
    written."""
    from flakebot.errors import HostError
    from flakebot.pipeline.request import RunRequest
    from flakebot.team.frontqueue import FrontQueue
    from flakebot.team.tokens import Principal

    alice = Principal("alice", "id-alice", "acme", calls_per_minute=60, concurrent_crafts=2, created=0.0)
    front = FrontQueue(database, LEASE)
    front.connect()
    try:
        with db.connect(database, autocommit=True) as conn:
            assert front._calls.conn is not None
            front._calls.conn.execute("SET default_transaction_read_only = on")  # as a standby answers
            for n in range(3):
                with pytest.raises(HostError, match="refused this request"):
                    front.enqueue(alice, RunRequest(need=f"need a csv deduper {n}"), waited=n % 2 == 0)
            assert conn.execute("SELECT count(*) AS n FROM jobs").fetchone() == {"n": 0}  # nothing written
            assert front.unsent() == 0
    finally:
        front.close()


def test_an_enqueue_whose_every_send_failed_ends_its_following_though_its_token_was_revoked_since(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alice's token revoked after the front's one look at revocations ended her followings (drop_revoked) but before
    her enqueue's first send committed (its answer lost, the resend failing): the front's end of that following at
    its next renewal ends it all the same, so the job she alone followed is cancelled. Before, her identity among the
    revoked made the cancel find her following no one's (None), and the job stayed queued, crafted for nobody."""
    from flakebot.errors import HostError
    from flakebot.pipeline.request import RunRequest
    from flakebot.team.tokens import Principal

    alice = Principal("alice", "id-alice", "acme", calls_per_minute=60, concurrent_crafts=2, created=0.0)
    with _front_cut(database, monkeypatch) as (front, connect, drops, away), connect(database, autocommit=True) as conn:
        assert front.drop_revoked({"id-alice"}, {"id-alice"}) == []  # the look: nothing of hers yet
        drops[0], away[0] = 1, 1
        with pytest.raises(HostError, match="does not answer"):
            front.enqueue(alice, RunRequest(need="need a csv deduper"), waited=False)
        job = conn.execute("SELECT job FROM audit WHERE action = 'enqueued' AND principal = 'alice'").fetchone()
        assert job is not None and state(conn, job["job"]) == "queued"
        ended = front.end_unsent({"id-alice"})  # the next renewal, her token revoked
        assert [row["state"] for row in ended] == ["cancelled"] and front.unsent() == 0
        assert state(conn, job["job"]) == "cancelled" and actions(conn) == [("alice", "cancelled", None)]


def test_a_calls_end_ends_its_following_though_its_token_was_revoked_before_that_following_was_written(
    database: str,
) -> None:
    """Alice's token revoked, the front's one look at revocations made (drop_revoked: nothing of hers yet), then her
    craft's enqueue commits (a call already past its token check) and the call ends before its answer: its end
    (leave_following) ends that following, so the job she alone followed is cancelled. Before, her identity among the
    revoked made the cancel find her following no one's, and the job stayed queued, crafted for nobody."""
    import anyio

    from flakebot import config
    from flakebot.mcp.front import TeamMCP
    from flakebot.pipeline.request import RunRequest
    from flakebot.team.admission import MemoryAdmission
    from flakebot.team.frontqueue import FrontQueue
    from flakebot.team.tokens import TokenStore

    settings = config.load()
    store = TokenStore(settings.path("workdir"))
    alice, _ = store.add("alice", tenant="acme")
    front = FrontQueue(database, LEASE)
    front.connect()
    team = TeamMCP(settings, [], store, MemoryAdmission(), front)
    try:
        with db.connect(database, autocommit=True) as conn:
            store.revoke("alice")
            assert front.drop_revoked(store.revoked(), store.revoked()) == []  # the look: nothing of hers yet
            enqueued = front.enqueue(alice, RunRequest(need="need a csv deduper"), waited=True)
            anyio.run(lambda: team.leave_following(enqueued.job_id, alice, enqueued.following, waited=True))
            assert state(conn, enqueued.job_id) == "cancelled"
            assert actions(conn) == [("alice", "cancelled", None)]
    finally:
        front.close()
