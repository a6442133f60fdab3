"""flakebot as an MCP server (stdio), on the MCP SDK's low-level Server.

Two kinds of tool:
- flakebot's own: every command of the command table with an MCP name (flakebot.commands.table, made into tools by
  flakebot.mcp.tooltable): craft, improve, status, resume, search, list, show, package, runs, run, rm, and the
  service tools service_up (long: a task when asked), service_down, services, service_logs and service_request (one
  HTTP request to that service's own port on 127.0.0.1, flakebot.services.proxy);
- every catalogued tool under its own name, with the input schema read from its clap --help. A call
  maps the arguments to argv (deliver.toolcall, the same mapping as `flakebot run --args-json`), runs
  the built program (a `stdin` argument is its standard input) and returns stdout, stderr and the exit
  code; a non-zero exit sets isError. A stdout past tool_output_limit comes back as its first lines with
  truncated: true and the file holding all of it (the call still succeeded: no isError for that).

Long work (a command declared long: `craft`, `improve`, `package`, `resume`, `service_up`) runs in a process of its own session (run_job), so it goes on
when the client ends its session (LangChain's adapters start a server for every call and kill its process group
after it); its events, with a heartbeat at least every HEARTBEAT_SECONDS while a step is long, are in the state
directory's mcp-jobs/. Each job passes admission first (pipeline.jobs: max_jobs, max_session_jobs; refused past
either, docs/limits.md). A request that carries a progress token is answered when the work is done, each event
relayed as notifications/progress (flakebot.mcp.follow); one without (the OpenAI Agents SDK's, whose requests time
out after 5 s) gets a run handle as soon as the run exists, and follows it with `status` (whose wait_seconds holds
an answer until the run moves on). `wait: true` or `detach: true` overrides either default. Results are compact
(flakebot.deliver.results) and tools carry annotations (flakebot.mcp.hints). On protocol 2025-11-25 the long
tools are also MCP tasks (flakebot.mcp.tasks): a call with a `task` param is answered at once with a task naming
such a detached job, followed with tasks/get and tasks/result. A craft, improve or `rm` that changes the
catalog sends notifications/tools/list_changed. Every result is one JSON object in a text block
(and as structuredContent); a failure is flakebot's error object with isError set.
"""

from __future__ import annotations

import collections
import gc
import importlib
import importlib.util
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from flakebot import __version__, api, config, launcher, preflight
from flakebot.commands.table import Command
from flakebot.deliver.results import compact_result
from flakebot.errors import FlakebotError, UsageError
from flakebot.events import Event, EventSink
from flakebot.mcp import earlylist, listing, tooltable
from flakebot.mcp import start as mcp_start
from flakebot.mcp.follow import MAX_WAIT_SECONDS, follow_job
from flakebot.mcp.hints import tool_annotations
from flakebot.mcp.start import Opening
from flakebot.modeltext import one_line
from flakebot.pipeline import jobs
from flakebot.pipeline.heartbeat import with_heartbeat
from flakebot.redact import RedactFilter
from flakebot.validation import check_arguments

logger = logging.getLogger(__name__)

INSTRUCTIONS = (
    "flakebot crafts tested command-line tools from a need in plain words. Every tool it has crafted is listed "
    "here as a tool of its own: call it with the arguments its schema names (and `stdin`). `craft` makes a new "
    "one (minutes: it edits, tests and builds a Rust crate). Unless the request asked for progress, `craft`, `improve`, "
    "`package` and `resume` answer at once with a run handle {run_id, status: running, follow}: call `status` with "
    "that run_id (wait_seconds holds each answer until the run moves on) until its status is succeeded (the result is "
    "in it) or failed; when the host runs "
    "them as MCP tasks, the task brings the result instead. `list` and `show` describe the catalog; `runs`, `status` "
    "and `resume` follow crafts. Services (long-running programs flakebot catalogued) start with `service_up` "
    "(it answers with their port once healthy), answer `service_request` (flakebot forwards the request to that "
    "service's port: no network of your own is needed), and stop with `service_down`."
)


FOLLOW = (
    f"call status with run_id and wait_seconds (up to {MAX_WAIT_SECONDS:.0f}, below your client's request timeout) "
    "until status is succeeded (the result is in it) or failed"
)


TABLE_TOOLS = tooltable.table_tools()  # flakebot's own tools: the command table's (mcp/tooltable.py), by tool name
# each own tool's description and strict input schema (deliver/schema.py), in the order clients list them
OWN_TOOLS = {name: (tooltable.description(c), tooltable.input_schema(c)) for name, c in TABLE_TOOLS.items()}
# What a tool accepts beyond its declared schema, as its description says: `run`'s args as one string, split as a
# shell would (the declared schema stays an array, the form every client can send).
ACCEPTED = {
    "run": {
        **OWN_TOOLS["run"][1],
        "properties": {
            **OWN_TOOLS["run"][1]["properties"],
            "args": {**OWN_TOOLS["run"][1]["properties"]["args"], "type": ["array", "string", "null"]},
        },
    }
}


