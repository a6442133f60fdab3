"""The team front: flakebot's MCP server (the same tools as `flakebot mcp`) over Streamable HTTP, for many agents.

The MCP SDK's session manager serves both protocols on one endpoint, `/mcp`: the 2025-11-25 session protocol
(`initialize`, then `Mcp-Session-Id`; a session answers only the principal that opened it, another's id is "not
found") and the stateless 2026-07-28 one (each POST stands alone, routed by its `MCP-Protocol-Version` header).

Auth is an OAuth 2.1 resource server's, as the MCP spec has it: every request carries `Authorization: Bearer TOKEN`;
a missing, unknown or revoked token is 401 with `WWW-Authenticate: Bearer ... resource_metadata="URL"`, and the
protected-resource metadata (RFC 9728) is served at `/.well-known/oauth-protected-resource` (and under the
resource's path, `.../mcp`). Tokens are flakebot's own static ones (flakebot.team.tokens: hashed on disk) and, with
--jwt-issuer, the identity provider's JWTs verified here with its public key (flakebot.team.idtokens); both behind
one verifier (tokens.Verifier), and the metadata then names that provider as the authorization server. A
foreign `Origin` (a browser page of another site) is 403 and a foreign `Host` 421: DNS rebinding cannot reach it.

Admission per token (flakebot.team.admission) comes before the MCP layer: a `tools/call` past the token's calls per
minute (counted by every front of the database together when there is one; any other request past ten times that)
is 429 with `Retry-After` and a JSON-RPC error saying how long to wait; long jobs count against the token's
concurrent crafts (pipeline.jobs' owner). Each tools/call and tools/list is audited (flakebot.team.audit) with the
caller's principal and tenant, which the handlers read from the request's authenticated user.

With a database (`--database`), crafts go to the team's PostgreSQL queue (flakebot.mcp.queued) instead of
processes of this machine. A tenant sees only its own tasks, queued jobs and runs (flakebot.team.tenancy); another's
are answered as unknown ones. `/metrics` (flakebot.team.metrics) is behind the same bearer check as `/mcp`, and
answers only a token granted `metrics` (tokens.GRANTS): it counts every tenant's work.

The front binds 127.0.0.1 unless told otherwise, and refuses any address beyond loopback without TLS and at least
one active token (BindRefused), before it binds.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.lowlevel

from flakebot import config
from flakebot.commands.runs import MAX_WAIT_SECONDS
from flakebot.errors import BindRefused, FlakebotError, Interrupted, QuotaExceeded, RunError, TeamError, UsageError
from flakebot.loopback import is_loopback
from flakebot.mcp import tenantservices
from flakebot.mcp.gone import PARSED, GoneRequests
from flakebot.mcp.server import FlakebotMCP
from flakebot.mcp.tenantsessions import TenantSessions, tell
from flakebot.pipeline import jobs
from flakebot.team import db, fronts, idtokens, tenancy
from flakebot.team.admission import (
    WINDOW_SECONDS,
    Admission,
    MemoryAdmission,
    Refusal,
    SharedAdmission,
    prune_windows,
)
from flakebot.team.audit import Audit
from flakebot.team.frontqueue import FrontQueue, handle, job_number
from flakebot.team.idtokens import JwtOptions, JwtVerifier
from flakebot.team.metrics import CONTENT_TYPE, Metrics
from flakebot.team.queue import Enqueued
from flakebot.team.tokens import METRICS, Principal, TokenStore, Verifier, Verifiers

logger = logging.getLogger(__name__)

PATH = "/mcp"
METRICS_PATH = "/metrics"  # Prometheus' text format, behind the same bearer check as /mcp, to a granted token
DEFAULT_PORT = 8765
BODY_LIMIT = 4 * 1024 * 1024  # the SDK's own request body limit: a larger body is its 413, not inspected here
SESSIONS_PER_TOKEN = 64  # open 2025-11-25 sessions one token may hold (the SDK's 10,000 are every token's together)
SESSION_RETRY_SECONDS = 60  # the Retry-After of an initialize past them (an agent's sessions end or expire meanwhile)
REVOKED_SWEEP_SECONDS = 1.0  # how often open sessions are checked against the token store (revoked: ended)
TOKEN_CALLS_AT_ONCE = 8  # a token's tool calls in flight; its others wait in its own queue, not in a shared pool
RATE_LIMITED = -32029  # a server-defined JSON-RPC error code (the -32000 range): too many calls, wait


@dataclass
class FrontOptions:
    """How `flakebot serve` was asked to serve."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    tls_cert: Path | None = None
    tls_key: Path | None = None
    url: str | None = None  # the URL clients use, when it differs from http(s)://HOST:PORT/mcp (a proxy, a name)
    issuer: str | None = None  # the authorization server named in the metadata (default: this server's origin)
    grant_roots: list[str] = field(default_factory=list)
    database: str | None = None  # the team's PostgreSQL URL: crafts go to its queue (None: crafted here, as before)
    jwt: JwtOptions | None = None  # the identity provider whose JWTs are let in, beside the static tokens
    lease: float = fronts.DEFAULT_LEASE  # seconds this front stays live in the database without renewing its lease

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None and self.tls_key is not None


def check_tls(options: FrontOptions) -> None:
    """The certificate and key load as a TLS server's pair (else one line here, not a traceback from the server)."""
    import ssl

    if not options.tls:
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(str(options.tls_cert), str(options.tls_key))
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(
            f"cannot use {options.tls_cert} and {options.tls_key} for TLS: {getattr(exc, 'strerror', None) or exc}",
            fix="pass a PEM certificate (chain) and its unencrypted PEM private key",
        ) from None


