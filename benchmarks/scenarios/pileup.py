"""What a caller can pile up through `flakebot mcp`, tried as an attacker would and judged from outside: how many job
processes run, what a task whose pid is now another process's reads as, how long tasks/result waits, which files
stay in outputs/. Each function drives the real server over stdio (the Python SDK's client; a task is created
over raw JSON-RPC, which that client cannot do) in the flakebot home `env` names, and returns what it saw.
tests/mcp/test_limits.py asserts every detail; the reliability report (benchmarks/reliability/limits.py) counts
the attacks that were bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A craft whose model takes minutes to write the spec: its job keeps running while the attack looks.
SLOW_MODEL = {"format": 1, "stages": {"spec": [{"fault": {"kind": "slow", "seconds": 300}, "content": "too late"}]}}
FORGED = "20261125-120000-1-{:016x}"  # a task id shaped like the server's (server._journal_path)


def slow_craft(scratch: Path, wait: bool | None = False) -> dict[str, Any]:
    """A craft's arguments whose job stays in its spec stage for minutes (`wait` None: the argument left out)."""
    script = scratch / "slow-model.json"
    script.write_text(json.dumps(SLOW_MODEL))
    craft: dict[str, Any] = {"need": "upper-case my input", "model": f"scripted:{script}", "registry": "local"}
    craft["fresh"] = True  # each call a craft of its own (the same need twice is refused while one runs)
    return craft if wait is None else {**craft, "wait": wait}


@asynccontextmanager
async def sdk_session(env: dict[str, str], cwd: Path | None = None, python: str = sys.executable) -> AsyncIterator[Any]:
    """A Python SDK client session on a new `flakebot mcp` with environment `env` (in `cwd`, else this directory),
    run by the interpreter `python` (its jobs are run by the same one)."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=python, args=["-m", "flakebot", "mcp"], env=env, cwd=cwd)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call(session: Any, name: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """A tool call's JSON answer and isError."""
    result = await session.call_tool(name, arguments)
    return json.loads(result.content[0].text), bool(result.is_error)


# ------------------------------------------------------------ job processes, counted from outside