class FlakebotMCP:
    """The server's state: settings, and the task group holding what outlives a request (watching detached work)."""

    def __init__(self, settings: config.Settings | None = None, grant_roots: list[str] | None = None) -> None:
        self._settings = settings
        self.jobs: anyio.abc.TaskGroup | None = None
        self.session = f"{os.getpid()}-{secrets.token_hex(4)}"  # what max_session_jobs counts by (pipeline.jobs)
        # Where the user started the server, once: every tool call runs here and relative grant roots start here.
        self.start = Path.cwd().resolve()
        self.grant_roots = list(grant_roots or [])  # the user's --grant-root; no call can add one
        self._forms: dict[Path, listing.WireForms] = {}  # per catalog: each crafted tool's entry, made once
        self._threads: dict[str, anyio.CapacityLimiter] = {}  # each table command's own worker threads
        self._crafted_schemas: dict[str, Any] = {}  # each crafted tool's inputSchema as the last tools/list sent it

    def task_handlers(self) -> Any:
        """The class answering tasks/* (flakebot.mcp.tasks.Tasks; the team front's also answers queued jobs)."""
        from flakebot.mcp.tasks import Tasks

        return Tasks

    def job_owner(self, ctx: Any) -> tuple[str, jobs.Limits]:
        """Whom a long job started by this request counts against, and the caps: over stdio, this server's session
        (max_session_jobs); the team front (mcp/front.py) counts by token."""
        return self.session, jobs.Limits.of(self.settings())

    def task_owner(self, ctx: Any) -> str | None:
        """Whose tasks a request may see: over stdio every task of this user (None); the team front narrows it."""
        return None

    def settings(self, ctx: Any = None) -> config.Settings:
        """The settings a call works with; `ctx`, the request they are for, matters to the team front only (its
        caller's tenant picks the catalog), so every call that reads or writes the catalog passes it."""
        from flakebot.deliver.grants import widened

        return widened(self._settings or config.load(), self.grant_roots)

    def server(self) -> Any:
        from mcp.server.lowlevel import Server

        from flakebot.mcp import tasks as mcp_tasks

        server = Server(
            "flakebot",
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            get_tool_input_schema=self.tool_input_schema,
        )
        mcp_tasks.install(server, self, LONG_TOOLS, self.task_handlers())
        server.middleware.insert(0, _call_shape)
        server.middleware += [_list_without_collector, listing.add_crafted]
        return server

    def tool_input_schema(self, name: str) -> dict[str, Any] | None:
        """The inputSchema tools/list gives `name`, for the SDK's check of a stateless tools/call's Mcp-Param headers:
        without it the SDK ran a whole tools/list (the catalog read, an audit line for a list nobody asked for) before
        every such call, half of a `show`'s time over the team front under load (yappi). Flakebot's own tools have
        their declared schema; a crafted tool the one the last tools/list of this server sent (None, as when the SDK's
        listing does not name the tool, until then: the SDK then skips the headers' check, which it also does for a
        schema with no x-mcp-header, and flakebot's schemas declare none)."""
        own = OWN_TOOLS.get(name)
        return own[1] if own is not None else self._crafted_schemas.get(name)

    async def list_tools(self, ctx: Any, params: Any) -> Any:
        import mcp_types as types

        from flakebot.deliver.catalog import Catalog
        from flakebot.deliver.definitions import stamped_definitions
        from flakebot.mcp.tasks import execution

        own = [
            types.Tool(
                name=name,
                description=text,
                input_schema=schema,
                execution=execution(ctx, name, LONG_TOOLS),
                annotations=types.ToolAnnotations.model_validate(tool_annotations(name)),
            )
            for name, (text, schema) in OWN_TOOLS.items()
        ]
        catalog = Catalog.open(self.settings(ctx))
        stamped = await anyio.to_thread.run_sync(lambda: stamped_definitions(catalog))
        crafted = [d for _, d in stamped.values() if d is not None]
        shadowed = [d["name"] for d in crafted if d["name"] in OWN_TOOLS]
        if shadowed:  # still callable through `run`
            logger.warning("catalogued tools named like flakebot's own are not listed: %s", ", ".join(shadowed))
        listed = [d for d in crafted if d["name"] not in OWN_TOOLS]
        # the last list's schemas, whichever tenant's catalog it was: only the SDK's check of Mcp-Param headers reads
        # them, and no flakebot schema declares one (x-mcp-header)
        self._crafted_schemas = {d["name"]: d["inputSchema"] for d in listed}
        forms = self._forms.setdefault(catalog.root, listing.WireForms()).forms(listed, ctx.protocol_version)
        stamps = {name: stamp for name, (stamp, _) in stamped.items()}
        if listing.put_aside(forms, stamps):  # sent as made (mcp/listing.py)
            return types.ListToolsResult(tools=own)
        return types.ListToolsResult(tools=own + [listing.tool(d) for d in listed])

    async def call_tool(self, ctx: Any, params: Any) -> Any:
        arguments = dict(params.arguments or {})
        try:
            if params.name in OWN_TOOLS:
                _check_own(params.name, arguments)
                command = TABLE_TOOLS.get(params.name)
                if command is not None:
                    payload = await self._call_command(ctx, command, arguments)
                else:
                    payload = await getattr(self, f"_tool_{params.name}")(ctx, arguments)
                return _result(payload, error=payload.get("ok") is False)  # `run` of a tool that failed
            call = await anyio.to_thread.run_sync(
                lambda: api.call_tool(params.name, arguments, self.settings(ctx), cwd=self.start)
            )
        except FlakebotError as exc:
            return _result({"ok": False, **exc.result()}, error=True)
        return _result(call.to_dict(), error=call.exit_code != 0)

    # ------------------------------------------------------------ flakebot's own tools

    # ------------------------------------------------------------ the command table's tools (mcp/tooltable.py)

    async def _call_command(self, ctx: Any, command: Command, args: dict[str, Any]) -> dict[str, Any]:
        if command.long:
            return await self._long(ctx, command.mcp or command.name, args, changes_catalog=command.changes_catalog)
        settings, arguments = self.settings(ctx), tooltable.arguments(command, args)
        command.call_check(arguments, settings=settings, agent=True)
        result = await anyio.to_thread.run_sync(
            lambda: command.call(arguments, settings=settings, agent=True, cwd=self.start),
            limiter=self._limiter(command),
        )
        if command.changes_catalog:
            await self.tools_changed(ctx)
        return {"ok": True, **_for_agent(command, result)}

    def _limiter(self, command: Command) -> anyio.CapacityLimiter:
        """The worker threads `command`'s calls run in, its own: calls that hold their answer (status's wait_seconds,
        up to 50 s each) or run a tool never take the threads every other call (tools/list, list) needs."""
        if command.name not in self._threads:
            self._threads[command.name] = anyio.CapacityLimiter(THREADS_PER_COMMAND)
        return self._threads[command.name]

    def checked_arguments(self, command: Command, args: dict[str, Any], ctx: Any = None) -> dict[str, Any]:
        """A command's arguments made from a call's (its schema checked before: validation.py) and checked by the
        command's own check: what its work runs with, or what the team front queues."""
        arguments = tooltable.arguments(command, args)
        if command.check is not None:
            command.call_check(arguments, settings=self.settings(ctx), agent=True)
        return arguments

    def _command_work(self, command: Command, args: dict[str, Any], ctx: Any = None) -> Work:
        """A long command's work as a function of the run's event sink: its arguments made (and checked by its
        own check) before anything starts."""
        settings, arguments = self.settings(ctx), self.checked_arguments(command, args, ctx)
        return lambda sink: _for_agent(command, command.call(arguments, settings=settings, sink=sink, agent=True))

    # ------------------------------------------------------------ long work

    async def _long(self, ctx: Any, name: str, args: dict[str, Any], *, changes_catalog: bool) -> dict[str, Any]:
        """Long work: to its end in a worker thread with progress notifications, or (wait=False) in a process of its
        own, answered as soon as its run exists (the run goes on when this client's session ends)."""
        self.work(name, args, ctx)  # the arguments are checked here, before anything starts
        if not _wait(ctx, args):
            return await self._detached(ctx, name, args, changes_catalog)
        return await self._followed(ctx, name, args, changes_catalog)

    async def _followed(self, ctx: Any, name: str, args: dict[str, Any], changes_catalog: bool) -> dict[str, Any]:
        """The work in a process of its own session (as _detached), its journal relayed as progress notifications
        (heartbeats included) until its result: a client that goes away leaves it running, not a run marked running
        whose process is gone."""
        process, journal = self._start(ctx, name, args)  # JobLimit: call_tool answers it
        count = 0

        async def report(line: dict[str, Any]) -> None:
            nonlocal count
            message = self.status_line(line)
            if message:
                count += 1
                await ctx.session.report_progress(float(count), None, message)

        last = await follow_job(process, journal, report)
        known = last or _job_died(name, process.returncode, journal)
        if "error" in known:
            return {"ok": False, **known["error"]}
        if changes_catalog and _catalogued(known["result"]):
            await self.tools_changed(ctx)
        return {"ok": True, **compact_result(known["result"])}

    async def _detached(self, ctx: Any, name: str, args: dict[str, Any], changes_catalog: bool) -> dict[str, Any]:
        """Start the work in a process of its own session (a client that ends its session kills the server's process
        group: LangChain's adapters start a server per call) and answer once its run exists, or it ended first."""
        process, journal = self._start(ctx, name, args)  # JobLimit: call_tool answers it
        deadline = time.monotonic() + jobs.bounded(self.settings(), "task_result_wait", 1, 3600)
        while True:
            known = _journal_reading(journal)
            if known is not None or process.poll() is not None:
                break
            if time.monotonic() > deadline:  # a run exists within a second or two: this job is stuck
                return {"ok": False, **_stop_unstarted(name, process, journal).result()}
            await anyio.sleep(0.05)
        known = known or _journal_reading(journal) or _job_died(name, process.returncode, journal)
        if "run_id" in known:
            if changes_catalog and self.jobs is not None:
                self.jobs.start_soon(self._notify_when_done, ctx, process, journal)
            return {"ok": True, "run_id": known["run_id"], "status": "running", "follow": FOLLOW}
        if "error" in known:
            return {"ok": False, **known["error"]}
        if changes_catalog and _catalogued(known["result"]):
            await self.tools_changed(ctx)
        return {"ok": True, **compact_result(known["result"])}

    def work(self, name: str, args: dict[str, Any], ctx: Any = None) -> Work:
        """Long tool `name`'s work for these arguments (for the request `ctx`), checked before anything starts."""
        command = TABLE_TOOLS.get(name)
        if command is not None:
            return self._command_work(command, args, ctx)
        return getattr(self, f"_work_{name}")(args)  # type: ignore[no-any-return]

    # What flakebot.mcp.tasks needs of the detached jobs (its Jobs protocol).

    def job_directory(self) -> Path:
        return _job_directory(self.settings())

    def start_job(self, ctx: Any, name: str, args: dict[str, Any]) -> tuple[subprocess.Popen[bytes], Path]:
        _check_own(name, args)  # the tasks door (mcp_tasks) takes the same check as call_tool, before any job
        if name in TABLE_TOOLS:  # a table command's check too (as _long runs it), before admission
            self.work(name, args, ctx)
        process, journal = self._start(ctx, name, args)
        if LONG_TOOLS[name] and self.jobs is not None:
            self.jobs.start_soon(self._notify_when_done, ctx, process, journal)
        return process, journal

    def _start(self, ctx: Any, name: str, args: dict[str, Any]) -> tuple[subprocess.Popen[bytes], Path]:
        process, journal = _start_job(self.settings(ctx), name, args, self.job_owner(ctx))
        self.job_started(ctx, journal)
        return process, journal

    def job_started(self, ctx: Any, journal: Path) -> None:
        """A detached job of this request started (the team front records whose it is)."""

    async def tools_changed(self, ctx: Any) -> None:
        """The catalog `ctx`'s call reads changed: tell its session (the team front tells every session of the
        caller's tenant)."""
        await _tools_changed(ctx)

    def may_see(self, ctx: Any, task_id: str) -> bool:
        """Whether the caller of `ctx` may see a detached job's task: over stdio, the user sees all of theirs."""
        return True

    def journal(self, journal: Path) -> list[dict[str, Any]]:
        return _journal_lines(journal)

    def status_line(self, line: dict[str, Any]) -> str | None:
        """A journal's event line as its progress message (None for a line that has none)."""
        parts = (line.get("event"), line.get("run_id"), line.get("stage"), line.get("message"), line.get("data"))
        kind, run_id, stage, message, data = parts
        return progress_message(Event(str(kind), str(run_id or ""), stage, str(message or ""), dict(data or {})))

    def call_result(self, line: dict[str, Any]) -> Any:
        """The CallToolResult a long call answered when it was done: its journal's last line, {result} or {error}."""
        if "error" in line:
            return _result({"ok": False, **line["error"]}, error=True)
        return _result({"ok": True, **compact_result(line["result"])})

    async def _notify_when_done(self, ctx: Any, process: subprocess.Popen[bytes], journal: Path) -> None:
        """tools/list_changed when a detached craft, improve or package catalogued its tool (while this session lasts): its
        journal's last line is its result as soon as the work returns."""
        while True:
            last = _journal_lines(journal)[-1:]
            if (last and ("result" in last[0] or "error" in last[0])) or process.poll() is not None:
                break
            await anyio.sleep(0.1)
        last = _journal_lines(journal)[-1:]
        if last and _catalogued(last[0].get("result") or {}):
            await self.tools_changed(ctx)


