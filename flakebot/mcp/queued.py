"""Crafts in the team's queue as MCP callers see them (`flakebot serve --database`): a job handle (`job-ID`) that
`status` follows and that is the taskId of a task-augmented craft, every answer read from the job's row, so any
front of the same database answers it. A tenant sees only its own jobs: another tenant's handle is "not found",
word for word the answer for one that never existed.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import anyio.to_thread
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import methods

from flakebot.deliver.results import compact_result
from flakebot.errors import FlakebotError, Interrupted, QuotaExceeded, RunError
from flakebot.mcp import tasks as mcp_tasks
from flakebot.pipeline import jobs
from flakebot.team.frontqueue import handle, job_number

logger = logging.getLogger(__name__)

STATUS = {  # row state -> status
    "queued": "queued",
    "running": "running",
    "done": "succeeded",
    "failed": "failed",
    "cancelled": "cancelled",
}
TASK_STATUS: dict[str, types.TaskStatus] = {
    "queued": "working",
    "running": "working",
    "done": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}
POLL_SECONDS = 0.5
ERROR_TYPE = re.compile(r"[A-Z][A-Za-z0-9]{0,63}")  # a failed row's error type the caller is told as it is
ROW_ERROR_CHARS = 400  # of a failed row's error (or fix) told to the caller: the rest is the row's, in the table
OWN = object()  # marks an error this front made (seen_by): no row read from the table can hold it
OWN_ERROR = "own_error"
FOLLOW = (
    "call status with this run_id (a queued job's handle) and wait_seconds until status is succeeded (the result is "
    "in it) or failed"
)


class QueueFront(Protocol):
    """What these answers need of the team front (flakebot.mcp.front.TeamMCP)."""

    def queued(self, name: str) -> bool:
        """Whether this tool's long jobs go to the queue."""

    def principal(self, ctx: Any) -> Any:
        """The caller's principal (its verified token), None without one."""

    def enqueue(self, ctx: Any, name: str, args: dict[str, Any], principal: Any = None) -> Any:
        """Check the call's arguments as the door does and queue its request (an Enqueued) for `principal`."""

    async def leave_following(self, job_id: int, principal: Any, following: int) -> None:
        """A call ended before its answer reached its caller: its own following of the job ends (queue.cancel)."""

    async def answering(self, principal: Any, enqueued: Any) -> None:
        """The call is about to send the job's id: its following outlives the front from now on (raised: it failed)."""

    def watch_job(self, ctx: Any, job_id: int) -> None:
        """Tell the session when the job catalogued its tool."""

    def job_row(self, ctx: Any, job_id: int) -> dict[str, Any] | None:
        """The job's row if the caller's tenant may see it."""

    def job_rows(self, ctx: Any) -> list[dict[str, Any]]:
        """The caller's tenant's jobs a task list shows (none without a database)."""

    def cancel_job(self, ctx: Any, job_id: int) -> dict[str, Any] | None:
        """Cancel the caller's queued or running job: its row, None when it is not the caller's to cancel."""

    def call_result(self, line: dict[str, Any]) -> Any:
        """The CallToolResult of a {result} or {error} line."""

    def settings(self) -> Any: ...


def not_found(name: str) -> RunError:
    return RunError(
        f"no job '{name}' (unknown here, or not your tenant's)",
        fix="use the run_id craft answered (job-ID); list your crafts with tasks/list or runs",
        reason="not_found",
    )


def handle_answer(enqueued: Any) -> dict[str, Any]:
    """A detached craft's answer: the job's handle, to follow with `status`."""
    return {
        "ok": True,
        "run_id": handle(enqueued.job_id),
        "status": enqueued.state,
        "joined": enqueued.joined,
        "follow": FOLLOW,
    }


def seen_by(row: dict[str, Any], principal: str) -> dict[str, Any]:
    """A job's row as `principal` (its identity, as `left_by` holds them) sees it: a job it left (tasks/cancel while
    other agents of its tenant follow it) is cancelled for it, whatever the job does for the others."""
    if principal not in (row.get("left_by") or ()) or row["state"] not in ("queued", "running"):
        return row
    error = {
        "error": f"you stopped following {handle(int(row['id']))} (cancelled for you); it goes on for the other "
        "agents of your tenant who joined it",
        "fix": "craft the same need again to follow it again",
        "type": "Cancelled",
    }
    return {**row, "state": "cancelled", "error": error, OWN_ERROR: OWN}