def check_exposure(options: FrontOptions, store: Verifier) -> None:
    """Refuse what would expose the server: half a TLS pair, or an address beyond loopback without TLS and tokens."""
    if (options.tls_cert is None) != (options.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together", fix="pass both (a PEM certificate and its key)")
    if is_loopback(options.host):
        return
    missing = [
        what
        for what, ok in (("TLS", options.tls), ("a token", bool(store.active()) or options.jwt is not None))
        if not ok
    ]
    if missing:
        raise BindRefused(
            f"refusing to serve on {options.host}, beyond loopback, without {' and '.join(missing)}: "
            "anyone who reaches that address could read what agents send or call flakebot's tools",
            fix="pass --tls-cert and --tls-key and make a token with 'flakebot token add NAME', or serve on "
            "127.0.0.1 (the default) behind a TLS proxy",
        )


class TeamMCP(FlakebotMCP):
    """The MCP server of the front: each call knows its principal; long jobs count against its token; calls are
    audited. With a database (`queue`), crafts go to the team's queue under the caller's tenant; a tenant sees only
    its own tasks, queued jobs and runs."""

    def __init__(
        self,
        settings: config.Settings,
        grant_roots: list[str],
        store: Verifier,
        admission: Admission,
        queue: FrontQueue | None = None,
    ):
        super().__init__(settings, grant_roots)
        self.store, self.admission, self.queue = store, admission, queue
        self.audit = Audit(settings.path("workdir"))
        self.metrics = Metrics()
        self._in_flight: dict[str, CallsInFlight] = {}  # each principal's calls at once, while it has any
        self._rows: dict[tuple[str, int], tuple[float, dict[str, Any] | None]] = {}  # (tenant, job) -> (read at, row)
        self._rows_lock = threading.Lock()
        # (tenant, NAME@VERSION) of finished jobs' tools tried to install -> how the tries went, the FETCHED_KEPT
        # last asked (a front serves for months: one forgotten is tried once more, at worst)
        self._fetched: collections.OrderedDict[tuple[str, str], ToolFetch] = collections.OrderedDict()
        self._watchers: dict[int, dict[str, Any]] = {}  # a watched queued job -> its sessions to tell (id -> a request)
        self.sessions = TenantSessions()  # each open session's tenant: whom a catalog change is told to
        self.stopping: Callable[[], bool] = lambda: False  # the server is shutting down (serve sets it)
        # (principal, job, following) of waited calls that ended while the database was away: ended once it answers
        self._unended: list[tuple[Principal, int, int]] = []

    def server(self) -> Any:
        import functools

        from mcp.server.lowlevel.server import NotificationOptions

        server = super().server()
        server.middleware.append(self._remember_session)
        server.middleware.append(self._task_call_audited)
        # The SDK's session manager asks for the initialize answer with no options (tools.listChanged false): say
        # that this front sends tools/list_changed, as `flakebot mcp` does, or a client may ignore what it is told.
        changed = NotificationOptions(tools_changed=True)
        server.create_initialization_options = functools.partial(server.create_initialization_options, changed)
        return server

    async def _remember_session(self, ctx: Any, call_next: Callable[[Any], Any]) -> Any:
        """Each request of a session remembers the session under its caller's tenant (mcp/tenantsessions.py)."""
        session_id, tenant = _session_id(ctx), self.tenant(ctx)
        if session_id and tenant is not None and getattr(ctx, "session", None) is not None:
            scope = getattr(getattr(ctx, "request", None), "scope", None) or {}
            token = getattr(getattr(scope.get("user"), "access_token", None), "token", None)
            store = self.store
            self.sessions.remember(session_id, tenant, ctx.session, lambda: store.verify(str(token)) is not None)
        return await call_next(ctx)

    async def _task_call_audited(self, ctx: Any, call_next: Callable[[Any], Any]) -> Any:
        """A tools/call asked as a task is answered by the tasks handlers (mcp/tasks.py routes it), not call_tool:
        audited and counted here as call_tool does a plain call, its outcome the task's creation (refused: error;
        cancelled before its answer: cancelled)."""
        from flakebot.mcp.tasks import CALL_AS_TASK

        if ctx.method != CALL_AS_TASK:
            return await call_next(ctx)
        started, outcome = time.monotonic(), "error"
        principal = self.principal(ctx)  # as admitted: the token may expire or be revoked before the call ends
        params = ctx.params if isinstance(ctx.params, dict) else {}
        name = params.get("name") if isinstance(params.get("name"), str) else None
        refused: list[str] = []  # filled by _refused
        refusals = _REFUSALS.set(refused)
        try:
            async with self.one_of_its_calls(ctx):
                result = await call_next(ctx)
            outcome = "ok"
            return result
        except anyio.get_cancelled_exc_class():
            outcome = "cancelled"
            raise
        finally:
            _REFUSALS.reset(refusals)
            self._count_call(name, outcome, refused, started)
            self._audited(principal, "tools/call", name, params.get("arguments") or {}, outcome, None, started)

    async def tools_changed(self, ctx: Any, tenant: str | None = None) -> None:
        """The caller's tenant's catalog changed: its own session hears it now, each other open session of its
        tenant on this front soon after (in the background: a slow client does not hold the caller's answer), no
        other tenant's. `tenant`: the caller's, taken earlier (a job's watcher: ctx's token may be gone since)."""
        from flakebot.mcp.server import _tools_changed

        await _tools_changed(ctx)
        tenant = tenant or self.tenant(ctx)
        others = self.sessions.of(tenant, _session_id(ctx)) if tenant is not None else []
        if not others:
            return
        if self.jobs is not None:
            self.jobs.start_soon(tell, others)
        else:
            await tell(others)

    def principal(self, ctx: Any) -> Principal | None:
        """The principal of the request `ctx` answers (its verified token, as the HTTP layer authenticated it)."""
        return principal_of_scope(getattr(getattr(ctx, "request", None), "scope", None) or {}, self.store)

    def job_owner(self, ctx: Any) -> tuple[str, jobs.Limits]:
        principal = self.principal(ctx)
        machine = jobs.Limits.of(self.settings())
        if principal is None:  # not through the front's auth (cannot happen over HTTP): one owner for all such calls
            return "token:none", jobs.Limits(machine.machine, 1)
        return self.admission.job_owner(principal, machine)

    # ------------------------------------------------------------ whose is what

    def tenant(self, ctx: Any) -> str | None:
        principal = self.principal(ctx)
        return principal.tenant if principal is not None else None

    def settings(self, ctx: Any = None) -> config.Settings:
        """The settings of a call: its tenant's catalog over the organisation's (deliver/catalog.py). A request with
        no principal (none comes through the front's auth) gets no catalog of anyone's: refused."""
        settings = super().settings()
        if ctx is None:  # what is no call's catalog: the workdir, limits, the job directory
            return settings
        tenant = self.tenant(ctx)
        if tenant is None:
            raise TeamError("no principal for this call", fix="call through the front with a token")
        return dataclasses.replace(settings, tenant=tenant)

    def start_job(self, ctx: Any, name: str, args: dict[str, Any]) -> Any:
        """A detached job asked as a task: a `resume`'s run resolved among the caller's tenant's runs first (as
        _tenant_call does for a plain call), so another tenant's run is an unknown one's answer and no job of it
        starts."""
        if name == "resume":
            from flakebot.mcp.server import _check_own

            _check_own(name, args)
            seen = self.run_seen(ctx, name, args.get("run_id"))
            args = {**args, "run_id": seen} if seen != args.get("run_id") else args
        return super().start_job(ctx, name, args)

    def _start(self, ctx: Any, name: str, args: dict[str, Any]) -> Any:
        try:
            return super()._start(ctx, name, args)
        except jobs.JobLimit:  # a plain call's and a task's: both start here
            self._refused("job_limit")
            raise

    def _count_call(self, name: object, outcome: str, refused: list[str], started: float) -> None:
        """A tool call's end in /metrics: an error its own quota or concurrent-crafts check made (`refused`, filled
        by _refused) counted `refused`, not `error`."""
        counted = "refused" if refused and outcome == "error" else outcome
        self.metrics.call(_metric_label(str(name)), counted, time.monotonic() - started)

    def _refused(self, reason: str) -> None:
        """The call being served was refused before any work (`reason`: quota, job_limit): counted, and its end
        counted `refused` (call_tool, _task_call_audited). Only here: an error's type in a call's answer is also a
        job's words (a row's, a journal's), which would make a call that ran count as refused."""
        self.metrics.refused(reason)
        refusals = _REFUSALS.get(None)
        if refusals is not None:  # a list shared with the call's own context: set in a worker thread too
            refusals.append(reason)

    def job_started(self, ctx: Any, journal: Path) -> None:
        principal = self.principal(ctx)
        if principal is not None:
            tenancy.record(journal.parent, journal.stem, principal)

    def may_see(self, ctx: Any, task_id: str) -> bool:
        tenant = self.tenant(ctx)
        return tenant is not None and tenancy.tenant_of(self.job_directory(), task_id) == tenant

    def task_handlers(self) -> Any:
        from flakebot.mcp.queued import QueueTasks

        return QueueTasks

    def owned_runs(self, ctx: Any) -> set[str]:
        """The runs the caller's tenant made through this front's jobs or the queue's: a run a row of the tenant's
        names only when the run says it was started for the tenant (the row is anyone's who can write the table)."""
        tenant = self.tenant(ctx)
        if tenant is None:
            return set()
        runs = tenancy.runs_of(self.job_directory(), tenant)
        if self.queue is None:
            return runs
        workdir = self.settings().path("workdir")
        return runs | {run for run in self.queue.runs_of(tenant) if tenancy.started_for(workdir, run, tenant)}

    def run_seen(self, ctx: Any, tool: str, run_id: Any) -> Any:
        """The run id to answer for: a prefix the caller's own runs make unique resolved to its run; one the caller's
        tenant did not make refused with the answer an unknown run gets (a prefix other tenants' runs share too is
        not "ambiguous" to it: their runs are not there)."""
        from flakebot.pipeline.run import find_run_dir, runs_dir

        if not isinstance(run_id, str) or not run_id:
            return run_id  # the tool's own check says what is wrong
        workdir = self.settings().path("workdir")
        owned = self.owned_runs(ctx)
        try:
            found = find_run_dir(workdir, run_id).name
        except RunError as exc:
            if exc.details.get("reason") is not None:  # unknown or malformed: the tool answers that itself
                return run_id
            mine = [run for run in owned if run.startswith(run_id)]
            found = mine[0] if len(mine) == 1 else ""
            if len(mine) > 1:
                return run_id  # ambiguous among the caller's own runs: the tool says so
        if found in owned:
            return found
        if tool == "show":
            raise RunError(f"no run or tool named '{run_id}'", fix="list them with 'flakebot runs' and 'flakebot list'")
        raise RunError(
            f"no run '{run_id}' in {runs_dir(workdir)}",
            fix="list runs with 'flakebot runs' (or pass the --workdir the run used)",
            reason="not_found",
        )

    # ------------------------------------------------------------ the queue (QueueFront of mcp/queued.py)

    def queued(self, name: str) -> bool:
        return self.queue is not None and name in QUEUED_TOOLS

    def enqueue(
        self, ctx: Any, name: str, args: dict[str, Any], principal: Principal | None = None, waited: bool = False
    ) -> Any:
        """Check a long call as the door checks it (its schema, its size and text, its arguments' values) and queue
        the request those checks made, under the caller's tenant and principal. Not its command's own check: what it
        asks of this machine (a usable model, the catalog) is the worker's to answer, and queue.tenant_request checks
        what a tenant may ask. Each call's enqueue or join is one following of the job (Enqueued.following), which
        only that call's end (a waited craft's, or a task's before its answer: leave_following) or the caller leaving
        the job ends. `principal`: the caller's, verified already (else verified here). `waited`: this call holds its
        answer until the job ends, so its following names this front (ended if the front is lost: flakebot.team.fronts)."""
        from flakebot.mcp import tooltable
        from flakebot.mcp.server import TABLE_TOOLS, _check_job_arguments, _check_own

        principal = principal or self.principal(ctx)
        if principal is None or self.queue is None:
            raise TeamError("no principal for this call", fix="call through the front with a token")
        self.refuse_if_stopping()
        _check_own(name, args)
        _check_job_arguments(name, args)
        request = tooltable.arguments(TABLE_TOOLS[name], args)["request"]
        try:
            enqueued = self.queue.enqueue(principal, request, waited=waited)
        except QuotaExceeded:
            self._refused("quota")
            raise
        revoked = self.store.revoked()
        if principal.id in revoked:  # revoked while this call was admitted: the front's look may have passed already
            self.queue.drop_revoked({principal.id}, revoked)  # its following ends as that look's would have ended it
            raise TeamError(
                "this token was revoked while its call was queued", fix="ask your flakebot admin for a token"
            )
        with self._rows_lock:  # a caller who had left the job it joins again follows it again from its next read
            self._rows.pop((principal.tenant, enqueued.job_id), None)
        return enqueued

    def job_row(self, ctx: Any, job_id: int) -> dict[str, Any] | None:
        """The job's row as the caller sees it (admitted_row for the caller's principal, verified once)."""
        principal = self.principal(ctx)
        return self.admitted_row(principal, job_id) if principal is not None else None

    def _kept_row(self, tenant: str, job_id: int) -> dict[str, Any] | None:
        """The tenant's job's row, read at most ROW_FRESH seconds ago: the calls following one job (held status
        calls, waited crafts, tasks/result, the watcher) share one read per poll, however many one tenant holds, so
        they cannot crowd the front's one connection every call's admission waits on."""
        assert self.queue is not None
        with self._rows_lock:
            now = time.monotonic()
            read = self._rows.get((tenant, job_id))
            if read is not None and now - read[0] < ROW_FRESH:
                return read[1]
            row = self.queue.job(tenant, job_id)
            if len(self._rows) >= ROWS_KEPT:  # only fresh reads are worth keeping
                self._rows = {key: kept for key, kept in self._rows.items() if now - kept[0] < ROW_FRESH}
            self._rows[(tenant, job_id)] = (time.monotonic(), row)
            return row

    def admitted_row(self, principal: Principal, job_id: int) -> dict[str, Any] | None:
        """The job's row as `principal` sees it (_seen_as), read at most ROW_FRESH seconds ago (_kept_row). A waited
        call reads it for the principal it was admitted as, whatever its token has done since: a JWT that expires
        while the call waits does not end a craft its caller was admitted for (an HTTP request is authorised as it
        arrives), nor cancel the job for nobody; a revoked token's followings the front's look ends, and this row
        then says so (queued.seen_by)."""
        if self.queue is None:
            return None
        return self._seen_as(principal, self._kept_row(principal.tenant, job_id))

    def _seen_as(self, principal: Principal, row: dict[str, Any] | None) -> dict[str, Any] | None:
        """A job's row as `principal` is handed it: cancelled for one who left it (queued.seen_by), and its result
        vouched for by this front's catalog of the principal's tenant (the row names, the catalog tells:
        queued.vouched)."""
        from flakebot.mcp import queued

        if row is not None:
            row = queued.seen_by(row, principal.id)
        return queued.vouched(row, dataclasses.replace(self.settings(), tenant=principal.tenant), fetch=self.fetch_tool)

    def fetch_tool(self, settings: config.Settings, ref: str, need: str) -> None:
        """A finished job's tool this front's catalog lacks (a worker on another machine made it), installed from the
        tenant's shared catalogs (the organisation's and its own, each checked with its own keys: a worker publishing
        the tenant's crafts signs them with the tenant's key). The first that holds it made for the job's `need`:
        another catalog's tool of the same name and version, made for another need, is not the job's. One try at a
        time per tool, whoever reads its job; a failure (the cache away for a moment, the worker's publication not
        visible yet) is logged and tried again at a read of the job once its wait is over (`fetch_retry_seconds`,
        doubled after each failure up to FETCH_RETRY_MAX), never sooner; a success is final."""
        if not need:
            return
        with self._rows_lock:
            key = (settings.tenant, ref)
            tried = self._fetched.setdefault(key, ToolFetch())
            self._fetched.move_to_end(key)
            while len(self._fetched) > FETCHED_KEPT:
                self._fetched.popitem(last=False)
            if tried.done or tried.busy or time.monotonic() < tried.not_before:
                return
            tried.busy = True
        why: list[str] | None = None
        try:
            why = _install_shared(settings, ref, need)
        finally:  # busy never outlives the try, even one the tenant's file broke (ConfigError: the caller's)
            with self._rows_lock:
                wait = tried.ended(why, settings.fetch_retry_seconds)
        if wait is not None:
            logger.warning(
                "a finished job's tool %s is not in tenant %s's catalog here: %s; tried again at a read of its job "
                "in %.0f s or later", ref, settings.tenant, "; ".join(why or ()), wait,
            )  # fmt: skip

    def cancel_job(self, ctx: Any, job_id: int, following: int | None = None) -> dict[str, Any] | None:
        """Cancel the caller's queued or running job, or leave it when others follow it too (FrontQueue.cancel; a revoked
        token's following does not count), as the caller then sees it; the row's kept read is dropped, so every
        follower of this front sees the change at its next read. `following`: end only that one following of the
        caller's (a waited call's), the job left or cancelled only if it was the caller's last (queue.cancel)."""
        principal = self.principal(ctx)
        if self.queue is None or principal is None:
            return None
        return self._seen_as(principal, self._cancel(principal, job_id, following))

    def _cancel(self, principal: Principal, job_id: int, following: int | None) -> dict[str, Any] | None:
        """The queue's cancel for `principal` (cancel_job), its row's kept read dropped: the row as the queue left it."""
        assert self.queue is not None
        # the caller is the one leaving, revoked or not (as queue.drop_followings): the front's one look at its
        # revocation may have come before this following was written, and nothing else would end it
        row = self.queue.cancel(principal, job_id, self.store.revoked() - {principal.id}, following)
        with self._rows_lock:
            self._rows.pop((principal.tenant, job_id), None)
        return row

    def drop_revoked_followings(self, seen: set[str]) -> None:
        """Tokens revoked since this front last looked (not in `seen`, which this adds them to) follow no queued job
        any more: each job one of them followed is left by it, and cancelled when no live principal follows it
        (FrontQueue.drop_revoked: queue.cancel's own path). The front does it, not `token revoke`: the store is a
        workdir's file, which the command changes without knowing any database, and the front holds both (it already
        sees a revocation within a second, to end the token's sessions). Every front whose store holds the token
        does it, the first for good (a cancel under the tenant's lock; the others find it done); a front started
        after the revocation does it at its first look. A database away: tried again at the next look."""
        if self.queue is None:
            return
        revoked = self.store.revoked()
        new = revoked - seen
        if not new:
            return
        self._forget_rows(self.queue.drop_revoked(new, revoked))
        seen |= new

    def sweep_lost_fronts(self, held_for: float | None = None) -> None:
        """The waited calls' followings of fronts whose lease ran out (killed, their machine lost) ended, as each
        call's own end would have ended it (flakebot.team.fronts; `held_for`: the seconds this front's renewals have
        held, no front of a longer lease taken for lost), the rows' kept reads dropped."""
        if self.queue is not None:
            self._forget_rows(self.queue.sweep_lost_fronts(self.store.revoked(), held_for))

    def end_unended(self) -> None:
        """The followings of calls that ended before their answer while the database was away (leave_following),
        and those of calls whose enqueue failed at every send after the database maybe committed one
        (FrontQueue.end_unsent), ended now; those the database refuses again kept for the next try. Each stays listed
        until it ended, so unended() counts it while its end waits (a stopping front gives that wait up:
        _end_unended_at_stop)."""
        if self.queue is not None and self.queue.unsent():
            self._forget_rows(self.queue.end_unsent(self.store.revoked()))
        with self._rows_lock:
            pending = list(self._unended)
        for held in pending:
            self._cancel(*held)  # raised: this one and the rest kept
            with self._rows_lock:
                if held in self._unended:
                    self._unended.remove(held)
            logger.info("job %s: the following of a call that ended while the database was away ended", held[1])

    def unended(self) -> int:
        """How many followings wait for the database to end them (end_unended)."""
        unsent = self.queue.unsent() if self.queue is not None else 0
        with self._rows_lock:
            return len(self._unended) + unsent

    def _forget_rows(self, rows: list[dict[str, Any]]) -> None:
        with self._rows_lock:
            for row in rows:
                self._rows.pop((str(row["tenant"]), int(row["id"])), None)

    def job_rows(self, ctx: Any) -> list[dict[str, Any]]:
        from flakebot.mcp.tasks import DEFAULT_TTL_MS

        tenant = self.tenant(ctx)
        if self.queue is None or tenant is None:
            return []
        from flakebot.mcp.queued import seen_by

        principal = self.principal(ctx)
        rows = self.queue.jobs_of(tenant, DEFAULT_TTL_MS / 1000)
        return [seen_by(row, principal.id) for row in rows] if principal is not None else rows

    async def _long(self, ctx: Any, name: str, args: dict[str, Any], *, changes_catalog: bool) -> dict[str, Any]:
        from flakebot.mcp import queued
        from flakebot.mcp.server import _wait

        if not self.queued(name):
            return await super()._long(ctx, name, args, changes_catalog=changes_catalog)
        wait = _wait(ctx, args)

        def admitted() -> tuple[Principal | None, Any]:  # verified once: the principal the following is made for
            principal = self.principal(ctx)
            return principal, self.enqueue(ctx, name, args, principal, waited=wait)

        # in a thread: verifying the caller's token may read the store or fetch an IdP's keys
        principal, enqueued = await anyio.to_thread.run_sync(admitted)
        assert principal is not None  # enqueue refuses a call without one
        if not wait:
            try:
                self.watch_job(ctx, enqueued.job_id)
                # a cancel that came while the enqueue ran (a thread the cancel waits for) is raised here: the SDK
                # sends no answer for a cancelled request, so the caller never learns the run_id (as a task call's)
                await anyio.lowlevel.checkpoint()
                await self.answering(principal, enqueued)
            except BaseException:
                await self.leave_following(enqueued.job_id, principal, enqueued.following)
                raise
            return queued.handle_answer(enqueued)
        return await self._follow_job(ctx, enqueued.job_id, changes_catalog, (principal, enqueued.following))

    def watch_job(self, ctx: Any, job_id: int) -> None:
        """Send tools/list_changed to this session (and so to every open session of its tenant) once a detached
        queued craft catalogued its tool (as a detached job of this machine does), watching for at most WATCH_HOURS. One reader per job on this front, whatever
        number of calls joined it: a job's callers are all of its tenant, and joining is never refused, so a reader
        per call would let one tenant pile up queries on the connection every call waits on."""
        self.refuse_if_stopping()  # its enqueue ended as the front stopped: its caller is told in one line
        session = _session_id(ctx)
        if self.jobs is None or not session:  # a stateless request: no session is left to tell once it answered
            return
        watching = self._watchers.setdefault(job_id, {})
        watching.setdefault(session, ctx)
        if len(watching) == 1:
            try:
                self.jobs.start_soon(self._notify_job_done, ctx, job_id)
            except RuntimeError:  # the lifespan's task group ended: the front is stopping (its flag not set: a test's)
                self._watchers.pop(job_id, None)
                raise stopping() from None

    def refuse_if_stopping(self) -> None:
        """A call that would queue work (or answered for work it queued) refused in one line while the front stops:
        nothing of this front would watch it, and its caller can call again elsewhere (the call's own following is
        then left by its caller's door, as any call cut before its answer)."""
        if self.stopping():
            logger.info("a call refused: this front is stopping")
            raise stopping()

    async def _notify_job_done(self, ctx: Any, job_id: int) -> None:
        """The watcher of one job for every follower on this front: its tenant and catalog are taken when it starts
        (in a thread: verifying a token may read the store), and the job's own end read, not as ctx's principal sees
        it (that first follower may leave the job, or its token be revoked or expire, while the others follow it)."""
        from flakebot.mcp import queued
        from flakebot.mcp.server import _catalogued

        deadline = time.monotonic() + WATCH_HOURS * 3600
        try:
            try:
                tenant = await anyio.to_thread.run_sync(self.tenant, ctx)
                settings = await anyio.to_thread.run_sync(self.settings, ctx) if tenant is not None else None
            except FlakebotError as exc:  # its token gone already: no tenant's job left to watch for it
                logger.info("job %s not watched: %s", job_id, exc.one_line())
                return
            if tenant is None or settings is None or self.queue is None:  # no tenant's call: no job of its to watch
                return
            while time.monotonic() < deadline:
                await anyio.sleep(WATCH_SECONDS)
                try:
                    row = await anyio.to_thread.run_sync(
                        lambda: queued.vouched(self._kept_row(tenant, job_id), settings, fetch=self.fetch_tool)
                    )
                except FlakebotError as exc:  # the database is away for now: look again later
                    logger.info("job %s not watched this time: %s", job_id, exc.one_line())
                    continue
                ended = queued.outcome(row) if row is not None else {}
                if ended is not None:
                    if _catalogued((ended or {}).get("result") or {}):
                        await self.tools_changed(ctx, tenant)  # the watchers' sessions are all of ctx's tenant
                    return
        finally:
            self._watchers.pop(job_id, None)

    async def _follow_job(
        self, ctx: Any, job_id: int, changes_catalog: bool, following: tuple[Principal, int]
    ) -> dict[str, Any]:
        """A queued job waited for: each change of its state a progress notification, then its result. `following`:
        the one following of the job this call holds (its enqueue or join) and the principal it was admitted as (its
        row read as that principal sees it: admitted_row), ended if the call ends first, however it ends: cancelled
        (its client went away), or an error raised (the database away): either way nobody waits on the job through
        this call any more."""
        from flakebot.deliver.results import compact_result
        from flakebot.mcp import queued
        from flakebot.mcp.server import _catalogued

        principal, _ = following
        count, last = 0, None
        try:
            while True:
                row = await anyio.to_thread.run_sync(self.admitted_row, principal, job_id)
                if row is None:
                    raise queued.not_found(handle(job_id))
                if row["state"] != last:
                    last, count = row["state"], count + 1
                    await ctx.session.report_progress(float(count), None, f"{handle(job_id)}: {last}")
                ended = queued.outcome(row)
                if ended is not None:
                    break
                await anyio.sleep(queued.POLL_SECONDS)
        except BaseException:  # nobody gets this job's answer through this call now
            await self.leave_following(job_id, *following, waited=True)
            raise
        if "error" in ended:
            return {"ok": False, **ended["error"]}
        if changes_catalog and _catalogued(ended["result"]):
            await self.tools_changed(ctx, principal.tenant)
        return {"ok": True, **compact_result(ended["result"])}

    async def answering(self, principal: Principal, enqueued: Enqueued) -> None:
        """A task's or a detached craft's call about to send the job's id: its following, which named this front
        until now (a sweep of this front, lost, ends it), outlives the front from here (FrontQueue.answered). Raised
        when the database refused (the call fails: its caller gets no id). A cancel that came meanwhile is raised
        here, after the write: the SDK sends no answer for a cancelled request, so the caller's door leaves the
        following, as any call's cut before its answer."""
        assert self.queue is not None
        await anyio.to_thread.run_sync(self.queue.answered, principal, enqueued)
        await anyio.lowlevel.checkpoint()

    async def leave_following(self, job_id: int, principal: Principal, following: int, waited: bool = False) -> None:
        """A call holding one following of a queued job ended before its caller got what it waits for: a waited
        craft's before its job ended, a craft asked as a task before its task id was sent (the SDK cancelled it: the
        client closed the connection, or sent notifications/cancelled; or it raised). Its own following of the job
        ends, and with the caller's last one (the database knows them all, on every front: tasks, detached crafts,
        other waited calls) the caller leaves the job as its tasks/cancel would, so a job it alone followed does not
        run on for nobody. Ended for the principal the following was made for, not the call's token verified again:
        a JWT that expired meanwhile still ends what it started (a revoked token's followings the front's look ends:
        revoked, it counts for nothing here). Shielded: the call is being cancelled. The database away: ended once it
        answers again (end_unended, at the lease's next renewal, and once more as the front stops); the front gone
        first, its lease ends it: the following still names the front (a task's or a detached craft's until its id
        was sent: answering). A front stopping does not end a `waited` call's (`stopping`): its lease, left to run
        out, ends it (flakebot.team.fronts), so a caller has that long to ask again and join the job. A task's or a
        detached craft's is ended now, stopping or not: nobody could come back to a job whose id it never got."""
        if waited and self.stopping():
            return
        with anyio.CancelScope(shield=True):
            await self._leave(job_id, principal, following)

    async def _leave(self, job_id: int, principal: Principal, following: int) -> None:
        try:
            row = await anyio.to_thread.run_sync(lambda: self._cancel(principal, job_id, following))
        except FlakebotError as exc:
            logger.warning(
                "job %s not left yet when a call of it ended before its answer (tried again): %s",
                job_id,
                exc.one_line(),
            )
            with self._rows_lock:
                self._unended.append((principal, job_id, following))
            return
        if row is not None and row.get("retracted"):
            logger.info("job %s: a call ended before its answer; its caller still follows it by another call", job_id)
        elif row is not None and not row.get("unchanged"):
            logger.info("job %s left: a call of it ended before its answer (%s for the caller)", job_id, row["state"])

    # ------------------------------------------------------------ the MCP handlers
    def work(self, name: str, args: dict[str, Any], ctx: Any = None) -> Any:
        """A long tool's work, checked: over the front, `package`'s flake directory (`out`) lies beneath a grant root
        (a network caller writes nowhere else; over stdio it is the local user's own choice). Both doors (a call, a
        task) check here, before any job starts."""
        if ctx is not None:  # a tenant's call: what it reads is no file of this machine (queue.check_tenant_sources)
            from flakebot.team.queue import check_tenant_sources

            check_tenant_sources(args.get("model"), args.get("from"), args.get("registry"))
        out = args.get("out") if name == "package" else None
        if isinstance(out, str) and out:
            from flakebot.deliver.grants import grants

            source = Path(os.path.realpath(self.start / Path(out).expanduser()))
            grants(self.settings(ctx), self.start).check(out, source)
        if name == "service_up" and ctx is not None:
            self._service_up_gate(ctx, args)
        return super().work(name, args, ctx)

    def task_owner(self, ctx: Any) -> str:
        """A task answers only the token that started it (tasks/list, get, result, cancel): another token holder
        must neither read its result nor cancel it."""
        return self.job_owner(ctx)[0]

    async def list_tools(self, ctx: Any, params: Any) -> Any:
        started = time.monotonic()
        result = await super().list_tools(ctx, params)
        self._audited(self.principal(ctx), "tools/list", None, None, "ok", None, started)
        return result

    @contextlib.asynccontextmanager
    async def one_of_its_calls(self, ctx: Any) -> AsyncIterator[None]:
        """Held while a tool call of the caller's token runs, whichever route it came by (a plain tools/call, one
        asked as a task): entered once the token has fewer than TOKEN_CALLS_AT_ONCE in flight, its others waiting in
        the token's own queue. A command's worker threads (THREADS_PER_COMMAND) and the default pool are shared by
        every token, and calls that hold their answer (status's wait_seconds, a tool's run, an enqueue waiting on the
        database) from one token must not take them all."""
        owner = self.job_owner(ctx)[0]
        calls = self._in_flight.get(owner) or self._in_flight.setdefault(owner, CallsInFlight())
        calls.users += 1  # from here until the call left: no await since the lookup, so no other call dropped it
        try:
            async with calls.limiter:
                yield
        finally:
            calls.users -= 1
            if calls.users == 0:  # none holds it or waits on it: a fresh one later caps as this one did
                del self._in_flight[owner]

    async def call_tool(self, ctx: Any, params: Any) -> Any:
        """The call, as one of its token's calls in flight (one_of_its_calls); audited and counted however it ends:
        one cancelled before its answer (its client went away) too, as `cancelled` (a client could otherwise make
        any call it made, a craft or a tool's run, vanish from the audit by leaving before the answer), and one that
        raised, as `error`. /metrics counts a call its quota or concurrent crafts refused as `refused`."""
        started = time.monotonic()
        principal = self.principal(ctx)  # as admitted: the token may expire or be revoked before the call ends
        outcome, code = "error", None
        refused: list[str] = []  # filled by _refused
        refusals = _REFUSALS.set(refused)
        try:
            async with self.one_of_its_calls(ctx):
                result = await self._tenant_call(ctx, params)
                # a cancel that came while the call's last thread ran is raised here: the SDK sends no answer for a
                # cancelled request, so the call is counted and audited as cancelled, not as the answer dropped
                await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            outcome = "cancelled"
            raise
        else:
            data = result.structured_content if isinstance(result.structured_content, dict) else {}
            code = data.get("exit_code") if isinstance(data.get("exit_code"), int) else None
            outcome = "error" if result.is_error else "ok"
            return result
        finally:
            _REFUSALS.reset(refusals)
            self._count_call(params.name, outcome, refused, started)
            self._audited(principal, "tools/call", params.name, params.arguments or {}, outcome, code, started)

    async def _tenant_call(self, ctx: Any, params: Any) -> Any:
        """A call as the caller's tenant sees flakebot: a queued job's status from its row, another tenant's run as
        unknown, `runs` listing its own."""
        from flakebot.mcp import queued
        from flakebot.mcp.server import _check_own, _result

        args = dict(params.arguments or {})
        try:
            if params.name in ("status", "resume", "show"):
                _check_own(params.name, args)
                key = args.get("name") if params.name == "show" else args.get("run_id")
                number = job_number(key) if isinstance(key, str) else None
                if number is not None and self.queue is not None and params.name == "status":
                    wait = max(0, min(int(args.get("wait_seconds") or 0), MAX_WAIT_SECONDS))
                    row = await queued.hold(lambda: self.job_row(ctx, number), wait)
                    if row is None:
                        raise queued.not_found(str(key))
                    return _result({"ok": True, **queued.job_status(row)})
                seen = await anyio.to_thread.run_sync(lambda: self.run_seen(ctx, params.name, key))
                if seen != key:
                    args["name" if params.name == "show" else "run_id"] = seen
                    params = params.model_copy(update={"arguments": args})
            if params.name in tenantservices.NAMED and isinstance(args.get("service"), str):  # service_up: work()
                _check_own(params.name, args)
                settings, tenant = self.settings(ctx), str(self.tenant(ctx))
                service = args["service"].partition("@")[0]
                if not await anyio.to_thread.run_sync(lambda: tenantservices.is_callers(settings, service, tenant)):
                    return await self._as_never_started(ctx, params, service)
        except FlakebotError as exc:
            return _result({"ok": False, **exc.result()}, error=True)
        result = await super().call_tool(ctx, params)
        if params.name == "runs" and not result.is_error and isinstance(result.structured_content, dict):
            try:  # the queue's runs of the tenant: the database may be away (FrontQueue says so, in one line)
                owned = await anyio.to_thread.run_sync(lambda: self.owned_runs(ctx))
            except FlakebotError as exc:
                return _result({"ok": False, **exc.result()}, error=True)
            runs = [run for run in result.structured_content.get("runs", []) if run.get("id") in owned]
            return _result({**result.structured_content, "runs": runs})
        if params.name == "services" and not result.is_error and isinstance(result.structured_content, dict):
            settings = self.settings(ctx)
            listed = result.structured_content.get("services", [])
            tenant = str(self.tenant(ctx))
            kept = await anyio.to_thread.run_sync(lambda: tenantservices.callers_services(settings, listed, tenant))
            return _result({**result.structured_content, "services": kept})
        return result

    def _service_up_gate(self, ctx: Any, args: dict[str, Any]) -> None:
        """Whether the caller may start the service `args` names (tenantservices): one needing another's running
        service is refused, and so is another's service of a name the caller's catalog also holds (a name the
        caller's catalog lacks is the verb's own "no service"). The start itself records the caller's tenant, and
        refuses another's name again under the service's lock (services/owner.py: two tenants' ups at once)."""
        from flakebot.deliver.catalog import Catalog

        service = args.get("service")
        if not isinstance(service, str):
            return  # the tool's own check says what is wrong
        name, settings, tenant = service.partition("@")[0], self.settings(ctx), str(self.tenant(ctx))
        try:
            started = tenantservices.started_program(settings, name)
        except UsageError:  # no service name: the verb refuses it
            return
        foreign = tenantservices.foreign_need(settings, tenantservices.needed(settings, name), tenant)
        if foreign is not None:
            raise tenantservices.refuse_need(name, foreign)
        if started is None:
            return
        if not tenantservices.is_callers(settings, name, tenant) and Catalog.open(settings).entry(name) is not None:
            raise tenantservices.refuse_up(name)

    async def _as_never_started(self, ctx: Any, params: Any, service: str) -> Any:
        """A service verb (not service_up) about a service not the caller's, answered by the verb itself in a
        workdir where no service was ever started: an unknown name's answer, word for word."""
        from flakebot.mcp import tooltable
        from flakebot.mcp.server import TABLE_TOOLS, _result

        nowhere = self.settings(ctx).path("workdir") / "team" / tenantservices.NOWHERE
        nowhere.mkdir(parents=True, exist_ok=True)
        command = TABLE_TOOLS[params.name]
        settings = dataclasses.replace(self.settings(ctx), workdir=str(nowhere))
        try:
            arguments = tooltable.arguments(command, dict(params.arguments or {}))
            command.call_check(arguments, settings=settings, agent=True)
            await anyio.to_thread.run_sync(lambda: command.call(arguments, settings=settings, agent=True))
        except FlakebotError as exc:
            return _result({"ok": False, **exc.result()}, error=True)
        logger.error("%s answered for %s in a workdir holding no service", params.name, service)
        unexpected = TeamError(f"no service {service} for this token", fix="list services with the services tool")
        return _result({"ok": False, **unexpected.result()}, error=True)

    def _audited(
        self,
        principal: Principal | None,
        method: str,
        tool: str | None,
        arguments: Any,
        outcome: str,
        code: int | None,
        started: float,
    ) -> None:
        if principal is None:
            logger.warning("%s answered without a principal: not audited", method)
            return
        elapsed = time.monotonic() - started
        self.audit.record(
            principal, method, tool=tool, arguments=arguments, outcome=outcome, exit_code=code, seconds=elapsed
        )


@dataclass
class ToolFetch:
    """How a front's tries to install one finished job's tool went (TeamMCP.fetch_tool): `busy` while one runs,
    `done` once one succeeded, else not tried again before `not_before` (time.monotonic) after `failures` tries."""

    busy: bool = False
    done: bool = False
    failures: int = 0
    not_before: float = 0.0

    def ended(self, why: list[str] | None, first: float) -> float | None:
        """A try ended: `why` it failed ([] when it did not; None: nothing was tried). The seconds until the next
        try after a failure (`first`, doubled after each failure since, up to FETCH_RETRY_MAX), else None."""
        self.busy, self.done = False, why == []
        if not why:
            return None
        self.failures += 1
        wait: float = min(first * 2 ** min(self.failures - 1, 32), max(first, FETCH_RETRY_MAX))
        self.not_before = time.monotonic() + wait
        return wait


def _install_shared(settings: config.Settings, ref: str, need: str) -> list[str] | None:
    """`ref` installed, made for `need`, from the first of the shared catalogs of `settings` that holds it: [] when
    one did, else why each did not (None: there are none to try)."""
    from flakebot.deliver.install import install_from_catalog

    sources = settings.shared_catalogs()  # the tenant's file read once per try
    if not sources:
        return None
    why = []
    for source in sources:
        try:
            install_from_catalog(ref, source, settings, need=need)
            return []
        except (FlakebotError, OSError, ValueError) as exc:  # as craft's skip: one catalog never stops the next
            why.append(exc.one_line() if isinstance(exc, FlakebotError) else str(exc))
    return why


@dataclass
class CallsInFlight:
    """A principal's tool calls at once (TeamMCP.one_of_its_calls), kept only while it has any: principals are
    unbounded (a JWT's subjects), and a map of every one ever seen would grow for the server's life. `users`: the
    calls holding the limiter or waiting on it; the entry goes when the last leaves, never while one still counts on
    it (a fresh limiter beside a held one would let the principal past its cap)."""

    limiter: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(TOKEN_CALLS_AT_ONCE))
    users: int = 0


