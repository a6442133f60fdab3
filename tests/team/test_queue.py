"""The team's queue on a real PostgreSQL: enqueue, claim and finish; needs folded; quotas exact under races;
fair claims; leases that run out."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flakebot.errors import QuotaExceeded, UsageError
from flakebot.pipeline.request import RunRequest
from flakebot.team import db, fronts, queue
from flakebot.team.dburl import ENV as DATABASE_ENV


def craft(need: str, **options: Any) -> RunRequest:
    return RunRequest(need=need, registry="local", **options)


def raced(database: str, task: Callable[[Any, int], Any], threads: int = 2) -> list[list[Any]]:
    """`task(connection, i)` in `threads` threads at once, each on a connection of its own; their answers."""
    connections = [db.connect(database) for _ in range(threads)]
    start = threading.Barrier(threads)
    answers: list[list[Any]] = [[] for _ in range(threads)]

    failures: list[BaseException] = []

    def one(n: int) -> None:
        start.wait()
        try:
            answers[n] = task(connections[n], n)
        except BaseException as exc:  # re-raised in the test's thread
            failures.append(exc)

    workers = [threading.Thread(target=one, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    for conn in connections:
        conn.close()
    if failures:
        raise failures[0]
    return answers


def test_a_job_is_enqueued_claimed_once_and_finished(database: str) -> None:
    conn = db.connect(database)
    db.connect(database).close()  # the schema made twice is the same schema
    queued = queue.enqueue(conn, "acme", "alice", craft("need a CSV deduper"))
    assert (queued.joined, queued.state) == (False, "queued")

    job = queue.claim(conn, "w1", lease_seconds=30)
    assert job is not None and (job["id"], job["state"], job["worker"], job["attempts"]) == (
        queued.job_id,
        "running",
        "w1",
        1,
    )
    assert job["request"]["need"] == "need a CSV deduper"
    assert queue.claim(conn, "w2", lease_seconds=30) is None  # held by w1
    assert queue.renew(conn, queued.job_id, "w1", 30) and not queue.renew(conn, queued.job_id, "w2", 30)
    assert not queue.finish(conn, queued.job_id, "w2", result={"status": "crafted"}, error=None)
    assert queue.finish(conn, queued.job_id, "w1", result={"status": "crafted"}, error=None)

    done = queue.get(conn, queued.job_id, "acme")
    assert done is not None and (done["state"], done["result"]) == ("done", {"status": "crafted"})
    assert queue.get(conn, queued.job_id, "other-tenant") is None
    audit = conn.execute("SELECT action, principal FROM audit ORDER BY id").fetchall()
    assert [(a["action"], a["principal"]) for a in audit] == [("enqueued", "alice"), ("claimed", "w1"), ("done", "w1")]
    with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
        with conn.transaction():
            conn.execute("DELETE FROM audit")
    with pytest.raises(psycopg.errors.RaiseException, match="append-only"):  # no row trigger sees a TRUNCATE
        with conn.transaction():
            conn.execute("TRUNCATE audit")
    assert conn.execute("SELECT count(*) AS n FROM audit").fetchone() == {"n": 3}
    conn.close()


def test_identical_needs_from_two_fronts_racing_fold_into_one_job(database: str) -> None:
    rounds = 15
    with db.connect(database) as conn:
        queue.set_quota(conn, "acme", max_in_flight=100, max_per_day=100)

    def front(conn: Any, _n: int) -> list[queue.Enqueued]:
        return [queue.enqueue(conn, "acme", "agent", craft(f"need tool number {i}")) for i in range(rounds)]

    first, second = raced(database, front)
    for a, b in zip(first, second, strict=True):
        assert a.job_id == b.job_id and sorted([a.joined, b.joined]) == [False, True]
    conn = db.connect(database)
    assert conn.execute("SELECT count(*) AS n FROM jobs").fetchone() == {"n": rounds}
    # the same words in another order are the same need; another option or another tenant is another job
    assert queue.enqueue(conn, "acme", "bob", craft("Need TOOL number 0!")).job_id == first[0].job_id
    assert not queue.enqueue(conn, "acme", "bob", craft("need tool number 0", fresh=True)).joined
    assert not queue.enqueue(conn, "globex", "carol", craft("need tool number 0")).joined
    conn.close()


def test_a_cancelled_queued_craft_does_not_count_for_the_day(database: str) -> None:
    """A craft cancelled before any worker claimed it never ran: it takes none of the tenant's crafts for the day
    (max_per_day); one a worker claimed and ran counts, whatever its end."""
    conn = db.connect(database)
    queue.set_quota(conn, "acme", max_in_flight=100, max_per_day=2)
    ran = queue.enqueue(conn, "acme", "alice", craft("need a tool that ran"), principal_id="id-alice")
    job = queue.claim(conn, "w", 30)
    assert job is not None and job["id"] == ran.job_id and queue.finish(conn, job["id"], "w", result={}, error=None)
    for i in range(3):  # each cancelled before a claim: the day's second craft is still free
        dropped = queue.enqueue(conn, "acme", "alice", craft(f"need a dropped tool {i}"), principal_id="id-alice")
        assert queue.cancel(conn, dropped.job_id, "acme", "alice", "id-alice") is not None
    assert queue.quota_of(conn, "acme")["used"]["today"] == 1
    queue.enqueue(conn, "acme", "alice", craft("need a second tool"), principal_id="id-alice")
    with pytest.raises(QuotaExceeded):
        queue.enqueue(conn, "acme", "alice", craft("need a third tool"), principal_id="id-alice")
    conn.close()


def test_a_tokens_concurrent_crafts_are_counted_by_its_identity_not_its_name(database: str) -> None:
    """The concurrent-crafts cap is a token's: a new token under a revoked one's name (another identity) starts with
    none of its crafts in flight, and the old identity's crafts still bound the old identity."""
    conn = db.connect(database)
    queue.set_quota(conn, "acme", max_in_flight=100, max_per_day=100)
    queue.enqueue(conn, "acme", "bob", craft("need a first tool"), principal_cap=1, principal_id="id-old")
    with pytest.raises(QuotaExceeded) as refused:
        queue.enqueue(conn, "acme", "bob", craft("need a second tool"), principal_cap=1, principal_id="id-old")
    assert refused.value.one_line().startswith("token 'bob' has 1 crafts queued or running"), refused.value
    again = queue.enqueue(conn, "acme", "bob", craft("need a third tool"), principal_cap=1, principal_id="id-new")
    assert not again.joined and again.state == "queued"
    conn.close()


