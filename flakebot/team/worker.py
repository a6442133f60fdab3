"""A worker: claims jobs from the team's queue and runs each through today's pipeline, unchanged.

The loop: LISTEN for new jobs, claim one (flakebot.team.queue.claim), hand it to `crafts` (the command's: today's
pipeline, as `flakebot craft` runs it) while a heartbeat thread renews its lease, and write its result (or its
error) back. The run a job's craft works in is recorded in its row as it starts, so a worker that claims the job
after its lease ran out (its worker was killed) resumes that run from its first unfinished stage. A database that goes away is reconnected to, with a pause that grows to
RECONNECT_MAX seconds; the job at hand goes on meanwhile.

A job its one follower cancels while it runs (queue.cancel: the row is `cancelled` at once) is stopped the way
`flakebot craft` stops on SIGTERM: the heartbeat sees the row (every CANCEL_POLL seconds) and sends SIGTERM to this
worker's main thread, the pipeline marks the stage interrupted and the sandboxes' `finally` kill their commands. The
worker tells that from its own stop by the heartbeat's mark: a cancelled job is settled (its CPU-seconds added) and
the next one claimed, where a stopped worker hands its job back and exits.

A worker also sweeps lost fronts (FrontSweeps: flakebot.team.fronts's sweep and guard, on a connection of its own as
a heartbeat's), so a waited craft whose every front was killed is cancelled, and stopped here, all the same.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from flakebot import launcher
from flakebot.errors import FlakebotError, HostError, Interrupted
from flakebot.events import Event, EventSink
from flakebot.team import db, fronts, queue

if TYPE_CHECKING:
    import psycopg

    Conn = psycopg.Connection[dict[str, Any]]

logger = logging.getLogger(__name__)

POLL_SECONDS = 5.0  # a waiting worker looks again this often even without a NOTIFY (leases that ran out send none)
RECONNECT_MAX = 5.0  # the longest pause between two attempts to reach the database
WRITE_ATTEMPTS = 30  # a job's end is written back through this many reconnects before the worker gives up on it
NAMEDATALEN = 63  # pg_stat_activity keeps this much of an application_name
CANCEL_POLL = 1.0  # seconds between a heartbeat's looks at its job's row: a cancelled craft stops this soon
T = TypeVar("T")


def default_name() -> str:
    """This worker's name in the jobs it holds: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def cpu_seconds() -> float:
    """CPU-seconds of this process and every child it waited for (cargo, nix and the builds nix waited for, in this
    worker's sandboxes; one job at a time, so a difference is one job's). A sandboxed command's time reaches it only
    through the sandbox's init, which a worker inherits and reaps (Worker.subreaper). A build a remote builder runs
    is that machine's, not counted here."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass
class Worker:
    """One worker process's link to the queue: its name, its lease, and a connection made again when lost."""

    url: str
    crafts: Callable[[dict[str, Any], EventSink], dict[str, Any]]  # a claimed job's row -> its result (or raises)
    name: str = field(default_factory=default_name)
    lease_seconds: float = 60.0
    poll_seconds: float = POLL_SECONDS
    # inherit what a job's processes leave behind (a sandbox's init) and reap it before its CPU-seconds are
    # counted (launcher); a worker process's own choice: a process that starts other things meanwhile must not
    subreaper: bool = False
    _conn: Conn | None = field(default=None, init=False, repr=False)
    # the craft's stop on a cancel (Heartbeat.cancelled): whether a craft runs on the main thread with our SIGTERM
    # handler around it, and the SIGTERMs the heartbeat sent that no handler took yet, under one lock (reentrant: the
    # handler runs on the main thread between two of its bytecodes, possibly while that thread holds it)
    _stopping: threading.RLock = field(default_factory=threading.RLock, init=False, repr=False)
    _crafting: bool = field(default=False, init=False, repr=False)
    _cancel_signals: int = field(default=0, init=False, repr=False)
    # a SIGTERM none of those: this worker's own stop (its operator's), which a cancel seen later does not undo
    _stopped: bool = field(default=False, init=False, repr=False)

    def run(self, once: bool = False) -> list[dict[str, Any]]:
        """Work jobs as they come (forever, or one with `once`); what each ended as. A database unreachable at the
        start is an error (a wrong URL says so at once); one lost later is waited for."""
        self.check_name(self.connection())
        if self.subreaper:
            launcher.become_subreaper()
        sweeps = FrontSweeps(self)
        sweeps.start()
        done = []
        try:
            while True:
                job = self.next_job()
                done.append(self.work(job))
                if once:
                    return done
        finally:
            sweeps.stop()

    def check_name(self, conn: Conn) -> None:
        """Refuse to start beside a connected worker of the same name: a lease is held by name, so two would renew
        and finish each other's jobs."""
        from flakebot.errors import UsageError

        twin = conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s AND pid <> pg_backend_pid()",
            (self.application_name()[:NAMEDATALEN],),
        ).fetchone()
        if twin and twin["n"]:
            raise UsageError(
                f"a worker named {self.name} is already connected to the team database",
                fix="give this worker another --name (or leave --name out: HOST:PID), or stop the other one first",
            )

    def application_name(self) -> str:
        return f"flakebot worker {self.name}"

    def next_job(self) -> dict[str, Any]:
        """The next job claimed, waiting (NOTIFY or the poll) as long as none is there."""
        pause = 0.2
        while True:
            try:
                conn = self.connection()
                job = queue.claim(conn, self.name, self.lease_seconds)
                if job is not None:
                    return job
                for _ in conn.notifies(timeout=self.poll_seconds, stop_after=1):
                    pass
                pause = 0.2
            except _lost() as exc:
                pause = self.lost(exc, pause)

    def work(self, job: dict[str, Any]) -> dict[str, Any]:
        """Run one claimed job under its lease and write its end back."""
        job_id = int(job["id"])
        logger.info("job %s (%s, tenant %s): attempt %s", job_id, job["kind"], job["tenant"], job["attempts"])
        heartbeat = Heartbeat(self, job_id)
        heartbeat.start()
        spent = self.cpu_seconds()
        result: dict[str, Any] | None = None
        error: dict[str, Any] | None = None
        try:
            with self.stoppable():
                result = self.crafts(job, self.run_recorder(job_id))
        except (Interrupted, KeyboardInterrupt):
            heartbeat.stop()
            if heartbeat.cancelled.is_set() and not self._stopped:  # its follower cancelled it: the row says so already
                return self.settle_cancelled(job_id, spent)
            # this worker is stopping, not the job failing: another resumes it
            used = self.cpu_seconds() - spent
            if self.with_db(lambda conn: queue.release(conn, job_id, self.name, used)):
                logger.warning("job %s handed back to the queue: this worker was stopped", job_id)
            elif self.with_db(lambda conn: queue.settle_cancelled(conn, job_id, self.name, used)):
                # cancelled before the heartbeat looked: nothing to hand back, but what it spent counts all the same
                logger.warning("job %s was cancelled as this worker was stopped: its CPU-seconds settled", job_id)
            raise
        except FlakebotError as exc:
            logger.warning("job %s failed: %s", job_id, exc.one_line())
            error = exc.result()
        finally:
            heartbeat.stop()
        used = self.cpu_seconds() - spent
        held = self.with_db(
            lambda conn: queue.finish(conn, job_id, self.name, result=result, error=error, cpu_seconds=used)
        )
        if not held and self.with_db(lambda conn: queue.settle_cancelled(conn, job_id, self.name, used)):
            # the cancel committed first (between the craft's end and this write): the row stays cancelled, as MCP
            # asks of a cancelled task, its CPU-seconds added; what the craft made before it (a catalogued tool) stays
            logger.warning("job %s was cancelled as its craft ended: its end here is not recorded", job_id)
            return _cancelled(job_id)
        if not held:
            logger.warning("job %s was taken over by another worker: its end here is not recorded", job_id)
        state = "failed" if error is not None else "done"
        return {"job": job_id, "state": state, "recorded": held, "run_id": (result or {}).get("run_id")}

    def settle_cancelled(self, job_id: int, spent: float) -> dict[str, Any]:
        """The end of a job cancelled while this worker crafted it: its CPU-seconds added to the cancelled row."""
        used = self.cpu_seconds() - spent
        self.with_db(lambda conn: queue.settle_cancelled(conn, job_id, self.name, used))
        logger.warning("job %s was cancelled by its follower: its craft stopped, nothing recorded", job_id)
        return _cancelled(job_id)

    @contextmanager
    def stoppable(self) -> Iterator[None]:
        """Around a craft on the main thread: SIGTERM raises KeyboardInterrupt wherever the craft is (the pipeline
        turns it into Interrupted inside a run, with its own handler), and a SIGTERM the heartbeat sent for a cancel
        that lands once the craft is over is dropped, not taken for this worker's stop; any other SIGTERM is this
        worker's stop (`_stopped`: the pipeline's handler passes it on), which a cancel seen after does not undo.
        Elsewhere: nothing (a signal handler is the main thread's to set), and a cancelled craft runs to its end,
        refused by its row."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_sigterm(signum: int, frame: Any) -> None:
            with self._stopping:
                ours, crafting = self._cancel_signals > 0, self._crafting
                self._cancel_signals = max(self._cancel_signals - 1, 0)
                self._stopped = self._stopped or not ours
            if crafting or not ours:
                raise KeyboardInterrupt

        self._stopped = False
        previous = signal.signal(signal.SIGTERM, on_sigterm)
        with self._stopping:
            self._crafting = True
        try:
            yield
        finally:
            try:  # a heartbeat's SIGTERM taken while waiting for the lock raises here: the handler is put back anyway
                with self._stopping:
                    self._crafting = False
            finally:
                self._crafting = False
                signal.signal(signal.SIGTERM, previous)
                # none of the heartbeat's SIGTERMs is still on its way: it sends them only while _crafting, cleared
                self._cancel_signals = 0

    def stop_craft(self) -> bool:
        """SIGTERM to the main thread while it crafts (stoppable): its craft stops as `flakebot craft` stops. False
        when no craft runs there to stop."""
        with self._stopping:
            if not self._crafting or self._stopped:  # a craft stopping already is not interrupted in its cleanup
                return False
            self._cancel_signals += 1
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
        return True

    def cpu_seconds(self) -> float:
        """cpu_seconds(), the sandboxes' inits this worker inherited reaped first (their commands' time is theirs)."""
        if self.subreaper:
            launcher.reap_orphans()
        return cpu_seconds()

    def run_recorder(self, job_id: int) -> Callable[[Event], None]:
        """An event sink that records the job's run id in its row when the run starts (a worker taking the job over
        resumes that run)."""

        def sink(event: Event) -> None:
            if event.kind != "run_started":
                return
            try:  # a few tries only: the craft goes on meanwhile, and without it a takeover crafts afresh
                self.with_db(lambda conn: queue.record_run(conn, job_id, self.name, event.run_id), attempts=3)
            except HostError as exc:
                logger.warning("job %s: its run %s is not recorded (%s)", job_id, event.run_id, exc.one_line())

        return sink

    def connection(self) -> Conn:
        if self._conn is None or self._conn.closed:
            self._conn = db.connect(self.url, autocommit=True, name=self.application_name())
            self._conn.execute(f"LISTEN {queue.CHANNEL}")
            logger.info("worker %s connected to %s", self.name, db.shown(self.url))
        return self._conn

    def close(self) -> None:
        """Close this worker's connection (a process that goes on after its worker: a library caller, a test)."""
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def with_db(self, call: Callable[[Conn], T], attempts: int = WRITE_ATTEMPTS) -> T:
        """`call(connection)`, through reconnects when the database goes away meanwhile."""
        pause = 0.2
        for _ in range(attempts):
            try:
                return call(self.connection())
            except _lost() as exc:
                pause = self.lost(exc, pause)
        raise HostError(
            f"the team database {db.shown(self.url)} stayed unreachable", fix="check that PostgreSQL runs there"
        )

    def lost(self, exc: Exception, pause: float) -> float:
        """Forget a connection that failed, wait, and return the next (longer) pause."""
        logger.warning("worker %s lost the database (%s); reconnecting in %.1fs", self.name, _reason(exc), pause)
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        time.sleep(pause)
        return min(pause * 2, RECONNECT_MAX)


