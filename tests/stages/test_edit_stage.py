"""Pieces of the edit stage's verdict, against real cargo output."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from flakebot.agent.verdict import has_doctests
from flakebot.cargo.diagnostics import run_cargo
from flakebot.cargo.runner import Cargo
from flakebot.sandbox import open_sandbox
from tests.conftest import require
from tests.fakes.fsyncs import recorded_fsyncs


@pytest.mark.parametrize(("kind", "expected"), [("--lib", True), ("--bin", False)])
def test_doc_tests_are_known_from_cargos_own_messages(tmp_path: Path, kind: str, expected: bool) -> None:
    require("cargo", "bwrap")
    subprocess.run(
        ["cargo", "init", kind, "--vcs", "none", "--name", "probe", str(tmp_path / "ws")],
        check=True,
        capture_output=True,
    )
    workspace = tmp_path / "ws"
    sandbox = open_sandbox("required", workspace=workspace, writable=[workspace, tmp_path / "target"])
    report = run_cargo(sandbox, Cargo(tmp_path / "target", offline=True), "test", cwd=workspace, extra=["--tests"])
    assert report.ok, report.summary()
    assert has_doctests(report, workspace) is expected


def test_each_loop_step_saves_the_spend_its_bytes_synced_its_rename_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's save (the usage a killed run keeps) is on disk whole before its rename; the rename is left to the next
    sync: lost to a machine's crash, the stage redoes itself from edit_base. The real fsync runs underneath."""
    from flakebot import config
    from flakebot.agent.loop import LoopResult
    from flakebot.llm.base import Usage
    from flakebot.llm.budget import Budget
    from flakebot.llm.transcript import Transcript
    from flakebot.pipeline import checkpoint as checkpoints
    from flakebot.pipeline.engine import StageContext
    from flakebot.pipeline.run import Run
    from flakebot.stages.edit import StageEvents

    run = Run.create(tmp_path / "work", "craft")
    settings = config.load()
    budget = Budget.from_settings(settings)
    budget.charge(Usage(prompt_tokens=900, completion_tokens=60))
    synced = recorded_fsyncs(monkeypatch)
    StageEvents(StageContext(run, settings, "edit"), budget, Transcript(run.transcript_path)).step(
        1, LoopResult(status="running"), None
    )
    checkpoints.flush(run.dir / "state.json")  # written on a thread of its own (Run.checkpoint)
    assert [Path(p).name.startswith(".state.json.") for p in synced] == [True]  # the bytes, not the directory
    assert Run.load(tmp_path / "work", run.id).state["usage"]["completion_tokens"] == 60