def test_a_jwt_principals_concurrent_crafts_refusal_names_its_claim_not_a_token_option() -> None:
    """A JWT principal's cap comes from its limits claim (flakebot.team.claimlimits): its refusal told it to ask for a
    `token add` option that no JWT has."""
    from flakebot.team.idtokens import ID_PREFIX, concurrent_crafts_set_by

    assert "limits claim" in concurrent_crafts_set_by(f"{ID_PREFIX}abc")
    assert "--concurrent-crafts" in concurrent_crafts_set_by("id-a")


def test_a_craft_a_worker_handed_back_then_cancelled_still_counts_for_the_day(database: str) -> None:
    """A craft a worker claimed ran (a build, model calls), even when the worker handed it back and it was then
    cancelled while queued again: it is one of the day's crafts, so a cancel after a hand-back frees nothing."""
    conn = db.connect(database)
    queue.set_quota(conn, "acme", max_in_flight=100, max_per_day=1)
    job_id = queue.enqueue(conn, "acme", "alice", craft("need a tool that started"), principal_id="id-alice").job_id
    assert queue.claim(conn, "w1", 30) is not None and queue.release(conn, job_id, "w1")
    cancelled = queue.cancel(conn, job_id, "acme", "alice", "id-alice")
    assert cancelled is not None and cancelled["state"] == "cancelled"
    assert queue.quota_of(conn, "acme")["used"]["today"] == 1
    with pytest.raises(QuotaExceeded):
        queue.enqueue(conn, "acme", "alice", craft("need another tool"), principal_id="id-alice")
    conn.close()


def test_a_running_craft_its_only_follower_cancels_ends_cancelled_for_good(database: str) -> None:
    """A job a worker claimed, cancelled by its one follower: the row ends cancelled at once (as MCP asks), names the
    worker to stop, is neither renewed, finished, handed back nor claimed again (its worker may die: its lease ran
    out, and no one resumes it), keeps the CPU-seconds its worker settles, and counts for the day. A cancel that
    comes after the worker's end changes nothing (whichever commits first is the job's end)."""
    conn = db.connect(database)
    queue.set_quota(conn, "acme", max_in_flight=100, max_per_day=2)
    job_id = queue.enqueue(conn, "acme", "alice", craft("need a tool to stop"), principal_id="id-alice").job_id
    assert queue.claim(conn, "w1", lease_seconds=0.5) is not None
    assert not queue.cancelled_while_held(conn, job_id, "w1")
    cancelled = queue.cancel(conn, job_id, "acme", "alice", "id-alice")
    assert cancelled is not None and (cancelled["state"], cancelled["worker"], cancelled["lease_until"]) == (
        "cancelled",
        "w1",
        None,
    )
    assert cancelled["error"] == queue.error_of_cancel(running=True) and queue.is_cancel_error(cancelled["error"])
    assert queue.cancelled_while_held(conn, job_id, "w1") and not queue.cancelled_while_held(conn, job_id, "w2")
    assert not queue.renew(conn, job_id, "w1", 30)
    assert not queue.finish(conn, job_id, "w1", result={"status": "crafted"}, error=None)
    assert not queue.release(conn, job_id, "w1")
    time.sleep(0.7)  # its lease would have run out: the worker died after the cancel
    assert queue.claim(conn, "w2", lease_seconds=30) is None
    assert queue.settle_cancelled(conn, job_id, "w1", 2.5) and not queue.settle_cancelled(conn, job_id, "w2", 1.0)
    row = queue.get(conn, job_id, "acme")
    assert row is not None and (row["state"], row["cpu_seconds"], row["result"]) == ("cancelled", 2.5, None)
    assert queue.quota_of(conn, "acme")["used"]["today"] == 1  # it ran: one of the day's crafts
    audit = conn.execute("SELECT principal, action, detail FROM audit WHERE job = %s ORDER BY id", (job_id,)).fetchall()
    assert [(a["principal"], a["action"]) for a in audit] == [
        ("alice", "enqueued"),
        ("w1", "claimed"),
        ("alice", "cancelled"),
    ]
    assert audit[-1]["detail"] == {"principal_id": "id-alice", "worker": "w1"}

    done_id = queue.enqueue(conn, "acme", "alice", craft("need a tool that ended"), principal_id="id-alice").job_id
    assert queue.claim(conn, "w1", 30) is not None
    assert queue.finish(conn, done_id, "w1", result={"status": "crafted"}, error=None)  # the worker's end first
    late = queue.cancel(conn, done_id, "acme", "alice", "id-alice")
    assert late is not None and late["state"] == "done" and late["unchanged"]
    conn.close()


def test_a_craft_its_queuer_left_to_a_joiner_still_takes_the_queuers_concurrent_crafts_until_it_ends(
    database: str,
) -> None:
    """A token that queued a craft, then left it to another agent who joined it (tasks/cancel: the job goes on for
    the joiner), still has it among its concurrent crafts until it ends: shed at the leave, a cap of 1 held nothing
    against two tokens taking turns (queue, the other joins, leave, queue again). Its end frees the cap."""
    conn = db.connect(database)
    queue.set_quota(conn, "acme", max_in_flight=100, max_per_day=100)
    job_id = queue.enqueue(
        conn, "acme", "alice", craft("need a shared tool"), principal_cap=1, principal_id="id-a"
    ).job_id
    assert queue.enqueue(conn, "acme", "bob", craft("need a shared tool"), principal_cap=1, principal_id="id-b").joined
    left = queue.cancel(conn, job_id, "acme", "alice", "id-a")
    assert left is not None and left["left_by"] == ["id-a"] and left["state"] == "queued"
    with pytest.raises(QuotaExceeded, match=f"its limit \\(concurrent crafts\\): job-{job_id}$"):
        queue.enqueue(conn, "acme", "alice", craft("need alice's next tool"), principal_cap=1, principal_id="id-a")
    assert (
        queue.enqueue(  # bob, who only joined it, queues his own
            conn, "acme", "bob", craft("need bob's own tool"), principal_cap=1, principal_id="id-b"
        ).state
        == "queued"
    )
    claimed = queue.claim(conn, "w1", 60)
    assert claimed is not None and claimed["id"] == job_id
    assert queue.finish(conn, job_id, "w1", result={"status": "crafted"}, error=None)
    mine = queue.enqueue(conn, "acme", "alice", craft("need alice's next tool"), principal_cap=1, principal_id="id-a")
    assert not mine.joined and mine.state == "queued"
    conn.close()