class _Connected(threading.Thread):
    """A worker's background thread on a database connection of its own (made again after the database went away),
    until stopped."""

    def __init__(self, worker: Worker, name: str, label: str) -> None:
        super().__init__(name=name, daemon=True)
        self.worker, self.label = worker, label
        self.stopped = threading.Event()
        self.conn: Conn | None = None

    def connection(self) -> Conn:
        if self.conn is None or self.conn.closed:
            self.conn = db.connect(self.worker.url, autocommit=True, name=self.label)
        return self.conn

    def drop(self) -> None:
        """The connection closed: the database went away (the next look connects again), or the thread ends."""
        if self.conn is not None:
            self.conn.close()
        self.conn = None

    def stop(self) -> None:
        self.stopped.set()
        if self.is_alive():
            self.join(timeout=30)


class Heartbeat(_Connected):
    """Renews a job's lease every third of it, on a connection of its own, until stopped."""

    def __init__(self, worker: Worker, job_id: int) -> None:
        super().__init__(worker, f"heartbeat-{job_id}", f"flakebot heartbeat {job_id}")
        self.job_id = job_id
        self.cancelled = threading.Event()  # the job's follower cancelled it: its craft was told to stop

    def run(self) -> None:
        every = self.worker.lease_seconds / 3
        renew_at = time.monotonic() + every
        while not self.stopped.wait(min(CANCEL_POLL, every)):
            try:
                conn = self.connection()
                if not self.cancelled.is_set() and queue.cancelled_while_held(conn, self.job_id, self.worker.name):
                    self.cancelled.set()
                    how = (
                        "stopping its craft"
                        if self.worker.stop_craft()
                        else "its craft is not signalled, its end unrecorded"
                    )
                    logger.warning("job %s cancelled by its follower: %s", self.job_id, how)
                if time.monotonic() < renew_at or self.cancelled.is_set():
                    continue
                renew_at = time.monotonic() + every
                if not queue.renew(conn, self.job_id, self.worker.name, self.worker.lease_seconds):
                    logger.warning("job %s: lease lost to another worker", self.job_id)
            except _lost() as exc:
                logger.warning("job %s: lease not renewed (%s)", self.job_id, _reason(exc))
                self.drop()
        self.drop()


