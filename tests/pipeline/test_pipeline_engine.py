"""The run/pipeline core: order, checkpoints, resume after SIGKILL, failures, corrupt state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flakebot import config
from flakebot.errors import FlakebotError, RunError
from flakebot.events import Event
from flakebot.pipeline import engine as pipeline
from flakebot.pipeline.request import RunRequest
from flakebot.pipeline.run import Run
from tests.conftest import REPO, json_result, run_cli, wait_for

TESTS = str(REPO)  # subprocesses import tests.fakes.pipelines from the checkout


def calls(run: Run) -> list[str]:
    return (run.dir / "calls").read_text().split()


def test_stages_run_in_order_and_checkpoint(workdir: Path) -> None:
    events: list[Event] = []
    settings = config.load()
    run = pipeline.start(
        "tests.fakes.pipelines:FAILING", workdir, settings, RunRequest(need="n"), sink=events.append, stop_after="first"
    )
    assert run.state["status"] == "stopped"
    saved = json.loads((run.dir / "state.json").read_text())
    assert saved["stages"]["first"]["status"] == "finished"
    assert saved["outputs"]["first"] == {"value": 1}
    assert "broken" not in saved["stages"]
    kinds = [e.kind for e in events]
    assert kinds == ["run_started", "stage_started", "stage_finished", "run_finished"]
    assert [json.loads(line)["event"] for line in run.events_path.read_text().splitlines()] == kinds


def test_failure_is_recorded_and_cleanup_still_runs(workdir: Path) -> None:
    with pytest.raises(FlakebotError) as caught:
        pipeline.start("tests.fakes.pipelines:FAILING", workdir, config.load())
    assert caught.value.stage == "broken"
    run = Run.load(workdir, os.listdir(workdir / "runs")[0])
    assert calls(run) == ["first", "broken", "cleanup"]
    assert run.state["status"] == "failed"
    assert run.state["stages"]["broken"]["error"]["message"] == "the broken stage broke"
    assert run.state["outputs"]["cleanup"] == {"after_failure": True}
    assert "last" not in run.state["stages"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed interrupt, on purpose
def test_a_sigterm_whose_interrupt_was_swallowed_still_stops_the_run(workdir: Path) -> None:
    """SIGTERM raises KeyboardInterrupt wherever the signal lands; inside a __del__ Python swallows it (a worker told
    to stop went on to finish its craft). The stage that was running is marked interrupted, no later stage starts,
    cleanup runs, and the run is resumable."""
    from flakebot.errors import Interrupted

    with pytest.raises(Interrupted) as caught:
        pipeline.start("tests.fakes.pipelines:SWALLOWED", workdir, config.load())
    assert caught.value.stage == "swallowed"
    run = Run.load(workdir, os.listdir(workdir / "runs")[0])
    assert calls(run) == ["first", "swallowed", "cleanup"] and run.state["status"] == "interrupted"
    assert run.state["stages"]["swallowed"]["status"] == "failed" and "last" not in run.state["stages"]


def test_resume_after_sigkill_redoes_only_the_unfinished_stage(workdir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": TESTS}
    code = (
        "from pathlib import Path; from flakebot import config; from flakebot.pipeline import engine as pipeline; "
        "from flakebot.pipeline.request import RunRequest; "
        f"pipeline.start('tests.fakes.pipelines:SLOW', Path({str(workdir)!r}), config.load(), RunRequest(need='slow need'))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run_dir = wait_for(lambda: next((workdir / "runs").glob("*/slow-started"), None)).parent
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    killed = Run.load(workdir, run_dir.name)
    assert killed.status == "interrupted"
    assert killed.stage_status("first") == "finished"
    assert killed.stage_status("slow") == "running"

    result = run_cli("resume", run_dir.name, "--json", env={"PYTHONPATH": TESTS})
    assert result.returncode == 0, result.stderr
    done = Run.load(workdir, run_dir.name)
    assert done.state["status"] == "succeeded"
    assert calls(done) == ["first", "slow", "slow", "last"]
    assert done.output("last") == {"value": 3}
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert {"event": "stage_skipped", "stage": "first"}.items() <= lines[1].items()
    assert lines[-1]["result"]["status"] == "succeeded"


def test_corrupt_state_gives_clear_error_and_keeps_the_file(workdir: Path) -> None:
    run = Run.create(workdir, "tests.fakes.pipelines:SLOW", RunRequest(need="need"))
    state = run.dir / "state.json"
    state.write_text('{"format": 1, "id": "x", "stages": ')
    for command in (["show", run.id], ["resume", run.id]):
        result = run_cli(*command, env={"PYTHONPATH": TESTS})
        assert result.returncode == RunError.exit_code
        assert "corrupt" in result.stderr and "Fix:" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert state.read_text() == '{"format": 1, "id": "x", "stages": '


def test_hand_edited_state_with_wrong_types_is_refused(workdir: Path) -> None:
    run = Run.create(workdir, "tests.fakes.pipelines:SLOW", RunRequest(need="need"))
    data = json.loads((run.dir / "state.json").read_text())
    data["stages"] = []
    (run.dir / "state.json").write_text(json.dumps(data))
    with pytest.raises(RunError, match="stages"):
        Run.load(workdir, run.id)


def test_unknown_run_id(workdir: Path) -> None:
    result = run_cli("resume", "no-such-run")
    assert result.returncode == RunError.exit_code
    assert "no run 'no-such-run'" in result.stderr and "flakebot runs" in result.stderr


def test_workdir_that_is_a_file_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run_cli("--workdir", str(blocker), "runs")
    assert result.returncode == 5 and "is not a directory" in result.stderr  # not "No runs": the setting is wrong
    with pytest.raises(RunError, match="not writable"):
        Run.create(blocker, "craft")
    assert blocker.read_text() == "not a directory"


def test_runs_and_show_list_the_run(workdir: Path) -> None:
    run = pipeline.start(
        "tests.fakes.pipelines:FAILING", workdir, config.load(), RunRequest(need="list me"), stop_after="first"
    )
    listing = run_cli("runs", "--json", env={"PYTHONPATH": TESTS})
    rows = json_result(listing)["runs"]
    assert rows == [
        {
            "id": run.id,
            "status": "stopped",
            "pipeline": "tests.fakes.pipelines:FAILING",
            "need": "list me",
            "created": rows[0]["created"],
        }
    ]
    shown = json_result(run_cli("show", run.id[:12], "--json", env={"PYTHONPATH": TESTS}))
    assert [s["status"] for s in shown["stages"]] == ["finished", "pending", "pending", "pending"]


def test_a_second_driver_of_the_same_run_is_refused(workdir: Path) -> None:
    run = Run.create(workdir, "tests.fakes.pipelines:SLOW", RunRequest(need="need"))
    with run.lock():
        with pytest.raises(RunError, match="another process"):
            with Run.load(workdir, run.id).lock():
                pass


def test_a_stage_end_is_written_with_the_next_stage_start(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At a boundary between stages state.json is written once, durably, holding the end of one and the start of the
    next; each stage_finished is announced once state.json holds it (a reader finds the stage finished there), in the
    same order as before; a failed run's cleanup end is recorded with the run's end."""
    written: list[dict[str, Any]] = []  # state.json as each write made it
    real_replace = os.replace

    def replace(source: Any, target: Any) -> None:
        real_replace(source, target)
        if Path(target).name == "state.json":
            written.append(json.loads(Path(target).read_text()))

    monkeypatch.setattr(os, "replace", replace)
    on_disk: dict[str, str] = {}  # stage -> its status in state.json when its stage_finished was announced

    def sink(event: Event) -> None:
        events.append(event.kind)
        if event.kind == "stage_finished":
            saved = json.loads(Path(run_dir[0], "state.json").read_text())
            on_disk[str(event.stage)] = saved["stages"][event.stage]["status"]
        if event.kind == "run_started":
            run_dir.append(next((workdir / "runs").iterdir()))

    events: list[str] = []
    run_dir: list[Path] = []
    with pytest.raises(FlakebotError):
        pipeline.start("tests.fakes.pipelines:FAILING", workdir, config.load(), RunRequest(need="n"), sink=sink)
    stages = [{name: record["status"] for name, record in state["stages"].items()} for state in written]
    assert {"first": "finished", "broken": "running"} in stages
    assert {"first": "finished"} not in stages  # no write of its own for the end of the first stage
    assert stages[-1] == {"first": "finished", "broken": "failed", "cleanup": "finished"}
    assert written[-1]["status"] == "failed"
    assert on_disk == {"first": "finished", "cleanup": "finished"}
    assert events == [
        "run_started",
        "stage_started",
        "stage_finished",
        "stage_started",
        "stage_failed",
        "stage_started",
        "stage_finished",
        "run_failed",
    ]