Work = Callable[[EventSink], dict[str, Any]]
# The long tools (their work can run detached, or as MCP tasks), and whether each changes the catalog.
LONG_TOOLS = {name: command.changes_catalog for name, command in TABLE_TOOLS.items() if command.long}


def _for_agent(command: Command, result: Any) -> dict[str, Any]:
    """A command's result as an agent gets it: its data, compacted as the command says."""
    data = command.data(result)
    return command.agent(data) if command.agent is not None else data


THREADS_PER_COMMAND = 64  # one command's calls at once over MCP; past it, its calls wait for a thread of its own

JOB_ARGUMENTS_LIMIT = 64 * 1024  # bytes of JSON: a long tool's arguments travel to its job on a command line


def _check_own(name: str, arguments: dict[str, Any]) -> None:
    """An own tool's arguments against the schema it declares (validation.py), whichever door the call came by."""
    check_arguments(name, arguments, ACCEPTED.get(name, OWN_TOOLS[name][1]))


def _check_job_arguments(name: str, args: dict[str, Any]) -> None:
    """A long tool's arguments fit a command line, and its need or request is text a model can take."""
    size = len(json.dumps(args).encode())
    if size > JOB_ARGUMENTS_LIMIT:
        raise UsageError(
            f"{name}'s arguments are {size:,} bytes, more than {JOB_ARGUMENTS_LIMIT:,}",
            fix="say the need in fewer words; put long examples in a spec file the CLI reads (--spec)",
        )
    for key, kind in (("need", "need"), ("request", "improvement")):
        if isinstance(args.get(key), str):
            preflight.check_text(kind, args[key], example=f'{{"{key}": "need a CSV deduper"}}')


