"""Crafts spread over workers: `crafts` offline crafts (the scripted csv-dedup session, each under a name of its own
in this run, so each is a real craft and a real Nix build, never a store hit of an earlier run) queued in a real
PostgreSQL (benchmarks/scenarios/postgres.py), made by one `flakebot worker`, then `crafts` others by two workers
(each in a home of its own, as on two machines), for ROUNDS rounds in both orders (one then two, two then one); the
figure is the two workers' walls over the one worker's, summed over the rounds, each round's ratio its spread (goal
<= 0.6). Beside it, the floor the two cores set: the two workers' CPU-seconds (their processes and every child they
waited for: cargo, rustc, nix and its builds) over the cores (2 here) is the least wall two workers can have on this
machine, given as a fraction of the one worker's wall; and how busy the machine's cores were meanwhile (/proc/stat,
every process's: the other load on this machine included).

Each wall runs from the workers' start to the last job's end (its row's `ended`). Every worker starts from a home of
its own, its cargo cache cold, and keeps it across its crafts. The crafts share one dependency set, so the first
craft on this machine builds its dependency derivation and every later one finds it in the store: one craft,
untimed, runs first, so that no timed phase pays that build and the others not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import secrets
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.perf.cpuowners import CpuOwners, pressure
from benchmarks.perf.failover import TENANT, home_env, worker
from benchmarks.scenarios.postgres import new_database, temporary_cluster
from flakebot.pipeline.request import RunRequest
from flakebot.team import db, queue

# The two phases' walls move by a fifth between samples on this shared machine (other sessions' builds): two rounds,
# in both orders, so that a load that moves within the run weighs on one worker and on two alike.
ROUNDS = 2


@dataclass(frozen=True, kw_only=True)
class Phase:
    """One timed phase: `crafts` crafts made by `workers` workers."""

    round: int
    workers: int
    wall_s: float
    cpu_s: float  # the workers' CPU-seconds, with every child they waited for (cargo, rustc, nix, the builds)
    machine_busy_s: float  # CPU-seconds the machine's cores were busy meanwhile, every process's (/proc/stat)
    spread: list[int]  # how many crafts each worker made
    craft_s: float = 0.0  # a craft's own wall (its job's claim to its end), mean
    lock_waits: int = 0  # lines of the crafts' logs saying they waited on a lock (LOCK_WAIT)
    first_claim_s: float = 0.0  # the workers' start to the first job's claim (a worker's own start-up)
    claim_gap_s: float = 0.0  # a job's end to its worker's next claim, the longest
    craft_cpu_s: float = 0.0  # a craft's CPU-seconds (its job row's: the worker and every child it waited for), mean
    cpu_wait: float = 0.0  # the share of the wall some task waited for a core (PSI), every process's
    io_wait: float = 0.0  # for I/O
    owners: dict[str, float] = field(default_factory=dict)  # CPU-seconds per owner, every process's (cpuowners)
    top: list[str] = field(default_factory=list)  # the processes that spent the most


@dataclass(frozen=True, kw_only=True)
class WorkersResult:
    """run()'s result, as report.json holds it."""

    crafts: int
    one_worker_s: float  # mean over the rounds
    two_workers_s: float
    ratio: float  # the two workers' walls over the one's, summed over the rounds
    spread: list[int]  # of the crafts on two workers, how many each made (summed over the rounds)
    rounds: int = 1
    round_ratios: list[float] = field(default_factory=list)
    cpu_one_s: float | None = None  # mean over the rounds
    cpu_two_s: float | None = None
    floor_ratio: float | None = None  # the two workers' CPU-seconds / cores over the one worker's wall, all rounds
    round_floors: list[float] = field(default_factory=list)
    busy_one: float | None = None  # the machine's busy cores during the one-worker phases, mean (of its `cores`)
    busy_two: float | None = None
    cores: int | None = None
    craft_one_s: float | None = None  # a craft's own wall on one worker, mean over every craft
    craft_two_s: float | None = None  # on each of two
    craft_cpu_one_s: float | None = None  # a craft's CPU-seconds on one worker, mean over every craft
    craft_cpu_two_s: float | None = None
    cpu_wait_one: float | None = None  # the share of the one-worker phases' wall some task waited for a core (PSI)
    cpu_wait_two: float | None = None
    lock_waits: int | None = None  # the crafts' logs' lines saying they waited on a lock, every phase
    first_claim_s: float | None = None  # the workers' start to their first claim, the longest of any phase
    claim_gap_s: float | None = None  # a job's end to its worker's next claim, the longest of any phase
    owners_one: dict[str, float] = field(default_factory=dict)  # busy cores per owner during one worker's phases
    owners_two: dict[str, float] = field(default_factory=dict)
    phases: list[Phase] = field(default_factory=list)


