"""What a caller can pile up through `flakebot mcp` is bounded, judged from outside: how many job processes run,
which files stay in outputs/, what a task whose process is gone reads as, and how long tasks/result waits. Each
test drives the real server over stdio with the Python SDK's client (a task is created over raw JSON-RPC: that
client cannot create one)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from tests.conftest import require, wait_for
from tests.deliver.test_toolrun import _tool
from tests.test_mcp import mcp_client
from tests.test_mcp_tasks import SLOW_MODEL, _processes_naming, ask, raw_session


def _job_processes(jobs: Path) -> list[int]:
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


def _end_jobs(jobs: Path) -> None:
    for pid in _job_processes(jobs):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not _job_processes(jobs), timeout=30)


def _slow_craft(tmp_path: Path) -> dict[str, Any]:
    """A craft whose model takes minutes to write the spec: its job keeps running while the test looks."""
    script = tmp_path / "slow-model.json"
    script.write_text(json.dumps(SLOW_MODEL))
    return {"need": "upper-case my input", "model": f"scripted:{script}", "registry": "local", "wait": False}


def test_a_session_cannot_start_more_jobs_than_its_cap_nor_the_machine(flakebot_home: Path, tmp_path: Path) -> None:
    """The issue's attack: one session started 12 crafts at once (12 job processes). With the default caps (2 per
    session, 4 on the machine) a session gets 2, a second session 2 more, a third none; each refusal is one line and
    leaves no job file."""
    require("nix")
    craft = _slow_craft(tmp_path)
    jobs = flakebot_home / "work/mcp-jobs"

    async def session(calls: int, waited: bool = False) -> list[tuple[dict[str, Any], bool]]:
        async with mcp_client() as client:
            answers = [await client.call("craft", craft) for _ in range(calls)]
            if waited:  # a call the server runs itself while the caller waits takes a slot too: none is left
                answers.append(await asyncio.wait_for(client.call("craft", {**craft, "wait": True}), 60))
            return answers

    try:
        first = asyncio.run(session(5, waited=True))
        after_first = len(_job_processes(jobs))
        second = asyncio.run(session(2))
        third = asyncio.run(session(1))
        running = len(_job_processes(jobs))
        journals = len(list(jobs.glob("*.jsonl")))
    finally:
        _end_jobs(jobs)
    assert [error for _, error in first] == [False, False, True, True, True, True], first
    assert after_first == 2
    refused = first[2][0]
    assert refused["type"] == "JobLimit" and "\n" not in refused["error"]
    assert "2 jobs are running on this MCP session (max_session_jobs = 2" in refused["error"]
    assert [error for _, error in second] == [False, False], second
    assert third[0][1] and third[0][0]["type"] == "JobLimit"
    assert "4 jobs are running on this machine (max_jobs = 4" in third[0][0]["error"]
    assert first[5][0]["type"] == "JobLimit" and "max_session_jobs = 2" in first[5][0]["error"]
    assert running == 4 and journals == 4  # a refused call started nothing and wrote no journal
    # once the jobs are gone, their slots are free again
    again = asyncio.run(session(1))
    _end_jobs(jobs)
    assert not again[0][1], again


# A task id shaped like the server's (mcp_server._journal_path), for forged records.
FORGED = "20261125-120000-1-{:016x}"


def _forge_task(jobs: Path, task_id: str, pid: int, **extra: Any) -> None:
    """A task record as a server writes it, with no result in its journal: what a reader finds after a crash."""
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / f"{task_id}.jsonl").write_text(json.dumps({"event": "run_started", "run_id": "r1"}) + "\n")
    record = {"format": 1, "tool": "craft", "pid": pid, "created": time.time(), "ttl": 60000, **extra}
    (jobs / f"{task_id}.task.json").write_text(json.dumps(record))


def test_a_task_whose_pid_is_now_another_process_reads_failed(flakebot_home: Path) -> None:
    """A job's pid, once it ended, can belong to anything: kthreadd (pid 2, a kernel thread with an empty command
    line), or a new process that even names the same journal. Neither is the job: its task reads failed."""
    jobs = flakebot_home / "work/mcp-jobs"
    kernel, reused = FORGED.format(2), FORGED.format(3)
    _forge_task(jobs, kernel, 2)
    impostor = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", str(jobs / f"{reused}.jsonl")], start_new_session=True
    )
    try:
        _forge_task(jobs, reused, impostor.pid, start_time=1)  # the job's start time, not this process's

        async def session() -> list[Any]:
            async with mcp_client() as client:
                got = [
                    await ask(client, types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id)), types.GetTaskResult)
                    for task_id in (kernel, reused)
                ]  # fmt: skip
                listed = await ask(client, types.ListTasksRequest(), types.ListTasksResult)
                return [*got, listed]

        by_kernel, by_impostor, listed = asyncio.run(session())
    finally:
        impostor.kill()
        impostor.wait()
    for task_id, got in ((kernel, by_kernel), (reused, by_impostor)):
        assert got.status == "failed", (task_id, got)
        assert f"the process of task {task_id} ended before it finished" in got.status_message
    assert {task.status for task in listed.tasks} == {"failed"}


def test_tasks_result_answers_by_its_deadline(
    flakebot_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tasks/result on a task that is still working waited forever; now it answers after task_result_wait seconds
    with the task's status and how to ask again (and the task goes on)."""
    require("nix")
    monkeypatch.setenv("FLAKEBOT_TASK_RESULT_WAIT", "3")
    jobs = flakebot_home / "work/mcp-jobs"
    craft = {k: v for k, v in _slow_craft(tmp_path).items() if k != "wait"}
    try:
        with raw_session("2025-11-25") as session:
            created = session.ask("tools/call", {"name": "craft", "arguments": craft, "task": {"ttl": 60000}})
            task_id = created["result"]["task"]["taskId"]
            began = time.monotonic()
            answer = session.ask("tasks/result", {"taskId": task_id})
            waited = time.monotonic() - began
            after = session.ask("tasks/get", {"taskId": task_id})["result"]
    finally:
        _end_jobs(jobs)
    error = answer["error"]
    assert 3 <= waited < 15, waited
    assert error["code"] == types.REQUEST_TIMEOUT, error
    assert f"task {task_id} is still working after 3 s" in error["message"]
    assert "call tasks/result again" in error["message"] and "tasks/get" in error["message"]
    assert after["status"] == "working"


