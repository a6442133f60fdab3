"""A run's RunRequest: stored in state.json, read back typed, and runs written before it (a dict of options) still
load, resume and clean as they did."""

from __future__ import annotations

import json
from pathlib import Path

from flakebot import config
from flakebot.pipeline import engine as pipeline
from flakebot.pipeline.engine import run_settings
from flakebot.pipeline.request import Improvement, RunRequest
from flakebot.pipeline.run import STATE_FORMAT, Run


def test_a_request_is_stored_and_read_back_as_it_was(workdir: Path) -> None:
    improvement = Improvement(tool="shout", request="add --quiet", from_version="0.1.0", kept_spec={"name": "shout"})
    request = RunRequest(need="n", model="scripted:x", keep=True, improve=improvement, settings={"max_iterations": 2})
    run = Run.create(workdir, "craft", request)
    saved = json.loads((run.dir / "state.json").read_text())
    assert saved["format"] == STATE_FORMAT and saved["need"] == "n" and saved["request"]["improve"]["tool"] == "shout"
    assert Run.load(workdir, run.id).request == request


def _old_state(run: Run, pipeline_name: str, options: dict[str, object]) -> None:
    """Rewrite `run`'s state.json as flakebot wrote it before requests were typed (format 2)."""
    state = {**run.state, "format": 2, "pipeline": pipeline_name, "options": options}
    del state["request"], state["settings"]
    (run.dir / "state.json").write_text(json.dumps(state))


def test_a_format_2_run_loads_with_its_options_as_a_request(workdir: Path) -> None:
    run = Run.create(workdir, "craft", RunRequest(need="csv dedup"))
    crate = {"name": "demo", "version": "0.1.0", "path": "/src/demo"}
    options = {
        "model": "scripted:x",
        "from": crate,
        "from_location": "/src/demo",
        "keep": True,
        "delete_fork": True,
        "improve": {"tool": "t", "request": "r", "version": "0.2.0", "no_longer_known": 1},
        "settings": {"sandbox": "off", "max_iterations": 3, "registry": "local"},
    }
    _old_state(run, "craft", options)
    loaded = Run.load(workdir, run.id)
    request = loaded.request
    assert (request.need, request.model, request.start, request.from_location) == (
        "csv dedup",
        "scripted:x",
        crate,
        "/src/demo",
    )
    assert request.keep and request.delete_fork and request.improve == Improvement("t", "r", version="0.2.0")
    assert loaded.state["settings"] == {"sandbox": "off", "max_iterations": 3, "registry": "local"}
    effective = run_settings(loaded, config.load())
    assert effective.max_iterations == 3 and effective.registry == "local" and effective.sandbox != "off"
    loaded.save()
    assert json.loads((run.dir / "state.json").read_text())["format"] == STATE_FORMAT


def test_a_format_2_package_run_resumes_at_its_locate_stage(workdir: Path, tmp_path: Path) -> None:
    """The package pipeline's first stage was called "source": an old run's record of it moves to "locate"."""
    run = Run.create(workdir, "package")
    _old_state(run, "package", {"target": str(tmp_path / "missing"), "bin": None, "settings": {}})
    state = json.loads((run.dir / "state.json").read_text())
    state["stages"] = {"source": {"status": "finished", "attempts": 1}}
    state["outputs"] = {"source": {"kind": "path", "source_dir": str(tmp_path)}}
    (run.dir / "state.json").write_text(json.dumps(state))
    loaded = Run.load(workdir, run.id)
    assert loaded.stage_status("locate") == "finished" and loaded.output("locate")["source_dir"] == str(tmp_path)
    assert "source" not in loaded.state["stages"] and loaded.request.target == str(tmp_path / "missing")
    assert pipeline.stage_names("package")[0] == "locate"