def test_a_tokens_concurrent_crafts_are_exact_when_two_fronts_race(database: str) -> None:
    """One token calling through two fronts at once gets exactly its cap of crafts in flight, whatever the race."""
    conn = db.connect(database)
    queue.set_quota(conn, "acme", max_in_flight=100, max_per_day=100)

    def front(conn: Any, n: int) -> list[Any]:
        answers: list[Any] = []
        for i in range(8):
            try:
                answers.append(
                    queue.enqueue(conn, "acme", "agent", craft(f"need tool{n}x{i}"), principal_cap=3, principal_id="id")
                )
            except QuotaExceeded as refused:
                answers.append(refused)
        return answers

    answers = [a for one in raced(database, front) for a in one]
    accepted = [a for a in answers if isinstance(a, queue.Enqueued)]
    assert len(accepted) == 3 and all(isinstance(a, QuotaExceeded) for a in answers if a not in accepted)
    assert queue.quota_of(conn, "acme")["used"]["in_flight"] == 3
    conn.close()


@pytest.mark.parametrize("quota", ["max_in_flight", "max_per_day"])
def test_a_tenants_quota_is_exact_when_two_fronts_race(database: str, quota: str) -> None:
    conn = db.connect(database)
    limits = {"max_in_flight": 100, "max_per_day": 100} | {quota: 5}
    queue.set_quota(conn, "acme", **limits)
    if quota == "max_per_day":  # jobs that ended still count for the day
        for i in range(2):
            queue.enqueue(conn, "acme", "alice", craft(f"need an earlier tool {i}"))
            job = queue.claim(conn, "w", 30)
            assert job is not None and queue.finish(conn, job["id"], "w", result={}, error=None)

    def front(conn: Any, n: int) -> list[Any]:
        answers: list[Any] = []
        for i in range(12):
            try:
                answers.append(queue.enqueue(conn, "acme", "agent", craft(f"need tool{n}x{i}")))
            except QuotaExceeded as refused:
                answers.append(refused)
        return answers

    answers = [a for one in raced(database, front) for a in one]
    accepted = [a for a in answers if isinstance(a, queue.Enqueued)]
    refused = [a for a in answers if isinstance(a, QuotaExceeded)]
    assert len(accepted) == (5 if quota == "max_in_flight" else 3) and len(refused) == 24 - len(accepted)
    line = refused[0].one_line()
    assert "Fix: wait" in line and "\n" not in line and refused[0].exit_code == 72
    assert refused[0].details["quota"] == quota
    assert not queue.enqueue(conn, "globex", "carol", craft("need tool0x0")).joined  # another tenant is not held
    conn.close()


def test_a_worker_claims_for_the_tenant_that_used_least_of_its_share(database: str) -> None:
    conn = db.connect(database)
    busy = [queue.enqueue(conn, "busy", "a", craft(f"need busy tool {i}")).job_id for i in range(3)]
    job = queue.claim(conn, "w", 30)
    assert job is not None and job["id"] == busy[0]
    queue.finish(conn, busy[0], "w", result={}, error=None)
    conn.execute("UPDATE jobs SET started = now() - interval '1 hour' WHERE id = %s", (busy[0],))
    conn.commit()
    quiet = queue.enqueue(conn, "quiet", "b", craft("need a quiet tool")).job_id  # queued after busy's others

    claimed = queue.claim(conn, "w", 30)
    assert claimed is not None and claimed["id"] == quiet  # quiet used nothing of its share; busy used an hour
    queue.set_quota(conn, "busy", max_in_flight=4, max_per_day=100, shares=10_000)  # an hour of 10,000 shares
    queue.enqueue(conn, "quiet", "b", craft("need another quiet tool"))
    conn.execute("UPDATE jobs SET started = now() - interval '1 minute' WHERE id = %s", (quiet,))
    conn.commit()
    claimed = queue.claim(conn, "w", 30)
    assert claimed is not None and claimed["id"] == busy[1]  # 3600 s / 10,000 shares < quiet's 60 s / 1
    conn.close()


def test_a_job_whose_lease_ran_out_is_claimed_again_then_failed_after_max_attempts(database: str) -> None:
    conn = db.connect(database)
    job_id = queue.enqueue(conn, "acme", "alice", craft("need a flaky tool")).job_id
    first = queue.claim(conn, "w1", lease_seconds=0.5)
    assert first is not None and queue.claim(conn, "w2", lease_seconds=0.5) is None
    time.sleep(0.7)
    again = queue.claim(conn, "w2", lease_seconds=0.5)
    assert again is not None and (again["id"], again["worker"], again["attempts"]) == (job_id, "w2", 2)
    queue.record_run(conn, job_id, "w2", "20260101-000000-abcdef")
    assert not queue.renew(conn, job_id, "w1", 30)  # w1 lost it: its heartbeat and its result are refused
    assert not queue.finish(conn, job_id, "w1", result={"status": "crafted"}, error=None)
    time.sleep(0.7)
    third = queue.claim(conn, "w3", lease_seconds=0.5)
    assert third is not None and (third["attempts"], third["run_id"]) == (3, "20260101-000000-abcdef")
    time.sleep(0.7)
    assert queue.claim(conn, "w4", lease_seconds=0.5) is None
    failed = queue.get(conn, job_id, "acme")
    assert failed is not None and failed["state"] == "failed" and failed["error"]["type"] == "WorkerLost"
    conn.close()