def test_outputs_beyond_the_quota_are_evicted_oldest_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stdout past tool_output_limit went to a file in outputs/ kept forever. Now outputs/ holds at most
    outputs_mb: a call that spills removes the oldest files beyond it, and one call's file stops at output_file_mb
    (the tool is killed past it, as at the sandbox's file-size limit)."""
    require("bwrap")
    _tool(tmp_path, "lines", 'seq "${1:-100000}"\n')
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("FLAKEBOT_TOOL_OUTPUT_LIMIT", "10000")
    monkeypatch.setenv("FLAKEBOT_OUTPUTS_MB", "1")  # 1 MiB holds three of these 288,895-byte outputs
    whole = "".join(f"{n}\n" for n in range(1, 50_001))

    async def session() -> tuple[list[dict[str, Any]], list[bool], int, dict[str, Any]]:
        async with mcp_client() as client:
            answers = []
            for _ in range(5):
                answers.append((await client.call("run", {"tool": "lines", "args": ["50000"]}))[0])
                await asyncio.sleep(0.05)  # distinct modification times
            kept = [Path(answer["stdout_file"]).exists() for answer in answers]
            whole_kept = [Path(answer["stdout_file"]).read_text() == whole for answer in answers[2:]]
            held = sum(path.stat().st_size for path in Path(answers[0]["stdout_file"]).parent.iterdir())
            big = (await client.call("run", {"tool": "lines", "args": ["1000000"]}))[0]
            return answers, kept + whole_kept, held, big

    answers, kept, held, big = asyncio.run(session())
    assert all(answer["truncated"] and answer["exit_code"] == 0 for answer in answers), answers
    files = [Path(answer["stdout_file"]) for answer in answers]
    outputs = files[0].parent
    # the oldest went first, the newest three stay whole, and the directory holds at most the quota
    assert kept == [False, False, True, True, True, True, True, True] and held <= 1024 * 1024, (kept, held)
    # 6.9 MB of stdout: its file stopped at the per-call cap (here the 1 MiB quota) and the tool was killed
    assert "stdout passed 1048576 bytes: the rest was dropped" in big["stderr"], big
    assert Path(big["stdout_file"]).stat().st_size == 1024 * 1024 and big["stdout_bytes"] >= 1024 * 1024
    assert [path.name for path in outputs.iterdir()] == [Path(big["stdout_file"]).name]
    assert _processes_naming(outputs) == []
