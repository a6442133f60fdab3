"""A worker killed mid-craft: one offline craft (the scripted csv-dedup session) queued in a real PostgreSQL
(benchmarks/scenarios/postgres.py), a `flakebot worker --once` killed with SIGKILL (its whole process group) once the
craft is editing, a second worker started at that moment, which claims the job when the first's lease runs out and
resumes its run; then the same craft, undisturbed, by one worker in a fresh home. The figure is the failover's whole
wall (first worker's start to the second's end) minus the undisturbed craft's wall (goal <= 60 s).

The failover craft runs first: the undisturbed one may then find its Nix builds in the store, so its wall is if
anything shorter and the figure larger, never flattered.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import flakebot
from benchmarks.scenarios.postgres import new_database, temporary_cluster
from flakebot.pipeline.request import RunRequest
from flakebot.team import db, queue

SESSION = Path(flakebot.__file__).parent / "data/sessions/csv-dedup.json"
REGISTRY = "/usr/share/cargo/registry"
TENANT = "acme"


@dataclass(frozen=True, kw_only=True)
class FailoverResult:
    """run()'s result, as report.json holds it."""

    lease_s: float
    killed_after_s: float  # the first worker's start to its SIGKILL
    kill_to_done_s: float  # the SIGKILL to the second worker's end
    failover_wall_s: float  # the first worker's start to the second's end
    own_s: float  # the same craft undisturbed, one worker
    overhead_s: float  # failover_wall_s - own_s
    attempts: int


RESULT = FailoverResult


def home_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKEBOT_")}
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        (home / var).mkdir(parents=True, exist_ok=True)
        env[var] = str(home / var)
    env["FLAKEBOT_WORKDIR"] = str(home / "work")
    env["FLAKEBOT_LOCAL_REGISTRY"] = REGISTRY
    # the model and offline are the worker's own settings: a job's row may not set them (queue.tenant_request)
    env["FLAKEBOT_MODEL"] = f"scripted:{SESSION}"
    env["FLAKEBOT_OFFLINE"] = "1"
    return env


def enqueue(database: str) -> int:
    asked = RunRequest(need="need a CSV deduper", registry="local")
    with db.connect(database) as conn:
        return queue.enqueue(conn, TENANT, "bench", asked).job_id


def job(database: str, job_id: int) -> dict[str, object]:
    with db.connect(database) as conn:
        row = queue.get(conn, job_id, TENANT)
    assert row is not None
    return dict(row)


def worker(
    database: str, env: dict[str, str], home: Path, name: str, lease: float, once: bool = True
) -> subprocess.Popen[bytes]:
    """A `flakebot worker` (--once: one job, then exit) in a session of its own, its output in HOME/NAME.log."""
    argv = [sys.executable, "-m", "flakebot", "worker", *(["--once"] if once else []),
            "--lease", f"{lease:g}", "--json", "--name", name]  # fmt: skip
    env = {**env, "FLAKEBOT_DATABASE_URL": database}  # its password off the command line (flakebot.team.dburl)
    with (home / f"{name}.log").open("wb") as out:
        return subprocess.Popen(argv, env=env, cwd=home, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def until(probe: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not probe():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s")
        time.sleep(0.1)


def finished(process: subprocess.Popen[bytes], home: Path, name: str, timeout: float = 1800) -> None:
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise RuntimeError(f"worker {name} still running after {timeout:g} s") from None
    if code != 0:
        raise RuntimeError(f"worker {name} exited {code}: {(home / f'{name}.log').read_text()[-2000:]}")


def editing(database: str, job_id: int, env: dict[str, str]) -> bool:
    run_id = job(database, job_id).get("run_id")
    events = Path(env["FLAKEBOT_WORKDIR"]) / "runs" / str(run_id) / "events.jsonl"
    return bool(run_id) and events.exists() and '"stage": "edit", "message": "' in events.read_text()


def run(lease: float = 20.0) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-failover-") as tmp, temporary_cluster() as cluster:
        root = Path(tmp)
        root.chmod(0o755)
        database = new_database(cluster)
        shared = root / "failover"
        env = home_env(shared)
        job_id = enqueue(database)
        started = time.perf_counter()
        first = worker(database, env, shared, "first", lease)
        try:
            until(lambda: editing(database, job_id, env), 900)
        finally:
            os.killpg(first.pid, signal.SIGKILL)  # the worker and the sandbox under it
            first.wait()
        killed = time.perf_counter()
        second = worker(database, env, shared, "second", lease)
        finished(second, shared, "second")
        done = time.perf_counter()
        row = job(database, job_id)
        if row["state"] != "done" or row["worker"] != "second":
            raise RuntimeError(f"the failover craft ended {row['state']} by {row['worker']}")

        alone = root / "alone"
        env_alone = home_env(alone)
        other = new_database(cluster)
        enqueue(other)
        began = time.perf_counter()
        finished(worker(other, env_alone, alone, "alone", lease), alone, "alone")
        own = time.perf_counter() - began
    wall = done - started
    return asdict(
        FailoverResult(
            lease_s=lease,
            killed_after_s=round(killed - started, 2),
            kill_to_done_s=round(done - killed, 2),
            failover_wall_s=round(wall, 2),
            own_s=round(own, 2),
            overhead_s=round(wall - own, 2),
            attempts=int(str(row["attempts"])),
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lease", type=float, default=20.0)
    options = parser.parse_args()
    print(json.dumps(run(options.lease), indent=1))