FETCHED_KEPT = 4096  # finished jobs' tools a front remembers having tried to install (TeamMCP.fetch_tool)
FETCH_RETRY_MAX = 600.0  # seconds the wait between two tries to install one such tool grows to at most
ROW_FRESH = 0.5  # seconds a job's row read serves every call following the job (queued.POLL_SECONDS)
ROWS_KEPT = 1000  # rows kept at most before the stale ones are dropped
WATCH_SECONDS = 5.0  # how often a detached queued craft's row is read for its end (tools/list_changed)
WATCH_HOURS = 24  # a queued craft watched this long at most (no worker may take it for a while)
STOP_ENDS_SECONDS = 10.0  # a stopping front's last try at the followings the database refused to end
# the refusals (TeamMCP._refused) of the tool call this context serves: its end is counted `refused` by them alone
_REFUSALS: ContextVar[list[str]] = ContextVar("flakebot_call_refusals")
QUEUED_TOOLS = frozenset({"craft"})  # what a worker makes (flakebot.commands.team_worker); the rest run here


CRAFTED = "crafted"  # the metrics' label of every crafted tool's calls


def _metric_label(tool: str) -> str:
    """A call's tool as /metrics names it: flakebot's own tools by name, every other name as CRAFTED (tenants' tool names
    are theirs: not the scraper's to read, nor to fill its storage with names made up at will)."""
    from flakebot.mcp.server import OWN_TOOLS

    return tool if tool in OWN_TOOLS else CRAFTED


