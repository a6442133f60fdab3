"""The work queue in PostgreSQL: enqueue (one craft per need, quotas exact), claim (fair, SKIP LOCKED), leases,
and a job's end written back.

Races are the database's to settle, not ours:
- enqueue takes a transaction-scoped advisory lock on its tenant, so two fronts enqueueing for one tenant count
  its jobs one after the other (a quota can never be exceeded), and a unique partial index on (tenant, kind,
  need_digest) over queued and running jobs keeps a need to one job even if a writer skipped the lock;
- claim picks with `FOR UPDATE SKIP LOCKED`, so two workers never take one job and never wait on each other;
- a lease is a time in the row: a worker renews it while it works (heartbeat); a job whose lease ran out (its
  worker was killed, or lost the database) is claimable again and resumed from its run. Only the worker named in
  the row may renew or finish it (a worker that lost its job to another cannot overwrite its result).
- a cancel of a running job ends its row `cancelled` at once (as MCP asks of tasks/cancel: cancelled before the answer,
  and cancelled for good); the worker holding it sees that at its next look (worker.Heartbeat, every second) and
  stops its craft, and its end is refused by the row (finish: the state is no longer running), whichever comes first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flakebot.errors import QuotaExceeded, UsageError

if TYPE_CHECKING:
    import psycopg

    from flakebot.pipeline.request import RunRequest

    Conn = psycopg.Connection[dict[str, Any]]

logger = logging.getLogger(__name__)

CHANNEL = "flakebot_jobs"  # NOTIFY'd on every enqueue: waiting workers wake at once instead of at their next poll
TENANT_LOCK = 0x666C6B71  # first key of pg_advisory_xact_lock(TENANT_LOCK, hashtext(tenant))
DEFAULT_MAX_IN_FLIGHT = 4  # a tenant's queued + running crafts, until set_quota says otherwise
DEFAULT_MAX_PER_DAY = 100  # crafts a tenant may enqueue per UTC day
MAX_QUOTA = 2**31 - 1  # the integer columns' largest
MAX_ATTEMPTS = 3  # claims of one job: a job whose workers keep dying is failed, not claimed forever
TODAY = "date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"  # the UTC day's start, in SQL
WINDOW = "24 hours"  # the share used is measured over this window (as Hydra's scheduler does)
REGISTRIES = ("auto", "crates-io", "local")  # a tenant's registry: by name only (a path would be the worker's)
ENQUEUE_KEY = "enqueue_key"  # an enqueue's or join's audit detail: the key of the call that wrote it (new_key)
REMOTE_SCHEMES = ("https://", "http://", "git://", "ssh://", "git@")  # a tenant's `from`: a repository, not a path


@dataclass(frozen=True)
class Enqueued:
    """A job an enqueue gave back: a new one, or the one already queued or running for the same need."""

    job_id: int
    joined: bool
    state: str
    following: int  # the audit row of this enqueue or join: the one following a waited call's end retracts (cancel)
    front: str | None = None  # the front that holds the following (waited) or holds it until answered (answering)


def need_digest(kind: str, request: dict[str, Any]) -> str:
    """The digest of what a job will make: its kind, its need as the catalog keys needs, and every other option (a
    request that differs in any option is another craft)."""
    from flakebot.deliver.catalog import normalize_need

    key = {**request, "need": normalize_need(str(request.get("need", "")))}
    canonical = json.dumps({"kind": kind, "request": key}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def tenant_request(kind: str, data: Any) -> RunRequest:
    """A job's request as a tenant may ask it, whoever wrote the row: the arguments the MCP tool of `kind` offers only
    (the door a team's front serves, as flakebot.pipeline.request declares them), checked against that schema by
    flakebot.validation as the door checks them, and nothing a worker owns: no setting overridden (sandbox, workdir,
    limits, builders...), no path on the worker's host (a spec file, a scripted model's script, a directory registry,
    a local crate to start from). What else a craft needs (model, offline, registry paths) is the worker's own
    settings. UsageError otherwise."""
    import dataclasses
    import typing

    from flakebot.deliver.schema import Field, closed_object
    from flakebot.pipeline.request import RunRequest, options
    from flakebot.preflight import check_text
    from flakebot.toolschema import json_schema
    from flakebot.validation import check_arguments

    if kind != "craft" or not isinstance(data, dict):
        raise UsageError(f"a {kind} job's request must be a craft's object", fix="enqueue it with flakebot.team.queue")
    hints = typing.get_type_hints(RunRequest)
    offered = {
        f.name: (meta["mcp_name"] or f.name, bool(meta["positional"])) for f, meta in options(RunRequest, kind, "mcp")
    }
    defaults = {f.name: f.default_factory() if callable(f.default_factory) else f.default
                for f in dataclasses.fields(RunRequest)}  # fmt: skip
    for key, value in data.items():
        if key not in offered and (key not in defaults or value != defaults[key]):
            raise UsageError(
                f"a {kind} job's request sets {key!r}, which no tenant may set",
                fix=f"a tenant's request takes only: {', '.join(name for name, _ in offered.values())}",
            )
    kinds = {path: json_schema(hints[path])["type"] for path in offered}
    schema = closed_object({name: Field(kinds[path], path, required) for path, (name, required) in offered.items()})
    given = {offered[path][0]: value for path, value in data.items() if path in offered and value is not None}
    check_arguments(kind, given, schema)
    values: dict[str, Any] = {}
    for path, (name, required) in offered.items():
        value = given.get(name)
        if required and not (isinstance(value, str) and value.strip()):
            raise UsageError(f"'{name}' is required", fix=f"pass {name} as a non-empty string")
        values[path] = bool(value) if kinds[path] == "boolean" else (str(value) if value else None)
    for name, value in values.items():  # jsonb holds no NUL: the database would refuse it with an error of its own
        if isinstance(value, str) and "\x00" in value:
            raise UsageError(f"the {name} holds a NUL character", fix=f"pass the {name} as plain text")
    request = RunRequest(**values)
    check_text("need", request.need, example="need a CSV deduper")  # as craft checks it: empty, not UTF-8, too long
    check_tenant_sources(request.model, request.from_location, request.registry)
    return request


def check_tenant_sources(model: Any, from_location: Any, registry: Any) -> None:
    """What a tenant's craft reads is not a file of the machine doing it (a worker's, or a front's that crafts
    itself): its model a provider's, not a script; its registry one by name, not a directory; its `from` a repository URL, not a path (a path could name another
    tenant's catalog, a tool's sources, beneath the organisation's catalog). UsageError otherwise."""
    if isinstance(model, str) and model.startswith("scripted:"):
        raise UsageError("a tenant's model cannot be a script on the worker", fix="name a provider's model")
    if isinstance(from_location, str) and from_location and not from_location.startswith(REMOTE_SCHEMES):
        raise UsageError("a tenant's 'from' is a repository URL (https, git, ssh)", fix="not a path on the worker")
    if isinstance(registry, str) and registry and registry not in REGISTRIES:
        raise UsageError(f"a tenant's registry is one of {', '.join(REGISTRIES)}", fix="leave registry out")


