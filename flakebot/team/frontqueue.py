"""The front's link to the team's queue: `flakebot serve --database` enqueues crafts there (the request the door
validated, under the caller's tenant and principal) and reads job rows back as their tenant sees them.

One connection per front, used by one thread at a time (a lock): calls come from the server's worker threads, and
every queue operation is a short transaction. The front's lease and its sweeps of lost fronts have a connection each
of their own: a call's enqueue or cancel, and a sweep's cancels, may wait on a tenant's lock (held by a process
stalled in a transaction, up to db.IDLE_IN_TRANSACTION), and meanwhile the front's lease is renewed all the same. A
connection the database dropped (a restart) is made again once per call before the call fails with one line; an
enqueue sent again so is the same call's (its key), never a second following of its job, and one whose every send
failed keeps its key until the database answers: the following a send may have committed is ended then
(end_unsent, at the lease's renewals), as the call's own end would end it.

Every door a client reaches the queue by (tasks/*, a craft, status, show and runs, admission, /metrics) goes through
`_call`, so it alone decides what a client is told when the database is away (`away()`) or answers an error of its
own (`refused()`: read-only after a failover, say): neither says anything of where the database is (host, port,
name: none of an agent's business, and a map for an attacker) nor repeats PostgreSQL's text. The operator's log gets
the whole line (`db.shown`'s URL and libpq's reason); only `connect()` at startup raises it, to the admin's terminal.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, TypeVar

from flakebot.errors import HostError
from flakebot.team import db, fronts, queue

if TYPE_CHECKING:
    import psycopg

    from flakebot.pipeline.request import RunRequest
    from flakebot.team.tokens import Principal

    Conn = psycopg.Connection[dict[str, Any]]

logger = logging.getLogger(__name__)

JOB_HANDLE = re.compile(r"job-([1-9][0-9]{0,18})")  # a queued job as callers name it: status run_id, a task's id
STATES = ("queued", "running", "done", "failed", "cancelled")
CALLS_LOCK = 0x666C6B63  # first key of pg_advisory_xact_lock(CALLS_LOCK, hashtext(principal id))
LISTED = 1000  # a tenant's jobs tasks/list reads at most (its newest)
T = TypeVar("T")


def handle(job_id: int) -> str:
    """A job's id as the front gives it to callers (run_id of its status, taskId of its task)."""
    return f"job-{job_id}"


def job_number(name: str) -> int | None:
    """The job a handle names, or None when `name` is no job handle (a run id, a local task's id)."""
    found = JOB_HANDLE.fullmatch(name)
    return int(found.group(1)) if found else None