def _session_id(ctx: Any) -> str | None:
    """The 2025-11-25 session a request came in (its Mcp-Session-Id header), None for a stateless request."""
    headers = getattr(getattr(ctx, "request", None), "headers", None)
    found = headers.get("mcp-session-id") if headers is not None else None
    return found if isinstance(found, str) and found else None


def principal_of_scope(scope: Any, store: Verifier) -> Principal | None:
    """The principal of an ASGI scope the SDK's bearer backend authenticated (its `user`), or None."""
    user = scope.get("user") if isinstance(scope, dict) else None
    token = getattr(getattr(user, "access_token", None), "token", None)
    return store.verify(token) if isinstance(token, str) else None


class StoreVerifier:
    """The SDK's TokenVerifier over flakebot's token store: a token's principal as an AccessToken (client_id: the
    principal's name; subject: its id, so a new token under a revoked one's name is another principal and cannot
    take over its sessions)."""

    def __init__(self, store: Verifier, resource: str, fetches: bool = False) -> None:
        self.store, self.resource = store, resource
        self.fetches = fetches  # verifying may fetch the IdP's keys: in a worker thread, never blocking the loop

    async def verify_token(self, token: str) -> Any:
        from mcp.server.auth.provider import AccessToken

        if self.fetches:
            principal = await anyio.to_thread.run_sync(self.store.verify, token)
        else:
            principal = self.store.verify(token)
        if principal is None:
            return None
        claims = {"tenant": principal.tenant}
        return AccessToken(
            token=token,
            client_id=principal.name,
            scopes=[],
            resource=self.resource,
            subject=principal.id,
            claims=claims,
        )