def job_tenant(value: Any) -> str:
    """A job row's tenant as a worker uses it (the catalog its craft goes to: deliver/catalog.py's tenant_root),
    checked as the row's request is: a tenant name (team.tokens.NAME), whoever wrote the row. UsageError otherwise."""
    from flakebot.team.tokens import NAME

    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise UsageError("a job's tenant is not a tenant name", fix="enqueue it with flakebot.team.queue")
    return value


def set_quota(
    conn: Conn,
    tenant: str,
    *,
    max_in_flight: int,
    max_per_day: int,
    shares: int = 1,
    max_cpu_seconds_per_day: int | None = None,
) -> None:
    """A tenant's quotas and its share of the workers (made if new); each a whole number the column holds (0 refuses
    every craft; shares at least 1; no CPU-seconds bound: None), else one UsageError and nothing changed."""
    change_quota(
        conn,
        tenant,
        {
            "max_in_flight": max_in_flight,
            "max_per_day": max_per_day,
            "shares": shares,
            "max_cpu_seconds_per_day": max_cpu_seconds_per_day,
        },
    )


QUOTA_LEAST = {"max_in_flight": 0, "max_per_day": 0, "shares": 1, "max_cpu_seconds_per_day": 0}
QUOTA_DEFAULTS = {"max_in_flight": DEFAULT_MAX_IN_FLIGHT, "max_per_day": DEFAULT_MAX_PER_DAY, "shares": 1}


def change_quota(conn: Conn, tenant: str, changes: dict[str, int | None]) -> None:
    """Set the quotas `changes` names, in one statement: the others stay as they are when it commits (a read, then
    a write of every field, would put back what another admin changed meanwhile). A new tenant gets the defaults
    for the rest. max_cpu_seconds_per_day None: no bound."""
    for key, value in changes.items():
        least = QUOTA_LEAST[key]  # a KeyError is a caller's bug: only these columns are ever named in the SQL
        if key == "max_cpu_seconds_per_day" and value is None:
            continue
        if type(value) is not int or not least <= value <= MAX_QUOTA:
            raise UsageError(
                f"{key} must be a whole number from {least} to {MAX_QUOTA}, got {value!r}",
                fix=f"give {key} as a whole number from {least} to {MAX_QUOTA}",
            )
    row = {**QUOTA_DEFAULTS, "max_cpu_seconds_per_day": None, **changes}
    columns = list(row)
    updates = ", ".join(f"{key} = EXCLUDED.{key}" for key in changes) or "name = EXCLUDED.name"
    with conn.transaction():
        conn.execute(
            f"INSERT INTO tenants (name, {', '.join(columns)}) VALUES (%s{', %s' * len(columns)}) "
            f"ON CONFLICT (name) DO UPDATE SET {updates}",
            (tenant, *row.values()),
        )