def _start_job(
    settings: config.Settings, name: str, args: dict[str, Any], owner: tuple[str, jobs.Limits]
) -> tuple[subprocess.Popen[bytes], Path]:
    """A long tool's work in a process of its own session (run_job), its journal beside its .log in mcp-jobs/, once
    admission (pipeline.jobs: max_jobs, and the owner's cap: max_session_jobs or a token's) let it start; refused, it
    raises JobLimit."""
    _check_job_arguments(name, args)  # before admission: a refused call leaves no job file
    session, limits = owner
    with jobs.admission(_job_directory(settings), name, session, limits) as admitted:
        journal = _journal_path(settings)
        code = "from flakebot.mcp.server import run_job; run_job(*sys.argv[1:5])"
        # isolated, started in flakebot's empty directory; the work itself is done in the server's (run_job)
        argv = launcher.python_code(code, name, json.dumps(args), str(journal), os.getcwd())
        with open(journal.with_suffix(".log"), "ab") as log:
            process = launcher.popen(
                argv,
                env=launcher.flakebot_env(keys=True, extra={"FLAKEBOT_TENANT": settings.tenant}),  # its catalog
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        admitted.record(journal.stem, process.pid)
    logger.info("%s runs in process %d (its events: %s)", name, process.pid, journal)
    return process, journal


def run_job(name: str, arguments: str, journal: str, workdir: str | None = None) -> None:
    """A detached long tool call's process: the work (in the server's `workdir`, as it would be done in the server;
    flakebot is imported by then, and the isolated interpreter never imports from a cwd), its events as JSON lines
    in `journal`, then its result (or error) as the last line. The run's own state (status, stages) is where every
    run keeps it."""
    if workdir is not None:
        os.chdir(workdir)
    path = Path(journal)
    handler = logging.StreamHandler()  # stderr: the job's .log beside its journal, with secrets redacted
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactFilter())
    logging.getLogger("flakebot").addHandler(handler)

    def write(line: dict[str, Any]) -> None:
        with path.open("a") as out:
            out.write(json.dumps(line, default=str) + "\n")

    try:
        work = FlakebotMCP().work(name, json.loads(arguments))
        write({"result": with_heartbeat(work, lambda event: write(event.to_dict()))})
    except FlakebotError as exc:
        write({"error": exc.result()})
    except Exception:  # noqa: BLE001 - a bug: its traceback goes to the job's log (redacted), the caller gets an error
        logger.exception("the detached %s failed", name)
        failed = FlakebotError(f"the detached {name} failed unexpectedly", fix=f"see {path.with_suffix('.log')}")
        write({"error": failed.result()})