def test_only_checkpoints_a_resume_needs_are_fsynced(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage's start is saved without syncing its rename (lost to a machine's crash, the stage is pending and runs
    again); its end, and the run's start and end, are on disk before the run goes on; every version's bytes are
    synced before its rename (else a crash may leave state.json empty). The real fsync runs underneath."""
    synced: list[dict[str, Any]] = []  # state.json as each sync of the run's directory made it durable
    written, bytes_synced = [], []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if path.name.startswith(".state.json."):
            bytes_synced.append(path)
        elif (path / "state.json").is_file():
            synced.append(json.loads((path / "state.json").read_text()))
        real_fsync(fd)

    def replace(source: Any, target: Any) -> None:
        if Path(target).name == "state.json":
            written.append(Path(source))
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace)

    monkeypatch.setattr(os, "fsync", fsync)
    run = pipeline.start(
        "tests.fakes.pipelines:FAILING", workdir, config.load(), RunRequest(need="n"), stop_after="first"
    )
    assert run.state["status"] == "stopped"
    first = [state["stages"].get("first", {}).get("status", "pending") for state in synced]
    assert "running" not in first and "finished" in first
    assert "running" in [state["status"] for state in synced] and synced[-1]["status"] == "stopped"
    assert written and written == bytes_synced