# What cargo (its package cache), Nix (the GC lock, its SQLite database busy) or SQLite print when they wait on a lock,
# as run.log keeps it: every line of the loop's dependency build and every warning; of the package stage's nix build
# only its progress lines (flakebot.nix.build). Nix 2.8 prints nothing while it waits for another process's lock on
# an output (it polls: flakebot.nix.command.POLL_SECONDS): each craft here builds outputs of its own.
LOCK_WAIT = re.compile(
    r"Blocking waiting for file lock|waiting for (the big garbage collector )?lock"
    r"|database is locked|SQLite database .* is busy"
)
RESULT = WorkersResult
LOOK_SECONDS = 0.5  # between the benchmark's looks at the jobs' rows


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


def until_ended(conn: Any, ids: list[int], running: list[Any], started: float, timeout: float) -> list[dict[str, Any]]:
    """The jobs' rows once all have ended, looked at every LOOK_SECONDS on one connection (the wall is read from the
    rows' `ended`, so how often this looks moves no figure: only the CPU it costs, which is the benchmark's)."""
    while True:
        found = [dict(r) for r in (queue.get(conn, job_id, TENANT) for job_id in ids) if r is not None]
        ended = [r for r in found if r["state"] in ("done", "failed")]
        if len(ended) == len(ids):
            return found
        if time.time() - started > timeout or any(w.poll() is not None for w in running):
            raise RuntimeError(f"{len(ended)} of {len(ids)} crafts ended; workers: {[w.poll() for w in running]}")
        time.sleep(LOOK_SECONDS)


