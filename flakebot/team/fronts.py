"""Each front's lease in the team database, and the end of a lost front's waited calls' followings.

A waited craft (a tools/call that holds its answer until its job ends) holds one following of its job, its audit row
naming the front that holds the call (queue.enqueue's `front`). The call's own end retracts it (flakebot.mcp.front's
leave_following); a front killed (SIGKILL, its machine lost) ends nothing. So each front holds a lease, a time in its
`fronts` row that it renews while it runs (as a worker renews a job's), and a live front retracts the waited
followings of any front whose lease ran out, through queue.cancel(following=...): the job goes on for its other
followers (a task, another front's waited call) and ends when none is left. A front stopping cleanly leaves its lease
to run out the same way, not retracting at once: a caller whose call it cut has a lease's time to come back (a retried
craft joins its job, and the job keeps that following). A task's or a detached craft's following names its front
only until the call sends the job's id (queue.answered, on a renewal of the front's lease): a front lost before that
is swept as a waited call's; after, the following outlives the front it came through, by design.

A sweep claims a lost front's row in the statement that finds its lease run out (sweep), before ending any of its
followings: a front that stalled and renews meanwhile either renews first (it is live: not swept) or finds its row
claimed, learns that its waited calls' followings are being ended, and holds a lease again under a new identity
(flakebot.team.frontqueue), so none of its later calls is taken for the lost one's.

A lease is a time, not a connection: a database restart ends none by itself. After the database was away longer
than a lease every front's time ran out, so a front sweeps others only once its own renewals have held for a whole
lease since (SweepGuard): by then every live front has renewed. The same after a stall of the front itself (a renewal
late: stopped, its VM paused), which may have stalled the fronts beside it as long. Leases differ (`serve --lease`,
`worker --lease`), so each front's row says its own, and a sweep takes a front for lost only once the sweeper's
renewals have held for that front's lease, however short the sweeper's own: a worker of `--lease 3` takes no front of
`--lease 30` for lost in the seconds before it renews after the database's absence.

Workers sweep too (flakebot.team.worker's FrontSweeps), through the same sweep and the same guard, their own looks at
the database every third of their lease standing for a front's renewals: with every front killed, a waited craft's
job does not run to its end for nobody.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from flakebot.team import queue

if TYPE_CHECKING:
    import psycopg

    Conn = psycopg.Connection[dict[str, Any]]

logger = logging.getLogger(__name__)

DEFAULT_LEASE = 30.0  # seconds a front stays live without renewing (it renews every third of it)
LOST = "front lost"  # the `because` of a following a lost front's sweep ended
SWEPT = "'-infinity'::timestamptz"  # the lease of a front a sweep claimed: never renewed again (SQL)
# a front's lease renewed, its parameters (lease_seconds, lease_seconds, front): nothing when a sweep claimed it
RENEWAL = (
    "UPDATE fronts SET lease_until = now() + make_interval(secs => %s), lease_seconds = %s "
    f"WHERE id = %s AND lease_until > {SWEPT}"
)


def new_identity() -> str:
    """A front's identity for one run: host, pid and a random part (a restarted front that got the same pid is
    another front, whose lease is not its predecessor's)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def renew(conn: Conn, front: str, lease_seconds: float) -> bool:
    """Renew `front`'s lease; False when it has none to renew: a sweep claimed it (or removed it since), so its
    identity is over (its waited calls' followings are ended), or it never registered."""
    renewed = conn.execute(RENEWAL, (lease_seconds, lease_seconds, front))
    return renewed.rowcount == 1


def hold(conn: Conn, front: str, lease_seconds: float) -> bool:
    """Renew `front`'s lease, its row made if it has none; False when it had none to renew (a new front; or one a
    sweep took for lost: it or its database stalled past its lease, and its waited calls' followings were ended. A
    row a sweep claimed and did not remove yet is not made again: a front told False registers a new identity)."""
    with conn.transaction():
        if renew(conn, front, lease_seconds):
            return True
        conn.execute(
            "INSERT INTO fronts (id, lease_until, lease_seconds) VALUES (%s, now() + make_interval(secs => %s), %s) "
            "ON CONFLICT (id) DO NOTHING",
            (front, lease_seconds, lease_seconds),
        )
    return False


def unseen_stall(lease_seconds: float) -> float:
    """The longest stall of a sweeper that its SweepGuard cannot tell from renewals on time: its renewal was due up to
    a third of its lease after the stall began, and is taken as on time when late by up to a sixth. Fronts stalled
    with it (one paused VM or host) whose lease is shorter than its own lapsed meanwhile and renew only as they
    resume: a sweeper takes for lost only fronts whose lease ran out longer ago than this (sweep's `grace`)."""
    return lease_seconds / 2