def _job_directory(settings: config.Settings) -> Path:
    return settings.path("workdir") / "mcp-jobs"


def _journal_path(settings: config.Settings) -> Path:
    """A new job's journal; its name (an MCP task's id) has 64 random bits, so an id cannot be guessed."""
    directory = _job_directory(settings)
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(8)}.jsonl"


def _journal_lines(journal: Path) -> list[dict[str, Any]]:
    try:
        text = journal.read_text()
    except FileNotFoundError:
        return []
    lines = []
    for line in text.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:  # the last line, half written
            break
    return lines


def _journal_reading(journal: Path) -> dict[str, Any] | None:
    """What the caller is answered with: the first event naming a run ({run_id}), or the result or error."""
    for line in _journal_lines(journal):
        if line.get("run_id"):
            return {"run_id": line["run_id"]}
        if "result" in line or "error" in line:
            return line
    return None


def _stop_unstarted(name: str, process: subprocess.Popen[bytes], journal: Path) -> FlakebotError:
    """End a detached job that started no run by task_result_wait (nothing of a run to keep), and say so."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    return FlakebotError(
        f"the {name} process started no run within task_result_wait seconds and was stopped",
        fix=f"see {journal.with_suffix('.log')}, then call {name} again",
    )


def _job_died(name: str, code: int | None, journal: Path) -> dict[str, Any]:
    error = FlakebotError(
        f"the {name} process ended (exit code {code}) before it started a run",
        fix=f"see {journal.with_suffix('.log')}",
    )
    return {"error": error.result()}


def _wait(ctx: Any, args: dict[str, Any]) -> bool:
    """Whether to answer when the work is done: `wait: true` says yes, `detach: true` no; else only when the client
    asked for progress (a client that did not may time out long before a craft ends: the Agents SDK's requests time
    out after 5 s). false means absent for both, as for every field: hosts that strip null make a model send it."""
    if args.get("wait") is True and args.get("detach") is True:
        raise UsageError("'wait' and 'detach' are both true", fix="pass at most one of them as true")
    if args.get("wait") is True or args.get("detach") is True:
        return args.get("wait") is True
    return bool(ctx.meta and ctx.meta.get("progress_token") is not None)


def progress_message(event: Event) -> str | None:
    """One line for a client's progress display: the stage, then what happened (edit iterations say passing/failing, tokens, cost)."""
    seconds = event.data.get("seconds")
    texts = {
        "run_started": f"run {event.run_id} started: {' -> '.join(event.data.get('stages', []))}",
        "stage_started": f"{event.stage}: started",
        "stage_skipped": f"{event.stage}: skipped ({event.message})",
        "progress": f"{event.stage}: {event.message}",
        "heartbeat": f"{event.stage or 'run'}: {event.message}",
        "stage_finished": f"{event.stage}: finished"
        + (f" in {seconds:.1f}s" if isinstance(seconds, (int, float)) else ""),
        "stage_failed": f"{event.stage}: failed: {event.message}",
        "run_finished": f"run {event.run_id} {event.data.get('status', 'finished')}",
        "run_failed": f"run {event.run_id} failed",
    }
    text = texts.get(event.kind)
    return None if text is None else one_line(text, 1000)  # messages quote model text (a spec's summary)