def job_processes(jobs: Path) -> list[int]:
    """Process ids of running job processes (each names its journal in mcp-jobs/)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.startswith(os.fsencode(f"{jobs}/")) and arg.endswith(b".jsonl") for arg in argv):
            found.append(int(cmdline.parent.name))
    return found


def end_jobs(jobs: Path, wait: float = 30.0) -> None:
    """Kill every job process of `jobs` (its whole group) and wait until none is left."""
    deadline = time.monotonic() + wait
    while (pids := job_processes(jobs)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


@dataclass
class Sessions:
    """Crafts started from several sessions, one after another: each session's answers, and the job processes
    running after each session ended."""

    answers: list[list[tuple[dict[str, Any], bool]]] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    journals: int = 0


def crafts_from_sessions(
    env: dict[str, str], work: Path, scratch: Path, calls: list[int], waited: bool = True, python: str = sys.executable
) -> Sessions:
    """Session i makes calls[i] detached crafts whose jobs keep running; the first session then makes one call it
    waits for (with `wait: true`), unless not `waited`. The jobs are ended afterwards. `python`: see sdk_session."""
    craft, jobs, seen = slow_craft(scratch), work / "mcp-jobs", Sessions()

    async def session(count: int, waited: bool) -> list[tuple[dict[str, Any], bool]]:
        async with sdk_session(env, python=python) as client:
            answers = [await call(client, "craft", craft) for _ in range(count)]
            if waited:
                answers.append(await _waited(client, {**craft, "wait": True}))
            return answers

    try:
        for index, count in enumerate(calls):
            seen.answers.append(asyncio.run(session(count, waited=waited and index == 0)))
            seen.processes.append(len(job_processes(jobs)))
        seen.journals = len(list(jobs.glob("*.jsonl")))
    finally:
        end_jobs(jobs)
    return seen


async def _waited(client: Any, craft: dict[str, Any], patience: float = 30) -> tuple[dict[str, Any], bool]:
    """A call the caller waits for: refused at once when no slot is free, else (admitted) still running after
    `patience` seconds (the slow model sees to that)."""
    try:
        return await asyncio.wait_for(call(client, "craft", craft), patience)
    except TimeoutError:
        return {"ok": True, "status": f"admitted: still running after {patience:g} s"}, False


# ------------------------------------------------------------ a task whose pid is another process's


def forge_task(jobs: Path, task_id: str, pid: int, **extra: Any) -> None:
    """A task record as a server writes it, with no result in its journal: what a reader finds after a crash."""
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / f"{task_id}.jsonl").write_text(json.dumps({"event": "run_started", "run_id": "r1"}) + "\n")
    record = {"format": 1, "tool": "craft", "pid": pid, "created": time.time(), "ttl": 60000, **extra}
    (jobs / f"{task_id}.task.json").write_text(json.dumps(record))


def reused_pids(env: dict[str, str], work: Path) -> dict[str, Any]:
    """Two task records whose job is gone: one whose pid is kthreadd's (pid 2, a kernel thread with an empty command
    line), one whose pid is a live process that even names the task's journal; and two runs left `running` with
    those pids. What tasks/get, tasks/list and `status` say of them: {"kernel": Task, "impostor": Task, "listed":
    [Task], "runs": {"kernel": status, "impostor": status}}."""
    import mcp_types as types

    from flakebot.pipeline.request import RunRequest
    from flakebot.pipeline.run import Run

    jobs = work / "mcp-jobs"
    kernel, reused = FORGED.format(2), FORGED.format(3)
    forge_task(jobs, kernel, 2)
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)", str(jobs / f"{reused}.jsonl")]
    impostor = subprocess.Popen(sleeper, start_new_session=True)
    try:
        forge_task(jobs, reused, impostor.pid, start_time=1)  # the job's start time, not this process's
        runs = {}
        for name, pid, extra in (("kernel", 2, {}), ("impostor", impostor.pid, {"pid_start": 1})):
            run = Run.create(work, "craft", RunRequest(need=f"a tool for {name}"))
            run.state.update(status="running", pid=pid, **extra)  # as a run whose process died
            run.save()
            runs[name] = run.id

        async def session() -> dict[str, Any]:
            async with sdk_session(env) as client:
                seen: dict[str, Any] = {"ids": {"kernel": kernel, "impostor": reused}, "runs": {}}
                for name, task_id in (("kernel", kernel), ("impostor", reused)):
                    get = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id))
                    seen[name] = await client.send_request(get, types.GetTaskResult)
                    seen["runs"][name] = (await call(client, "status", {"run_id": runs[name]}))[0].get("status")
                listed = await client.send_request(types.ListTasksRequest(), types.ListTasksResult)
                return {**seen, "listed": listed.tasks}

        return asyncio.run(session())
    finally:
        impostor.kill()
        impostor.wait()


# ------------------------------------------------------------ tasks/result on a task still working


class RawSession:
    """JSON-RPC on `flakebot mcp`'s stdio, one request at a time, with a deadline on every answer."""

    def __init__(self, server: subprocess.Popen[str]) -> None:
        assert server.stdin is not None and server.stdout is not None
        self.stdin, self.stdout, self.sent = server.stdin, server.stdout, 0

    def ask(self, method: str, params: dict[str, Any], timeout: float = 120) -> dict[str, Any] | None:
        """The answer, or None if none came within `timeout` seconds."""
        self.sent += 1
        self.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.sent, "method": method, "params": params}) + "\n")
        self.stdin.flush()
        ready, _, _ = select.select([self.stdout], [], [], timeout)
        return json.loads(self.stdout.readline()) if ready else None

    def tell(self, method: str) -> None:
        self.stdin.write(json.dumps({"jsonrpc": "2.0", "method": method}) + "\n")
        self.stdin.flush()


@contextmanager
def raw_session(env: dict[str, str], cwd: Path) -> Iterator[RawSession]:
    """A session of protocol 2025-11-25 (tasks) on a new `flakebot mcp`; the server is killed at the end."""
    command = [sys.executable, "-m", "flakebot", "mcp"]
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=cwd
    ) as server:
        try:
            session = RawSession(server)
            hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
            session.ask("initialize", hello)
            session.tell("notifications/initialized")
            yield session
        finally:
            server.kill()


