"""The team's PostgreSQL database: a connection, and the schema made (idempotently) on every connect.

Tables: `tenants` (each tenant's quotas and share of the workers), `jobs` (the work queue: one row per craft, its
need's digest, request, state, worker, lease and result), `audit` (append-only: triggers refuse UPDATE, DELETE and
TRUNCATE; a table's owner can still drop them, so the role workers and fronts connect as should not own the tables:
docs/team.md), `calls` (each token's tool calls of the last minute, for the fronts' shared admission) and `fronts`
(each front's lease, renewed while it runs: flakebot.team.fronts). A URL's
password never reaches a log: `shown()` is the URL as logs and errors say it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from flakebot.redact import REDACTED, redact_text
from flakebot.team import dburl

if TYPE_CHECKING:
    import psycopg

logger = logging.getLogger(__name__)

# 2: calls (a token's tool calls of the last minute); 3: TRUNCATE of audit refused too; 4: build CPU-seconds per job
# and a tenant's bound on them per day; 5: a job's state 'cancelled'; 6: audit rows indexed by job; 7: fronts (each
# front's lease: flakebot.team.fronts); 8: a front's lease length in its row (a sweeper waits that long first); 9:
# followings indexed by their call's enqueue key (an enqueue sent again finds its own: queue.enqueue)
SCHEMA_VERSION = 9
MIGRATION_LOCK = 0x666C616B  # pg_advisory_xact_lock key: two processes connecting at once migrate one at a time
CONNECT_TIMEOUT = 10  # seconds libpq waits for the server to answer a connect
# Seconds the server lets one of our sessions sit inside a transaction before ending it: every transaction here
# lasts milliseconds, and a process stopped inside one (SIGSTOP, a paused VM) would hold its locks (the schema's,
# a tenant's, a job's row) for every other worker and front until it ran again.
IDLE_IN_TRANSACTION = 15

SCHEMA = """
CREATE TABLE IF NOT EXISTS flakebot_schema (version integer PRIMARY KEY);
CREATE TABLE IF NOT EXISTS tenants (
    name text PRIMARY KEY,
    max_in_flight integer NOT NULL,
    max_per_day integer NOT NULL,
    shares integer NOT NULL DEFAULT 1 CHECK (shares > 0),
    created timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS jobs (
    id bigserial PRIMARY KEY,
    tenant text NOT NULL REFERENCES tenants (name),
    principal text NOT NULL,
    kind text NOT NULL,
    need_digest text NOT NULL,
    request jsonb NOT NULL,
    state text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'running', 'done', 'failed')),
    worker text,
    lease_until timestamptz,
    attempts integer NOT NULL DEFAULT 0,
    run_id text,
    result jsonb,
    error jsonb,
    created timestamptz NOT NULL DEFAULT now(),
    started timestamptz,
    ended timestamptz
);
-- one craft per need: at most one queued or running job per tenant, kind and digest
CREATE UNIQUE INDEX IF NOT EXISTS jobs_one_per_need ON jobs (tenant, kind, need_digest)
    WHERE state IN ('queued', 'running');
