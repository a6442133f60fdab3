"""Crafts spread over workers: `crafts` offline crafts (the scripted csv-dedup session, each under a name of its own
so each is a real craft and a real build) queued in a real PostgreSQL (benchmarks/scenarios/postgres.py), made by one
`flakebot worker`, then `crafts` others by two workers (each in a home of its own, as on two machines); the figure is
the wall on two over the wall on one, in the same run (goal <= 0.6).

Each wall runs from the workers' start to the last job's end (its row read every half second). Every worker starts
from a home of its own, its cargo cache cold, and keeps it across its crafts. The crafts share one dependency set,
so the first craft on this machine builds its dependency derivation and every later one finds it in the store: one
craft, untimed, runs first, so that neither timed run pays that build and the other not.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.perf.failover import TENANT, home_env, worker
from benchmarks.scenarios.postgres import new_database, temporary_cluster
from flakebot.pipeline.request import RunRequest
from flakebot.team import db, queue


@dataclass(frozen=True, kw_only=True)
class WorkersResult:
    """run()'s result, as report.json holds it."""

    crafts: int
    one_worker_s: float
    two_workers_s: float
    ratio: float
    spread: list[int]  # of the crafts on two workers, how many each made


RESULT = WorkersResult


def enqueue(database: str, crafts: int, batch: str) -> list[int]:
    ids = []
    with db.connect(database) as conn:
        queue.set_quota(conn, TENANT, max_in_flight=crafts, max_per_day=100)  # all queued before a worker starts
        for i in range(crafts):
            # the model (the scripted session) and offline are each worker's settings (failover.home_env)
            asked = RunRequest(need=f"need a CSV deduper ({batch}{i})", registry="local", name=f"csv-dedup-{batch}{i}",
                               fresh=True)  # fmt: skip
            ids.append(queue.enqueue(conn, TENANT, "bench", asked).job_id)
    return ids


def rows(database: str, ids: list[int]) -> list[dict[str, object]]:
    with db.connect(database) as conn:
        found = [queue.get(conn, job_id, TENANT) for job_id in ids]
    return [dict(r) for r in found if r is not None]


def crafted(database: str, ids: list[int], homes: list[Path], timeout: float = 3600) -> tuple[float, list[int]]:
    """(wall seconds, jobs made by each worker) of workers, one per home, until every job has ended."""
    started = time.perf_counter()
    running = [worker(database, home_env(home), home, f"w{n}", 60.0, once=False) for n, home in enumerate(homes)]
    try:
        while True:
            found = rows(database, ids)
            ended = [r for r in found if r["state"] in ("done", "failed")]
            if len(ended) == len(ids):
                break
            if time.perf_counter() - started > timeout or any(w.poll() is not None for w in running):
                raise RuntimeError(f"{len(ended)} of {len(ids)} crafts ended; workers: {[w.poll() for w in running]}")
            time.sleep(0.5)
        wall = time.perf_counter() - started
    finally:
        for w in running:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGKILL)
            w.wait()
    failed = [r for r in found if r["state"] != "done"]
    if failed:
        raise RuntimeError(f"{len(failed)} crafts failed: {failed[0].get('error')}")
    return wall, [sum(r["worker"] == f"w{n}" for r in found) for n in range(len(homes))]


def run(crafts: int = 6) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-workers-") as tmp, temporary_cluster() as cluster:
        root = Path(tmp)
        root.chmod(0o755)
        warm_db, one_db, two_db = new_database(cluster), new_database(cluster), new_database(cluster)
        crafted(warm_db, enqueue(warm_db, 1, "warm"), [root / "warm"])  # the dependency derivation, into the store
        one_s, _ = crafted(one_db, enqueue(one_db, crafts, "a"), [root / "one"])
        two_s, spread = crafted(two_db, enqueue(two_db, crafts, "b"), [root / "two-a", root / "two-b"])
    return asdict(
        WorkersResult(
            crafts=crafts,
            one_worker_s=round(one_s, 2),
            two_workers_s=round(two_s, 2),
            ratio=round(two_s / one_s, 3),
            spread=spread,
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--crafts", type=int, default=6)
    options = parser.parse_args()
    print(json.dumps(run(options.crafts), indent=1))