@dataclass
class Waited:
    """tasks/result on a task still working: the answer (None: none within `patience`), how long it took, and the
    task's status afterwards."""

    task_id: str
    answer: dict[str, Any] | None
    seconds: float
    status_after: str


def result_of_working_task(env: dict[str, str], work: Path, scratch: Path, patience: float) -> Waited:
    """Create a craft task that stays working, then ask tasks/result and wait at most `patience` seconds."""
    craft = slow_craft(scratch, wait=None)
    try:
        with raw_session(env, scratch) as session:
            created = session.ask("tools/call", {"name": "craft", "arguments": craft, "task": {"ttl": 60000}})
            task_id = (created or {})["result"]["task"]["taskId"]
            began = time.monotonic()
            answer = session.ask("tasks/result", {"taskId": task_id}, timeout=patience)
            seconds = time.monotonic() - began
            after = session.ask("tasks/get", {"taskId": task_id}) if answer is not None else None
    finally:
        end_jobs(work / "mcp-jobs")
    status = (after or {}).get("result", {}).get("status", "no answer")
    return Waited(task_id, answer, round(seconds, 1), status)


# ------------------------------------------------------------ outputs/


LINES = 'seq "${1:-100000}"\n'  # a tool that prints as many numbers as asked


def catalogue_lines(settings: Any, root: Path) -> None:
    """Catalogue `lines`, a shell-script tool standing in for a crafted binary (its directory as the store path)."""
    from flakebot.deliver.catalog import Catalog

    store = root / "store-lines"
    (store / "bin").mkdir(parents=True, exist_ok=True)
    (store / "bin/lines").write_text("#!/bin/sh\n" + LINES)
    (store / "bin/lines").chmod(0o755)
    (root / "flake").mkdir(exist_ok=True)
    manifest = {"name": "lines", "main_program": "lines", "store_path": str(store), "nix_run_argv": ["nix", "run", "x"]}
    Catalog.open(settings).add(
        "lines", need="lines around", flake_dir=root / "flake", manifest={**manifest, "summary": ""},
        usage_md="# lines\n", store_path=str(store), run_id="r1", origin={},
    )  # fmt: skip


@dataclass
class Spilled:
    """Five calls whose stdout spilled into outputs/, then one far past the per-call cap."""

    answers: list[dict[str, Any]]
    kept: list[bool]  # which of the five files still existed after the fifth call
    whole: list[bool]  # whether each kept file held the whole stdout
    held: int  # bytes in outputs/ after the fifth call
    big: dict[str, Any]
    left: list[str]  # the files in outputs/ at the end


def spill_calls(env: dict[str, str], cwd: Path | None = None, count: int = 50_000, big: int = 1_000_000) -> Spilled:
    """`run lines COUNT` five times in one session (each stdout spills: tool_output_limit is set low), then
    `run lines BIG`; the server runs in `cwd` (else this directory)."""
    whole_text = "".join(f"{n}\n" for n in range(1, count + 1))

    async def session() -> Spilled:
        async with sdk_session(env, cwd) as client:
            answers = []
            for _ in range(5):
                answers.append((await call(client, "run", {"tool": "lines", "args": [str(count)]}))[0])
                await asyncio.sleep(0.05)  # distinct modification times
            files = [Path(answer["stdout_file"]) if answer.get("stdout_file") else None for answer in answers]
            kept = [path is not None and path.exists() for path in files]
            whole = [path.read_text() == whole_text for path in files if path is not None and path.exists()]
            outputs = Path(env["FLAKEBOT_WORKDIR"]) / "outputs"
            held = sum(path.stat().st_size for path in outputs.iterdir()) if outputs.is_dir() else 0
            last = (await call(client, "run", {"tool": "lines", "args": [str(big)]}))[0]
            left = sorted(path.name for path in outputs.iterdir()) if outputs.is_dir() else []
            return Spilled(answers, kept, whole, held, last, left)

    return asyncio.run(session())
