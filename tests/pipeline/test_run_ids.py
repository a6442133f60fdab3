"""Run ids are names: a path (RUN/flake, ../x) never loads a state.json the model wrote; clean removes only what is
inside the run's directory; a resume takes the sandbox mode from the current setting, not from state.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flakebot import config
from flakebot.errors import RunError
from flakebot.pipeline.cleanup import clean_run
from flakebot.pipeline.engine import run_settings
from flakebot.pipeline.request import RunRequest
from flakebot.pipeline.run import Run, find_run_dir
from tests.conftest import run_cli
from tests.fakes.mcp_call import mcp_call


def planted_run(workdir: Path, victim: Path) -> Run:
    """A real run whose flake/ and workspace/ hold a state.json as a model would write it: sandbox off, and the
    host file `victim` among its resources."""
    run = Run.create(workdir, "craft", RunRequest(need="shout"))
    state = {**run.state, "id": "planted", "status": "failed", "options": {"settings": {"sandbox": "off"}}}
    state["resources"] = [{"kind": "path", "path": str(victim)}]
    for sub in ("flake", "workspace"):
        (run.dir / sub).mkdir()
        (run.dir / sub / "state.json").write_text(json.dumps(state))
    victim.write_text("keep me\n")
    return run


@pytest.mark.parametrize("command", ["resume", "show", "clean"])
@pytest.mark.parametrize("sub", ["flake", "workspace", "../runs/{id}", "{id}/."])
def test_a_path_is_not_a_run_id_for_the_cli(workdir: Path, tmp_path: Path, command: str, sub: str) -> None:
    victim = tmp_path / "victim.txt"
    run = planted_run(workdir, victim)
    given = sub.format(id=run.id) if "{" in sub else f"{run.id}/{sub}"
    done = run_cli(command, given)
    assert done.returncode == 4, done.stderr
    assert "Traceback" not in done.stderr
    assert "not a run id" in done.stderr or "no run or tool named" in done.stderr
    assert victim.read_text() == "keep me\n" and (run.dir / "flake/state.json").is_file()


def test_a_path_is_not_a_run_id_for_the_mcp_server(workdir: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    run = planted_run(workdir, victim)
    for tool, key in (("resume", "run_id"), ("status", "run_id"), ("show", "name")):
        answer = mcp_call(tool, {key: f"{run.id}/flake"})
        assert answer.get("ok") is False, answer
        assert "not a run id" in json.dumps(answer) or "no run or tool named" in json.dumps(answer), answer
    assert victim.read_text() == "keep me\n"


def test_ids_and_prefixes_still_find_the_run(workdir: Path) -> None:
    run = Run.create(workdir, "craft", RunRequest(need="n"))
    assert find_run_dir(workdir, run.id) == run.dir
    assert find_run_dir(workdir, run.id[:10]) == run.dir
    for bad in ("", "*", f"{run.id[:4]}*", "..", "/etc", f"runs/{run.id}"):
        with pytest.raises(RunError, match="not a run id"):
            find_run_dir(workdir, bad)


def test_a_state_json_naming_another_run_is_refused(workdir: Path) -> None:
    run = Run.create(workdir, "craft", RunRequest(need="n"))
    state = json.loads((run.dir / "state.json").read_text())
    (run.dir / "state.json").write_text(json.dumps({**state, "id": "someone-else"}))
    with pytest.raises(RunError, match="not written for this run"):
        Run.load(workdir, run.id)


def test_clean_removes_only_what_is_inside_the_run(workdir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "file").write_text("x")
    run = Run.create(workdir, "craft", RunRequest(need="n"))
    (run.dir / "workspace").mkdir()
    (run.dir / "link").symlink_to(outside)
    run.state["resources"] = [
        {"kind": "path", "path": str(outside)},
        {"kind": "path", "path": str(run.dir / "workspace/../../..")},
        {"kind": "path", "path": str(run.dir / "link")},
        {"kind": "path", "path": str(run.dir / "workspace")},
        {"kind": "path", "path": "relative/path"},
    ]
    removed = clean_run(run)
    assert (outside / "file").is_file()  # neither the listed path nor the link's target
    assert not (run.dir / "link").exists() and not (run.dir / "workspace").exists()
    assert f"path:{run.dir / 'workspace'}" in removed


def test_a_resume_takes_the_sandbox_mode_from_the_current_setting(workdir: Path) -> None:
    run = Run.create(workdir, "craft", RunRequest(need="n", settings={"sandbox": "off", "max_iterations": 3}))
    current = config.load()
    assert current.sandbox != "off"
    effective = run_settings(run, current)
    assert effective.sandbox == current.sandbox and effective.max_iterations == 3
    assert run_settings(run, config.Settings(sandbox="off")).sandbox == "off"  # off when the user says so now
