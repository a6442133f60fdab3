"""`flakebot worker` as a real process on a real PostgreSQL: it survives the database restarting, and a craft whose
worker is killed -9 is resumed by another worker once its lease runs out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flakebot.pipeline.request import RunRequest
from flakebot.pipeline.run import Run
from flakebot.team import db, queue
from flakebot.team.dburl import ENV as DATABASE_ENV
from flakebot.team.worker import Worker
from tests.conftest import FLAKEBOT, REPO, require, wait_for
from tests.fakes.processes import own_processes
from tests.team.conftest import Cluster

SESSION = REPO / "flakebot/data/sessions/csv-dedup.json"
LEASE = "4"  # seconds: a killed worker's job is free again this soon


@contextmanager
def worker(
    database: str,
    log: Path,
    *extra: str,
    model: str = f"scripted:{SESSION}",
    verbose: bool = False,
    once: bool = True,
) -> Iterator[subprocess.Popen[bytes]]:
    """A `flakebot worker --once` (or working on, `once` False) in a session of its own (killed with all its children
    if still running), offline, with `model` (the worker's settings choose them: a tenant's row may not); its database
    in FLAKEBOT_DATABASE_URL, as an admin gives it (a password on the command line is refused)."""
    argv = [*FLAKEBOT, *(["-vv"] if verbose else []), "worker", *(["--once"] if once else []), "--lease", LEASE]
    argv += ["--json", *extra]
    env = {**os.environ, DATABASE_ENV: database, "FLAKEBOT_MODEL": model, "FLAKEBOT_OFFLINE": "true"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=os.getcwd(), env=env
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def listening(database: str) -> bool:
    with db.connect(database) as conn:
        found = conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'flakebot worker %%' AND state = 'idle'"
        ).fetchone()
    return bool(found and found["n"])


def job_row(database: str, job_id: int) -> dict[str, Any]:
    with db.connect(database) as conn:
        row = queue.get(conn, job_id, "acme")
    assert row is not None
    return row


def test_a_waiting_worker_reconnects_after_the_database_restarts(
    postgres: Cluster, database: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    with worker(database, log, model="scripted:/nonexistent.json") as proc:
        wait_for(lambda: listening(database), timeout=60, interval=0.2)
        postgres.restart()
        with db.connect(database) as conn:  # a craft that fails at its first check: no model script there
            asked = RunRequest(need="need a csv deduper", registry="local")
            job_id = queue.enqueue(conn, "acme", "alice", asked).job_id
        assert proc.wait(timeout=90) == 0, log.read_text()
    row = job_row(database, job_id)
    assert row["state"] == "failed" and row["error"]["type"] == "ScriptError", row
    summary = json.loads(log.read_text().splitlines()[-1])["result"]
    assert summary["jobs"] == [{"job": job_id, "state": "failed", "recorded": True, "run_id": None}]
    text = log.read_text()
    assert "lost the database" in text and postgres.password not in text  # the URL's password never logged


@pytest.mark.parametrize("lease", ["1", "1e300", "86401"])
def test_a_bad_lease_is_refused_before_connecting(database: str, tmp_path: Path, lease: str) -> None:
    """Too short to renew, or longer than a day: 1e300 passed and the worker started, a lease PostgreSQL cannot add to
    a time ("timestamp out of range", as serve's first lease was refused); a lease of a year kept a killed worker's
    job from every other worker as long."""
    done = subprocess.run(
        [*FLAKEBOT, "worker", "--lease", lease, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, DATABASE_ENV: database},
    )
    assert done.returncode == 2 and json.loads(done.stdout.splitlines()[-1])["type"] == "UsageError"


PASSWORD_FORMS = [
    "postgresql://flakebot:{pw}@127.0.0.1:1/postgres",
    "postgresql://:{pw}@127.0.0.1:1/postgres",  # no user: libpq's default user, this password
    "postgresql://flakebot@127.0.0.1:1/postgres?password={pw}&sslmode=disable",
    "host=127.0.0.1 port=1 user=flakebot password={pw} dbname=postgres",
    "postgresql://flakebot@127.0.0.1:1/postgres?sslpassword={pw}&sslmode=disable",  # the client key's password
]


@pytest.mark.parametrize(
    "url",
    ["postgresql://u@db/x?%70assword=ab12", "host=db password = ab12", "host=db sslpassword = 'ab12'"],
)
def test_the_database_a_log_line_names_holds_no_password_however_short_or_spelled(url: str) -> None:
    """libpq decodes a URL's query keys and takes spaces around a connection string's '=': a short password so
    spelled matches neither a general pattern nor the length a secret must have to be replaced wherever it appears."""
    assert "ab12" not in db.shown(url), db.shown(url)


def worker_refused(url: str, error: str) -> subprocess.CompletedProcess[str]:
    """`flakebot worker --once` given `url` in FLAKEBOT_DATABASE_URL: exit 5 and one line, starting with `error`."""
    done = subprocess.run(
        [*FLAKEBOT, "worker", "--once"],
        capture_output=True, text=True, timeout=60, env={**os.environ, DATABASE_ENV: url},
    )  # fmt: skip
    assert done.returncode == 5, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(error), done.stderr
    return done


@pytest.mark.parametrize(
    "url", ["postgresql://u:hunter%zz22secret@127.0.0.1:1/db", "host=127.0.0.1 port=1 password='hunter22secret"]
)
def test_a_database_url_libpq_cannot_read_is_one_line_without_its_password(url: str) -> None:
    """libpq's complaint about a URL it cannot read quotes the piece it stopped at (a bad %-escape in the password,
    an unterminated quoted password): that piece is no pattern's, and libpq names no password to replace."""
    done = worker_refused(url, "error: ")
    assert "hunter" not in done.stderr + done.stdout, done.stderr