def job_status(row: dict[str, Any]) -> dict[str, Any]:
    """`status` of a queued job, from its row. Its need as the row says it when that is text, at most a need's
    length (what a front queues): a row is anyone's with the database's password, its request any JSON."""
    from flakebot.preflight import NEED_LIMIT

    request = row["request"] if isinstance(row.get("request"), dict) else {}
    need = request.get("need")
    answer: dict[str, Any] = {
        "run_id": handle(int(row["id"])),
        "status": STATUS[row["state"]],
        "queue_state": row["state"],
        "need": need[:NEED_LIMIT] if isinstance(need, str) else "",
        "attempts": row["attempts"],
        "worker_run_id": row["run_id"],
        "error": row_error(row),
    }
    if row["state"] == "done":
        answer["result"] = compact_result(row["result"] or {})
    return answer


ROW_RESULT_KEPT = ("status", "name", "version", "run_id", "seconds", "from_catalog")  # what a row's result may say
ENDED = ("crafted", "cached", "installed", "stopped")  # a craft result's statuses


def vouched(
    row: dict[str, Any] | None, settings: Any, fetch: Callable[[Any, str, str], None] | None = None
) -> dict[str, Any] | None:
    """The row with its result as a front hands it on. A row is anyone's with the database's password, so its result
    only names the tool (name, version, status, run, seconds, token use, kept to their shapes); what the tool is and
    how it runs (its manifest: store path, nix run, summary, usage; USAGE.md, where it was installed from) are this
    front's catalog's for the caller's tenant (`settings`), at the version named. A tool that catalog lacks is named
    only: no path or command of a row's reaches a caller as flakebot's words, and so is one that catalog holds made
    for another need than the job's (another tool of that name: catalogs on several machines need not agree). `fetch(settings, NAME@VERSION, need)`
    may first install a tool the catalog lacks, made for the job's need, from the tenant's signed shared catalogs."""
    if row is None:
        return row
    from flakebot.pipeline.run import RUN_ID

    if not (isinstance(row.get("run_id"), str) and RUN_ID.fullmatch(row["run_id"])):  # the worker's run: a run id
        row = {**row, "run_id": None}
    if row.get("state") != "done":
        return row
    from flakebot.deliver.catalog import normalize_need, show_tool
    from flakebot.deliver.versions import VERSION_RE
    from flakebot.toolspec import NAME_RE

    said: dict[str, Any] = row["result"] if isinstance(row.get("result"), dict) else {}
    result = {k: said[k] for k in ROW_RESULT_KEPT if _shaped(k, said.get(k))}
    name, version = str(result.get("name", "")), str(result.get("version", ""))
    if result.get("status") not in ENDED or not NAME_RE.fullmatch(name) or not VERSION_RE.fullmatch(version or "0.1.0"):
        return {**row, "result": {k: v for k, v in result.items() if k in ("run_id", "seconds")}}
    usage: dict[str, Any] = said["usage"] if isinstance(said.get("usage"), dict) else {}
    result["usage"] = {k: v for k, v in usage.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    ref = f"{name}@{version}" if version else name
    request: dict[str, Any] = row["request"] if isinstance(row.get("request"), dict) else {}
    need = str(request.get("need") or "")
    try:
        shown = show_tool(ref, settings)
    except FlakebotError:  # not in this front's catalog for the tenant (another machine's worker made it)
        shown = None
    if shown is None or shown.get("need_key") != normalize_need(need):  # none here, or this name made for another need
        if fetch is None or result["status"] == "stopped":
            return {**row, "result": result}
        fetch(settings, ref, need)
        return vouched(row, settings)
    manifest = shown["manifest"]
    kept = {"manifest": manifest, "usage_markdown": shown["usage_markdown"]}
    installed = manifest.get("installed_from")
    return {**row, "result": {**result, **kept, **({"installed_from": installed} if installed else {})}}


def _shaped(key: str, value: Any) -> bool:
    """Whether a row's result field has the shape flakebot writes: any other text is the forger's words."""
    from flakebot.pipeline.run import RUN_ID

    if key == "from_catalog":
        return isinstance(value, bool)
    if key == "seconds":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if key == "run_id":
        return isinstance(value, str) and bool(RUN_ID.fullmatch(value))
    return isinstance(value, str) and len(value) < 200  # status, name, version: checked against their sets below


def row_error(row: dict[str, Any]) -> Any:
    """An ended row's error as the caller is told it: the row's text (a worker's, or a forger's who can write the
    table) quoted as the row's words, bounded and without control characters (modeltext.quoted), never as
    flakebot's own error and fix. Told as the row has it: the error a front writes when it cancels a job (exactly its
    shape, queue.is_cancel_error), the one seen_by makes, and other states' (none)."""
    from flakebot.modeltext import ROW_NOTE, quoted
    from flakebot.team.queue import is_cancel_error

    error, state = row["error"], row["state"]
    if row.get(OWN_ERROR) is OWN or state not in ("failed", "cancelled") or error is None:
        return error
    if state == "cancelled" and is_cancel_error(error):  # a front writes it only as it cancels: in no failed row
        return error
    # a cancelled job's type is known from its state; a failed one's names the error class its exit code follows
    fallback = "Cancelled" if state == "cancelled" else "FlakebotError"
    if not isinstance(error, dict):  # no shape flakebot writes: none of its words told
        return {"error": f"the job {state}", "type": fallback}
    kind = error.get("type")
    told = {
        "error": f"{handle(int(row['id']))} {state}; its row says {quoted(error.get('error'), ROW_ERROR_CHARS, ROW_NOTE)}",
        "type": kind if state == "failed" and isinstance(kind, str) and ERROR_TYPE.fullmatch(kind) else fallback,
    }
    if error.get("fix"):
        told["fix"] = f"its row suggests {quoted(error.get('fix'), ROW_ERROR_CHARS, ROW_NOTE)}"
    return told


def outcome(row: dict[str, Any]) -> dict[str, Any] | None:
    """The job's end as a journal's last line would say it ({result} or {error}), None while it is not over."""
    if row["state"] == "done":
        return {"result": row["result"] or {}}
    if row["state"] in ("failed", "cancelled"):
        return {"error": row_error(row) or {"error": f"the job {row['state']}", "type": "FlakebotError"}}
    return None


async def hold(read: Callable[[], dict[str, Any] | None], seconds: float) -> dict[str, Any] | None:
    """A row read again until its state changes or ends, at most `seconds` (status's wait_seconds). Each read is a
    short call in a worker thread and the wait between them is the event loop's: a held call keeps no thread, so one
    tenant's held calls cannot take the threads every other call needs (admission, tools/list)."""
    row = await anyio.to_thread.run_sync(read)
    deadline = time.monotonic() + seconds
    first = row["state"] if row is not None else None
    while row is not None and row["state"] == first and first in ("queued", "running"):
        if time.monotonic() >= deadline:
            break
        await anyio.sleep(POLL_SECONDS)
        row = await anyio.to_thread.run_sync(read)
    return row


def task_of(row: dict[str, Any]) -> types.Task:
    state = row["state"]
    message = {"queued": "queued", "running": f"running (attempt {row['attempts']})", "done": "done"}.get(state)
    if state in ("failed", "cancelled"):
        error = row_error(row) or {}
        message = f"{error.get('error')}. Fix: {error.get('fix')}" if error.get("fix") else str(error.get("error"))
    stamps = [row[key] for key in ("created", "started", "ended") if isinstance(row.get(key), datetime)]
    return types.Task(
        task_id=handle(int(row["id"])),
        status=TASK_STATUS[state],
        status_message=message,
        created_at=_iso(row["created"]),
        last_updated_at=_iso(max(stamps)),
        ttl=mcp_tasks.DEFAULT_TTL_MS,
        poll_interval=mcp_tasks.POLL_INTERVAL_MS,
    )


class QueueTasks(mcp_tasks.Tasks):
    """tasks/* of the team front: a craft's task is its queued job (taskId job-ID, read from the row); every other
    task is a detached job's, as flakebot.mcp.tasks answers it."""

    @property
    def front(self) -> QueueFront:
        return self.jobs  # type: ignore[return-value]  # TeamMCP is both Jobs and QueueFront

    async def call(self, ctx: Any, params: types.CallToolRequestParams) -> types.CreateTaskResult:
        if not self.front.queued(params.name):
            return await super().call(ctx, params)
        mcp_tasks.offered(ctx)
        arguments = dict(params.arguments or {})

        def admitted() -> tuple[Any, Any]:  # verified once: the principal the following is made for
            principal = self.front.principal(ctx)
            return principal, self.front.enqueue(ctx, params.name, arguments, principal)

        try:
            principal, enqueued = await anyio.to_thread.run_sync(admitted)
        except (QuotaExceeded, jobs.JobLimit, Interrupted) as exc:  # nothing queued (Interrupted: the front stopping)
            raise MCPError(mcp_tasks.REFUSED, exc.one_line()) from None
        except FlakebotError as exc:  # arguments the tool refuses: nothing queued either
            raise MCPError(types.INVALID_PARAMS, exc.one_line()) from None
        try:
            self.front.watch_job(ctx, enqueued.job_id)
            task = (await self._row(ctx, handle(enqueued.job_id)))[1]
            # a cancel that came while the row was read (a thread the cancel waits for) is raised here
            await anyio.lowlevel.checkpoint()
            # then the following outlives this front (a cancel meanwhile raised after it): past this point nothing
            # awaits before the answer, which the SDK would not send for a cancelled request
            await self.front.answering(principal, enqueued)
        except BaseException as exc:  # cancelled, or the row unread: the caller never learns the task id
            await self.front.leave_following(enqueued.job_id, principal, enqueued.following)
            if isinstance(exc, FlakebotError):  # the front stopping: one line to the caller, not a traceback
                raise MCPError(types.INTERNAL_ERROR, exc.one_line()) from None
            raise
        joined = " (joined the job already queued for this need)" if enqueued.joined else ""
        text = f"{params.name} is queued as task {task.task_id}{joined}; its result comes when the task completes"
        return types.CreateTaskResult(task=task, _meta={mcp_tasks.IMMEDIATE_RESPONSE: text})

    async def get(self, ctx: Any, params: types.GetTaskRequestParams) -> types.GetTaskResult:
        if job_number(params.task_id) is None:
            return await super().get(ctx, params)
        mcp_tasks.offered(ctx)
        return types.GetTaskResult(**(await self._row(ctx, params.task_id))[1].model_dump())

    async def result(self, ctx: Any, params: types.GetTaskPayloadRequestParams) -> Any:
        if job_number(params.task_id) is None:
            return await super().result(ctx, params)
        mcp_tasks.offered(ctx)
        wait = jobs.bounded(self.front.settings(), "task_result_wait", 1, 3600)
        deadline = time.monotonic() + wait
        row, task = await self._row(ctx, params.task_id)
        while outcome(row) is None:
            if time.monotonic() >= deadline:
                raise MCPError(types.REQUEST_TIMEOUT, mcp_tasks.still_running(task, wait))
            await anyio.sleep(POLL_SECONDS)
            row, task = await self._row(ctx, params.task_id)
        ended = outcome(row)
        assert ended is not None
        result = self.front.call_result(ended).model_dump(by_alias=True, mode="json", exclude_none=True)
        wire = methods.serialize_server_result("tools/call", ctx.protocol_version, result)
        return {**wire, "_meta": {**wire.get("_meta", {}), mcp_tasks.RELATED_TASK: {"taskId": params.task_id}}}

    async def listed(self, ctx: Any) -> dict[tuple[float, str], Callable[[], types.Task | None]]:
        """This machine's detached jobs of the caller's tenant, and its tenant's queued crafts: those queued or
        running, and those that ended within a task's default ttl."""
        listed = await super().listed(ctx)
        for row in await _asked(lambda: self.front.job_rows(ctx)):
            task = task_of(row)
            listed[(row["created"].timestamp(), task.task_id)] = lambda task=task: task  # type: ignore[misc]
        return listed

    def listable(self, task_id: str) -> bool:
        return super().listable(task_id) or job_number(task_id) is not None

    async def cancel(self, ctx: Any, params: types.CancelTaskRequestParams) -> types.CancelTaskResult:
        if job_number(params.task_id) is None:
            return await super().cancel(ctx, params)
        mcp_tasks.offered(ctx)
        number = job_number(params.task_id)
        assert number is not None
        row = await _asked(lambda: self.front.cancel_job(ctx, number))
        if row is None:  # another tenant's job, or one the caller does not follow: as any unknown task
            raise mcp_tasks.no_task(params.task_id)
        task = task_of(row)
        if row.get("unchanged") and task.status in mcp_tasks.TERMINAL:  # the spec: a terminal task's cancel is -32602
            raise mcp_tasks.terminal(task)
        return types.CancelTaskResult(**task.model_dump())

    async def _row(self, ctx: Any, task_id: str) -> tuple[dict[str, Any], types.Task]:
        number = job_number(task_id)
        row = None
        if number is not None:
            row = await _asked(lambda: self.front.job_row(ctx, number))
        if row is None:
            raise mcp_tasks.no_task(task_id)
        return row, task_of(row)


async def _asked(read: Callable[[], Any]) -> Any:
    """What a tasks/* request reads from the queue, in a thread; flakebot's own error (the database away) a JSON-RPC
    error in one line with its fix, not the SDK's code 0 with the message alone and a traceback in the log."""
    try:
        return await anyio.to_thread.run_sync(read)
    except FlakebotError as exc:
        logger.warning("a task's request not answered: %s", exc.one_line())
        raise MCPError(types.INTERNAL_ERROR, exc.one_line()) from None


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