class AdmittedCalls:
    """ASGI: a POST's JSON-RPC request counted against its token's requests per minute (a `tools/call` against its
    calls per minute, anything else against a wider window); past it, 429 with Retry-After (and a JSON-RPC error
    naming the wait), a tool call audited as refused (up to the token's calls per minute of refusals a minute: past
    them a flood of 429s would grow the audit at the network's speed). Everything else passes unchanged (the body
    replayed)."""

    def __init__(
        self,
        app: Any,
        store: Verifier,
        admission: Admission,
        audit: Audit,
        metrics: Metrics,
        sessions_of: Callable[[str], set[str]] = lambda principal_id: set(),
    ) -> None:
        self.app, self.store, self.admission, self.audit, self.metrics = app, store, admission, audit, metrics
        self.sessions_of = sessions_of  # the ids of the open sessions a principal (by id) holds on this front
        self._refusals: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
        self._refusals_pruned = time.monotonic()
        # initializes let through whose answer has not started yet, by principal id: the SDK registers a session
        # only after awaits of its own, so a cap counted from registered sessions alone let every initialize in
        # flight through (100 at once all opened one)
        self._opening: collections.Counter[str] = collections.Counter()
        # the sessions whose opening answer started, by principal id: a registered session counts once, either
        # among those being opened or among these (pruned to the registered ones at each count)
        self._answered: dict[str, set[str]] = collections.defaultdict(set)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        principal = principal_of_scope(scope, self.store)
        if scope.get("type") != "http" or scope.get("method") != "POST" or principal is None:
            await self.app(scope, receive, send)
            return
        messages, body = await _read_body(receive)
        request = _posted_request(body)
        scope[PARSED] = request  # handed on: what serves the request after this parses its body no more (mcp/gone.py)
        # in a thread: a shared admission asks the database
        refusal = await anyio.to_thread.run_sync(self.admission.admit_call, principal, request[1]) if request else None
        label = "rate_limit"
        if request is not None and refusal is None and request[1] == "initialize" and _opens_session(scope):
            refusal, label = self._too_many_sessions(principal), "sessions"
            if refusal is None:  # counted (no await since the check) until the SDK answers it
                await self._opening_session(principal.id, scope, _replaying(messages, receive), send)
                return
        if request is None or refusal is None:
            await self.app(scope, _replaying(messages, receive), send)
            return
        await self._refuse(request, refusal, send, principal, label)

    async def _opening_session(self, principal_id: str, scope: Any, receive: Any, send: Any) -> None:
        """The SDK's answer to an initialize let through, counted among the principal's sessions being opened until
        that answer starts; then the session it names (if the SDK opened one) counts among the answered ones."""
        self._opening[principal_id] += 1
        counted = True

        def release(session_id: str | None = None) -> None:
            nonlocal counted
            if counted:
                counted = False
                self._opening[principal_id] -= 1
                if self._opening[principal_id] <= 0:
                    del self._opening[principal_id]
                if session_id:
                    self._answered[principal_id].add(session_id)

        async def sending(message: Any) -> None:
            if message.get("type") == "http.response.start":
                headers = dict(message.get("headers") or [])
                opened = headers.get(b"mcp-session-id")
                release(opened.decode("latin-1") if isinstance(opened, bytes) else None)
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            release()

    def _too_many_sessions(self, principal: Principal) -> Refusal | None:
        """An initialize (a new session) of a principal holding SESSIONS_PER_TOKEN open sessions already, those being
        opened counted: refused, so that one token's sessions never fill the SDK's cap of every token's together.
        Exact under concurrent initializes: this check and the count of this one (_opening_session) run with no
        await between them. A registered session counts once: among those being opened until its answer starts,
        then among the answered ones (a session the SDK registered but had not answered yet, counted twice, refused
        60 of 100 initializes at once instead of 36)."""
        answered = self._answered[principal.id] & self.sessions_of(principal.id)  # those the SDK still holds
        if answered:
            self._answered[principal.id] = answered
        else:
            self._answered.pop(principal.id, None)
        held = len(answered) + self._opening[principal.id]
        if held < SESSIONS_PER_TOKEN:
            return None
        reason = (
            f"token {principal.name} holds {held} open sessions, the most one token may; end one you no longer use "
            "(HTTP DELETE with its Mcp-Session-Id) or let idle ones expire"
        )
        return Refusal(reason, SESSION_RETRY_SECONDS)

    async def _refuse(self, request: Any, refusal: Refusal, send: Any, principal: Principal, label: str) -> None:
        request_id, method, tool, arguments = request
        if method == "tools/call" and self._audit_refusal(principal):  # a refused flood of listings is not kept
            self.audit.record(principal, method, tool=tool, arguments=arguments, outcome="refused")
        if method == "tools/call":  # counted however many: a counter per tool and outcome takes no more room
            self.metrics.call(_metric_label(str(tool)), "refused", 0.0)
        self.metrics.refused(label)
        message = f"{refusal.reason}. Fix: call again after {refusal.retry_after} s"
        error = {"jsonrpc": "2.0", "id": request_id, "error": {"code": RATE_LIMITED, "message": message}}
        payload = json.dumps(error).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"retry-after", str(refusal.retry_after).encode()),
        ]
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    def _audit_refusal(self, principal: Principal) -> bool:
        """Whether this refusal goes to the audit: fewer than the token's calls per minute were audited in the last
        minute."""
        now = time.monotonic()
        if now - self._refusals_pruned >= WINDOW_SECONDS:  # a principal refused once keeps no entry for ever
            prune_windows(self._refusals, now)
            self._refusals_pruned = now
        audited = self._refusals[principal.id]
        while audited and audited[0] <= now - 60:
            audited.popleft()
        if len(audited) >= principal.calls_per_minute:
            logger.debug("refusal of %s's tool call not audited: %d audited this minute", principal.name, len(audited))
            return False
        audited.append(now)
        return True


