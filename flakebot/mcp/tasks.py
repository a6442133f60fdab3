"""MCP tasks (spec 2025-11-25) for the MCP server's long tools, kept in their detached jobs' files.

A tools/call of craft, improve, package or resume with a `task` param starts the work as a detached job (the server's
start_job: a process of its own session, its events then its result in the state directory's mcp-jobs/ID.jsonl) and
is answered at once with a CreateTaskResult whose taskId is ID. ID.task.json beside it records the task: the tool,
the job's process id, when it was created, its ttl and whether it was cancelled. Everything else is read from those
files, so any `flakebot mcp` of the same user answers tasks/get, tasks/result, tasks/list and tasks/cancel for a
task another one created (LangChain's adapters start a server per call). The files are the user's own, so a task
is as private as the state directory; its id carries 64 random bits besides. Under `flakebot serve` a task answers
only the token that started it (the record's owner, server.task_owner), within its tenant (the server's `may_see`):
another's is "no task", as an unknown one, and tasks/list leaves it out. The front's subclass
(flakebot.mcp.queued.QueueTasks) also answers the crafts it queued, from their rows, to the tenant's agents.

Status: working while the job's process runs (its pid with the start time the record keeps, pipeline.jobs: a pid
given to another process since is not the job) and its journal has no result; completed once the journal ends with a
result, failed once it ends with flakebot's error (the call's isError result) or the process is gone without
either; cancelled once tasks/cancel marked it. Cancelling sends SIGTERM to the job's process group (a flakebot run
takes it as Ctrl-C: the stage and run are marked interrupted, and `resume` continues it), then SIGKILL to what is
left after CANCEL_GRACE seconds. tasks/result waits for a terminal status (at most task_result_wait seconds, then a
REQUEST_TIMEOUT error saying the status and how to ask again) and returns the CallToolResult the call would have
returned had it waited. ttl: as asked, at most MAX_TTL_MS, DEFAULT_TTL_MS if not; a task whose ttl has
passed is forgotten once it is terminal (its journal stays). Tasks are offered on protocol 2025-11-25 only: the
2026-07-28 revision moved them out of the core protocol, and older revisions have none. Neither
notifications/tasks/status nor progress for a task is sent (both optional): a host polls tasks/get, whose
statusMessage is the job's latest progress line.

The SDK's low-level server has the task types but no task handling, and it checks a tools/call result against
CallToolResult, so a middleware routes a task-augmented tools/call to a method of its own (CALL_AS_TASK) and adds
the `tasks` capability to an initialize result of protocol 2025-11-25.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import methods

from flakebot import config, processid
from flakebot.errors import FlakebotError
from flakebot.fsutil import atomic_write_json  # another server may read a record at any moment
from flakebot.pipeline import jobs

logger = logging.getLogger(__name__)

TASKS_PROTOCOL = "2025-11-25"
REFUSED = types.INVALID_REQUEST  # the JSON-RPC code of a task call refused before any work (quota, concurrent jobs)
CAPABILITY: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
CALL_AS_TASK = "flakebot/tools/call-as-task"  # where the middleware sends a task-augmented tools/call
RELATED_TASK = "io.modelcontextprotocol/related-task"
IMMEDIATE_RESPONSE = "io.modelcontextprotocol/model-immediate-response"
POLL_INTERVAL_MS = 2000
DEFAULT_TTL_MS = 24 * 3600 * 1000
MAX_TTL_MS = 30 * 24 * 3600 * 1000
PAGE_SIZE = 50  # tasks per tasks/list page
CANCEL_GRACE = 10.0  # seconds between SIGTERM and SIGKILL of a cancelled job's process group
TASK_ID = re.compile(r"\d{8}-\d{6}-\d+-[0-9a-f]+")  # a journal's name (server._journal_path)
TERMINAL = ("completed", "failed", "cancelled")


class Jobs(Protocol):
    """What tasks need of the server (server.FlakebotMCP): its detached jobs."""

    def settings(self) -> config.Settings:
        """The settings (task_result_wait)."""

    def job_directory(self) -> Path:
        """Where the jobs' journals are."""

    def start_job(self, ctx: Any, name: str, args: dict[str, Any]) -> tuple[subprocess.Popen[bytes], Path]:
        """Start a long tool's work detached; its process and journal."""

    def task_owner(self, ctx: Any) -> str | None:
        """Whose tasks the request `ctx` may see: None, every task of this user (stdio); under `flakebot serve`, the
        caller's token (a task answers only the token that started it)."""

    def journal(self, journal: Path) -> list[dict[str, Any]]:
        """A journal's lines: events, then {result} or {error}."""

    def status_line(self, line: dict[str, Any]) -> str | None:
        """An event line as one line of progress, if it has one."""

    def call_result(self, line: dict[str, Any]) -> Any:
        """The CallToolResult the call answered, from its journal's last line."""

    def may_see(self, ctx: Any, task_id: str) -> bool:
        """Whether the caller may see this task (the team front: only its tenant's)."""