class FrontSweeps(_Connected):
    """The waited followings of fronts whose lease ran out ended (fronts.sweep), as a live front ends them: looked at
    every third of this worker's lease, on a connection of its own (as a Heartbeat renews a job's lease), and swept
    only once those looks have held on time for a whole lease (fronts.SweepGuard): a worker that was away from the
    database, or stalled, takes no live front for lost. No token store here: a revoked token's following still counts
    (a live front's look ends it)."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(worker, "front-sweeps", f"flakebot sweeps {worker.name}")

    def run(self) -> None:
        guard = fronts.SweepGuard(self.worker.lease_seconds, f"worker {self.worker.name}")
        while not self.stopped.wait(guard.pause()):
            try:
                conn = self.connection()
                conn.execute("SELECT 1")  # this look at the database held now
                if guard.held():
                    for row in fronts.sweep(conn, held_for=guard.held_for(), grace=guard.grace):
                        logger.info("job %s: its waited call's front was lost (swept by this worker)", row["id"])
            except _lost() as exc:
                guard.lapsed()
                logger.warning("worker %s: lost fronts not swept this time (%s)", self.worker.name, _reason(exc))
                self.drop()
            except _refused() as exc:  # a role without the fronts table's privileges: the admin's to grant
                guard.lapsed()
                logger.error("worker %s: the team database refused a sweep of lost fronts: %s", self.worker.name, exc)
        self.drop()


def _cancelled(job_id: int) -> dict[str, Any]:
    """What work() answers for a job its follower cancelled while this worker crafted it (the row's end is the
    cancel's, recorded by the front)."""
    return {"job": job_id, "state": "cancelled", "recorded": True, "run_id": None}


def _lost() -> tuple[type[Exception], ...]:
    """The errors that mean the database went away (reconnect), not a bug of ours."""
    import psycopg

    # the server ends a session stopped inside a transaction (db.IDLE_IN_TRANSACTION): once running again, reconnect
    return (psycopg.OperationalError, psycopg.InterfaceError, psycopg.errors.IdleInTransactionSessionTimeout, HostError)


def _refused() -> tuple[type[Exception], ...]:
    """The errors of a database that answers but refuses (a privilege missing, a read-only standby)."""
    import psycopg

    return (psycopg.Error,)


def _reason(exc: Exception) -> str:
    return exc.one_line() if isinstance(exc, FlakebotError) else (str(exc).strip().splitlines() or [""])[0]