async def _read_body(receive: Any) -> tuple[list[Any], bytes]:
    """The request's messages as received (to replay them) and its body; stops reading past BODY_LIMIT (the body is
    then not inspected: the SDK refuses it with 413)."""
    messages, size, more = [], 0, True
    while more and size <= BODY_LIMIT:
        message = await receive()
        messages.append(message)
        if message.get("type") != "http.request":
            break
        size += len(message.get("body", b""))
        more = bool(message.get("more_body"))
    body = b"".join(m.get("body", b"") for m in messages) if not more else b""
    return messages, body


def _opens_session(scope: Any) -> bool:
    """Whether a request would open a session: one without an Mcp-Session-Id."""
    return not any(name == b"mcp-session-id" for name, _ in scope.get("headers") or [])


def _replaying(messages: list[Any], receive: Any) -> Any:
    pending = list(messages)

    async def replayed() -> Any:
        return pending.pop(0) if pending else await receive()

    return replayed


def _posted_request(body: bytes) -> tuple[Any, str, str | None, Any] | None:
    """(id, method, tool name, arguments) when the body is one JSON-RPC request (a method and an id), else None (a
    notification, a response, a body the SDK refuses as it is)."""
    try:
        message = json.loads(body) if body else None
    except (ValueError, RecursionError):  # deep nesting: the SDK answers its parse error (was a 500 and a traceback)
        return None
    if not isinstance(message, dict) or not isinstance(message.get("method"), str) or "id" not in message:
        return None
    method = message["method"]
    params = message.get("params")
    if method != "tools/call":
        return message["id"], method, None, None
    if not isinstance(params, dict):
        params = {}
    return message["id"], method, str(params.get("name")), params.get("arguments")