@pytest.mark.parametrize("form", PASSWORD_FORMS)
def test_an_unreachable_database_is_one_line_without_its_password(postgres: Cluster, form: str) -> None:
    wrong = form.format(pw=postgres.password)  # nothing listens on port 1; libpq takes each form
    done = worker_refused(wrong, "error: cannot reach the team database")
    assert postgres.password not in done.stderr + done.stdout and "[REDACTED]" in done.stderr


@pytest.mark.parametrize("form", PASSWORD_FORMS)
@pytest.mark.parametrize("command", [("worker", "--once"), ("quota", "acme"), ("serve", "--port", "0")])
def test_a_password_on_the_command_line_is_refused_in_one_line(
    postgres: Cluster, form: str, command: tuple[str, ...], tmp_path: Path
) -> None:
    """Every user of the machine reads a process's arguments (ps, /proc/PID/cmdline): a --database with a password
    is refused before anything starts, in one line that names the private ways and never echoes the password."""
    given = form.format(pw=postgres.password).replace("127.0.0.1:1", f"127.0.0.1:{postgres.port}")
    given = given.replace("port=1 ", f"port={postgres.port} ")  # a database that answers: the refusal is not its
    done = subprocess.run(
        [*FLAKEBOT, "--log-file", str(tmp_path / "log"), "-vv", command[0], "--database", given, *command[1:]],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --database holds a password"), done.stderr
    assert DATABASE_ENV in lines[0] and "pgpass" in lines[0], lines[0]
    logged = (tmp_path / "log").read_text() if (tmp_path / "log").exists() else ""
    assert postgres.password not in done.stderr + done.stdout + logged
    assert "flakebot serve:" not in done.stdout  # nothing listened


def test_a_worker_given_its_database_in_the_environment_shows_its_password_nowhere(
    postgres: Cluster, database: str, tmp_path: Path
) -> None:
    """The URL with its password in FLAKEBOT_DATABASE_URL: the worker connects and works, and neither its command
    line (which every local user reads), its log, its output nor the job's row and audit hold the password."""
    assert postgres.password in database
    log = tmp_path / "worker.log"
    with worker(database, log, model="scripted:/nonexistent.json", verbose=True) as proc:
        wait_for(lambda: listening(database), timeout=60, interval=0.2)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert b"worker" in cmdline and postgres.password.encode() not in cmdline, cmdline
        with db.connect(database) as conn:  # a craft that fails at its first check: no model script there
            job_id = queue.enqueue(conn, "acme", "alice", RunRequest(need="need a csv deduper")).job_id
        assert proc.wait(timeout=90) == 0, log.read_text()
    row = job_row(database, job_id)
    assert row["state"] == "failed", row
    with db.connect(database) as conn:
        audit = conn.execute("SELECT * FROM audit").fetchall()
    text = log.read_text()
    assert audit and postgres.password not in text + json.dumps(row, default=str) + str(audit)
    assert "postgresql://[REDACTED]@127.0.0.1" in text, text  # the log names the database, redacted


@pytest.mark.slow
def test_a_killed_workers_craft_is_resumed_by_another_worker(database: str, tmp_path: Path, workdir: Path) -> None:
    require("bwrap", "cargo", "nix")
    with db.connect(database) as conn:
        asked = RunRequest(need="need a CSV deduper", registry="local")
        job_id = queue.enqueue(conn, "acme", "alice", asked).job_id
    with worker(database, tmp_path / "first.log", "--name", "first") as first:
        run_id = wait_for(lambda: job_row(database, job_id)["run_id"], timeout=120, interval=0.2)
        events = workdir / "runs" / run_id / "events.jsonl"
        wait_for(lambda: events.exists() and '"stage": "edit", "message": "' in events.read_text(), timeout=180)
        os.killpg(first.pid, signal.SIGKILL)  # the worker and the sandbox under it, mid-edit
    assert job_row(database, job_id)["state"] == "running"

    with worker(database, tmp_path / "second.log", "--name", "second") as second:
        assert second.wait(timeout=600) == 0, (tmp_path / "second.log").read_text()
    row = job_row(database, job_id)
    assert (row["state"], row["worker"], row["attempts"], row["run_id"]) == ("done", "second", 2, run_id)
    assert row["result"]["status"] == "crafted" and row["result"]["name"] == "csv-dedup"
    # the second worker's CPU-seconds (its cargo and nix builds); the killed one's were lost with it
    assert row["cpu_seconds"] > 1.0, row["cpu_seconds"]
    run = Run.load(workdir, run_id)
    assert run.state["status"] == "succeeded" and run.state["stages"]["edit"]["attempts"] == 2
    assert run.state["stages"]["spec"]["attempts"] == 1  # resumed, not crafted again


@pytest.mark.slow
def test_a_worker_stopped_mid_craft_hands_its_job_back_at_once(database: str, tmp_path: Path, workdir: Path) -> None:
    require("bwrap", "cargo", "nix")
    with db.connect(database) as conn:
        asked = RunRequest(need="need a CSV deduper", registry="local")
        job_id = queue.enqueue(conn, "acme", "alice", asked).job_id
    log = tmp_path / "worker.log"
    # the edit stage's first model call answers after five minutes: the craft is mid-edit when stopped, however slowly
    # this machine ran it up to there (a craft that ended first would hand back nothing)
    session = json.loads(SESSION.read_text())
    session["stages"]["edit"].insert(0, {"fault": {"kind": "slow", "seconds": 300}, "content": "-"})
    stalled = tmp_path / "stalled-mid-edit.json"
    stalled.write_text(json.dumps(session))
    with worker(database, log, "--lease", "600", model=f"scripted:{stalled}") as proc:  # a lease of ten minutes
        run_id = wait_for(lambda: job_row(database, job_id)["run_id"], timeout=120, interval=0.2)
        events = workdir / "runs" / run_id / "events.jsonl"
        wait_for(lambda: events.exists() and '"stage": "edit", "message": "' in events.read_text(), timeout=180)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 130, log.read_text()
    row = job_row(database, job_id)
    assert (row["state"], row["worker"], row["run_id"]) == ("queued", None, run_id), log.read_text()
    with db.connect(database) as conn:
        again = queue.claim(conn, "next", 30)
    assert again is not None and again["id"] == job_id  # free now, not after the ten minutes


def forge(database: str, request: Any) -> int:
    """A job row written straight into the table, as anyone with the database's password could."""
    with db.connect(database) as conn:
        queue.set_quota(conn, "acme", max_in_flight=99, max_per_day=99)
        row = conn.execute(
            "INSERT INTO jobs (tenant, principal, kind, need_digest, request) VALUES ('acme', 'mallory', 'craft', "
            "md5(random()::text), %s) RETURNING id",
            (Jsonb(request),),
        ).fetchone()
        conn.commit()
    assert row is not None
    return int(row["id"])


def test_a_forged_job_row_cannot_steer_the_worker(database: str, tmp_path: Path) -> None:
    evil = tmp_path / "evil"
    need = "need a csv deduper"
    forged = {
        "settings": {"need": need, "settings": {"sandbox": "off", "workdir": str(evil)}},
        "sandbox": {"need": need, "sandbox": "off"},
        "spec_file": {"need": need, "spec_file": "/etc/passwd"},
        "model": {"need": need, "model": "scripted:/etc/passwd"},
        "registry": {"need": need, "registry": "/etc"},
        "from": {"need": need, "from_location": str(tmp_path)},
        "need": {"need": ["not", "a", "string"]},
        "unknown": {"need": need, "grant_root": "/"},
    }
    env = {
        **os.environ,
        DATABASE_ENV: database,
        "FLAKEBOT_MODEL": "scripted:/nonexistent.json",
        "FLAKEBOT_WORKDIR": str(tmp_path / "w"),
    }
    for field_name, request in forged.items():
        job_id = forge(database, request)
        log = tmp_path / f"{field_name}.log"
        with log.open("wb") as out:
            done = subprocess.run(
                [*FLAKEBOT, "worker", "--once", "--json"],
                stdout=out, stderr=subprocess.STDOUT, env=env, timeout=120,
            )  # fmt: skip
        assert done.returncode == 0, log.read_text()
        row = job_row(database, job_id)
        assert row["state"] == "failed" and row["error"]["type"] == "UsageError", (field_name, row["error"])
        assert "root:" not in json.dumps(row["error"]), row["error"]  # no host file's text in the job's error
    assert not evil.exists() and not (tmp_path / "w" / "runs").exists()


def test_a_forged_run_id_does_not_resume_another_tenants_run(database: str, tmp_path: Path) -> None:
    work = tmp_path / "w"
    theirs = Run.create(work, "craft", RunRequest(need="need globex's secret pricing tool"))
    before = (work / "runs" / theirs.id / "state.json").read_bytes()
    env = {
        **os.environ,
        DATABASE_ENV: database,
        "FLAKEBOT_MODEL": "scripted:/nonexistent.json",
        "FLAKEBOT_WORKDIR": str(work),
    }
    for run_id in (theirs.id, theirs.id[:9]):
        job_id = forge(database, {"need": "need a csv deduper"})
        with db.connect(database) as conn:
            conn.execute("UPDATE jobs SET run_id = %s WHERE id = %s", (run_id, job_id))
        done = subprocess.run(
            [*FLAKEBOT, "worker", "--once", "--json"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        row = job_row(database, job_id)
        assert row["state"] == "failed" and row["error"]["type"] == "ScriptError", row["error"]  # crafted afresh
        assert row["error"]["run_id"] is None, row["error"]
    assert (work / "runs" / theirs.id / "state.json").read_bytes() == before


def test_a_process_stalled_inside_a_transaction_stalls_nobody_for_long(database: str, tmp_path: Path) -> None:
    """A process stopped (SIGSTOP, a paused VM) in the middle of one of flakebot's transactions, holding the locks
    taken there (the schema's on connect, a tenant's on enqueue): other workers still connect and work, and the
    server ends the stalled transaction so the tenant's enqueues go on."""
    with db.connect(database) as conn:
        job_id = queue.enqueue(conn, "acme", "alice", RunRequest(need="need a csv deduper")).job_id
    stalled = db.connect(database)
    stalled.execute("SELECT pg_advisory_xact_lock(%s)", (db.MIGRATION_LOCK,))  # as migrate() takes it
    stalled.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (queue.TENANT_LOCK, "acme"))  # as enqueue
    env = {
        **os.environ,
        DATABASE_ENV: database,
        "FLAKEBOT_MODEL": "scripted:/nonexistent.json",
        "FLAKEBOT_WORKDIR": str(tmp_path / "w"),
    }
    done = subprocess.run(
        [*FLAKEBOT, "worker", "--once", "--json"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert job_row(database, job_id)["state"] == "failed"
    with db.connect(database) as conn:
        started = time.monotonic()
        queue.enqueue(conn, "acme", "alice", RunRequest(need="need a json pretty printer"))
        assert time.monotonic() - started < db.IDLE_IN_TRANSACTION + 10
    assert _gone(stalled)  # the server ended the stalled session, its locks with it
    stalled.close()


def _gone(conn: Any) -> bool:
    """Whether the server closed `conn`'s session."""
    try:
        conn.execute("SELECT 1")
    except psycopg.Error:
        return True
    return False


@pytest.mark.slow
def test_a_stalled_workers_job_taken_over_ends_done_once(database: str, tmp_path: Path, workdir: Path) -> None:
    """A worker stalled past its lease (SIGSTOP: its heartbeat stalls too) while it drives the run: the worker that
    takes the job over waits for that run instead of failing the job, and records its one result."""
    require("bwrap", "cargo", "nix")
    with db.connect(database) as conn:
        job_id = queue.enqueue(conn, "acme", "alice", RunRequest(need="need a CSV deduper", registry="local")).job_id
    with worker(database, tmp_path / "first.log", "--name", "first") as first:
        run_id = wait_for(lambda: job_row(database, job_id)["run_id"], timeout=120, interval=0.2)
        events = workdir / "runs" / run_id / "events.jsonl"
        wait_for(lambda: events.exists() and '"stage": "edit", "message": "' in events.read_text(), timeout=180)
        os.killpg(first.pid, signal.SIGSTOP)
        try:
            with worker(database, tmp_path / "second.log", "--name", "second") as second:
                wait_for(lambda: job_row(database, job_id)["worker"] == "second", timeout=60, interval=0.2)
                os.killpg(first.pid, signal.SIGCONT)
                assert first.wait(timeout=600) == 0, (tmp_path / "first.log").read_text()
                assert second.wait(timeout=600) == 0, (tmp_path / "second.log").read_text()
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGCONT)
    row = job_row(database, job_id)
    assert (row["state"], row["worker"], row["run_id"]) == ("done", "second", run_id), row
    assert row["result"]["status"] == "crafted" and row["result"]["run_id"] == run_id
    first_summary = json.loads((tmp_path / "first.log").read_text().splitlines()[-1])["result"]
    assert first_summary["jobs"][0]["recorded"] is False  # the stalled worker's end was not written over it
    assert Run.load(workdir, run_id).state["status"] == "succeeded"


def test_a_second_worker_with_a_name_in_use_is_refused(database: str, tmp_path: Path) -> None:
    """Two workers of one name would renew and finish each other's jobs (a lease is held by name)."""
    with worker(database, tmp_path / "first.log", "--name", "twin"):
        wait_for(lambda: listening(database), timeout=60, interval=0.2)
        done = subprocess.run(
            [*FLAKEBOT, "worker", "--once", "--name", "twin"],
            capture_output=True, text=True, timeout=60, env={**os.environ, DATABASE_ENV: database},
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "twin" in lines[0] and lines[0].startswith("error: "), done.stderr


def _claimed(database: str) -> tuple[Any, dict[str, Any]]:
    """A connection, and a job queued by alice and claimed by worker w1 (as Worker.next_job claims it)."""
    conn = db.connect(database, autocommit=True)
    queue.enqueue(conn, "acme", "alice", RunRequest(need="need a CSV deduper"), principal_id="id-alice")
    job = queue.claim(conn, "w1", 30)
    assert job is not None
    return conn, job


def _work_stopped(database: str, crafts: Any, job: dict[str, Any]) -> None:
    """Worker w1's work() of `job` with `crafts`, which must end in the worker's own stop (KeyboardInterrupt)."""
    working = Worker(database, crafts, "w1", lease_seconds=30)
    try:
        with pytest.raises(KeyboardInterrupt):
            working.work(job)
    finally:
        working.close()


def _cancel_once(started: threading.Event, database: str, job: dict[str, Any]) -> threading.Thread:
    """A thread that cancels `job` as alice (its only follower) on a connection of its own, as a front would, once
    `started` is set; started."""

    def cancel() -> None:
        started.wait(10)
        with db.connect(database) as other:
            assert queue.cancel(other, int(job["id"]), "acme", "alice", "id-alice") is not None

    helper = threading.Thread(target=cancel)
    helper.start()
    return helper


def test_a_craft_cancelled_while_it_runs_is_stopped_and_its_worker_goes_on(database: str) -> None:
    """A Worker on the main thread whose craft waits (as a sandboxed command does): the cancel, committed by another
    connection, stops it within seconds through SIGTERM, and work() answers cancelled instead of raising (a stop of
    the worker would raise); the row stays cancelled, its CPU-seconds settled."""
    conn, job = _claimed(database)
    started = threading.Event()

    def crafts(row: dict[str, Any], sink: Any) -> dict[str, Any]:
        started.set()
        time.sleep(60)  # interrupted by the cancel's SIGTERM long before
        raise AssertionError("the craft was not stopped")

    helper = _cancel_once(started, database, job)
    begun, working = time.monotonic(), Worker(database, crafts, "w1", lease_seconds=30)
    try:
        ended = working.work(job)
    finally:
        working.close()
    helper.join(timeout=10)
    assert ended["state"] == "cancelled" and time.monotonic() - begun < 20, ended
    row = queue.get(conn, int(job["id"]), "acme")
    assert row is not None and (row["state"], row["result"], row["worker"]) == ("cancelled", None, "w1")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the worker's handler is gone with its craft
    conn.close()


def test_a_cancel_between_a_crafts_end_and_its_write_wins_the_row(database: str) -> None:
    """The cancel commits after the craft ended and before the worker writes its end: the worker's result is refused,
    the row stays cancelled (as MCP keeps a cancelled task cancelled), and the worker answers cancelled."""
    conn, job = _claimed(database)

    def crafts(row: dict[str, Any], sink: Any) -> dict[str, Any]:
        with db.connect(database) as other:  # the craft is over; its follower's cancel lands now
            assert queue.cancel(other, int(row["id"]), "acme", "alice", "id-alice") is not None
        return {"status": "crafted", "name": "csv-dedup", "run_id": "20260101-000000-abcdef"}

    working = Worker(database, crafts, "w1", lease_seconds=30)
    try:
        ended = working.work(job)
    finally:
        working.close()
    assert ended["state"] == "cancelled", ended
    row = queue.get(conn, int(job["id"]), "acme")
    assert row is not None and (row["state"], row["result"]) == ("cancelled", None)
    conn.close()


def test_a_worker_stopped_as_its_job_is_cancelled_still_counts_its_cpu_seconds(database: str) -> None:
    """The cancel commits, then the operator's SIGTERM reaches the worker before its heartbeat looks at the row: the
    worker stops (work() raises, as any stop), the job cannot be handed back (its row is cancelled for good), and the
    CPU-seconds the craft spent are still added to the cancelled row, which counts them against the tenant's day."""
    conn, job = _claimed(database)

    def crafts(row: dict[str, Any], sink: Any) -> dict[str, Any]:
        until = time.process_time() + 0.3
        while time.process_time() < until:  # CPU the tenant's day must count
            pass
        with db.connect(database) as other:
            assert queue.cancel(other, int(row["id"]), "acme", "alice", "id-alice") is not None
        os.kill(os.getpid(), signal.SIGTERM)  # the operator's, within the heartbeat's second
        time.sleep(60)
        raise AssertionError("the craft was not stopped")

    _work_stopped(database, crafts, job)
    row = queue.get(conn, int(job["id"]), "acme")
    assert row is not None and row["state"] == "cancelled", row
    assert row["cpu_seconds"] >= 0.25, row
    conn.close()


def test_after_a_cancelled_craft_its_worker_crafts_the_next_job_to_its_end(database: str) -> None:
    """The same Worker, its first craft (which spent CPU) cancelled and stopped: its next job, a craft outlasting
    several of the heartbeat's looks, ends done and recorded (no stop left over from the cancel), SIGTERM's handler
    is the one before, and the next job is charged none of the cancelled craft's CPU-seconds."""
    conn, job = _claimed(database)
    started = threading.Event()

    def crafts(row: dict[str, Any], sink: Any) -> dict[str, Any]:
        until = time.process_time() + (0.5 if row["id"] == job["id"] else 0.0)
        while time.process_time() < until:
            pass
        started.set()
        time.sleep(60 if row["id"] == job["id"] else 3.5)  # the first is cancelled; the next outlasts three looks
        return {"status": "crafted", "name": "csv-dedup", "run_id": "20260101-000000-abcdef"}

    helper = _cancel_once(started, database, job)
    working = Worker(database, crafts, "w1", lease_seconds=30)
    try:
        assert working.work(job)["state"] == "cancelled"
        helper.join(timeout=10)
        queue.enqueue(conn, "acme", "alice", RunRequest(need="need a word counter"), principal_id="id-alice")
        following = queue.claim(conn, "w1", 30)
        assert following is not None
        ended = working.work(following)
    finally:
        working.close()
    assert (ended["state"], ended["recorded"]) == ("done", True), ended
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    first, second = queue.get(conn, int(job["id"]), "acme"), queue.get(conn, int(following["id"]), "acme")
    assert first is not None and second is not None
    assert (first["state"], second["state"]) == ("cancelled", "done"), (first, second)
    assert first["cpu_seconds"] >= 0.4 and second["cpu_seconds"] < 0.3, (first, second)
    conn.close()


def test_a_worker_sigtermed_as_its_running_job_is_cancelled_stops_and_counts_it(
    database: str, tmp_path: Path, workdir: Path
) -> None:
    """A real worker mid-edit (a sandboxed command running): its job's one follower cancels it and, at once, before
    the heartbeat's look, its operator sends SIGTERM. The worker stops as stopped (130), the job stays cancelled (not
    handed back: nobody resumes it), its CPU-seconds counted, its run interrupted, none of its processes left."""
    require("bwrap", "cargo", "nix")
    with db.connect(database) as conn:
        asked = RunRequest(need="need a CSV deduper", registry="local")
        job_id = queue.enqueue(conn, "acme", "alice", asked).job_id
    log = tmp_path / "worker.log"
    with own_processes() as listing, worker(database, log, "--lease", "600") as proc:
        run_id = wait_for(lambda: job_row(database, job_id)["run_id"], timeout=120, interval=0.2)
        events = workdir / "runs" / run_id / "events.jsonl"
        wait_for(lambda: events.exists() and '"stage": "edit", "message": "' in events.read_text(), timeout=180)
        wait_for(lambda: any("bwrap" in argv[0] for _, argv in listing()), timeout=120, interval=0.1)
        with db.connect(database) as conn:
            assert queue.cancel(conn, job_id, "acme", "alice") is not None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 130, log.read_text()
        wait_for(lambda: not listing(), timeout=30, interval=0.1)
    row = job_row(database, job_id)
    assert (row["state"], row["result"]) == ("cancelled", None), log.read_text()
    assert row["cpu_seconds"] > 0, (row, log.read_text())
    assert json.loads((workdir / "runs" / run_id / "state.json").read_text())["status"] == "interrupted"
    with db.connect(database) as conn:
        assert queue.claim(conn, "next", 30) is None  # cancelled for good


def test_a_cancel_seen_while_the_craft_stops_for_its_worker_neither_undoes_the_stop_nor_cuts_its_cleanup(
    database: str,
) -> None:
    """The operator's SIGTERM first; the follower's cancel lands while the craft cleans up (kills its sandboxes, as
    the pipeline does on SIGTERM), long enough for the heartbeat to see it. The cleanup is not interrupted again (a
    cut cleanup leaves processes running for nobody), and the worker still stops (work() raises; it took the cancel
    for the reason and went on to the next job before), the cancelled row counting the CPU-seconds spent."""
    conn, job = _claimed(database)
    cleaned: list[bool] = []

    def crafts(row: dict[str, Any], sink: Any) -> dict[str, Any]:
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the operator's
            time.sleep(60)
        except KeyboardInterrupt:
            with db.connect(database) as other:
                assert queue.cancel(other, int(row["id"]), "acme", "alice", "id-alice") is not None
            until = time.process_time() + 0.3
            while time.process_time() < until:  # the cleanup's CPU
                pass
            time.sleep(2.5)  # three of the heartbeat's looks
            cleaned.append(True)
            raise
        raise AssertionError("the craft was not stopped")

    _work_stopped(database, crafts, job)
    assert cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    row = queue.get(conn, int(job["id"]), "acme")
    assert row is not None and row["state"] == "cancelled" and row["cpu_seconds"] >= 0.25, row
    conn.close()


def test_a_worker_sigtermed_while_its_craft_stops_for_a_cancel_stops_too(database: str) -> None:
    """The cancel's stop first (the heartbeat's SIGTERM), the operator's SIGTERM during the craft's cleanup: the
    worker stops (work() raises) instead of going on to the next job, the row cancelled."""
    conn, job = _claimed(database)
    started = threading.Event()

    def crafts(row: dict[str, Any], sink: Any) -> dict[str, Any]:
        started.set()
        try:
            time.sleep(60)  # until the cancel's SIGTERM
        except KeyboardInterrupt:
            os.kill(os.getpid(), signal.SIGTERM)  # the operator's, as the craft cleans up
            time.sleep(5)
        raise AssertionError("the craft was not stopped")

    helper = _cancel_once(started, database, job)
    _work_stopped(database, crafts, job)
    helper.join(timeout=10)
    row = queue.get(conn, int(job["id"]), "acme")
    assert row is not None and row["state"] == "cancelled", row
    conn.close()
