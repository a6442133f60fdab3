"""What a caller can pile up through `flakebot mcp` is bounded, judged from outside: how many job processes run,
which files stay in outputs/, what a task whose process is gone reads as, and how long tasks/result waits. The
attacks are benchmarks/scenarios/pileup.py's (the reliability report runs them too); each drives the real server
over stdio. Every one worked against the code before the limits: 5 crafts from one session ran as 5 processes,
a task whose pid was kthreadd's read `working`, tasks/result on a working task gave no answer in 90 s, and
outputs/ kept every file."""

from __future__ import annotations

import asyncio
import os
import site
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from benchmarks.scenarios import pileup
from flakebot import config
from tests.conftest import require

MIB = 1024 * 1024


def test_a_session_cannot_start_more_jobs_than_its_cap_nor_the_machine(flakebot_home: Path, tmp_path: Path) -> None:
    """The issue's attack: one session started 12 crafts at once (12 job processes). With the default caps (2 per
    session, 4 on the machine) a session gets 2 (a call it waits for counts too), a second session 2 more, a third
    none; each refusal is one line and leaves no job file."""
    require("nix")
    work = flakebot_home / "work"
    old, recent = _ended_job(work, "00000000000000aa", days=40), _ended_job(work, "00000000000000bb", days=20)
    seen = pileup.crafts_from_sessions(dict(os.environ), work, tmp_path, [5, 2, 1])
    first, second, third = seen.answers
    assert [error for _, error in first] == [False, False, True, True, True, True], first
    assert [error for _, error in second] == [False, False] and [error for _, error in third] == [True]
    assert seen.processes == [2, 4, 4]
    assert seen.journals == 4 + 1  # a refused call started nothing and wrote no journal (+1: the recent old job)
    # admission cleared the files of a job that ended over a month ago, and kept those of a recent one
    assert [path.exists() for path in old] == [False] * 3 and [path.exists() for path in recent] == [True] * 3
    refused, waited, machine = first[2][0], first[5][0], third[0][0]
    assert {refused["type"], waited["type"], machine["type"]} == {"JobLimit"}
    assert "\n" not in refused["error"] and refused["fix"].startswith("wait for one to finish")
    assert "craft not started: 2 jobs are running on this MCP session (max_session_jobs = 2" in refused["error"]
    assert "max_session_jobs = 2" in waited["error"]
    assert "craft not started: 4 jobs are running on this machine (max_jobs = 4" in machine["error"]
    # once the jobs are gone, their slots are free again
    again = pileup.crafts_from_sessions(dict(os.environ), work, tmp_path, [2])
    assert [error for _, error in again.answers[0]] == [False, False, True] and again.processes == [2]


def hooked_python(directory: Path, sitecustomize: str) -> str:
    """An interpreter of its own (a venv over this one's packages) whose site-packages holds `sitecustomize`."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True, timeout=120)
    [packages] = directory.glob("lib/python*/site-packages")
    ours = [path for path in site.getsitepackages() if Path(path).is_dir()]
    (packages / "ours.pth").write_text("".join(f"import site; site.addsitedir({path!r})\n" for path in ours))
    (packages / "sitecustomize.py").write_text(sitecustomize)
    return str(directory / "bin" / "python")


# An interpreter runs the sitecustomize module of its own site-packages at start, even isolated (-I, as flakebot
# starts its jobs; PYTHONPATH and the cwd no longer reach them): this one makes a job process (an argument names its
# journal) hang before flakebot is even imported, as a wedged start would.
IS_JOB = 'any(a.endswith(".jsonl") and "/mcp-jobs/" in a for a in sys.argv[1:])'
STUCK_START = f"""import sys, time
if {IS_JOB}:
    time.sleep(120)
"""


def test_a_detached_job_that_starts_no_run_is_stopped_by_the_deadline(
    flakebot_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A detached call answers once its run exists; a job that never gets there made the call wait forever. Now
    after task_result_wait seconds the job is stopped and the call says so."""
    python = hooked_python(tmp_path / "venv", STUCK_START)
    monkeypatch.setenv("FLAKEBOT_TASK_RESULT_WAIT", "2")
    work = flakebot_home / "work"
    began = time.monotonic()
    seen = pileup.crafts_from_sessions(dict(os.environ), work, tmp_path, [1], waited=False, python=python)
    seconds = time.monotonic() - began
    (answer, error), processes = seen.answers[0][0], seen.processes
    assert (
        error and "the craft process started no run within task_result_wait seconds and was stopped" in answer["error"]
    )
    assert processes == [0] and seconds < 30, (processes, seconds)


LINGER = f"""import atexit, sys, time
if {IS_JOB}:
    atexit.register(time.sleep, 120)
"""