def test_a_job_handed_back_by_a_stopping_worker_is_claimed_again_with_its_run(database: str) -> None:
    conn = db.connect(database)
    job_id = queue.enqueue(conn, "acme", "alice", craft("need a patient tool")).job_id
    assert queue.claim(conn, "w1", 30) is not None
    queue.record_run(conn, job_id, "w1", "20260101-000000-abcdef")
    assert not queue.release(conn, job_id, "w2") and queue.release(conn, job_id, "w1")
    again = queue.claim(conn, "w2", 30)
    assert again is not None and (again["id"], again["attempts"], again["run_id"]) == (
        job_id,
        2,
        "20260101-000000-abcdef",
    )
    conn.close()


def test_workers_claiming_at_once_never_take_one_job_twice(database: str) -> None:
    with db.connect(database) as conn:
        queue.set_quota(conn, "acme", max_in_flight=100, max_per_day=100)
        jobs = {queue.enqueue(conn, "acme", "alice", craft(f"need tool{i}")).job_id for i in range(30)}

    def worker(conn: Any, n: int) -> list[int]:
        taken = []
        while (job := queue.claim(conn, f"w{n}", 30)) is not None:
            taken.append(int(job["id"]))
        return taken

    first, second = raced(database, worker)
    assert sorted(first + second) == sorted(jobs)  # each job once, none left


def test_a_database_of_schema_1_is_brought_to_the_current_one_keeping_its_jobs(database: str) -> None:
    with db.connect(database) as conn:
        kept = queue.enqueue(conn, "acme", "alice", RunRequest(need="need a csv deduper")).job_id
        conn.execute("DROP TABLE calls")  # as schema 1 had it
        conn.execute("DELETE FROM flakebot_schema")
        conn.execute("INSERT INTO flakebot_schema VALUES (1)")
        conn.commit()
    with db.connect(database) as conn:
        assert conn.execute("SELECT max(version) AS v FROM flakebot_schema").fetchone() == {"v": db.SCHEMA_VERSION}
        assert conn.execute("SELECT to_regclass('calls') IS NOT NULL AS made").fetchone() == {"made": True}
        assert queue.get(conn, kept, "acme") is not None