def children_cpu() -> float:
    """CPU-seconds of every child this process waited for (the workers, killed and reaped, and theirs)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def machine_busy() -> float:
    """CPU-seconds the machine's cores have been busy since boot, every process's (/proc/stat: all but idle, iowait)."""
    with open("/proc/stat") as stat:
        ticks = [int(n) for n in stat.readline().split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # guest time is already counted in user


def crafted(database: str, ids: list[int], homes: list[Path], postmaster: int, timeout: float = 3600) -> Phase:
    """Workers, one per home, until every job has ended: the wall from their start to the last job's end (its row's
    `ended`), their CPU-seconds, the machine's busy CPU-seconds meanwhile and whose they were, and how many jobs each
    made."""
    sampler = CpuOwners()
    sampler.start()
    cpu, busy, waits, started = children_cpu(), machine_busy(), pressure(), time.time()
    running = [worker(database, home_env(home), home, f"w{n}", 60.0, once=False) for n, home in enumerate(homes)]
    try:
        with db.connect(database, autocommit=True, name="bench workers") as conn:  # one for the phase's looks
            found = until_ended(conn, ids, running, started, timeout)
        busy = machine_busy() - busy
        waits = {kind: total - waits[kind] for kind, total in pressure().items()}
        sampler.stop()
    finally:
        for w in running:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGKILL)
            w.wait()
    failed = [r for r in found if r["state"] != "done"]
    if failed:
        raise RuntimeError(f"{len(failed)} crafts failed: {failed[0].get('error')}")
    last = max(r["ended"].timestamp() for r in found)
    own = [(r["ended"] - r["started"]).total_seconds() for r in found]
    first = min(r["started"].timestamp() for r in found)
    roots = {postmaster: "postgresql", os.getpid(): "benchmark (its polling)", 1: "other processes"}
    roots.update({w.pid: "workers" for w in running})
    wall = last - started
    return Phase(round=0, workers=len(homes), wall_s=round(last - started, 2), cpu_s=round(children_cpu() - cpu, 2),
                 machine_busy_s=round(busy, 2), spread=[sum(r["worker"] == f"w{n}" for r in found) for n in range(len(homes))],
                 craft_s=round(sum(own) / len(own), 2), lock_waits=sum(lock_waits(home) for home in homes),
                 first_claim_s=round(first - started, 2), claim_gap_s=claim_gap(found),
                 craft_cpu_s=round(sum(r["cpu_seconds"] for r in found) / len(found), 2),
                 cpu_wait=round(waits.get("cpu", 0.0) / wall, 3), io_wait=round(waits.get("io", 0.0) / wall, 3),
                 owners=sampler.owners(roots, split=frozenset({"workers"})), top=sampler.top(roots))  # fmt: skip


def claim_gap(found: list[dict[str, Any]]) -> float:
    """The longest a worker took from one job's end to its next claim (the queue's own cost between two crafts)."""
    gaps = [0.0]
    for name in {r["worker"] for r in found}:
        mine = sorted((r for r in found if r["worker"] == name), key=lambda r: r["started"])
        gaps += [(b["started"] - a["ended"]).total_seconds() for a, b in zip(mine, mine[1:], strict=False)]
    return round(max(gaps), 3)


def lock_waits(home: Path) -> int:
    """Lines of a worker's log and of its runs' logs that say a craft waited on a lock."""
    logs = [*home.glob("*.log"), *home.glob("work/runs/*/run.log")]
    return sum(len(LOCK_WAIT.findall(log.read_text(errors="replace"))) for log in logs)


def run(crafts: int = 6, rounds: int = ROUNDS) -> dict[str, object]:
    salt = secrets.token_hex(3)  # this run's names: every craft builds its tool, none is an earlier run's store hit
    phases: list[Phase] = []
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-workers-") as tmp, temporary_cluster() as cluster:
        root = Path(tmp)
        root.chmod(0o755)
        warm = new_database(cluster)
        postmaster = cluster.postmaster()
        crafted(
            warm, enqueue(warm, 1, f"{salt}warm"), [root / "warm"], postmaster
        )  # the dependency derivation, into the store
        for n in range(rounds):
            for count in (1, 2) if n % 2 == 0 else (2, 1):  # both orders: a load that moves weighs on both alike
                batch = f"{salt}r{n}w{count}x"
                database = new_database(cluster)
                homes = [root / f"{batch}-{k}" for k in range(count)]
                phase = crafted(database, enqueue(database, crafts, batch), homes, postmaster)
                phases.append(Phase(**{**asdict(phase), "round": n}))
    return asdict(summary(crafts, rounds, phases))


def summary(crafts: int, rounds: int, phases: list[Phase]) -> WorkersResult:
    one = [p for p in phases if p.workers == 1]
    two = [p for p in phases if p.workers == 2]
    one_wall, two_wall = sum(p.wall_s for p in one), sum(p.wall_s for p in two)
    cores = os.cpu_count() or 1
    return WorkersResult(
        crafts=crafts,
        one_worker_s=round(one_wall / rounds, 2),
        two_workers_s=round(two_wall / rounds, 2),
        ratio=round(two_wall / one_wall, 3),
        spread=[sum(p.spread[k] for p in two) for k in range(2)],
        rounds=rounds,
        round_ratios=[round(b.wall_s / a.wall_s, 3) for a, b in zip(one, two, strict=True)],
        cpu_one_s=round(sum(p.cpu_s for p in one) / rounds, 2),
        cpu_two_s=round(sum(p.cpu_s for p in two) / rounds, 2),
        floor_ratio=round(sum(p.cpu_s for p in two) / cores / one_wall, 3),  # the least wall the cores allow two
        round_floors=[round(b.cpu_s / cores / a.wall_s, 3) for a, b in zip(one, two, strict=True)],
        busy_one=round(sum(p.machine_busy_s for p in one) / one_wall, 2),
        busy_two=round(sum(p.machine_busy_s for p in two) / two_wall, 2),
        cores=cores,
        craft_one_s=round(sum(p.craft_s for p in one) / len(one), 2),
        craft_two_s=round(sum(p.craft_s for p in two) / len(two), 2),
        craft_cpu_one_s=round(sum(p.craft_cpu_s for p in one) / len(one), 2),
        craft_cpu_two_s=round(sum(p.craft_cpu_s for p in two) / len(two), 2),
        cpu_wait_one=round(sum(p.cpu_wait * p.wall_s for p in one) / one_wall, 3),
        cpu_wait_two=round(sum(p.cpu_wait * p.wall_s for p in two) / two_wall, 3),
        lock_waits=sum(p.lock_waits for p in phases),
        first_claim_s=max(p.first_claim_s for p in phases),
        claim_gap_s=max(p.claim_gap_s for p in phases),
        owners_one=per_core(one),
        owners_two=per_core(two),
        phases=phases,
    )


def per_core(phases: list[Phase]) -> dict[str, float]:
    """Each owner's CPU-seconds over the phases' walls: how many cores it kept busy."""
    wall = sum(p.wall_s for p in phases)
    names = {name for p in phases for name in p.owners}
    busy = {name: round(sum(p.owners.get(name, 0.0) for p in phases) / wall, 3) for name in names}
    return dict(sorted(busy.items(), key=lambda kv: -kv[1]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--crafts", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    options = parser.parse_args()
    print(json.dumps(run(options.crafts, options.rounds), indent=1))