def sweep(
    conn: Conn, revoked: Collection[str] = (), held_for: float | None = None, grace: float = 0.0
) -> list[dict[str, Any]]:
    """Fronts whose lease ran out over `grace` seconds ago (unseen_stall of the sweeper's lease; `held_for`: the
    seconds the sweeper's own renewals have held, SweepGuard; a front whose lease is longer is left, as it may not
    have renewed since the database came back; a row already claimed is taken whatever its lease): each claimed (its
    lease made SWEPT) in the one statement that finds it run out, so
    a renewal either comes first (the front is live, and not swept) or finds its row claimed (renew: False), then
    each waited following they held retracted (retract), then their rows removed. No lock is held across the cancels
    (each takes its tenant's lock, as a waited enqueue does after renewing its front's row). Idempotent: a sweep cut
    short leaves its claimed rows run out for the next sweep, and two fronts sweeping at once end each following
    once. The job rows changed."""
    with conn.transaction():  # its own: on a connection not in autocommit, a bare statement would leave one open
        claimed = conn.execute(
            f"UPDATE fronts SET lease_until = {SWEPT} WHERE id IN (SELECT id FROM fronts "
            "WHERE lease_until < now() - make_interval(secs => %(grace)s) "
            "AND (%(held)s::float8 IS NULL OR lease_seconds IS NULL OR lease_seconds <= %(held)s "
            f"OR lease_until = {SWEPT}) "
            "ORDER BY id FOR UPDATE SKIP LOCKED) RETURNING id",
            {"held": held_for, "grace": grace},
        ).fetchall()
    lost = sorted(str(row["id"]) for row in claimed)
    if not lost:
        return []
    changed = retract(conn, lost, revoked, LOST)
    with conn.transaction():
        conn.execute(f"DELETE FROM fronts WHERE id = ANY(%s) AND lease_until = {SWEPT}", (lost,))
    return changed


def retract(conn: Conn, fronts: list[str], revoked: Collection[str], because: str) -> list[dict[str, Any]]:
    """Each following the waited calls of `fronts` (claimed by a sweep: their identities are over, no call names them
    again) hold of a job still queued or running, and each their tasks' and detached crafts' calls held unanswered
    (queue.enqueue's `answering`, no 'answered' row: its caller never got the job's id; none can be written once the
    front is claimed), ended as the call's own end would have ended it (queue.cancel with that `following`;
    `revoked`: identities that follow nothing). An `answered` row counts only if the following's own principal
    wrote it after the following (the role workers use may INSERT any audit row: another's, or one written ahead
    naming an id to come, would keep a following whose caller never got the job's id). The rows changed."""
    with conn.transaction():
        held = conn.execute(
            "SELECT a.id, a.job, a.tenant, a.principal, a.detail->>'principal_id' AS principal_id "
            "FROM jobs j JOIN audit a ON a.job = j.id AND a.tenant = j.tenant "
            "WHERE j.state IN ('queued', 'running') AND a.action IN ('enqueued', 'joined') "
            "AND (a.detail->>'front' = ANY(%(lost)s) OR a.detail->>'answering' = ANY(%(lost)s) AND NOT EXISTS ("
            "SELECT 1 FROM audit r WHERE r.job = a.job AND r.tenant = a.tenant AND r.action = 'answered' "
            f"AND r.detail->>'following' = a.id::text AND r.id > a.id AND {queue.who('r')} = {queue.WHO})) ORDER BY a.id",
            {"lost": fronts},
        ).fetchall()
    changed = []
    for following in held:
        row = queue.cancel(
            conn,
            following["job"],
            following["tenant"],
            following["principal"],
            following["principal_id"],
            revoked,
            because=because,
            following=following["id"],
        )
        if row is not None and not row.get("unchanged"):
            changed.append(row)
    return changed


class SweepGuard:
    """When a sweeper (a front, a worker) may take others' leases for lost: once its own renewals, each due a third
    of `lease_seconds` after the last, have held on time for a whole lease. A renewal that failed (the database
    away) starts the lease again, and so does one late by more than a sixth of a lease: a stall of the sweeper itself
    (SIGSTOP, a paused VM, the host frozen) that may have held up the fronts beside it too, so a live front lapses
    only after a stall of two thirds of a lease, which makes this renewal at least a third late."""

    def __init__(self, lease_seconds: float, who: str) -> None:
        self.lease_seconds, self.who = lease_seconds, who
        self.steady: float | None = None  # since when (monotonic) each renewal held
        self.due = time.monotonic()  # when the next renewal should come

    def held(self) -> bool:
        """A renewal held now: whether the sweeper may sweep."""
        now = time.monotonic()
        if self.steady is not None and now - self.due > self.lease_seconds / 6:
            logger.info("%s stalled (renewed %.1f s late): it sweeps no front for a lease", self.who, now - self.due)
            self.steady = None
        self.steady = now if self.steady is None else self.steady
        return now - self.steady >= self.lease_seconds

    @property
    def grace(self) -> float:
        """How long ago a front's lease must have run out for this sweeper to take it for lost (unseen_stall)."""
        return unseen_stall(self.lease_seconds)

    def held_for(self) -> float:
        """The seconds the renewals have held on time (0 when the last one failed): the longest lease of another
        front a sweep may take for lost now (sweep's `held_for`)."""
        return 0.0 if self.steady is None else time.monotonic() - self.steady

    def lapsed(self) -> None:
        """A renewal failed, or found its lease taken: the whole lease starts again."""
        self.steady = None

    def pause(self) -> float:
        """The seconds until the next renewal is due (a third of the lease), from now."""
        self.due = time.monotonic() + self.lease_seconds / 3
        return self.lease_seconds / 3