def test_a_role_that_does_not_own_the_tables_works_the_queue_but_cannot_rewrite_the_audit(database: str) -> None:
    """The grants docs/team.md gives the workers' role: enough for the queue, not for dropping the triggers."""
    db.connect(database).close()  # the schema made by the owner
    name = database.rsplit("/", 1)[1]
    with psycopg.connect(database, autocommit=True) as owner:
        owner.execute(f"CREATE ROLE worker_{name} LOGIN PASSWORD 'pw-{name}'")
        owner.execute(f"GRANT SELECT ON flakebot_schema TO worker_{name}")
        owner.execute(f"GRANT SELECT, INSERT, UPDATE ON jobs, tenants TO worker_{name}")
        owner.execute(f"GRANT SELECT, INSERT ON audit TO worker_{name}")
        owner.execute(f"GRANT SELECT, UPDATE, DELETE ON fronts TO worker_{name}")
        owner.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO worker_{name}")
    where = urlsplit(database)
    conn = db.connect(where._replace(netloc=f"worker_{name}:pw-{name}@{where.hostname}:{where.port}").geturl())
    job_id = queue.enqueue(conn, "acme", "alice", craft("need a CSV deduper")).job_id
    job = queue.claim(conn, "w1", lease_seconds=30)
    assert job is not None and job["id"] == job_id
    assert queue.finish(conn, job_id, "w1", result={"status": "crafted"}, error=None)
    with psycopg.connect(database, autocommit=True) as owner:  # a front's lease, run out: the worker sweeps it
        owner.execute("INSERT INTO fronts (id, lease_until) VALUES ('lost', now() - interval '1 second')")
    waited = queue.enqueue(conn, "acme", "alice", craft("need a word counter"), principal_id="id-alice", front="lost")
    assert [row["id"] for row in fronts.sweep(conn)] == [waited.job_id]
    for sql in ("TRUNCATE audit", "DROP TRIGGER audit_append_only ON audit", "ALTER TABLE audit DISABLE TRIGGER ALL"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with conn.transaction():
                conn.execute(sql)
    conn.close()


def _role(database: str, grants: list[str]) -> str:
    """A role that does not own the tables, given `grants` (ON ... clauses), logging in: its URL."""
    name = database.rsplit("/", 1)[1]
    with psycopg.connect(database, autocommit=True) as owner:
        owner.execute(f"CREATE ROLE front_{name} LOGIN PASSWORD 'pw-{name}'")
        for grant in grants:
            owner.execute(f"GRANT {grant} TO front_{name}")
    where = urlsplit(database)
    return where._replace(netloc=f"front_{name}:pw-{name}@{where.hostname}:{where.port}").geturl()


FRONT_GRANTS = [  # docs/team.md, The tables: the workers' grants and a front's
    "SELECT ON flakebot_schema",
    "SELECT, INSERT, UPDATE ON jobs, tenants",
    "SELECT, INSERT ON audit",
    "USAGE ON ALL SEQUENCES IN SCHEMA public",
    "SELECT, INSERT, DELETE ON calls",
]


def test_a_role_that_does_not_own_the_tables_cannot_bring_an_old_schema_up_and_says_so_in_one_line(
    database: str,
) -> None:
    """A database schema 6 made (before fronts' leases), the fronts and workers connecting as the role docs/team.md
    grants, not the tables' owner: its first connect after the upgrade tried the DDL and PostgreSQL's "permission
    denied for schema public" left db.connect raw, a traceback on the admin's terminal (exit 1). Now it is one line
    saying which schema the database has and what to do; once the owner connected, the role with a front's grants
    holds a lease and sweeps a lost one."""
    from flakebot.errors import HostError

    with db.connect(database) as conn:  # schema 6, as the previous version left it
        conn.execute("DROP TABLE fronts")
        conn.execute("DELETE FROM flakebot_schema")
        conn.execute("INSERT INTO flakebot_schema VALUES (6)")
        conn.commit()
    role = _role(database, [*FRONT_GRANTS])
    with pytest.raises(HostError) as refused:
        db.connect(role)
    said = refused.value.one_line()
    assert f"at schema 6, and this role cannot bring it to {db.SCHEMA_VERSION}" in said and "owns" in said, said
    assert f"pw-{database.rsplit('/', 1)[1]}" not in said
    done = quota(role, "acme")  # any command connecting as that role: the CLI prints the one line
    assert done.returncode == 5 and done.stderr.strip().splitlines() == [f"error: {said}"], done.stderr
    db.connect(database).close()  # the owner brings it up
    with psycopg.connect(database, autocommit=True) as owner:
        owner.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON fronts TO front_{database.rsplit('/', 1)[1]}")
    with db.connect(role, autocommit=True) as conn:
        assert not fronts.hold(conn, "front-a", 30) and fronts.hold(conn, "front-a", 30)
        alice = queue.enqueue(conn, "acme", "alice", craft("need a csv deduper"), principal_id="id-alice", front="a")
        fronts.hold(conn, "a", 30)
        conn.execute("UPDATE fronts SET lease_until = now() - interval '1 second' WHERE id = 'a'")
        assert [row["id"] for row in fronts.sweep(conn)] == [alice.job_id]
        assert [row["id"] for row in conn.execute("SELECT id FROM fronts").fetchall()] == ["front-a"]


@pytest.mark.parametrize(
    "limits",
    [
        {"max_in_flight": -1, "max_per_day": 5},
        {"max_in_flight": 5, "max_per_day": 2**40},
        {"max_in_flight": 5, "max_per_day": 5, "shares": 0},
        {"max_in_flight": True, "max_per_day": 5},
        {"max_in_flight": 2.5, "max_per_day": 5},
    ],
)
def test_a_bad_quota_is_one_usage_error_and_changes_nothing(database: str, limits: dict[str, Any]) -> None:
    conn = db.connect(database)
    queue.set_quota(conn, "acme", max_in_flight=3, max_per_day=7)
    with pytest.raises(UsageError):
        queue.set_quota(conn, "acme", **limits)
    row = conn.execute("SELECT max_in_flight, max_per_day, shares FROM tenants WHERE name = 'acme'").fetchone()
    assert row == {"max_in_flight": 3, "max_per_day": 7, "shares": 1}
    conn.close()


@pytest.mark.parametrize(
    "request_",
    [
        craft("need a\x00 tool"),  # jsonb holds no NUL: the database would refuse it with its own error
        craft("need a tool", name="tool\x00"),
        craft("need a tool " + "very " * 20_000),
        craft("   "),
    ],
)
def test_a_need_no_craft_could_take_is_refused_at_enqueue(database: str, request_: RunRequest) -> None:
    conn = db.connect(database)
    with pytest.raises(UsageError):
        queue.enqueue(conn, "acme", "alice", request_)
    assert conn.execute("SELECT count(*) AS n FROM jobs").fetchone() == {"n": 0}
    conn.close()


def test_a_tenants_cpu_seconds_for_the_day_bound_its_next_craft(database: str) -> None:
    """A tenant's CPU-seconds bound: the seconds its finished jobs took today (as their workers counted them) refuse
    its next craft in one line; another tenant and a join are not refused."""
    conn = db.connect(database)
    queue.set_quota(conn, "acme", max_in_flight=4, max_per_day=10, max_cpu_seconds_per_day=60)
    first = queue.enqueue(conn, "acme", "alice", craft("need a CSV deduper"))
    job = queue.claim(conn, "w1", lease_seconds=30)
    assert job is not None and job["id"] == first.job_id
    assert queue.release(conn, first.job_id, "w1", cpu_seconds=25.0)  # a stopping worker's seconds count too
    assert queue.claim(conn, "w2", lease_seconds=30) is not None
    assert queue.finish(conn, first.job_id, "w2", result={"status": "crafted"}, error=None, cpu_seconds=40.0)
    assert queue.quota_of(conn, "acme")["used"] == {"in_flight": 0, "today": 1, "cpu_seconds": 65.0}
    with pytest.raises(QuotaExceeded, match=r"tenant acme has used its 60 CPU-seconds of crafting for today \(65\)"):
        queue.enqueue(conn, "acme", "alice", craft("need a word counter"))
    assert not queue.enqueue(conn, "other", "bob", craft("need a word counter")).joined  # not another's bound
    queue.set_quota(conn, "acme", max_in_flight=4, max_per_day=10)  # no bound: None
    assert not queue.enqueue(conn, "acme", "alice", craft("need a word counter")).joined
    with pytest.raises(UsageError, match="max_cpu_seconds_per_day must be a whole number"):
        queue.set_quota(conn, "acme", max_in_flight=4, max_per_day=10, max_cpu_seconds_per_day=-1)
    conn.close()


def quota(database: str, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """`flakebot quota ARGS` on `database`, given as an admin should: in FLAKEBOT_DATABASE_URL."""
    from tests.conftest import run_cli

    return run_cli("quota", *args, env={DATABASE_ENV: database}, check=check)


def test_the_quota_command_shows_and_sets_a_tenants_quotas(database: str) -> None:
    """`flakebot quota TENANT --database URL`: the defaults for a tenant with no job yet, then set a field at a time
    (the others stay); a bad value is one line, changing nothing."""
    from tests.conftest import json_result

    shown = json_result(quota(database, "acme", "--json", check=True))
    assert (shown["known"], shown["max_in_flight"], shown["max_cpu_seconds_per_day"]) == (False, 4, None)
    set_ = json_result(quota(database, "acme", "--cpu-seconds", "600", "--json", check=True))
    assert (set_["changed"], set_["max_cpu_seconds_per_day"], set_["max_per_day"]) == (True, 600, 100)
    more = json_result(quota(database, "acme", "--shares", "3", "--json", check=True))
    assert (more["shares"], more["max_cpu_seconds_per_day"]) == (3, 600)
    both = quota(database, "acme", "--cpu-seconds", "5", "--no-cpu-bound")
    assert both.returncode == 2 and "cannot be combined" in both.stderr
    negative = quota(database, "acme", "--max-per-day", "-1")
    assert negative.returncode == 2 and "\n" not in negative.stderr.strip(), negative.stderr
    lifted = quota(database, "acme", "--no-cpu-bound")
    assert lifted.returncode == 0 and "no bound" in lifted.stdout and "shares     3" in lifted.stdout, lifted.stdout
    bad = quota(database, "Not A Name")
    assert bad.returncode != 0 and "is not a name" in bad.stderr


def test_two_admins_setting_different_quotas_of_a_tenant_at_once_both_land(database: str) -> None:
    """`quota TENANT --cpu-seconds N` changes that field only: an admin's --shares committed while it waited for
    the tenant's row stays (was read before, then written back over: a lost update). Also: a value past the
    column's largest names the option the user gave, not the column."""
    from tests.conftest import json_result, wait_for

    with db.connect(database) as first:
        queue.set_quota(first, "acme", max_in_flight=4, max_per_day=10)
    other = db.connect(database)
    other.execute("UPDATE tenants SET shares = 3 WHERE name = 'acme'")  # uncommitted: the row is locked
    ran: list[Any] = []
    setting = threading.Thread(target=lambda: ran.append(quota(database, "acme", "--cpu-seconds", "600", "--json")))
    setting.start()
    watch = db.connect(database, autocommit=True)  # pg_stat_activity is read once per transaction
    wait_for(
        lambda: watch.execute(
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        ).fetchone()
    )
    other.commit()
    setting.join(timeout=60)
    assert json_result(ran[0])["max_cpu_seconds_per_day"] == 600, ran[0].stderr
    assert queue.quota_of(other, "acme")["shares"] == 3
    huge = quota(database, "acme", "--cpu-seconds", str(2**40))
    assert huge.returncode == 2 and "'--cpu-seconds'" in huge.stderr, huge.stderr
    other.close()
    watch.close()


def test_cpu_seconds_that_are_no_count_are_not_added(database: str) -> None:
    """finish and release add a job's CPU-seconds: an infinite or NaN figure (no real count) adds nothing, so the
    tenant's day is not spent for good and `quota --json` stays JSON (was Infinity, which no JSON parser takes)."""
    conn = db.connect(database)
    first = queue.enqueue(conn, "acme", "alice", craft("need a CSV deduper"))
    assert queue.claim(conn, "w1", lease_seconds=30) is not None
    assert queue.release(conn, first.job_id, "w1", cpu_seconds=float("nan"))
    assert queue.claim(conn, "w2", lease_seconds=30) is not None
    assert queue.finish(conn, first.job_id, "w2", result={"status": "crafted"}, error=None, cpu_seconds=float("inf"))
    assert queue.quota_of(conn, "acme")["used"]["cpu_seconds"] == 0.0
    conn.close()


def test_a_revoked_principals_followings_end_as_its_cancels_would(database: str) -> None:
    """drop_followings of a revoked identity: a job it alone follows is cancelled, one another revoked identity also
    follows too (neither keeps it going), one a live identity follows is left to that one; ended jobs and jobs it
    already left are untouched, and a second drop changes nothing."""
    conn = db.connect(database)
    queue.set_quota(conn, "acme", max_in_flight=100, max_per_day=100)

    def job(need: str, *followers: str) -> int:
        ids = [queue.enqueue(conn, "acme", f"n-{who}", craft(need), principal_id=who).job_id for who in followers]
        assert len(set(ids)) == 1
        return ids[0]

    alone = job("need a", "id-c")
    claimed = queue.claim(conn, "w1", 60)  # running: its worker is the one to stop
    assert claimed is not None and claimed["id"] == alone
    with_revoked, with_live = job("need b", "id-c", "id-d"), job("need c", "id-c", "id-a")
    done, left = job("need d", "id-c"), job("need e", "id-c", "id-a")
    conn.execute("UPDATE jobs SET state = 'done', ended = now() WHERE id = %s", (done,))
    assert queue.cancel(conn, left, "acme", "n-id-c", "id-c") is not None  # left already: id-a follows it
    changed = queue.drop_followings(conn, "id-c", {"id-c", "id-d"})
    assert [(row["id"], row["state"], row.get("left_by")) for row in changed] == [
        (alone, "cancelled", None),  # its worker named in the row, as any cancel of a running job
        (with_revoked, "cancelled", None),
        (with_live, "queued", ["id-c"]),
    ], changed
    assert queue.drop_followings(conn, "id-c", {"id-c", "id-d"}) == []
    states = {job_id: queue.get(conn, job_id, "acme")["state"] for job_id in (done, left)}  # type: ignore[index]
    assert states == {done: "done", left: "queued"}, states
    because = conn.execute("SELECT DISTINCT detail->>'because' AS why FROM audit WHERE principal = 'n-id-c' AND "
                           "action IN ('cancelled', 'left') AND job <> %s", (left,)).fetchall()  # fmt: skip
    assert [row["why"] for row in because] == ["revoked"], because
    conn.close()


def test_cancels_racing_a_claim_and_each_other_end_a_job_once(database: str) -> None:
    """Each round, a worker's claim and two cancels by the job's one follower at the same moment: the job ends
    cancelled, cancelled once (one audit row, the other cancel `unchanged`), a claim that won names its worker in the
    row and the audit (the worker to stop), one that lost got nothing, and nobody claims the job afterwards."""
    conn = db.connect(database, autocommit=True)
    queue.set_quota(conn, "acme", max_in_flight=100, max_per_day=100)
    for round_ in range(12):
        job_id = queue.enqueue(conn, "acme", "alice", craft(f"need tool {round_}"), principal_id="id-alice").job_id

        def race(c: Any, n: int, job_id: int = job_id, round_: int = round_) -> Any:
            if n == 0:
                return queue.claim(c, "w1", 30)
            time.sleep(round_ % 4 * 0.004)  # the claim a little ahead in some rounds: both orders happen
            return queue.cancel(c, job_id, "acme", "alice", "id-alice")

        claimed, *cancels = raced(database, race, threads=3)
        assert all(answer is not None and answer["state"] == "cancelled" for answer in cancels), cancels
        assert sum(1 for answer in cancels if not answer.get("unchanged")) == 1, cancels
        row = queue.get(conn, job_id, "acme")
        assert row is not None and row["state"] == "cancelled", row
        said = conn.execute("SELECT action, detail FROM audit WHERE job = %s ORDER BY id", (job_id,)).fetchall()
        actions = [a["action"] for a in said]
        assert actions.count("cancelled") == 1, actions
        if claimed:  # the claim committed first: the cancel stops w1's craft
            assert (
                claimed["id"] == job_id
                and row["worker"] == "w1"
                and actions.index("claimed") < actions.index("cancelled")
            )
            assert said[actions.index("cancelled")]["detail"]["worker"] == "w1"
        else:
            assert row["worker"] is None and "claimed" not in actions
        assert queue.claim(conn, "w2", 30) is None
    conn.close()


def test_each_enqueue_or_join_is_one_following_a_waited_calls_end_retracts_alone(database: str) -> None:
    """One token follows a job by three calls (a waited call on one front queued it, one on another front joined it,
    a task joined it): the end of a waited call (cancel of its `following`) retracts that following only, the job
    goes on while the token holds another, and the same end again changes nothing; a following not the token's own is
    not its to end. The token's tasks/cancel ends all its followings (it leaves the job another identity follows);
    joining again follows again, and the last following of the job's last follower gone cancels it."""
    conn = db.connect(database)

    def follow(who: str) -> int:
        return queue.enqueue(conn, "acme", "alice", craft("need a tac"), principal_id=who).following

    def end(who: str, following: int | None = None) -> dict[str, Any]:
        row = queue.cancel(conn, job, "acme", "alice", who, following=following)
        assert row is not None
        return row

    def left_by() -> list[str]:
        row = conn.execute(f"SELECT {queue.LEFT_BY} FROM jobs j WHERE j.id = %s", (job,)).fetchone()
        assert row is not None
        return list(row["left_by"])

    queued = queue.enqueue(conn, "acme", "alice", craft("need a tac"), principal_id="id-alice")
    job, first = queued.job_id, queued.following
    second, task = follow("id-alice"), follow("id-alice")
    assert end("id-alice", first).get("retracted") and end("id-alice", second).get("retracted")
    assert end("id-alice", first).get("unchanged")  # a retried end: nothing more
    other = follow("id-alice-2")  # a token under the same name: someone else
    assert end("id-alice", other).get("unchanged") and left_by() == []
    assert end("id-alice")["left_by"] == ["id-alice"]  # tasks/cancel: all of alice's followings end, task's too
    assert end("id-alice", task)["left_by"] == ["id-alice"] and left_by() == ["id-alice"]
    again = follow("id-alice")
    assert left_by() == [] and end("id-alice", again)["left_by"] == ["id-alice"]
    assert end("id-alice-2", other)["state"] == "cancelled"
    said = conn.execute("SELECT action, detail FROM audit WHERE job = %s ORDER BY id", (job,)).fetchall()
    assert [(a["action"], a["detail"].get("following")) for a in said] == [
        ("enqueued", None), ("joined", None), ("joined", None), ("retracted", first), ("retracted", second),
        ("joined", None), ("left", None), ("joined", None), ("left", again), ("cancelled", other),
    ], said  # fmt: skip
    conn.close()


def test_only_its_own_retraction_ends_a_following(database: str) -> None:
    """A following is retracted only by a 'retracted' row of its own job, tenant and identity naming its id exactly:
    rows naming it from another job, another tenant or another identity, as other text ("0007"), or a following
    retracted in passing by a row written for another one end nothing (whoever writes the table); a job's followings
    are read in one pass over its rows, however many (queue._FOLLOWINGS: no query per following)."""
    conn = db.connect(database)
    queue.set_quota(conn, "acme", max_in_flight=10, max_per_day=10)
    mine = queue.enqueue(conn, "acme", "alice", craft("need a tac"), principal_id="id-alice")
    theirs = queue.enqueue(conn, "acme", "bob", craft("need a tac"), principal_id="id-bob")
    elsewhere = queue.enqueue(conn, "acme", "alice", craft("need a cat"), principal_id="id-alice").job_id
    queue.set_quota(conn, "other", max_in_flight=10, max_per_day=10)
    other_tenant = queue.enqueue(conn, "other", "alice", craft("need a tac"), principal_id="id-alice").job_id
    job, following = mine.job_id, mine.following
    forged = [
        ("acme", elsewhere, {"principal_id": "id-alice", "following": following}),
        ("other", other_tenant, {"principal_id": "id-alice", "following": following}),
        ("acme", job, {"principal_id": "id-bob", "following": following}),
        ("acme", job, {"principal_id": "id-alice", "following": f"000{following}"}),
        ("acme", job, {"principal_id": "id-alice", "following": theirs.following}),
        ("acme", job, {"principal_id": "id-alice"}),
    ]
    for tenant, job_id, detail in forged:
        conn.execute(
            "INSERT INTO audit (tenant, principal, action, job, detail) VALUES (%s, 'alice', 'retracted', %s, %s)",
            (tenant, job_id, Jsonb(detail)),
        )
    assert queue._followings(conn, job, "acme") == {"id-alice": {following}, "id-bob": {theirs.following}}
    assert queue.cancel(conn, job, "acme", "alice", "id-alice", following=following)["left_by"] == ["id-alice"]  # type: ignore[index]
    assert queue._followings(conn, job, "acme") == {"id-alice": set(), "id-bob": {theirs.following}}
    conn.close()


@pytest.mark.parametrize("other_end", ["the other waited call's", "a revocation's", "a tasks/cancel"])
def test_a_tokens_two_followings_ending_at_once_end_its_job_once(database: str, other_end: str) -> None:
    """Each round, one token's two followings of a job it alone follows end at the same moment, on two connections
    (two fronts): a waited call's end (its following retracted) and `other_end`. Whichever commits first, the job ends
    cancelled once: the audit holds one 'cancelled', and a retraction only when it came first. (A revocation's on a
    connection not in autocommit, as these are, committed nothing: its cancels were savepoints in the transaction its
    first read left open.)"""
    conn = db.connect(database, autocommit=True)
    queue.set_quota(conn, "acme", max_in_flight=100, max_per_day=100)
    for round_ in range(10):
        first = queue.enqueue(conn, "acme", "alice", craft(f"need tool {round_}"), principal_id="id-alice")
        second = queue.enqueue(conn, "acme", "alice", craft(f"need tool {round_}"), principal_id="id-alice")
        job, followings = first.job_id, (first.following, second.following)

        def race(c: Any, n: int, job: int = job, round_: int = round_, ends: tuple[int, int] = followings) -> Any:
            time.sleep((round_ + n) % 3 * 0.003)  # either first, in some rounds
            if n == 0:
                return queue.cancel(c, job, "acme", "alice", "id-alice", following=ends[0])
            if other_end == "a revocation's":
                return queue.drop_followings(c, "id-alice", {"id-alice"})
            following = ends[1] if other_end == "the other waited call's" else None
            return queue.cancel(c, job, "acme", "alice", "id-alice", following=following)

        raced(database, race)
        row = queue.get(conn, job, "acme")
        assert row is not None and row["state"] == "cancelled", row
        actions = [a["action"] for a in conn.execute("SELECT action FROM audit WHERE job = %s ORDER BY id", (job,))]
        assert actions.count("cancelled") == 1 and actions.count("left") == 0, actions
        assert actions.count("retracted") <= 1 and actions.index("cancelled") == len(actions) - 1, actions
    conn.close()


def test_an_enqueue_sent_again_under_its_calls_key_finds_its_first_following(database: str) -> None:
    """A front sends an enqueue again when its connection dropped, maybe after the database committed it (its
    acknowledgement lost): that wrote a second following, the first held by no call. The call's key now finds the
    first: the same job and following, the job's state now, nothing written and no quota counted again (the job ended
    and the tenant's crafts for the day are used: still its answer). Another principal's send of that key (another
    identity under alice's name too), or another tenant's, is its own following; a row of the key naming another
    tenant's job is none."""
    conn = db.connect(database, autocommit=True)
    queue.set_quota(conn, "acme", max_in_flight=4, max_per_day=1)
    key = queue.new_key()

    def send(who: str, name: str = "alice", tenant: str = "acme", need: str = "need a csv deduper") -> queue.Enqueued:
        return queue.enqueue(conn, tenant, name, craft(need), principal_id=who, answering="front-a", key=key)

    def followings() -> int:
        return int(
            conn.execute("SELECT count(*) AS n FROM audit WHERE action IN ('enqueued', 'joined')").fetchone()["n"]
        )

    first = send("id-alice")
    assert (first.joined, first.state, first.front) == (False, "queued", "front-a")
    assert send("id-alice") == first and followings() == 1
    carol = send("id-carol", "carol")
    assert carol.joined and carol.job_id == first.job_id and carol.following != first.following
    assert send("id-carol", "carol") == carol and followings() == 2
    namesake = send("id-alice-2")  # a new token under alice's name: someone else
    assert namesake.joined and namesake.following not in (first.following, carol.following)
    elsewhere = send("id-alice", tenant="globex")
    assert not elsewhere.joined and elsewhere.job_id != first.job_id and followings() == 4
    claimed = queue.claim(conn, "w1", lease_seconds=30)
    assert claimed is not None and claimed["id"] == first.job_id
    assert send("id-alice") == dataclasses.replace(first, state="running")
    assert queue.finish(conn, first.job_id, "w1", result={"status": "crafted"}, error=None)
    assert send("id-alice") == dataclasses.replace(first, state="done") and followings() == 4
    with pytest.raises(QuotaExceeded):  # the day's one craft used: what the key found was no new craft
        queue.enqueue(conn, "acme", "alice", craft("need a csv deduper"), principal_id="id-alice", key=queue.new_key())
    forged = queue.new_key()  # a row of alice's in globex naming acme's job: no following of hers there
    conn.execute(
        "INSERT INTO audit (tenant, principal, action, job, detail) VALUES ('globex', 'alice', 'enqueued', %s, %s)",
        (first.job_id, Jsonb({"principal_id": "id-alice", queue.ENQUEUE_KEY: forged})),
    )
    own = queue.enqueue(conn, "globex", "alice", craft("need a tac"), principal_id="id-alice", key=forged)
    assert (own.joined, own.state) == (False, "queued") and own.job_id not in (first.job_id, elsewhere.job_id)
    conn.close()


def test_an_enqueue_key_is_found_by_its_index_among_many_followings(database: str) -> None:
    """Every keyed enqueue looks its key up first, under the tenant's lock: the look goes through the partial index
    on the key (schema 9), not over the audit table, however many rows it holds."""
    conn = db.connect(database, autocommit=True)
    conn.execute(
        "INSERT INTO audit (tenant, principal, action, job, detail) SELECT 'acme', 'alice', "
        "CASE WHEN n %% 3 = 0 THEN 'claimed' ELSE 'joined' END, n %% 500, "
        "jsonb_build_object('principal_id', 'id-alice', %s::text, md5(n::text)) FROM generate_series(1, 50000) n",
        (queue.ENQUEUE_KEY,),
    )
    conn.execute("ANALYZE audit")
    plan = conn.execute(
        f"EXPLAIN (FORMAT JSON) {queue.SENT_BEFORE}", (queue.new_key(), "acme", "id-alice", "front-a")
    ).fetchone()
    assert plan is not None and "audit_by_enqueue_key" in json.dumps(plan), plan
    conn.close()


def test_an_enqueue_sent_again_after_its_token_was_revoked_is_not_made_a_following_again(database: str) -> None:
    """alice's call joined carol's job (committed, its acknowledgement lost); before the front sent it again, alice's
    token was revoked and the front's look made her leave the job (drop_followings, once per revocation). The resend
    finds her first following, ended: its answer is that one (her call answers the job as she sees it), never a new
    following of the job for a revoked identity, which no later look would end."""
    conn = db.connect(database, autocommit=True)
    carol = queue.enqueue(conn, "acme", "carol", craft("need a csv deduper"), principal_id="id-carol", answering="f")
    key = queue.new_key()
    first = queue.enqueue(
        conn, "acme", "alice", craft("need a csv deduper"), principal_id="id-alice", answering="f", key=key
    )
    assert first.joined and first.job_id == carol.job_id
    assert [row["id"] for row in queue.drop_followings(conn, "id-alice", ["id-alice"])] == [carol.job_id]
    again = queue.enqueue(
        conn, "acme", "alice", craft("need a csv deduper"), principal_id="id-alice", answering="f", key=key
    )
    assert again == first
    rows = conn.execute(
        "SELECT principal, action FROM audit WHERE action IN ('enqueued', 'joined', 'left') ORDER BY id"
    )
    assert [(r["principal"], r["action"]) for r in rows.fetchall()] == [
        ("carol", "enqueued"),
        ("alice", "joined"),
        ("alice", "left"),
    ]
    conn.close()