class MetricsApp:
    """ASGI: GET /metrics, the front's metrics as Prometheus text, to a token granted `metrics` only (a scraper's:
    `flakebot token add prometheus --grant metrics`): they count every tenant's work (the queue's depth, calls and
    refusals), which no tenant's agent is to read. Any other token: 403 in one line."""

    def __init__(self, state: TeamMCP) -> None:
        self.state = state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        principal = principal_of_scope(scope, self.state.store)
        if principal is None or METRICS not in principal.grants:
            who = f"token {principal.name!r}" if principal is not None else "this token"
            refusal = TeamError(
                f"{who} may not read /metrics: they count every tenant's work",
                fix=f"scrape with a token made for it: flakebot token add prometheus --grant {METRICS}",
            )
            await _plain(send, 403, refusal.one_line() + "\n")
            return
        queue = self.state.queue
        try:
            depth = await anyio.to_thread.run_sync(queue.depth) if queue is not None else None
        except FlakebotError as exc:  # the database is away: the front's own metrics still answer
            logger.warning("queue depth not read for /metrics: %s", exc.one_line())
            depth = None
        await _plain(send, 200, self.state.metrics.render(depth))


async def _plain(send: Any, status: int, text: str) -> None:
    """An answer of Prometheus' text type (a refusal too: a scraper shows its body as the scrape's error)."""
    payload = text.encode()
    headers = [(b"content-type", CONTENT_TYPE.encode()), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


# ---------------------------------------------------------------- the application


def resource_url(options: FrontOptions, port: int) -> str:
    """The URL clients reach `/mcp` at: --url, else this server's scheme, host and port."""
    if options.url:
        return options.url.rstrip("/")
    host = f"[{options.host}]" if ":" in options.host else options.host
    return f"{'https' if options.tls else 'http'}://{host}:{port}{PATH}"


def security_settings(options: FrontOptions, url: str) -> Any:
    """The Host and Origin values the SDK accepts: loopback names on a loopback address, and the URL's own."""
    from mcp.server.transport_security import TransportSecuritySettings

    parts = urlsplit(url)
    hosts, origins = [str(parts.netloc)], [f"{parts.scheme}://{parts.netloc}"]
    if is_loopback(options.host):
        for name in ("127.0.0.1", "localhost", "[::1]"):
            hosts.append(f"{name}:*")
            origins += [f"http://{name}:*", f"https://{name}:*"]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)


def build_app(state: TeamMCP, options: FrontOptions, url: str) -> Any:
    """The ASGI application: `/mcp` behind the bearer check and admission, and the protected-resource metadata."""
    from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
    from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
    from mcp.server.auth.routes import build_resource_metadata_url, create_protected_resource_routes
    from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
    from pydantic import AnyHttpUrl
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.authentication import AuthenticationMiddleware
    from starlette.routing import Route

    manager = StreamableHTTPSessionManager(app=state.server(), security_settings=security_settings(options, url))
    resource = AnyHttpUrl(url)
    parts = urlsplit(url)
    # the authorization server: the IdP whose JWTs are let in, else this server (the issuer of its static tokens)
    named = options.jwt.issuer if options.jwt is not None else options.issuer
    issuer = AnyHttpUrl(named or f"{parts.scheme}://{parts.netloc}")

    def sessions_of(principal_id: str) -> set[str]:  # the SDK's owner of each session (its private map, as below)
        owners = list(manager._session_owners.items())
        return {sid for sid, owner in owners if str(owner.get("subject") or "") == principal_id}

    admitted = AdmittedCalls(
        GoneRequests(StreamableHTTPASGIApp(manager)),
        state.store,
        state.admission,
        state.audit,
        state.metrics,
        sessions_of,
    )
    endpoint = RequireAuthMiddleware(admitted, [], build_resource_metadata_url(resource))
    metrics = RequireAuthMiddleware(MetricsApp(state), [], build_resource_metadata_url(resource))
    metadata = create_protected_resource_routes(resource, [issuer], resource_name="flakebot")
    # the path RFC 9728 derives from the resource (.../mcp), and the bare well-known path clients also try
    bare = Route("/.well-known/oauth-protected-resource", endpoint=metadata[0].endpoint, methods=["GET", "OPTIONS"])
    routes = [Route(PATH, endpoint=endpoint), Route(METRICS_PATH, endpoint=metrics, methods=["GET"]), *metadata, bare]

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with manager.run(), anyio.create_task_group() as group:
            state.jobs = group  # what outlives a request: watching detached work for tools/list_changed
            state.sessions.live = lambda: manager._server_instances.keys()  # the SDK's open sessions (its private map)
            group.start_soon(
                _kept_running, "ending revoked tokens' sessions", _end_revoked_sessions, manager, state.store
            )
            group.start_soon(_kept_running, "leaving revoked tokens' queued jobs", _drop_revoked_followings, state)
            group.start_soon(_kept_running, "holding this front's lease", _hold_lease, state)
            yield
            group.cancel_scope.cancel()
        await _end_unended_at_stop(state)
        # its lease not given up: its waited calls' followings end when it runs out (another front's sweep), giving
        # the callers it cut a lease's time to come back to their jobs (flakebot.team.fronts)

    middleware = [
        Middleware(
            AuthenticationMiddleware,
            backend=BearerAuthBackend(StoreVerifier(state.store, url, options.jwt is not None and options.jwt.fetched)),
        ),
        Middleware(AuthContextMiddleware),
    ]
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