def _catalogued(result: dict[str, Any]) -> bool:
    """Whether a long tool's result changed the catalog: a craft or improvement that catalogued its tool, a craft
    that installed one from a shared catalog, or a package with catalog (its entry in `catalog`), however the call
    was answered (waited, detached, a task)."""
    return result.get("status") in ("crafted", "installed", "succeeded") or bool(result.get("catalog"))


async def _tools_changed(ctx: Any) -> None:
    """Tell the client the tool list changed (a tool was crafted or removed)."""
    try:
        await ctx.session.send_tool_list_changed()
    except Exception as exc:  # noqa: BLE001 - the client may be gone; the catalog change stands
        logger.info("could not send tools/list_changed: %s", exc)


async def _threaded(call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    return {"ok": True, **await anyio.to_thread.run_sync(call)}


def _result(payload: dict[str, Any], *, error: bool = False) -> Any:
    import mcp_types as types

    text = json.dumps(payload, default=str)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=json.loads(text), is_error=error
    )


CALL_SHAPE = {"name": (str,), "arguments": (dict, type(None)), "task": (dict, type(None))}


async def _call_shape(ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """A tools/call whose name is no string, or whose arguments or task is no object, said as one line naming which
    (the SDK's own validation answers a bare "Invalid request parameters"); a task's route reads `task` too."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import INVALID_PARAMS

    from flakebot.validation import JSON_TYPES, kind_of

    params = ctx.params if isinstance(ctx.params, dict) else {}
    if ctx.method == "tools/call":
        for key, kinds in CALL_SHAPE.items():
            value = params.get(key)
            if not isinstance(value, kinds) or isinstance(value, bool):
                wanted = JSON_TYPES["string" if key == "name" else "object"]
                fix = "name one of the tools tools/list gives" if key == "name" else f"pass {key} as an object"
                raise MCPError(
                    INVALID_PARAMS, f"tools/call: '{key}' must be {wanted}, got {kind_of(value)}. Fix: {fix}"
                )
        ttl = (params.get("task") or {}).get("ttl")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float))):
            raise MCPError(
                INVALID_PARAMS,
                f"tools/call: 'task.ttl' must be a number (milliseconds), got {kind_of(ttl)}. Fix: pass a number or "
                "leave ttl out",
            )
    return await call_next(ctx)


async def _list_without_collector(ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """tools/list with Python's cyclic garbage collector paused: the SDK validates and dumps every tool's schema
    (with 10,000 tools, millions of short-lived objects), and the collections those allocations set off cost several
    times that work. Reference counting still frees them all: a list makes no cycles."""
    if ctx.method != "tools/list" or not gc.isenabled():
        return await call_next(ctx)
    gc.disable()
    try:
        return await call_next(ctx)
    finally:
        gc.enable()


def load_sdk() -> None:
    """Import the SDK's low-level server and stdio transport without running the `mcp` and `mcp.server` packages'
    __init__: those import the SDK's client, MCPServer and their dependencies (0.3-0.4 s of a 0.7 s start) that a
    stdio server never uses. For the `flakebot mcp` process only (a later `import mcp` there would see the bare
    package); anywhere else, or if the SDK's layout differs, the plain import runs.

    The wire models of every protocol version the SDK speaks (mcp_types._v*) are built when first used rather than
    at import (pydantic's defer_build, set on their shared base before they are defined): a session uses a few of
    hundreds, and building them all was 50-70 ms of the start."""
    if "mcp" in sys.modules:
        return
    _defer_wire_model_builds()
    try:
        for name in ("mcp", "mcp.server"):
            spec = importlib.util.find_spec(name)
            if spec is None or spec.submodule_search_locations is None:
                raise ImportError(name)
            sys.modules[name] = importlib.util.module_from_spec(spec)  # the package's path, its __init__ not run
        importlib.import_module("mcp.server.lowlevel.server")
        importlib.import_module("mcp.server.stdio")
    except ImportError as exc:
        logger.debug("the SDK's modules did not import on their own (%s): importing the whole package", exc)
        for name in [m for m in sys.modules if m == "mcp" or m.startswith("mcp.")]:
            del sys.modules[name]
        importlib.import_module("mcp.server.lowlevel.server")


def _defer_wire_model_builds() -> None:
    try:
        from mcp_types._wire_base import WireModel
    except ImportError:  # another SDK layout: its models build at import, as they always did
        logger.debug("mcp_types._wire_base.WireModel not found: the SDK's wire models build at import")
        return
    WireModel.model_config["defer_build"] = True


def serve(
    settings: config.Settings | None = None, grant_roots: list[str] | None = None, opening: Opening | None = None
) -> None:
    """Serve over stdio until the client disconnects, answering every request read before it did; jobs still running
    then are interrupted (resume them later). `grant_roots`: the user's --grant-root directories, added to the
    grant_roots setting for every call. `opening`: what `flakebot mcp` read (and answered) before the SDK started
    (flakebot.mcp.start); the SDK reads it first."""
    anyio.run(_serve, FlakebotMCP(settings, grant_roots), opening)


async def _serve(state: FlakebotMCP, opening: Opening | None) -> None:
    from mcp.server.lowlevel.server import NotificationOptions
    from mcp.server.stdio import stdio_server

    server = state.server()
    options = server.create_initialization_options(NotificationOptions(tools_changed=True))
    stdin = anyio.wrap_file(mcp_start.replayed_stdin(opening)) if opening is not None else None
    async with stdio_server(stdin=stdin) as (read, write), anyio.create_task_group() as jobs:
        state.jobs = jobs
        unanswered = _Unanswered(opening)
        async with anyio.create_task_group() as relays:  # joined: the last answers are written before jobs end
            answers = await _watch_answers(write, unanswered, relays)
            checked = await _answer_unreadable_lines(read, write, relays, unanswered)
            await server.run(checked, answers, options)
        jobs.cancel_scope.cancel()


class _Unanswered:
    """The requests read and not yet answered (by id), so that the end of input waits for their answers; and the
    opening `initialize` (flakebot.mcp.start), whose answer from the SDK goes to the client only when none was sent
    early."""

    def __init__(self, opening: Opening | None) -> None:
        self.opening = opening if opening is not None and opening.request is not None else None
        self.listed = opening.listed if opening is not None else None  # the tools/list answered early, if any
        self.listed_sent = opening.listed_sent if opening is not None else None
        self.version = str(((opening.sent if opening is not None else None) or {}).get("protocolVersion", ""))
        self.ids: collections.Counter[Any] = collections.Counter()
        self.none = anyio.Event()
        self.none.set()

    def read(self, message: Any) -> None:
        """A message from the client: a request to answer, or the cancellation of one (never answered)."""
        import mcp_types as types
        from mcp.shared.dispatcher import coerce_request_id
        from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params

        if isinstance(message, types.JSONRPCRequest):
            self.ids[coerce_request_id(message.id)] += 1
            self.none = anyio.Event() if self.none.is_set() else self.none
        elif isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
            cancelled = cancelled_request_id_from_params(message.params)  # "7" and 7 are one id, as the SDK has it
            self.ids.pop(None if cancelled is None else coerce_request_id(cancelled), None)
            self._settled()

    def answered(self, message: Any) -> Opening | None:
        """A message to the client; when it answers the opening `initialize`, that opening."""
        import mcp_types as types
        from mcp.shared.dispatcher import coerce_request_id

        if not isinstance(message, (types.JSONRPCResponse, types.JSONRPCError)) or message.id is None:
            return None  # a request or notification of the server's, or an error about an unreadable line
        key = coerce_request_id(message.id)
        if key not in self.ids:
            return None
        self.ids[key] -= 1
        if self.ids[key] <= 0:
            del self.ids[key]
        self._settled()
        opening = self.opening
        if opening is None or opening.request is None or opening.request["id"] != message.id:
            return None
        self.opening = None  # answered once: a later request reusing its id is answered as any other
        return opening

    def early_list(self, message: Any) -> str | None:
        """When `message` answers the tools/list answered early (flakebot.mcp.earlylist), what was sent for it."""
        import mcp_types as types

        listed, sent = self.listed, self.listed_sent
        if listed is None or sent is None or not isinstance(message, (types.JSONRPCResponse, types.JSONRPCError)):
            return None
        if message.id != listed["id"]:
            return None
        self.listed = self.listed_sent = None  # answered once, as the opening initialize
        return sent

    def _settled(self) -> None:
        if not self.ids:
            self.none.set()


async def _watch_answers(write: Any, unanswered: _Unanswered, group: Any) -> Any:
    """The stream the SDK writes to: each message goes on to `write`, counted as an answer; the SDK's answer to an
    `initialize` answered early is checked against it and cached (flakebot.mcp.start.settle), and its answer to a
    tools/list answered early checked against it (flakebot.mcp.earlylist), neither sent twice."""
    sender, receiver = anyio.create_memory_object_stream[Any](0)

    async def relay() -> None:
        async with receiver, write:
            async for item in receiver:
                listed = unanswered.early_list(item.message)
                opening = unanswered.answered(item.message)
                if listed is not None:  # sent before the SDK was imported: checked, not sent twice
                    check = (_check_early_list, item.message, listed, unanswered.version)
                    group.start_soon(anyio.to_thread.run_sync, *check)
                elif opening is None or opening.sent is None:
                    await write.send(item)
                if opening is not None:
                    answer = item.message.model_dump(mode="json", by_alias=True, exclude_unset=True)
                    group.start_soon(anyio.to_thread.run_sync, mcp_start.settle, opening, answer)

    group.start_soon(relay)
    return sender


def _check_early_list(message: Any, sent: str, version: str) -> None:
    """Log when the SDK's own answer to a tools/list answered early (flakebot.mcp.earlylist) differs from it, and drop
    the cache it came from (the server's next list writes it again)."""
    if message.model_dump_json(by_alias=True, exclude_unset=True).endswith(f',"result":{sent}}}'):
        return  # the same bytes, as the SDK writes them: no parse of a list that may be 23 MB (10,000 tools)
    answer = message.model_dump(mode="json", by_alias=True, exclude_unset=True)
    if answer.get("result") != json.loads(sent):
        logger.warning(
            "the early tool list differed from the MCP SDK's answer (a tool changed meanwhile, or a stale cache)"
        )
        earlylist.forget(version)


async def _answer_unreadable_lines(read: Any, write: Any, group: Any, unanswered: _Unanswered) -> Any:
    """The messages of `read`, where a line that is not JSON is answered -32700 (parse error) and one that is JSON but
    no JSON-RPC message -32600 (invalid request), as JSON-RPC 2.0 says, instead of being dropped with no reply. At the
    end of input the stream ends only once every request read is answered (the SDK cancels what is still running when
    its input ends)."""
    from mcp import types
    from mcp.shared.message import SessionMessage

    sender, receiver = anyio.create_memory_object_stream[Any](0)

    async def relay() -> None:
        async with sender:
            async for item in read:
                if not isinstance(item, Exception):
                    unanswered.read(item.message)
                    await sender.send(item)
                    continue
                code, what = _unreadable(item)
                error = types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(code=code, message=what))
                await write.send(SessionMessage(error))
            await unanswered.none.wait()

    group.start_soon(relay)
    return receiver


def _unreadable(exc: Exception) -> tuple[int, str]:
    """The JSON-RPC code and message for a line the transport could not read as a message."""
    text = str(exc)
    if "json_invalid" in text or "Invalid JSON" in text:
        return -32700, "parse error: the line is not JSON (one JSON-RPC message per line)"
    return -32600, "invalid request: the line is JSON but not a JSON-RPC 2.0 message"