def test_a_job_that_wrote_its_result_holds_no_slot_while_its_process_exits(
    flakebot_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job process may take a while to exit after it wrote its result (here: 2 minutes, an atexit hook); its
    caller has its answer, so the job no longer counts against max_session_jobs."""
    python = hooked_python(tmp_path / "venv", LINGER)
    jobs = flakebot_home / "work/mcp-jobs"

    async def session() -> list[tuple[dict[str, Any], bool]]:
        async with pileup.sdk_session(dict(os.environ), python=python) as client:
            # a job that ends at once with an error of its own: its model script has no turn for the spec stage
            script = tmp_path / "empty-script.json"
            script.write_text('{"turns": []}')
            need = {"need": "need a CSV deduper", "model": f"scripted:{script}", "registry": "local", "wait": True}
            return [await pileup.call(client, "craft", need) for _ in range(3)]

    try:
        answers = asyncio.run(session())
        lingering = len(pileup.job_processes(jobs))
    finally:
        pileup.end_jobs(jobs)
    assert lingering == 3  # every job is still exiting
    assert [(answer["type"], error) for answer, error in answers] == [("ModelError", True)] * 3, answers


def _ended_job(work: Path, suffix: str, days: float) -> list[Path]:
    """The files a finished task leaves in mcp-jobs/ (journal, log, task record), last touched `days` ago."""
    task_id = pileup.FORGED.format(int(suffix, 16))
    pileup.forge_task(work / "mcp-jobs", task_id, 2)
    files = [work / "mcp-jobs" / f"{task_id}{ext}" for ext in (".jsonl", ".log", ".task.json")]
    files[1].write_text("")
    when = time.time() - days * 86400
    for path in files:
        os.utime(path, (when, when))
    return files


def test_a_task_whose_pid_is_now_another_process_reads_failed(flakebot_home: Path) -> None:
    """A job's pid, once it ended, can belong to anything: kthreadd (pid 2, a kernel thread with an empty command
    line), or a new process that even names the same journal. Neither is the job: its task reads failed, and a run
    left running with such a pid reads interrupted."""
    seen = pileup.reused_pids(dict(os.environ), flakebot_home / "work")
    for name in ("kernel", "impostor"):
        task, task_id = seen[name], seen["ids"][name]
        assert task.status == "failed", (name, task)
        assert f"the process of task {task_id} ended before it finished" in task.status_message
    assert {task.status for task in seen["listed"]} == {"failed"}
    # `status`, which a caller polls to follow a run handle, read such runs as running (forever, for pid 2)
    assert seen["runs"] == {"kernel": "interrupted", "impostor": "interrupted"}


def test_tasks_result_answers_by_its_deadline(
    flakebot_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tasks/result on a task that is still working waited forever; now it answers after task_result_wait seconds
    with the task's status and how to ask again (and the task goes on)."""
    require("nix")
    monkeypatch.setenv("FLAKEBOT_TASK_RESULT_WAIT", "3")
    seen = pileup.result_of_working_task(dict(os.environ), flakebot_home / "work", tmp_path, patience=60)
    assert seen.answer is not None and 3 <= seen.seconds < 15, seen
    error = seen.answer["error"]
    assert error["code"] == types.REQUEST_TIMEOUT, error
    assert f"task {seen.task_id} is still working after 3 s" in error["message"]
    assert "call tasks/result again" in error["message"] and "tasks/get" in error["message"]
    assert seen.status_after == "working"


def test_outputs_beyond_the_quota_are_evicted_oldest_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stdout past tool_output_limit went to a file in outputs/ kept forever. Now outputs/ holds at most
    outputs_mb: a call that spills removes the oldest files beyond it, and one call's file stops at output_file_mb
    (never past the quota); the rest is dropped and the result says so."""
    require("bwrap")
    pileup.catalogue_lines(config.load(), tmp_path)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("FLAKEBOT_TOOL_OUTPUT_LIMIT", "10000")
    monkeypatch.setenv("FLAKEBOT_OUTPUTS_MB", "1")  # 1 MiB holds three of these 288,895-byte outputs
    seen = pileup.spill_calls(dict(os.environ))
    assert all(answer["truncated"] and answer["exit_code"] == 0 for answer in seen.answers), seen.answers
    # the oldest went first, the newest three stay whole, and the directory holds at most the quota
    assert seen.kept == [False, False, True, True, True] and seen.whole == [True] * 3 and seen.held <= MIB, seen
    # 6.9 MB of stdout: its file stopped at the per-call cap (here the 1 MiB quota), and every older file went
    big = seen.big
    assert "stdout passed 1048576 bytes: the rest was dropped" in big["stderr"], big
    assert Path(big["stdout_file"]).stat().st_size == MIB and big["stdout_bytes"] >= MIB
    assert seen.left == [Path(big["stdout_file"]).name]
