"""`flakebot worker` as a real process on a real PostgreSQL: it survives the database restarting, and a craft whose
worker is killed -9 is resumed by another worker once its lease runs out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from flakebot.pipeline.request import RunRequest
from flakebot.pipeline.run import Run
from flakebot.team import db, queue
from tests.conftest import FLAKEBOT, REPO, require, wait_for
from tests.team.conftest import Cluster

SESSION = REPO / "flakebot/data/sessions/csv-dedup.json"
LEASE = "4"  # seconds: a killed worker's job is free again this soon


@contextmanager
def worker(database: str, log: Path, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """A `flakebot worker --once` in a session of its own (killed with all its children if still running)."""
    argv = [*FLAKEBOT, "worker", "--database", database, "--once", "--lease", LEASE, "--json", *extra]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=os.getcwd())
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
    with worker(database, log) as proc:
        wait_for(lambda: listening(database), timeout=60, interval=0.2)
        postgres.restart()
        with db.connect(database) as conn:  # a craft that fails at its first check: no model script there
            asked = RunRequest(need="need a csv deduper", model="scripted:/nonexistent.json", registry="local")
            job_id = queue.enqueue(conn, "acme", "alice", asked).job_id
        assert proc.wait(timeout=90) == 0, log.read_text()
    row = job_row(database, job_id)
    assert row["state"] == "failed" and row["error"]["type"] == "ScriptError", row
    summary = json.loads(log.read_text().splitlines()[-1])["result"]
    assert summary["jobs"] == [{"job": job_id, "state": "failed", "recorded": True, "run_id": None}]
    text = log.read_text()
    assert "lost the database" in text and postgres.password not in text  # the URL's password never logged


def test_a_bad_lease_is_refused_before_connecting(database: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [*FLAKEBOT, "worker", "--database", database, "--lease", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and json.loads(done.stdout.splitlines()[-1])["type"] == "UsageError"


def test_an_unreachable_database_is_one_line_without_its_password(postgres: Cluster) -> None:
    wrong = f"postgresql://flakebot:{postgres.password}@127.0.0.1:1/postgres"  # nothing listens on port 1
    done = subprocess.run(
        [*FLAKEBOT, "worker", "--database", wrong, "--once"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 5, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach the team database"), done.stderr
    assert postgres.password not in done.stderr + done.stdout and "[REDACTED]" in done.stderr


@pytest.mark.slow
def test_a_killed_workers_craft_is_resumed_by_another_worker(database: str, tmp_path: Path, workdir: Path) -> None:
    require("bwrap", "cargo", "nix")
    with db.connect(database) as conn:
        asked = RunRequest(need="need a CSV deduper", model=f"scripted:{SESSION}", registry="local", offline=True)
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
    run = Run.load(workdir, run_id)
    assert run.state["status"] == "succeeded" and run.state["stages"]["edit"]["attempts"] == 2
    assert run.state["stages"]["spec"]["attempts"] == 1  # resumed, not crafted again


@pytest.mark.slow
def test_a_worker_stopped_mid_craft_hands_its_job_back_at_once(database: str, tmp_path: Path, workdir: Path) -> None:
    require("bwrap", "cargo", "nix")
    with db.connect(database) as conn:
        asked = RunRequest(need="need a CSV deduper", model=f"scripted:{SESSION}", registry="local", offline=True)
        job_id = queue.enqueue(conn, "acme", "alice", asked).job_id
    log = tmp_path / "worker.log"
    with worker(database, log, "--lease", "600") as proc:  # a lease that would hold the job for ten minutes
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