def quota_of(conn: Conn, tenant: str) -> dict[str, Any]:
    """A tenant's quotas (the defaults for one never seen: nothing is made) and what it used of them: crafts queued
    or running, made today and their CPU-seconds (UTC day)."""
    row = conn.execute("SELECT * FROM tenants WHERE name = %s", (tenant,)).fetchone()
    quotas = {
        "max_in_flight": row["max_in_flight"] if row else DEFAULT_MAX_IN_FLIGHT,
        "max_per_day": row["max_per_day"] if row else DEFAULT_MAX_PER_DAY,
        "shares": row["shares"] if row else 1,
        "max_cpu_seconds_per_day": row["max_cpu_seconds_per_day"] if row else None,
    }
    return {"tenant": tenant, "known": row is not None, **quotas, "used": _used(conn, tenant)}


def _used(conn: Conn, tenant: str) -> dict[str, Any]:
    counts = conn.execute(
        "SELECT count(*) FILTER (WHERE state IN ('queued', 'running')) AS in_flight, "
        # a craft cancelled before any worker claimed it never ran: not one of the day's; one a worker started,
        # then handed back (its worker lost) before the cancel, did run, and counts
        f"count(*) FILTER (WHERE created >= {TODAY} AND (state <> 'cancelled' OR started IS NOT NULL)) AS today, "
        f"coalesce(sum(cpu_seconds) FILTER (WHERE coalesce(ended, started, created) >= {TODAY}), 0) AS cpu_seconds "
        "FROM jobs WHERE tenant = %s",
        (tenant,),
    ).fetchone()
    assert counts is not None
    return {"in_flight": counts["in_flight"], "today": counts["today"], "cpu_seconds": round(counts["cpu_seconds"], 1)}


LEAST_LEASE = 3.0  # a job's or a front's: shorter leaves too little time to renew between a database's hiccups
MOST_LEASE = 86400.0  # longer keeps a killed worker's job from the others, or a killed front's crafts going, as long


def check_lease(seconds: float) -> None:
    """A `--lease` (a worker's, a front's), refused unless from LEAST_LEASE to MOST_LEASE seconds: nan (which no
    comparison holds), inf or 1e300 reach PostgreSQL as an 'interval out of range' at the first renewal."""
    if LEAST_LEASE <= seconds <= MOST_LEASE:
        return
    why = "too short to renew" if seconds < LEAST_LEASE else "too long" if seconds > MOST_LEASE else "not a number"
    raise UsageError(
        f"--lease {seconds:g} is {why}", fix=f"pass --lease from {LEAST_LEASE:g} to {MOST_LEASE:g} (seconds)"
    )


def enqueue(
    conn: Conn,
    tenant: str,
    principal: str,
    request: RunRequest,
    kind: str = "craft",
    principal_cap: int | None = None,
    principal_id: str | None = None,
    front: str | None = None,
    answering: str | None = None,
    key: str | None = None,
) -> Enqueued:
    """Queue `request` for `tenant`, or join the job already queued or running for the same need; refused with
    QuotaExceeded when the tenant has its maximum in flight or has used its crafts for the day, or (`principal_cap`:
    a token's concurrent crafts) the principal has that many of its own queued or running. Joining is never
    refused: it adds no craft. `principal_id`: the principal's identity, by which its following is known (cancel).
    `front`: the front whose waited call holds this following (flakebot.team.fronts ends it if that front is lost).
    `answering`: the front whose call (a task, a detached craft) holds it only until the job's id is sent (answered:
    from then on it outlives its front), ended as a waited one's if that front is lost first. Another key than a
    waited call's `front`, so a front of an older flakebot, which knows no `answered`, never sweeps it. `key`: the
    call's own (random, one per call: new_key), kept in the following's audit row; the same call sent again (its
    first send committed, its acknowledgement lost) gets back the following that send wrote, nothing written again."""
    data = tenant_request(kind, request.to_dict()).to_dict()
    digest = need_digest(kind, data)
    held_by = {"front": front} if front else {"answering": answering} if answering else {}
    held_by |= {ENQUEUE_KEY: key} if key else {}
    with conn.transaction():
        lock_tenant(conn, tenant)
        sent = _sent_before(conn, tenant, principal_id or principal, key, front or answering) if key else None
        if sent is not None:
            return sent
        quota = _tenant(conn, tenant)
        same = conn.execute(
            "SELECT id, state FROM jobs WHERE tenant = %s AND kind = %s AND need_digest = %s "
            "AND state IN ('queued', 'running')",
            (tenant, kind, digest),
        ).fetchone()
        if same is not None:
            said = {"need_digest": digest, **_identity(principal_id), **held_by}
            following = _audit(conn, tenant, principal, "joined", same["id"], said)
            return Enqueued(int(same["id"]), True, str(same["state"]), following, front or answering)
        if principal_cap is not None:
            _check_principal(conn, tenant, principal, principal_cap, principal_id)
        _check_quota(conn, tenant, quota)
        row = conn.execute(
            "INSERT INTO jobs (tenant, principal, kind, need_digest, request) VALUES (%s, %s, %s, %s, %s) RETURNING id",
            (tenant, principal, kind, digest, _json(data)),
        ).fetchone()
        assert row is not None
        said = {"need_digest": digest, **_identity(principal_id), **held_by}
        following = _audit(conn, tenant, principal, "enqueued", row["id"], said)
        conn.execute(f"NOTIFY {CHANNEL}")
    return Enqueued(int(row["id"]), False, "queued", following, front or answering)