def install(server: Any, jobs: Jobs, long_tools: Mapping[str, bool], kind: type[Tasks] | None = None) -> None:
    """Offer tasks for `long_tools` on an SDK low-level Server: the middleware and the tasks/* handlers (`kind`'s:
    Tasks, or a subclass)."""
    tasks = (kind or Tasks)(jobs, set(long_tools))
    server.middleware.append(tasks.route)
    server.add_request_handler(CALL_AS_TASK, types.CallToolRequestParams, tasks.call)
    server.add_request_handler("tasks/get", types.GetTaskRequestParams, tasks.get)
    server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, tasks.result)
    server.add_request_handler("tasks/list", types.PaginatedRequestParams, tasks.list_tasks)
    server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, tasks.cancel)


def execution(ctx: Any, name: str, long_tools: Mapping[str, bool]) -> types.ToolExecution | None:
    """A tool's `execution` in tools/list: the long tools may run as tasks (on the protocol that has them)."""
    if name in long_tools and ctx.protocol_version == TASKS_PROTOCOL:
        return types.ToolExecution(task_support="optional")
    return None


@dataclasses.dataclass
class TaskView:
    """A task as its files show it now."""

    task: types.Task
    outcome: dict[str, Any] | None  # the journal's last line once it is {result} or {error}