CREATE INDEX IF NOT EXISTS jobs_waiting ON jobs (state, lease_until) WHERE state IN ('queued', 'running');
CREATE INDEX IF NOT EXISTS jobs_by_tenant ON jobs (tenant, created);
CREATE TABLE IF NOT EXISTS audit (
    id bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    tenant text NOT NULL,
    principal text NOT NULL,
    action text NOT NULL,
    job bigint,
    detail jsonb NOT NULL DEFAULT '{}'
);
-- each token's tool calls of the last minute, so that every front counts its calls per minute together
CREATE TABLE IF NOT EXISTS calls (
    principal text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS calls_by_principal ON calls (principal, at);
CREATE OR REPLACE FUNCTION flakebot_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit table is append-only';
END $$;
CREATE OR REPLACE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON audit
    FOR EACH STATEMENT EXECUTE FUNCTION flakebot_audit_append_only();
-- TRUNCATE fires no UPDATE or DELETE trigger: it has its own
CREATE OR REPLACE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
    FOR EACH STATEMENT EXECUTE FUNCTION flakebot_audit_append_only();
-- the CPU-seconds a job's worker spent on it (the craft and every process it waited for: cargo, nix and its builds)
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS cpu_seconds double precision NOT NULL DEFAULT 0;
-- a tenant's bound on them per UTC day (NULL: none)
ALTER TABLE tenants ADD COLUMN IF NOT EXISTS max_cpu_seconds_per_day integer;
-- a queued craft its only follower cancelled (flakebot.team.queue.cancel)
ALTER TABLE jobs DROP CONSTRAINT IF EXISTS jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled'));
-- a job's audit rows, read at each cancel and each admission of a token's concurrent crafts (who queued it)
CREATE INDEX IF NOT EXISTS audit_by_job ON audit (job);
-- each front's lease (flakebot.team.fronts): a front whose lease ran out was lost, its waited calls' followings end
CREATE TABLE IF NOT EXISTS fronts (
    id text PRIMARY KEY,
    started timestamptz NOT NULL DEFAULT now(),
    lease_until timestamptz NOT NULL
);
-- how long the front's lease is (NULL: a front of schema 7, swept as before): a sweeper takes it for lost only once
-- its own looks at the database have held that long (flakebot.team.fronts.sweep)
ALTER TABLE fronts ADD COLUMN IF NOT EXISTS lease_seconds double precision;
-- a following by the key of the call that wrote it: an enqueue sent again (its acknowledgement lost) finds the one its
-- first send wrote (flakebot.team.queue.enqueue); only followings a front keyed, so other rows cost nothing
CREATE INDEX IF NOT EXISTS audit_by_enqueue_key ON audit ((detail->>'enqueue_key'))
    WHERE action IN ('enqueued', 'joined') AND detail->>'enqueue_key' IS NOT NULL;
"""


UNREADABLE = "(a URL or connection string libpq cannot read, not shown: it may hold a password)"


def shown(url: str) -> str:
    """`url` as a log line or an error may say it: its password (and any key-shaped text) redacted."""
    if not url:
        return "(libpq's PG* environment)"
    parsed = dburl.parsed(url)
    if parsed is None:  # its password, if any, is none libpq could name: nothing of it is said
        return UNREADABLE
    said = _redacted(url, url)
    if dburl.parsed(said) is not None and all(secret == REDACTED for secret in dburl.passwords(said)):
        return said  # libpq reads no secret in what is said
    # a short password spelled as libpq also reads it (a %-escaped key, spaces around '=') is neither long enough to
    # be replaced wherever it appears nor matched by a pattern: said as libpq read it, its secrets left out
    return _redacted(" ".join(f"{k}={REDACTED if k in dburl.SECRETS else v}" for k, v in parsed.items()), url)


def _redacted(text: str, url: str) -> str:
    """`text` redacted, the password `url` carries included however libpq spells it (an empty user, %-escapes, a
    connection string's quotes), which no general pattern of flakebot.redact covers."""
    from flakebot.redact import MIN_SECRET_LENGTH, secret_values

    own = [secret for secret in dburl.passwords(url) if len(secret) >= MIN_SECRET_LENGTH]
    return redact_text(text, [*sorted(own, key=len, reverse=True), *secret_values()])


def connect(url: str, *, autocommit: bool = False, name: str = "flakebot") -> psycopg.Connection[dict[str, object]]:
    """A connection to the team's database, its schema made or brought up to date; `url` empty: libpq's PG*
    variables and ~/.pgpass (a password kept off the command line). `name`: its application_name, as
    pg_stat_activity shows who is connected."""
    import psycopg
    from psycopg.rows import dict_row

    from flakebot.errors import HostError

    try:
        conn = psycopg.connect(
            url, row_factory=dict_row, connect_timeout=CONNECT_TIMEOUT, application_name=name, autocommit=True
        )
        conn.execute(f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION}s'")
    except psycopg.Error as exc:
        # libpq's complaint about a URL it cannot read quotes the piece it stopped at, maybe of the password
        why = _redacted(_first_line(exc), url) if dburl.parsed(url) is not None else "libpq cannot read its URL"
        raise HostError(
            f"cannot reach the team database {shown(url)}: {why}",
            fix="check that PostgreSQL runs there and the URL (or PGHOST, PGUSER, ~/.pgpass) is right",
        ) from None
    try:
        migrate(conn)
    except psycopg.Error as exc:
        with conn:  # closed as it is left
            raise _not_migrated(conn, url, exc) from None
    conn.autocommit = autocommit
    return conn


def _not_migrated(conn: psycopg.Connection[dict[str, object]], url: str, exc: Exception) -> Exception:
    """Why the schema could not be made or brought up here, in one line: most often a role that does not own the
    tables (as docs/team.md has workers and fronts connect) meeting a database an older flakebot made."""
    import psycopg

    from flakebot.errors import HostError

    try:
        version = _version(conn)  # the failed migration's transaction rolled back: the connection still answers
    except psycopg.Error:
        version = 0
    found = f"at schema {version}" if version else "without flakebot's schema"
    why = redacted_reason(exc, url)
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return HostError(
            f"the team database {shown(url)} is {found}, and this role cannot bring it to {SCHEMA_VERSION}: {why}",
            fix="connect once as the role that owns the tables (any flakebot command with its URL: the schema is "
            "made then), and give this role the grants docs/team.md lists under 'The tables'",
        )
    return HostError(
        f"cannot bring the team database {shown(url)} to schema {SCHEMA_VERSION}: {why}",
        fix="check that it is the primary (not a read-only standby) and that it has room; then start again",
    )


def migrate(conn: psycopg.Connection[dict[str, object]]) -> None:
    """Make the schema (idempotent), one process at a time. A current schema is seen without the lock: a process
    stalled while holding it then delays only processes that must migrate (and only until the server ends it)."""
    if _version(conn) >= SCHEMA_VERSION:
        return
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        if _version(conn) >= SCHEMA_VERSION:
            return
        logger.info("making the team schema (version %d)", SCHEMA_VERSION)
        conn.execute(SCHEMA)
        conn.execute("INSERT INTO flakebot_schema VALUES (%s) ON CONFLICT DO NOTHING", (SCHEMA_VERSION,))


def _version(conn: psycopg.Connection[dict[str, object]]) -> int:
    made = conn.execute("SELECT to_regclass('flakebot_schema') IS NOT NULL AS made").fetchone()
    if not made or not made["made"]:
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) AS version FROM flakebot_schema").fetchone()
    return int(row["version"]) if row else 0  # type: ignore[call-overload]


def redacted_reason(exc: Exception, url: str) -> str:
    """PostgreSQL's reason for `exc` in one line, nothing of `url`'s secrets in it."""
    return _redacted(_first_line(exc), url)


def _first_line(exc: Exception) -> str:
    return redact_text(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