def new_key() -> str:
    """A call's enqueue key: random, so that no caller can name another call's following by guessing it."""
    import secrets

    return secrets.token_hex(16)


def _sent_before(conn: Conn, tenant: str, who: str, key: str, holder: str | None) -> Enqueued | None:
    """The following an earlier send of the call `key` names wrote for the principal `who` (its identity) in
    `tenant`, held by the same front identity `holder`, its job as it is now; None when there is none, or when it is
    held by another identity of the front (its first, which a sweep took for lost: that following is the sweep's to
    end): then the call is queued afresh (SENT_BEFORE). Another principal's row of the same key is never its
    (a key is looked up with its tenant and identity); the index audit_by_enqueue_key finds it among any number."""
    row = conn.execute(SENT_BEFORE, (key, tenant, who, holder)).fetchone()
    if row is None:
        return None
    logger.info("job %s: an enqueue sent again found its following %s", row["job"], row["id"])
    return Enqueued(int(row["job"]), row["action"] == "joined", str(row["state"]), int(row["id"]), row["front"])


def end_sent(
    conn: Conn,
    tenant: str,
    principal: str,
    principal_id: str | None,
    key: str,
    holders: Collection[str],
    revoked: Collection[str] = (),
) -> list[dict[str, Any]]:
    """The following a call's enqueue `key` wrote, its every send failed (the first maybe committed, its
    acknowledgement lost), ended as that call's end would end it (cancel with that `following`: its caller never got
    the job's id): the first row of the key held by each front identity `holders` a send went under (SENT_BEFORE), all
    under the tenant's lock, so a sweep of the front or another try ends each once. Nothing when no send committed.
    The rows changed."""
    who = principal_id or principal
    changed = []
    with conn.transaction():
        lock_tenant(conn, tenant)
        for holder in holders:
            row = conn.execute(SENT_BEFORE, (key, tenant, who, holder)).fetchone()
            if row is None:
                continue
            ended = cancel(conn, int(row["job"]), tenant, principal, principal_id, revoked, following=int(row["id"]))
            if ended is not None and not ended.get("unchanged"):
                changed.append(ended)
    return changed


def lock_tenant(conn: Conn, tenant: str) -> None:
    """The tenant's lock, held to the end of the transaction: enqueues and cancels of one tenant one at a time."""
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (TENANT_LOCK, tenant))


def answered(
    conn: Conn,
    front: str,
    lease_seconds: float,
    tenant: str,
    principal: str,
    principal_id: str | None,
    job_id: int,
    following: int,
) -> bool:
    """The call holding `following` (enqueue's `answering`: `front`) is about to send its caller the job's id: the
    following outlives its front from now on, and no sweep of that front ends it (audit 'answered', naming it).
    Written in the one statement that renews `front`'s lease (one round trip: a task call's answer waits on it), so
    a sweep either claimed that front first (nothing written, False: the call must fail) or finds this row."""
    from flakebot.team.fronts import RENEWAL  # (fronts reads this module's SQL too)

    detail = {**_identity(principal_id), "following": following}
    written = conn.execute(
        f"WITH renewed AS ({RENEWAL} RETURNING id) "
        "INSERT INTO audit (tenant, principal, action, job, detail) "
        "SELECT %s, %s, 'answered', %s, %s FROM renewed RETURNING id",
        (lease_seconds, lease_seconds, front, tenant, principal, job_id, _json(detail)),
    ).fetchone()
    return written is not None


def _tenant(conn: Conn, tenant: str) -> dict[str, Any]:
    conn.execute(
        "INSERT INTO tenants (name, max_in_flight, max_per_day) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
        (tenant, DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_PER_DAY),
    )
    row = conn.execute("SELECT * FROM tenants WHERE name = %s", (tenant,)).fetchone()
    assert row is not None
    return row