class Tasks:
    """The task handlers; every answer is read from the jobs' files (ID.task.json, ID.jsonl)."""

    def __init__(self, jobs: Jobs, long_tools: set[str]) -> None:
        self.jobs = jobs
        self.long_tools = long_tools
        self.processes: dict[str, subprocess.Popen[bytes]] = {}  # jobs this server started: it reaps them

    async def route(self, ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
        """Server middleware: the capability on initialize, and task-augmented tools/call to CALL_AS_TASK."""
        task = (ctx.params or {}).get("task")  # {} (no ttl) asks for a task too
        if ctx.method == "tools/call" and ctx.protocol_version == TASKS_PROTOCOL and task is not None:
            return await call_next(dataclasses.replace(ctx, method=CALL_AS_TASK))
        result = await call_next(ctx)
        if ctx.method == "initialize" and isinstance(result, dict) and result.get("protocolVersion") == TASKS_PROTOCOL:
            result = {**result, "capabilities": {**result.get("capabilities", {}), "tasks": CAPABILITY}}
        return result

    async def call(self, ctx: Any, params: types.CallToolRequestParams) -> types.CreateTaskResult:
        offered(ctx)
        if params.name not in self.long_tools:
            raise MCPError(
                types.METHOD_NOT_FOUND,
                f"tool '{params.name}' does not run as a task: call it without `task` "
                f"(tasks are for {', '.join(sorted(self.long_tools))})",
            )
        asked = params.task.ttl if params.task is not None else None
        ttl = min(asked, MAX_TTL_MS) if asked is not None and asked > 0 else DEFAULT_TTL_MS
        try:
            process, journal = self.jobs.start_job(ctx, params.name, dict(params.arguments or {}))
        except jobs.JobLimit as exc:  # nothing started, nothing written
            raise MCPError(REFUSED, exc.one_line()) from None
        except FlakebotError as exc:  # arguments the tool refuses (its schema, its check): nothing started either
            raise MCPError(types.INVALID_PARAMS, exc.one_line()) from None
        task_id = journal.stem
        self.processes[task_id] = process
        record = {"format": 1, "tool": params.name, "pid": process.pid, "created": time.time(), "ttl": ttl}
        record["owner"] = self.jobs.task_owner(ctx)
        record["start_time"] = processid.start_time(process.pid)  # the job's identity: its pid may be another's later
        atomic_write_json(self._record_path(task_id), record)
        logger.info("task %s: %s in process %d", task_id, params.name, process.pid)
        text = f"{params.name} runs as task {task_id}; its result comes when the task completes"
        return types.CreateTaskResult(task=self._known(task_id, ctx).task, _meta={IMMEDIATE_RESPONSE: text})

    async def get(self, ctx: Any, params: types.GetTaskRequestParams) -> types.GetTaskResult:
        offered(ctx)
        return types.GetTaskResult(**self._known(params.task_id, ctx).task.model_dump())

    async def result(self, ctx: Any, params: types.GetTaskPayloadRequestParams) -> Any:
        """The call's own result once the task is terminal (waiting till then, at most task_result_wait seconds), with
        the related-task _meta."""
        offered(ctx)
        view = self._known(params.task_id, ctx)
        wait = jobs.bounded(self.jobs.settings(), "task_result_wait", 1, 3600)
        deadline = time.monotonic() + wait
        while view.task.status not in TERMINAL:
            if time.monotonic() >= deadline:
                raise MCPError(types.REQUEST_TIMEOUT, still_running(view.task, wait))
            await anyio.sleep(0.25)
            view = self._known(params.task_id, ctx)
        outcome = view.outcome or {"error": self._lost(params.task_id, view.task.status).result()}
        result = self.jobs.call_result(outcome).model_dump(by_alias=True, mode="json", exclude_none=True)
        wire = methods.serialize_server_result("tools/call", ctx.protocol_version, result)  # as tools/call sends it
        return {**wire, "_meta": {**wire.get("_meta", {}), RELATED_TASK: {"taskId": params.task_id}}}

    async def list_tasks(self, ctx: Any, params: types.PaginatedRequestParams) -> types.ListTasksResult:
        """The caller's tasks, newest first, PAGE_SIZE at a time; a cursor is where the previous page ended."""
        offered(ctx)
        after = self.cursor_key(params.cursor) if params.cursor is not None else None
        listed = await self.listed(ctx)
        keys = [key for key in sorted(listed, reverse=True) if after is None or key < after]
        page: list[types.Task] = []
        for key in keys:
            task = listed[key]()
            if task is not None:
                page.append(task)
            if len(page) == PAGE_SIZE:
                break
        more = len(page) == PAGE_SIZE and key != keys[-1]
        return types.ListTasksResult(tasks=page, next_cursor=f"{key[0]!r} {key[1]}" if more else None)

    async def listed(self, ctx: Any) -> dict[tuple[float, str], Callable[[], types.Task | None]]:
        """Each task the caller may see, by how tasks/list orders it (when it was created, then its id), with how to
        read it (None once it expired)."""

        owner = self.jobs.task_owner(ctx)

        def reader(task_id: str) -> Callable[[], types.Task | None]:
            return lambda: view.task if (view := self._view(task_id, owner)) is not None else None

        keys = (key for key in map(_record_key, self._records()) if key is not None)
        return {key: reader(key[1]) for key in keys if self.jobs.may_see(ctx, key[1])}

    def cursor_key(self, cursor: str) -> tuple[float, str]:
        """Where a tasks/list cursor says the previous page ended."""
        created, _, task_id = cursor.partition(" ")
        try:
            if self.listable(task_id):
                return float(created), task_id
        except ValueError:
            pass
        raise MCPError(types.INVALID_PARAMS, f"invalid cursor {cursor!r}: pass the nextCursor tasks/list answered")

    def listable(self, task_id: str) -> bool:
        """Whether `task_id` has the shape of a task id tasks/list gives."""
        return TASK_ID.fullmatch(task_id) is not None

    async def cancel(self, ctx: Any, params: types.CancelTaskRequestParams) -> types.CancelTaskResult:
        """Mark the task cancelled, then end its job's process group (SIGTERM: the run is interrupted)."""
        offered(ctx)
        view = self._known(params.task_id, ctx)
        if view.task.status in TERMINAL:
            raise terminal(view.task)
        path = self._record_path(params.task_id)
        record = _read_record(path) or {}
        atomic_write_json(path, {**record, "cancelled": time.time()})
        await self._end_group(params.task_id, record)
        return types.CancelTaskResult(**self._known(params.task_id, ctx).task.model_dump())

    # ------------------------------------------------------------ reading a task from its files

    def _record_path(self, task_id: str) -> Path:
        return self.jobs.job_directory() / f"{task_id}.task.json"

    def _records(self) -> list[Path]:
        directory = self.jobs.job_directory()
        return list(directory.glob("*.task.json")) if directory.is_dir() else []

    def _known(self, task_id: str, ctx: Any) -> TaskView:
        """The task, or the one "no task" error whether it is unknown, expired, or another token's or tenant's."""
        seen = TASK_ID.fullmatch(task_id) and self.jobs.may_see(ctx, task_id)
        view = self._view(task_id, self.jobs.task_owner(ctx)) if seen else None
        if view is None:
            raise no_task(task_id)
        return view

    def _view(self, task_id: str, owner: str | None) -> TaskView | None:
        """The task now, or None if there is none, it is another owner's (`owner` None: any owner's), or it expired
        (then its record goes)."""
        path = self._record_path(task_id)
        record = _read_record(path)
        if record is None or (owner is not None and record.get("owner") != owner):
            return None
        journal = path.with_name(f"{task_id}.jsonl")
        self._reap(task_id)
        alive = _job_alive(record, journal)  # before reading: a job that just ended wrote its result
        lines = self.jobs.journal(journal)
        outcome = lines[-1] if lines and ("result" in lines[-1] or "error" in lines[-1]) else None
        status: types.TaskStatus
        if record.get("cancelled"):
            status = "cancelled"
        elif outcome is not None:
            status = "failed" if "error" in outcome else "completed"
        else:
            status = "working" if alive else "failed"
        created, ttl = float(record["created"]), int(record["ttl"])
        if status in TERMINAL and time.time() > created + ttl / 1000:
            path.unlink(missing_ok=True)
            return None
        updated = max([created, *(p.stat().st_mtime for p in (path, journal) if p.exists())])
        task = types.Task(
            task_id=task_id,
            status=status,
            status_message=self._message(task_id, status, lines, outcome),
            created_at=_iso(created),
            last_updated_at=_iso(updated),
            ttl=ttl,
            poll_interval=POLL_INTERVAL_MS,
        )
        return TaskView(task, outcome)

    def _message(self, task_id: str, status: str, lines: list[dict[str, Any]], outcome: dict[str, Any] | None) -> str:
        error = outcome.get("error") if outcome is not None else None
        if status == "cancelled":
            return f"cancelled: {_error_line(error)}" if error else "cancelled"
        if status == "failed":
            return _error_line(error) if error else self._lost(task_id, status).one_line()
        latest = next((m for m in map(self.jobs.status_line, reversed(lines)) if m), None)
        return latest or ("done" if status == "completed" else "starting")

    def _lost(self, task_id: str, status: str) -> FlakebotError:
        """The error of a job that ended without a result: killed, or cancelled before its run began."""
        log = self.jobs.job_directory() / f"{task_id}.log"
        if status == "cancelled":
            return FlakebotError(f"task {task_id} was cancelled before it finished", fix="start it again")
        return FlakebotError(f"the process of task {task_id} ended before it finished", fix=f"see {log}")

    # ------------------------------------------------------------ ending a cancelled job

    def _reap(self, task_id: str) -> None:
        process = self.processes.get(task_id)
        if process is not None and process.poll() is not None:
            del self.processes[task_id]

    async def _end_group(self, task_id: str, record: dict[str, Any]) -> None:
        """SIGTERM the job's process group, SIGKILL it if anything of it is left after CANCEL_GRACE seconds."""
        journal = self.jobs.job_directory() / f"{task_id}.jsonl"
        pid = record.get("pid")
        if not isinstance(pid, int) or not _job_alive(record, journal):
            return  # ended already (the id may be another process's by now)
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + CANCEL_GRACE
        while _group_exists(pid) and time.monotonic() < deadline:
            self._reap(task_id)
            await anyio.sleep(0.1)
        if _group_exists(pid):
            logger.warning("task %s: its process group %d outlived SIGTERM; killing it", task_id, pid)
            _signal_group(pid, signal.SIGKILL)
        for _ in range(100):  # no zombie left behind by the server that started it
            self._reap(task_id)
            if task_id not in self.processes:
                break
            await anyio.sleep(0.05)


def still_running(task: types.Task, waited: float) -> str:
    """tasks/result's answer once task_result_wait passed: where the task is, and how to ask again."""
    return (
        f"task {task.task_id} is still {task.status} after {waited:g} s ({task.status_message}): call tasks/result "
        f"again to wait once more, or poll tasks/get every {task.poll_interval // 1000 if task.poll_interval else 2} s"
    )


def terminal(task: types.Task) -> MCPError:
    """tasks/cancel of a task already terminal, as the spec asks (-32602, nothing changed): the same answer however
    often it is asked, its status said in words and in `data`."""
    return MCPError(
        types.INVALID_PARAMS,
        f"cannot cancel task {task.task_id}: it is already {task.status} (get its result with tasks/result)",
        data={"taskId": task.task_id, "status": task.status},
    )


def no_task(task_id: str) -> MCPError:
    """The one answer for a task that is unknown, expired or another tenant's."""
    return MCPError(
        types.INVALID_PARAMS,
        f"no task {task_id!r} (unknown, or forgotten once its ttl passed): use a taskId that tools/call "
        "or tasks/list returned",
    )


def _error_line(error: dict[str, Any]) -> str:
    """flakebot's error object (FlakebotError.result) as one line."""
    return f"{error.get('error')}. Fix: {error.get('fix')}" if error.get("fix") else str(error.get("error"))


def offered(ctx: Any) -> None:
    if ctx.protocol_version != TASKS_PROTOCOL:
        raise MCPError(
            types.METHOD_NOT_FOUND,
            f"tasks are offered on MCP protocol {TASKS_PROTOCOL} only (this session speaks {ctx.protocol_version})",
        )


def _record_key(path: Path) -> tuple[float, str] | None:
    """How tasks/list orders a task: when it was created, then its id."""
    record = _read_record(path)
    return None if record is None else (float(record.get("created", 0)), path.name.removesuffix(".task.json"))


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        logger.warning("unreadable task record %s", path)
        return None
    return record if isinstance(record, dict) else None


def _job_alive(record: dict[str, Any], journal: Path) -> bool:
    """Whether the record's process is still the job writing `journal`: the same pid and start time (pipeline.jobs),
    not a zombie. A record from before start times were kept: its process's command line must name the journal (a
    kernel thread's is empty)."""
    pid = record.get("pid")
    if "start_time" in record:
        return processid.is_running(pid, record["start_time"])
    if not isinstance(pid, int) or processid.start_time(pid) is None:
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return processid.is_running(pid, processid.start_time(pid)) and os.fsencode(str(journal)) in argv.split(b"\0")


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