class FrontQueue:
    """The team database as one front uses it."""

    def __init__(self, url: str, lease_seconds: float = fronts.DEFAULT_LEASE) -> None:
        self.url = url
        self.front = fronts.new_identity()  # this front's, in its lease and its waited calls' followings
        self.lease_seconds = lease_seconds
        self._leased = False  # whether this front held its lease yet
        self._lost = False  # a renewal found its lease taken for lost, not yet told by hold_lease
        self._calls = _Line()  # every call's connection
        self._lease = _Line()  # the lease's renewals (hold_lease)
        self._sweeps = _Line()  # sweeps' (sweep_lost_fronts)
        self._identity = threading.Lock()  # held while this front's identity is renewed or changed (_held)
        self._unsent: list[_Unsent] = []  # enqueues whose every send failed: their following ended once it answers
        self._unsent_lock = threading.Lock()

    def connect(self) -> None:
        """Reach the database now and hold this front's lease (at startup: a wrong URL, or a role that may not hold a
        lease, is one line, where and why, on the admin's terminal before the server listens)."""
        import psycopg

        with self._calls.lock:
            if self._calls.conn is None or self._calls.conn.closed:
                self._calls.conn = db.connect(self.url, autocommit=True, name="flakebot serve")
            try:
                self._held(self._calls.conn)
            except psycopg.Error as exc:  # the admin's to read: PostgreSQL's reason said, as db.connect says it
                granted = isinstance(exc, psycopg.errors.InsufficientPrivilege)
                raise HostError(
                    f"the team database {db.shown(self.url)} refused this front's lease: "
                    f"{db.redacted_reason(exc, self.url)}",
                    fix="give this role SELECT, INSERT, UPDATE, DELETE on fronts (docs/team.md, 'The tables')"
                    if granted
                    else "check that it is the primary (not a read-only standby); then start again",
                ) from None

    def enqueue(
        self, principal: Principal, request: RunRequest, kind: str = "craft", waited: bool = False
    ) -> queue.Enqueued:
        """Queue `request` for the principal's tenant, or join the job already there for the same need
        (QuotaExceeded past the tenant's quotas or the token's concurrent crafts). The following names this front
        (flakebot.team.fronts ends it if the front is lost): `waited`, until the job ends (a call of this front holds
        it); else until the call sends the job's id (answered). Sent again by `_call` (its connection dropped, maybe
        after the database committed it), the enqueue finds the following its first send wrote (the call's key)."""
        cap = principal.concurrent_crafts
        key = queue.new_key()  # one per call, outside the closure: a send again finds the following the first wrote
        # the front identities of its sends cut with their connection (a sweep may change it between two): only
        # such a send may have committed unseen; one the database refused (read-only, say) rolled back, and kept
        # here it would be a following counted and looked for that none wrote, one more per call while it refuses
        sent_as: list[str] = []

        def enqueue(conn: Conn) -> queue.Enqueued | None:
            import psycopg

            front = self.front  # read once: the lease's thread may change it once a sweep claimed it
            try:
                return send(conn, front)
            except (psycopg.OperationalError, psycopg.InterfaceError):  # as _call takes the database for away
                if front not in sent_as:
                    sent_as.append(front)
                raise

        def send(conn: Conn, front: str) -> queue.Enqueued | None:
            with conn.transaction():
                # the tenant's lock first: the front's row, locked by its renewal, is held only while the enqueue
                # writes, never while it waits on that lock (the lease's renewals would wait behind it)
                queue.lock_tenant(conn, principal.tenant)
                # the following names this front, whose lease is renewed with it (a sweep finds it live); its row
                # claimed by a sweep: nothing written, this front holds a lease again under a new identity
                if not fronts.renew(conn, front, self.lease_seconds):
                    return None
                enqueued = queue.enqueue(
                    conn,
                    principal.tenant,
                    principal.name,
                    request,
                    kind,
                    principal_cap=cap,
                    principal_id=principal.id,
                    front=front if waited else None,
                    answering=None if waited else front,
                    key=key,
                )
                # a send again finds only a following of this identity (a swept one's is that sweep's to end)
                return dataclasses.replace(enqueued, front=front)

        try:
            enqueued = self._call(enqueue)
            if enqueued is None:  # swept meanwhile: enqueued under the identity it holds a lease as now
                self._call(self._held)
                enqueued = self._call(enqueue)
        except HostError:  # a send may have committed before the database went away: its following is no call's
            if sent_as:
                with self._unsent_lock:
                    self._unsent.append(_Unsent(principal, key, tuple(sent_as)))
            raise
        if enqueued is None:  # swept again within milliseconds: its database's clock jumped, say
            raise away()
        logger.info(
            "%s job %s for %s (tenant %s)",
            "joined" if enqueued.joined else "queued",
            enqueued.job_id,
            principal.name,
            principal.tenant,
        )
        return enqueued

    def answered(self, principal: Principal, enqueued: queue.Enqueued) -> None:
        """The call holding `enqueued`'s following (not a waited one) is about to send the job's id: from now on the
        following outlives this front (queue.answered, with the lease of the front it names renewed). That front
        swept meanwhile (this front stalled past its lease), or the database away: raised, and the call must fail
        (its caller gets no id; the sweep, or the call's own end, ends the following)."""
        assert enqueued.front is not None

        def answer(conn: Conn) -> bool:
            return queue.answered(
                conn,
                str(enqueued.front),
                self.lease_seconds,
                principal.tenant,
                principal.name,
                principal.id,
                enqueued.job_id,
                enqueued.following,
            )

        if not self._call(answer):
            logger.warning("job %s: its call not answered: this front was swept as lost meanwhile", enqueued.job_id)
            raise away()

    def end_unsent(self, revoked: Collection[str]) -> list[dict[str, Any]]:
        """The followings of calls whose enqueue failed at every send (the database away or refusing, maybe after it
        committed one) ended as those calls' ends would end them (queue.end_sent; `revoked`: identities that follow
        nothing): nothing for a call none of whose sends committed. One the database does not answer for is kept
        for the next try (raised: the rest kept too). The rows changed."""
        with self._unsent_lock:
            pending = list(self._unsent)
        changed = []
        for unsent in pending:
            rows = self._call(lambda conn, u=unsent: u.end(conn, revoked))  # type: ignore[misc]
            with self._unsent_lock:
                if unsent in self._unsent:
                    self._unsent.remove(unsent)
            changed += self._said(rows, "an enqueue of it failed after its database maybe committed it")
        return changed

    def unsent(self) -> int:
        """How many failed enqueues wait for the database to end what they may have written (end_unsent)."""
        with self._unsent_lock:
            return len(self._unsent)

    def job(self, tenant: str, job_id: int) -> dict[str, Any] | None:
        """The job's row as `tenant` sees it (`left_by`: the principals who stopped following it): another tenant's
        job is None, as an unknown one."""
        return self._call(
            lambda conn: conn.execute(
                f"SELECT j.*, {queue.LEFT_BY} FROM jobs j WHERE j.id = %s AND j.tenant = %s", (job_id, tenant)
            ).fetchone()
        )

    def cancel(
        self, principal: Principal, job_id: int, revoked: Collection[str] = (), following: int | None = None
    ) -> dict[str, Any] | None:
        """Cancel a job the principal alone follows, queued or running, those in `revoked` not counted (queue.cancel;
        `following`: end only that one following of the principal's, the job cancelled with its last): its row, None
        when not its to cancel."""
        row = self._call(
            lambda conn: queue.cancel(
                conn, job_id, principal.tenant, principal.name, principal.id, revoked, following=following
            )
        )
        if row is not None and not row.get("unchanged"):
            how = "one following ended" if row.get("retracted") else "left" if row.get("left_by") else "cancelled"
            logger.info("job %s %s by %s (tenant %s)", job_id, how, principal.name, principal.tenant)
        return row

    def drop_revoked(self, principal_ids: Collection[str], revoked: Collection[str]) -> list[dict[str, Any]]:
        """Each of `principal_ids` (tokens revoked since this front last looked) made to follow no job
        (queue.drop_followings; `revoked`: every revoked id): the rows changed."""
        changed = []
        for principal_id in sorted(principal_ids):
            rows = self._call(lambda conn, who=principal_id: queue.drop_followings(conn, who, revoked))  # type: ignore[misc]
            for row in rows:
                how = "left" if row.get("left_by") else "cancelled"
                logger.info("job %s %s: the token %s following it was revoked", row["id"], how, principal_id)
            changed += rows
        return changed

    def hold_lease(self) -> bool:
        """Renew this front's lease (its row made the first time): False when a sweep had taken the front for lost
        since it last held it (or a waited call's enqueue found it so); it holds a lease under a new identity then."""
        self._call(self._held, self._lease)
        with self._identity:
            lost, self._lost = self._lost, False
        return not lost

    def _held(self, conn: Conn) -> None:
        """This front's lease renewed on `conn` (the caller holds the lock). Its row claimed or removed by a sweep: a
        new identity registered (the old one's followings are the sweep's to end), the loss noted for hold_lease.
        One thread at a time (the lease's, and a waited enqueue's that found its front claimed), so one new identity."""
        with self._identity:
            if fronts.renew(conn, self.front, self.lease_seconds):
                return
            if self._leased:
                front = fronts.new_identity()
                fronts.hold(conn, front, self.lease_seconds)  # committed (autocommit) before the identity is taken
                logger.warning("front %s was swept as lost: it holds a lease again as %s", self.front, front)
                self.front, self._lost = front, True
            else:
                fronts.hold(conn, self.front, self.lease_seconds)
                self._leased = True

    def sweep_lost_fronts(self, revoked: Collection[str], held_for: float | None = None) -> list[dict[str, Any]]:
        """The waited followings of fronts whose lease ran out ended (fronts.sweep; `held_for`: the seconds this
        front's renewals have held, no front of a longer lease taken for lost; none whose lease ran out within this
        front's unseen stall): the rows changed."""
        grace = fronts.unseen_stall(self.lease_seconds)
        swept = self._call(lambda conn: fronts.sweep(conn, revoked, held_for, grace), self._sweeps)
        return self._said(swept, "its waited call's front was lost")

    def _said(self, rows: list[dict[str, Any]], why: str) -> list[dict[str, Any]]:
        for row in rows:
            how = "one following ended" if row.get("retracted") else "left" if row.get("left_by") else "cancelled"
            logger.info("job %s %s: %s", row["id"], how, why)
        return rows

    def jobs_of(self, tenant: str, seconds: float, limit: int = LISTED) -> list[dict[str, Any]]:
        """The tenant's jobs queued or running, and those that ended within `seconds`, newest first (`limit` of
        them)."""
        return self._call(
            lambda conn: conn.execute(
                f"SELECT j.*, {queue.LEFT_BY} FROM jobs j WHERE tenant = %s AND (state IN ('queued', 'running') "
                "OR ended > now() - make_interval(secs => %s)) ORDER BY created DESC, id DESC LIMIT %s",
                (tenant, seconds, limit),
            ).fetchall()
        )

    def runs_of(self, tenant: str) -> set[str]:
        """The run ids the tenant's jobs work in."""
        rows = self._call(
            lambda conn: conn.execute(
                "SELECT run_id FROM jobs WHERE tenant = %s AND run_id IS NOT NULL", (tenant,)
            ).fetchall()
        )
        return {str(row["run_id"]) for row in rows}

    def admit_call(self, principal_id: str, cap: int, window: float) -> tuple[int, float] | None:
        """Count a tool call of the principal in the database, or refuse it: (calls in the window, seconds until the
        oldest leaves it). The principal's advisory lock makes two fronts count one after the other."""

        def admit(conn: Conn) -> tuple[int, float] | None:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (CALLS_LOCK, principal_id))
                conn.execute(
                    "DELETE FROM calls WHERE principal = %s AND at <= clock_timestamp() - make_interval(secs => %s)",
                    (principal_id, window),
                )
                seen = conn.execute(
                    "SELECT count(*) AS n, extract(epoch FROM min(at) + make_interval(secs => %s) - clock_timestamp()) "
                    "AS wait FROM calls WHERE principal = %s",
                    (window, principal_id),
                ).fetchone()
                assert seen is not None
                if seen["n"] >= cap:
                    return int(seen["n"]), float(seen["wait"] or 0)
                conn.execute("INSERT INTO calls (principal) VALUES (%s)", (principal_id,))
            return None

        return self._call(admit)

    def depth(self) -> dict[str, int]:
        """How many jobs are in each state (every state named, 0 when none)."""
        rows = self._call(lambda conn: conn.execute("SELECT state, count(*) AS n FROM jobs GROUP BY state").fetchall())
        counts = {state: 0 for state in STATES}
        counts.update({str(row["state"]): int(row["n"]) for row in rows})
        return counts

    def close(self) -> None:
        for line in (self._calls, self._lease, self._sweeps):
            with line.lock:
                if line.conn is not None:
                    line.conn.close()
                line.conn = None

    def _call(self, call: Callable[[Conn], T], line: _Line | None = None) -> T:
        """`call` on the front's connection (`line`: another of its connections), made again once if the database
        dropped it; the database away: away() raised, the reason logged."""
        import psycopg

        line = line or self._calls
        with line.lock:
            for attempt in (1, 2):
                if line.conn is None or line.conn.closed:
                    try:
                        line.conn = db.connect(self.url, autocommit=True, name="flakebot serve")
                    except HostError as exc:  # where the database is and why: the operator's to read, not a caller's
                        logger.warning("%s", exc.one_line())
                        raise away() from None
                try:
                    return call(line.conn)
                except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                    logger.warning("the team database went away (%s); reconnecting", str(exc).strip()[:200])
                    line.conn.close()
                    line.conn = None
                    if attempt == 2:
                        break
                except psycopg.Error as exc:  # it answers but refuses (read-only after a failover, a privilege)
                    logger.error("the team database %s refused: %s", db.shown(self.url), str(exc).strip()[:200])
                    raise refused() from None
        logger.warning("the team database %s does not answer", db.shown(self.url))
        raise away()