def _check_quota(conn: Conn, tenant: str, quota: dict[str, Any]) -> None:
    counts = _used(conn, tenant)
    if counts["in_flight"] >= quota["max_in_flight"]:
        flying = conn.execute(
            "SELECT id FROM jobs WHERE tenant = %s AND state IN ('queued', 'running') ORDER BY id LIMIT 6", (tenant,)
        ).fetchall()
        raise QuotaExceeded(
            f"tenant {tenant} has {counts['in_flight']} crafts queued or running, its limit: {_named(flying)}",
            fix="wait for one of them to end (status with its run_id and wait_seconds follows it), then ask again",
            tenant=tenant,
            quota="max_in_flight",
        )
    if counts["today"] >= quota["max_per_day"]:
        raise QuotaExceeded(
            f"tenant {tenant} has made its {quota['max_per_day']} crafts for today",
            fix="wait until midnight UTC, or ask the team's admin to raise max_per_day",
            tenant=tenant,
            quota="max_per_day",
        )
    bound = quota.get("max_cpu_seconds_per_day")
    if bound is not None and counts["cpu_seconds"] >= bound:  # the crafts already running count once they end
        raise QuotaExceeded(
            f"tenant {tenant} has used its {bound} CPU-seconds of crafting for today ({counts['cpu_seconds']:g})",
            fix="wait until midnight UTC, or ask the team's admin to raise it (flakebot quota TENANT --cpu-seconds)",
            tenant=tenant,
            quota="max_cpu_seconds_per_day",
        )


def _check_principal(conn: Conn, tenant: str, principal: str, cap: int, principal_id: str | None) -> None:
    """One principal may not take all of its tenant's crafts in flight: at most `cap` of those it queued at once. A
    principal is its identity (the audit's enqueued row says who queued a job), never its name: a new token under a
    revoked one's name starts with none of its crafts, and another token under the same name takes none of its cap.
    One it left since (tasks/cancel while others follow it) is still its own until it ends: were it shed at the
    leave, two tokens (one queueing, the other joining each craft before the first leaves it) would hold every
    craft their tenant allows, whatever their caps. The refusal names the crafts to wait for."""
    who = principal_id or principal
    mine = conn.execute(
        "SELECT j.id FROM jobs j WHERE j.tenant = %s AND j.state IN ('queued', 'running') AND EXISTS ("
        f"SELECT 1 FROM audit a WHERE a.job = j.id AND a.tenant = j.tenant AND a.action = 'enqueued' AND {WHO} = %s) "
        "ORDER BY j.id",
        (tenant, who),
    ).fetchall()
    if len(mine) >= cap:
        from flakebot.team.idtokens import concurrent_crafts_set_by  # a refusal's words: PyJWT imported then

        raise QuotaExceeded(
            f"token '{principal}' has {len(mine)} crafts queued or running, its limit (concurrent crafts): "
            f"{_named(mine)}",
            fix="wait for one of them to end (status with its run_id and wait_seconds follows it), "
            f"or ask the admin to raise it ({concurrent_crafts_set_by(who)})",
            tenant=tenant,
            quota="concurrent_crafts",
        )


def _named(rows: list[dict[str, Any]]) -> str:
    """The handles of the jobs a refusal waits for, the first five (a sixth row: more of them)."""
    return ", ".join(f"job-{row['id']}" for row in rows[:5]) + (", ..." if len(rows) > 5 else "")


def claim(conn: Conn, worker: str, lease_seconds: float) -> dict[str, Any] | None:
    """The next job for `worker`, now running under its lease, or None: a job whose lease ran out first (its worker
    died: resume it), then the queued job of the tenant that used the least of its share over the last day (work
    seconds / shares, as Hydra orders jobsets), oldest first. Jobs another worker is claiming are skipped."""
    with conn.transaction():
        _fail_exhausted(conn)
        row = conn.execute(
            "SELECT j.id FROM jobs j JOIN tenants t ON t.name = j.tenant "
            "WHERE j.state = 'queued' OR (j.state = 'running' AND j.lease_until < now()) "
            "ORDER BY (j.state = 'running') DESC, "
            f"(SELECT coalesce(sum(extract(epoch FROM coalesce(u.ended, now()) - u.started)), 0) FROM jobs u "
            f"WHERE u.tenant = j.tenant AND u.started IS NOT NULL AND coalesce(u.ended, now()) > now() - "
            f"interval '{WINDOW}') / t.shares, j.id "
            "LIMIT 1 FOR UPDATE OF j SKIP LOCKED"
        ).fetchone()
        if row is None:
            return None
        job = conn.execute(
            "UPDATE jobs SET state = 'running', worker = %s, lease_until = now() + make_interval(secs => %s), "
            "attempts = attempts + 1, started = coalesce(started, now()) WHERE id = %s RETURNING *",
            (worker, lease_seconds, row["id"]),
        ).fetchone()
        assert job is not None
        _audit(conn, job["tenant"], worker, "claimed", job["id"], {"attempt": job["attempts"]})
    return job


def _fail_exhausted(conn: Conn) -> None:
    """Jobs whose lease ran out MAX_ATTEMPTS times: failed, so one job that kills its workers cannot cycle forever."""
    for job in conn.execute(
        "UPDATE jobs SET state = 'failed', ended = now(), lease_until = NULL, error = %s "
        "WHERE state = 'running' AND lease_until < now() AND attempts >= %s RETURNING id, tenant, worker",
        (_json({"error": f"its worker was lost {MAX_ATTEMPTS} times", "type": "WorkerLost"}), MAX_ATTEMPTS),
    ).fetchall():
        _audit(conn, job["tenant"], job["worker"] or "", "failed", job["id"], {"why": "attempts"})