def stopping() -> Interrupted:
    """What a call that came as the front stops is told."""
    return Interrupted(
        "this flakebot server is stopping and takes no new work",
        fix="call again in a moment: another front of the team answers it, or this one once restarted",
    )


async def _kept_running(what: str, sweep: Callable[..., Awaitable[None]], *args: Any) -> None:
    """A background sweep of the front, started again after an error nobody foresaw (logged with its traceback, once
    per sweep's pause): one raising out of the lifespan's task group took the whole front down, every request of
    every token answered 500 until a restart (a token store's directory made a file did, until the store said it)."""
    while True:
        try:
            await sweep(*args)
            return
        except Exception:
            logger.exception("%s failed; started again in %s s", what, REVOKED_SWEEP_SECONDS)
            await anyio.sleep(REVOKED_SWEEP_SECONDS)


async def _end_revoked_sessions(manager: Any, store: Verifier) -> None:
    """End the sessions whose static token is no longer active (revoked, or a store that became unsafe): a revoked
    token's next request is 401 anyway, but a GET stream it opened before would stay open, carrying notifications.
    A JWT's session is left to its token's expiry (the IdP lists no active users; each request is verified again).
    The SDK keeps each session's owner (the AccessToken's subject: the principal id) but no hook to end one, hence
    its private maps, pinned by tests/team/test_serve_attacks.py."""
    while True:
        await anyio.sleep(REVOKED_SWEEP_SECONDS)
        active = store.live()  # an unsafe store: none (the store logs that once, not each second)
        for session_id, owner in list(manager._session_owners.items()):
            transport = manager._server_instances.get(session_id)
            subject = str(owner.get("subject") or "")
            if subject.startswith(idtokens.ID_PREFIX):
                continue
            if subject not in active and transport is not None:
                logger.info("session %s ended: its token is no longer active", session_id)
                await manager._discard_session(session_id, transport)


async def _end_unended_at_stop(state: TeamMCP) -> None:
    """The followings the database refused to end while this front ran (TeamMCP.end_unended), tried once more as it
    stops, for at most STOP_ENDS_SECONDS (a cancel may wait on a tenant's lock): what is left the front's lease ends
    once it runs out (another front's or a worker's sweep), each following still naming this front."""
    if state.queue is None or not state.unended():
        return
    with anyio.move_on_after(STOP_ENDS_SECONDS):
        try:
            await anyio.to_thread.run_sync(state.end_unended, abandon_on_cancel=True)
        except FlakebotError as exc:
            logger.warning("followings not ended as this front stops: %s", exc.one_line())
    left = state.unended()
    if left:
        logger.warning("%d following(s) left for this front's lease to end (a sweep, once it runs out)", left)


async def _drop_revoked_followings(state: TeamMCP) -> None:
    """Revoked tokens' following of queued jobs ended, as often as sessions are checked (TeamMCP.drop_revoked_followings)."""
    seen: set[str] = set()
    while state.queue is not None:
        await anyio.sleep(REVOKED_SWEEP_SECONDS)
        try:
            await anyio.to_thread.run_sync(state.drop_revoked_followings, seen)
        except FlakebotError as exc:
            logger.warning("revoked tokens' queued jobs not looked at this time: %s", exc.one_line())


async def _hold_lease(state: TeamMCP) -> None:
    """This front's lease renewed every third of it (with it, waited calls' followings the database was away to end
    ended: TeamMCP.end_unended), and the fronts whose lease ran out swept (TeamMCP.sweep_lost_fronts) once this
    front's own renewals have held on time for a whole lease (fronts.SweepGuard): after the database was away longer
    than a lease, or a stall of this front, every live front renews before any is taken for lost. The renewals have a
    connection of their own (FrontQueue), and the ends and the sweep run beside them: their cancels may wait seconds
    on a tenant's lock, and a renewal waiting behind them would let this live front's own lease run out."""
    queue = state.queue
    if queue is None:
        return
    guard = fronts.SweepGuard(queue.lease_seconds, "this front")
    sweeping = False  # the ends and a sweep run (beside the renewals: their cancels may wait on a tenant's lock)

    async def sweep(held_for: float | None) -> None:
        nonlocal sweeping
        try:
            await anyio.to_thread.run_sync(state.end_unended)
            if held_for is not None:
                await anyio.to_thread.run_sync(state.sweep_lost_fronts, held_for)
        except FlakebotError as exc:
            logger.warning(
                "waited calls' followings not ended, or lost fronts not swept, this time: %s", exc.one_line()
            )
        finally:
            sweeping = False

    async with anyio.create_task_group() as sweeps:
        while True:
            try:
                if await anyio.to_thread.run_sync(queue.hold_lease):
                    held_for = guard.held_for() if guard.held() else None
                    if not sweeping:
                        sweeping = True
                        sweeps.start_soon(sweep, held_for)
                else:
                    guard.lapsed()
                    logger.warning(
                        "this front's lease had run out (it or its database stalled longer than %g s): its waited "
                        "calls' followings were ended by another front; it holds a lease again under a new identity",
                        queue.lease_seconds,
                    )
            except FlakebotError as exc:
                guard.lapsed()
                logger.warning("this front's lease not renewed this time: %s", exc.one_line())
            await anyio.sleep(guard.pause())


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one), made before the server starts so its port is known."""
    if not 0 <= port <= 65535:  # getaddrinfo takes 99999 modulo 65536: the server would listen where nobody asked
        raise UsageError(f"--port {port} is not a TCP port", fix="pass a port from 0 to 65535 (0: a free one)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", fix="pick another --port") from None
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


def verifiers(options: FrontOptions, settings: config.Settings) -> Verifier:
    """The ways in: the workdir's static tokens, and the IdP's JWTs when --jwt-issuer was given (its key read now)."""
    store = TokenStore(settings.path("workdir"))
    if options.jwt is None:
        return store
    return Verifiers(store, JwtVerifier(options.jwt))


def serve(
    options: FrontOptions, settings: config.Settings | None = None, ready: Callable[[str, int], None] | None = None
) -> None:
    """Serve until SIGINT or SIGTERM. `ready(url, active tokens)` is called once the socket listens."""
    import uvicorn

    settings = settings or config.load()
    store = verifiers(options, settings)
    check_exposure(options, store)
    check_tls(options)
    from flakebot.deliver.grants import check_flag_roots

    check_flag_roots(options.grant_roots, settings, Path.cwd())
    from flakebot.team.queue import check_lease

    check_lease(options.lease)
    queue = FrontQueue(options.database, options.lease) if options.database is not None else None
    if queue is not None:
        # a database that cannot be reached is one line now, before the port is taken; and the lease held before any
        # call: a waited call's following names a front that holds a lease
        queue.connect()
        logger.info("crafts go to the team queue at %s", db.shown(options.database or ""))
    sock = bind(options.host, options.port)
    url = resource_url(options, sock.getsockname()[1])
    admission = SharedAdmission(queue) if queue is not None else MemoryAdmission()
    state = TeamMCP(settings, options.grant_roots, store, admission, queue)
    uv = uvicorn.Config(
        build_app(state, options, url),
        log_config=None,  # flakebot's handlers (redacted) take uvicorn's records; it configures nothing itself
        access_log=False,  # the audit says who called what; a line per request would only repeat the path
        ssl_certfile=str(options.tls_cert) if options.tls_cert else None,
        ssl_keyfile=str(options.tls_key) if options.tls_key else None,
        timeout_graceful_shutdown=5,
        lifespan="on",
    )
    if not store.active() and options.jwt is None:
        logger.warning("no active token: every request is refused until 'flakebot token add NAME'")
    if ready is not None:
        ready(url, len(store.active()))
    server = uvicorn.Server(uv)
    state.stopping = lambda: server.should_exit  # set on SIGINT/SIGTERM, before any request is cancelled
    server.run(sockets=[sock])