@dataclasses.dataclass(frozen=True)
class _Unsent:
    """A call's enqueue that failed at every send: its key, and each front identity a send went under."""

    principal: Principal
    key: str
    fronts: tuple[str, ...]

    def end(self, conn: Conn, revoked: Collection[str]) -> list[dict[str, Any]]:
        who = self.principal
        # its own revocation does not keep it from ending its following (as drop_followings): the front's one look
        # at that revocation may have come before this send committed, and nothing else would end it
        others = set(revoked) - {who.id}
        return queue.end_sent(conn, who.tenant, who.name, who.id, self.key, self.fronts, others)


class _Line:
    """One connection of a front to the database, used by one thread at a time (its lock)."""

    def __init__(self) -> None:
        self.conn: Conn | None = None
        self.lock = threading.Lock()


def refused() -> HostError:
    """What a client is told when the team database answers with an error of its own (PostgreSQL's text is the
    operator's: the log has it)."""
    return _told("refused this request")


def away() -> HostError:
    """What a client is told when the team database does not answer: one line, nothing of where it is, a fix the
    agent can take (the admin reads why in the front's log)."""
    return _told("does not answer")


def _told(what: str) -> HostError:
    return HostError(
        f"the team database {what} now (the server's admin sees why in its log)",
        fix="call again in a minute; if it keeps failing, tell your flakebot admin",
    )