def renew(conn: Conn, job_id: int, worker: str, lease_seconds: float) -> bool:
    """Extend `worker`'s lease on a job; False when the job is no longer its own (another worker took it)."""
    with conn.transaction():
        done = conn.execute(
            "UPDATE jobs SET lease_until = now() + make_interval(secs => %s) "
            "WHERE id = %s AND worker = %s AND state = 'running'",
            (lease_seconds, job_id, worker),
        )
    return done.rowcount == 1


def record_run(conn: Conn, job_id: int, worker: str, run_id: str) -> None:
    """The run a job's craft works in (a worker that takes the job over resumes it)."""
    with conn.transaction():
        conn.execute("UPDATE jobs SET run_id = %s WHERE id = %s AND worker = %s", (run_id, job_id, worker))


def finish(
    conn: Conn,
    job_id: int,
    worker: str,
    *,
    result: dict[str, Any] | None,
    error: dict[str, Any] | None,
    cpu_seconds: float = 0.0,
) -> bool:
    """Write a job's end (done with its result, or failed with its error) and the CPU-seconds this attempt took;
    False when `worker` no longer holds it."""
    state = "failed" if error is not None else "done"
    with conn.transaction():
        row = conn.execute(
            "UPDATE jobs SET state = %s, result = %s, error = %s, ended = now(), lease_until = NULL, "
            "cpu_seconds = cpu_seconds + %s WHERE id = %s AND worker = %s AND state = 'running' RETURNING tenant",
            (state, _json(result), _json(error), _counted(cpu_seconds), job_id, worker),
        ).fetchone()
        if row is None:
            return False
        _audit(conn, row["tenant"], worker, state, job_id, {})
    return True


def _counted(cpu_seconds: float) -> float:
    """A worker's CPU-seconds as a job adds them: a finite count of at least 0; anything else (NaN, infinite, a
    negative difference) adds nothing rather than spending the tenant's day for good or making its JSON invalid."""
    return cpu_seconds if math.isfinite(cpu_seconds) and cpu_seconds > 0 else 0.0


def release(conn: Conn, job_id: int, worker: str, cpu_seconds: float = 0.0) -> bool:
    """Hand a job `worker` holds back to the queue (the worker is stopping), with the CPU-seconds it spent on it:
    the next claim resumes its run."""
    with conn.transaction():
        row = conn.execute(
            "UPDATE jobs SET state = 'queued', worker = NULL, lease_until = NULL, cpu_seconds = cpu_seconds + %s "
            "WHERE id = %s AND worker = %s AND state = 'running' RETURNING tenant",
            (_counted(cpu_seconds), job_id, worker),
        ).fetchone()
        if row is None:
            return False
        _audit(conn, row["tenant"], worker, "released", job_id, {})
        conn.execute(f"NOTIFY {CHANNEL}")
    return True


def who(alias: str = "a") -> str:
    """An audit row's (under `alias`) principal, as an identity (SQL)."""
    return f"coalesce({alias}.detail->>'principal_id', {alias}.principal)"


# A principal's followings of a job: each enqueue or join is one (its audit row), the call that made it holds it. A
# following ends when its principal leaves the job ('left': all of its followings before it, as tasks/cancel and a
# revocation end them) or when the one call holding it ends ('retracted', naming it in detail's `following`: a waited
# call whose client went away, on whichever front). A principal follows the job while one of its followings is live;
# one that followed it and holds none left it. A principal is its identity (detail's principal_id: a token's hash
# prefix, a JWT's issuer and subject), never its name: a new token under a revoked one's name is someone else.
# _FOLLOWINGS: each following of a job {job} of a tenant {tenant}, whose (who), and whether it is live; LEFT_BY: the
# same as a column of a row of jobs (alias j), the identities that left it.
WHO = who()  # an audit row's (alias a) principal, as an identity
_FOLLOWINGS = (  # one pass over the job's rows, sorted twice (a token may join one job thousands of times): the
    # principal's last 'left' by a window over its rows, a following's retraction by a window over its own id and the
    # retractions naming it (detail's text compared: a forged detail fails no cast). No subquery per following: that
    # read every row of the job again for each (5000 joins, half retracted: 4 s a read), or hashed them under JIT
    "SELECT who, id, id > last_left AND NOT retracted AS live "
    f"FROM (SELECT {WHO} AS who, a.id, a.action, coalesce(max(a.id) FILTER (WHERE a.action = 'left') "
    f"OVER (PARTITION BY {WHO}), 0) AS last_left, bool_or(a.action = 'retracted') OVER (PARTITION BY {WHO}, "
    "CASE WHEN a.action = 'retracted' THEN a.detail->>'following' ELSE a.id::text END) AS retracted FROM audit a "
    "WHERE a.job = {job} AND a.tenant = {tenant} AND a.action IN ('enqueued', 'joined', 'left', 'retracted')) f "
    "WHERE action IN ('enqueued', 'joined')"
)
SENT_BEFORE = (  # the following of a key (its job's tenant the row's: a row naming another tenant's job is none),
    # held by the sending front's identity: a front swept as lost sends again under a new one, and the first send's
    # following, named by the old, is that sweep's to end (maybe only after this look: a sweep claims the front's row
    # first, retracts later), so the call is queued afresh. One ended otherwise since (a revocation's 'left', a cancel)
    # is still the answer, its job as its principal sees it: a revoked token's call is never made a following again
    "SELECT a.id, a.action, coalesce(a.detail->>'front', a.detail->>'answering') AS front, j.id AS job, j.state "
    f"FROM audit a JOIN jobs j ON j.id = a.job AND j.tenant = a.tenant WHERE a.detail->>'{ENQUEUE_KEY}' = %s "
    f"AND a.action IN ('enqueued', 'joined') AND a.tenant = %s AND {WHO} = %s "
    "AND coalesce(a.detail->>'front', a.detail->>'answering') IS NOT DISTINCT FROM %s ORDER BY a.id LIMIT 1"
)
LEFT_BY = (
    f"ARRAY(SELECT who FROM ({_FOLLOWINGS.format(job='j.id', tenant='j.tenant')}) f GROUP BY who "
    "HAVING NOT bool_or(live) ORDER BY who) AS left_by"
)


def _followings(conn: Conn, job_id: int, tenant: str) -> dict[str, set[int]]:
    """Each principal that followed the job (its identity) -> its live followings (none: it left the job)."""
    held: dict[str, set[int]] = {}
    for row in conn.execute(_FOLLOWINGS.format(job="%s", tenant="%s"), (job_id, tenant)).fetchall():
        live = held.setdefault(str(row["who"]), set())
        if row["live"]:
            live.add(int(row["id"]))
    return held


def cancel(
    conn: Conn,
    job_id: int,
    tenant: str,
    principal: str,
    principal_id: str | None = None,
    revoked: Collection[str] = (),
    because: str | None = None,
    following: int | None = None,
) -> dict[str, Any] | None:
    """Cancel a job of `tenant` for `principal`, one of those following it (who queued or joined it, and did not
    leave it since: _FOLLOWINGS). When another principal follows it too, `principal` only leaves it (audit 'left',
    every following of its own ended; the job goes on for the others; the row returned has it in `left_by`);
    otherwise its row ends `cancelled` and no worker claims it; a running one ends `cancelled` too, at once (its
    worker stops its craft when it next looks: the row's `worker` still names it, and what it spent is added by
    settle_cancelled). A job that ended, or one the principal left, is its row as it is, marked `unchanged` (a cancel
    retried is idempotent). None when the tenant has no such job or the principal does not follow it (answered as an
    unknown job). Under the tenant's lock, as
    enqueue: nobody joins between the count of followers and the cancel; the row's lock keeps a claim from crossing
    it. A follower is known by `principal_id` (the principal's identity; its name `principal` when none is given),
    `principal` being only the name said. `revoked`: identities that can never ask again (revoked tokens, as the
    front's token store says): they follow nothing, so the last live follower's cancel cancels the job (were they
    counted, a job whose other followers were all revoked would be left to run for nobody). `because`: why, when the
    principal did not ask (its audit row's detail). `following`: end only that one following of the principal (the
    Enqueued.following of a waited call whose client went away): while the principal holds another (a task, a
    detached craft, a waited call on any front), it is retracted alone (audit 'retracted'; the row returned is marked
    `retracted`); its last one gone, the principal leaves or cancels the job as above. One already ended:
    `unchanged`."""
    who = principal_id or principal
    said = {**_identity(principal_id), **({"because": because} if because else {})}
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (TENANT_LOCK, tenant))
        row = conn.execute("SELECT * FROM jobs WHERE id = %s AND tenant = %s FOR UPDATE", (job_id, tenant)).fetchone()
        held = _followings(conn, job_id, tenant)
        mine = held.get(who)
        # a cancel again (the caller left it, or it ended) changes nothing: its row as it is, `unchanged`
        if row is not None and mine is not None and not mine:
            return {**row, "left_by": [who], "unchanged": True}
        followers = {identity for identity, live in held.items() if live} - set(revoked)
        if row is None or who not in followers or mine is None:
            return None
        if row["state"] not in ("queued", "running") or (following is not None and following not in mine):
            return {**row, "unchanged": True}  # ended: nothing to stop, for anyone; or that following ended already
        if following is not None:
            said["following"] = following
            if mine - {following}:  # the caller holds the job by another call still: only this one's ends
                _audit(conn, tenant, principal, "retracted", job_id, said)
                return {**row, "retracted": True}
        if followers - {who}:  # the craft is theirs too: stop only the caller's following of it
            _audit(conn, tenant, principal, "left", job_id, said)
            return {**row, "left_by": [who]}
        running = row["state"] == "running"
        # a running job keeps its worker's name (the one to stop, whose CPU-seconds settle_cancelled adds) and its
        # `started` (a craft that ran counts for the day); no lease: nobody may claim or renew it again
        ended = conn.execute(
            "UPDATE jobs SET state = 'cancelled', ended = now(), lease_until = NULL, error = %s WHERE id = %s "
            "RETURNING *",
            (_json(error_of_cancel(running=running)), job_id),
        ).fetchone()
        worker = {"worker": row["worker"]} if running else {}
        _audit(conn, tenant, principal, "cancelled", job_id, {**said, **worker})
    return ended


def drop_followings(conn: Conn, principal_id: str, revoked: Collection[str] = ()) -> list[dict[str, Any]]:
    """A revoked principal's following of every job still queued or running, ended as its own tasks/cancel would end
    it (cancel, `because` 'revoked'): a job another live principal follows goes on for it (the revoked one left it),
    one nobody else live follows is cancelled (queued: never claimed; running: its worker stops it). `revoked`: every
    identity revoked (none of them keeps a job going). The rows it changed."""
    with conn.transaction():  # its own: on a connection not in autocommit, a bare read would leave a transaction
        # open, and each cancel's below would be only a savepoint in it, committed by nobody
        followed = conn.execute(
            "SELECT DISTINCT j.id, j.tenant, a.principal FROM jobs j JOIN audit a ON a.job = j.id AND a.tenant = "
            f"j.tenant WHERE j.state IN ('queued', 'running') AND {WHO} = %s AND a.action IN ('enqueued', 'joined') "
            "ORDER BY j.id",
            (principal_id,),
        ).fetchall()
    others = set(revoked) - {principal_id}  # cancel counts the caller among the followers: it is the one leaving
    changed = []
    for job in followed:
        row = cancel(conn, job["id"], job["tenant"], job["principal"], principal_id, others, because="revoked")
        if row is not None and not row.get("unchanged"):
            changed.append(row)
    return changed


def cancelled_while_held(conn: Conn, job_id: int, worker: str) -> bool:
    """Whether the job `worker` was crafting has been cancelled (queue.cancel) while it held it: its craft is to stop."""
    row = conn.execute(
        "SELECT 1 FROM jobs WHERE id = %s AND worker = %s AND state = 'cancelled'", (job_id, worker)
    ).fetchone()
    return row is not None


def settle_cancelled(conn: Conn, job_id: int, worker: str, cpu_seconds: float) -> bool:
    """Add the CPU-seconds `worker` spent on a job cancelled while it crafted it (its end is the cancel's, not the
    worker's to write: finish refuses it); False when the row is not that."""
    with conn.transaction():
        done = conn.execute(
            "UPDATE jobs SET cpu_seconds = cpu_seconds + %s WHERE id = %s AND worker = %s AND state = 'cancelled'",
            (_counted(cpu_seconds), job_id, worker),
        )
    return done.rowcount == 1


# The error a cancelled row holds, as a front writes it. It names nobody: who cancelled is the audit's to say, and a
# name here (a JWT's subject can be any text) would let whoever writes the table put words of theirs in it.
CANCEL_ERROR = {
    "error": "cancelled before a worker claimed it, by the only agent following it",
    "fix": "craft the need again to queue it afresh",
    "type": "Cancelled",
}
CANCEL_RUNNING_ERROR = {
    "error": "cancelled while a worker crafted it, by the only agent following it: the worker stops its craft",
    "fix": "craft the need again to queue it afresh",
    "type": "Cancelled",
}


def error_of_cancel(running: bool = False) -> dict[str, str]:
    """The error a front writes as it cancels (a job queued, or `running`): the only texts of a cancelled row a reader
    tells as flakebot's words (`is_cancel_error`); any other is whoever wrote the table's."""
    return dict(CANCEL_RUNNING_ERROR if running else CANCEL_ERROR)


def is_cancel_error(error: Any) -> bool:
    """Whether `error` is exactly what error_of_cancel writes."""
    return isinstance(error, dict) and error in (CANCEL_ERROR, CANCEL_RUNNING_ERROR)


def get(conn: Conn, job_id: int, tenant: str) -> dict[str, Any] | None:
    """A job as its tenant sees it (another tenant's job is not found)."""
    return conn.execute("SELECT * FROM jobs WHERE id = %s AND tenant = %s", (job_id, tenant)).fetchone()


def _identity(principal_id: str | None) -> dict[str, Any]:
    """An audit row's detail naming the principal's identity, by which its following of a job is known."""
    return {"principal_id": principal_id} if principal_id else {}


def _audit(conn: Conn, tenant: str, principal: str, action: str, job: int | None, detail: dict[str, Any]) -> int:
    """Append an audit row; its id."""
    row = conn.execute(
        "INSERT INTO audit (tenant, principal, action, job, detail) VALUES (%s, %s, %s, %s, %s) RETURNING id",
        (tenant, principal, action, job, _json(detail)),
    ).fetchone()
    assert row is not None
    return int(row["id"])


def _json(value: Any) -> Any:
    from psycopg.types.json import Jsonb

    return None if value is None else Jsonb(value)
