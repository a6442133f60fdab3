"""The acquire stage driven by the real pipeline; Debian's csv and hexyl pass `cargo test --offline` in the result.

The pipeline here is this module's STAGES: `spec` and `choose` hand over what the real stages would
(taken from the run's options), then the real acquire stage runs.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import git as gitpython
import pytest

from benchmarks.scenarios.gitserve import crate_manifest, free_port, library_source, make_crate_repo, write
from flakebot.cargo.runner import Cargo
from flakebot.config import Settings
from flakebot.crates import CrateInfo
from flakebot.errors import AcquireError
from flakebot.pipeline import cleanup
from flakebot.pipeline import engine as pipeline
from flakebot.pipeline.engine import Stage, StageContext
from flakebot.pipeline.request import RunRequest
from flakebot.pipeline.run import Run
from flakebot.stages.acquire import acquire_stage
from tests.conftest import DEBIAN_REGISTRY, run_cli

OFFLINE = Settings(offline=True, local_registry=str(DEBIAN_REGISTRY))


def spec_stage(ctx: StageContext) -> dict[str, Any]:
    return {"name": ctx.request.name}


def choose_stage(ctx: StageContext) -> dict[str, Any]:
    # the test's crate is the request's start point, as `craft --from` gives one
    return {"crate": ctx.request.start, "mode": ctx.request.mode or "fork", "reason": "chosen by the test"}


STAGES = [Stage("spec", spec_stage), Stage("choose", choose_stage), Stage("acquire", acquire_stage)]
PIPELINE = f"{__name__}:STAGES"


def registry_crate(name: str, version: str) -> dict[str, Any]:
    return CrateInfo(
        name=name, version=version, source="local", path=str(DEBIAN_REGISTRY / f"{name}-{version}")
    ).to_dict()


def local_crate(root: Path, name: str, deps: str = "") -> dict[str, Any]:
    write(root, {"Cargo.toml": crate_manifest(name, "0.1.0", deps), "src/lib.rs": library_source("0.1.0")})
    return CrateInfo(name=name, version="0.1.0", source="local", path=str(root)).to_dict()


def request(tool: str, crate: dict[str, Any] | None = None, mode: str | None = None) -> RunRequest:
    return RunRequest(name=tool, start=crate, mode=mode)


def start(workdir: Path, tool: str, crate: dict[str, Any] | None = None, mode: str | None = None) -> Run:
    return pipeline.start(PIPELINE, workdir, OFFLINE, request(tool, crate, mode))


def events(run: Run, kind: str) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, run.events_path.read_text().splitlines()) if e["event"] == kind]


def cargo_test(run: Run, cwd: Path) -> tuple[list[dict[str, Any]], str]:
    """`cargo test` through flakebot's runner: (the compiler-artifact messages, the test harness output)."""
    result = Cargo.for_run(OFFLINE, run.target_dir).run(["test", "--message-format=json"], cwd, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    artifacts = [
        m for m in (json.loads(x) for x in lines if x.startswith("{")) if m.get("reason") == "compiler-artifact"
    ]
    return artifacts, "\n".join(x for x in lines if not x.startswith("{"))


def committed_clean(workspace: Path) -> bool:
    with gitpython.Repo(workspace) as repo:
        return not repo.is_dirty(untracked_files=True)


@pytest.mark.slow
def test_csv_from_the_debian_registry_passes_cargo_test_twice_the_second_time_incrementally(workdir: Path) -> None:
    run = start(workdir, tool="csv-tool", crate=registry_crate("csv", "1.1.6"))
    out = run.output("acquire")
    workspace = Path(out["workspace"])
    assert out["origin"]["method"] == "local"
    assert out["origin"]["version"] == "1.1.6"
    assert out["branch"] == "flakebot/csv-tool"
    assert (out["lockfile"], out["metadata_ok"]) == ("generated", True)  # csv ships no Cargo.lock
    assert not (workspace / ".cargo-checksum.json").exists() and not (workspace / "debian").exists()
    assert {"kind": "path", "path": str(run.workspace)} in run.state["resources"]
    assert {"kind": "path", "path": str(run.target_dir)} in run.state["resources"]
    with gitpython.Repo(workspace) as repo:
        assert [c.message.strip() for c in repo.iter_commits()] == [
            "Cargo.lock for the crate source this run uses",
            "upstream csv 1.1.6",
        ]

    first, output = cargo_test(run, workspace)
    assert "test result: ok. 137 passed" in output  # csv's doc tests; Debian commented out the example-running tests
    assert output.count("test result: ok.") == 3 and "FAILED" not in output
    assert any(not a["fresh"] for a in first)
    second, output = cargo_test(run, workspace)
    assert second and all(a["fresh"] for a in second)  # nothing recompiled: the run's one target dir is reused
    assert "test result: ok. 139 passed" in output
    assert run.target_dir.is_dir() and not (workspace / "target").exists()
    assert committed_clean(workspace)  # cargo wrote nothing into the tool's tree


@pytest.mark.slow
def test_hexyl_from_the_debian_registry_passes_cargo_test(workdir: Path) -> None:
    run = start(workdir, tool="hex-viewer", crate=registry_crate("hexyl", "0.8.0"))
    out = run.output("acquire")
    assert (out["lockfile"], out["metadata_ok"]) == ("generated", True)
    lock = tomllib.loads((run.workspace / "Cargo.lock").read_text())
    assert {p["name"]: p["version"] for p in lock["package"]}["clap"] == "2.34.0"
    artifacts, output = cargo_test(run, run.workspace)
    assert "test result: ok. 12 passed" in output and "FAILED" not in output
    assert any(a["target"]["name"] == "hexyl" and a["target"]["kind"] == ["bin"] for a in artifacts)


@pytest.mark.slow
def test_a_new_crate_using_csv_builds_offline(workdir: Path) -> None:
    run = start(workdir, tool="csv-dedupe", mode="new", crate=registry_crate("csv", "1.1.6"))
    out = run.output("acquire")
    assert out["origin"]["method"] == "new"
    assert out["origin"]["library"] == {"name": "csv", "version": "1.1.6"}
    assert (out["lockfile"], out["metadata_ok"]) == ("existing", True)  # cargo add wrote it
    (run.workspace / "src/main.rs").write_text(
        'fn main() {\n    let _ = csv::ReaderBuilder::new();\n    println!("ok");\n}\n'
    )
    result = Cargo.for_run(OFFLINE, run.target_dir).run(["run", "--quiet"], run.workspace, timeout=900)
    assert (result.returncode, result.stdout) == (0, "ok\n"), result.stderr[-2000:]


def test_the_stage_records_the_origin_and_clean_removes_what_it_made(workdir: Path, tmp_path: Path) -> None:
    run = start(workdir, tool="demo-tool", crate=local_crate(tmp_path / "demo", "demo"))
    out = run.output("acquire")
    assert run.state["status"] == "succeeded"
    assert out["origin"]["method"] == "local" and out["origin"]["crate"] == "demo"
    assert {k: out[k] for k in ("fork", "push", "delete_fork", "lockfile", "metadata_ok")} == {
        "fork": False,
        "push": False,
        "delete_fork": False,
        "lockfile": "generated",
        "metadata_ok": True,
    }
    assert committed_clean(run.workspace)
    assert any(e["message"] == "acquiring demo 0.1.0" for e in events(run, "progress"))
    run.target_dir.mkdir()  # as the first cargo build would

    removed = cleanup.clean_run(Run.load(workdir, run.id))

    assert f"path:{run.workspace}" in removed and f"path:{run.target_dir}" in removed
    assert not run.workspace.exists() and not run.target_dir.exists()
    assert (run.dir / "state.json").exists()
    assert run_cli("clean", run.id).returncode == 0
    assert not run.dir.exists()


def test_a_workspace_left_by_a_failed_attempt_is_replaced(workdir: Path, tmp_path: Path) -> None:
    run = Run.create(workdir, PIPELINE, request("demo-tool", local_crate(tmp_path / "demo", "demo")))
    run.workspace.mkdir()
    (run.workspace / "half-copied.rs").write_text("")
    pipeline.execute(run, OFFLINE)
    assert not (run.workspace / "half-copied.rs").exists()
    assert (run.workspace / "Cargo.toml").is_file()
    assert any(e["message"] == "removing the workspace of an earlier attempt" for e in events(run, "progress"))


def test_dependencies_missing_from_the_registry_are_reported_not_fatal(workdir: Path, tmp_path: Path) -> None:
    run = start(
        workdir, tool="demo-tool", crate=local_crate(tmp_path / "needy", "needy", 'no-such-crate-anywhere = "1"\n')
    )
    out = run.output("acquire")
    assert out["lockfile"] == "failed" and out["metadata_ok"] is False
    assert "no-such-crate-anywhere" in out["cargo_error"]
    warnings = [e for e in events(run, "progress") if e["data"].get("warning")]
    assert warnings and warnings[0]["message"].startswith("cargo cannot resolve the crate's dependencies: ")


def test_a_missing_tag_notice_reaches_the_events(workdir: Path, tmp_path: Path) -> None:
    bare = make_crate_repo(tmp_path, "demo", ["0.1.0"])
    chosen = CrateInfo(name="demo", version="0.5.0", repository=bare.as_uri()).to_dict()
    run = start(workdir, tool="demo-tool", crate=chosen)
    notice = run.output("acquire")["origin"]["notice"]
    assert notice.startswith("no tag for version 0.5.0")
    assert [e["message"] for e in events(run, "progress") if e["data"].get("notice")] == [notice]


def test_a_failed_acquisition_fails_the_stage_naming_the_crate(workdir: Path) -> None:
    chosen = CrateInfo(name="gone", version="1.0.0", repository=f"git://127.0.0.1:{free_port()}/gone.git").to_dict()
    with pytest.raises(AcquireError) as caught:
        start(workdir, tool="gone-tool", crate=chosen)
    assert caught.value.stage == "acquire"
    assert caught.value.exit_code == 20
    assert caught.value.message.startswith("cannot acquire gone 1.0.0: git clone")
    (run_dir,) = (workdir / "runs").iterdir()
    run = Run.load(workdir, run_dir.name)
    assert run.state["status"] == "failed"
    assert not run.workspace.exists()


def test_the_stage_needs_a_chosen_crate_and_a_tool_name(workdir: Path) -> None:
    with pytest.raises(AcquireError, match="no crate was chosen to start from"):
        start(workdir, tool="x")
    with pytest.raises(AcquireError, match="the spec stage gave the tool no name"):
        start(workdir, tool="", crate=registry_crate("csv", "1.1.6"))


def test_a_new_crate_is_vouched_committed_whole_for_the_edit_stage_of_this_process(
    workdir: Path, tmp_path: Path
) -> None:
    """A new crate's tree is cargo's and flakebot's alone, committed whole (ignored files too): the acquire stage says
    so in this process (Run.workspace_committed), and the edit stage's first start then runs no `git reset --hard` nor
    `git clean -fdx` (edit.py _start_clean). Nothing else is vouched for: a fork's tree, a run loaded again."""
    from flakebot.source import safegit

    run = start(workdir, tool="plain-tool", mode="new")
    assert run.state["status"] == "succeeded", run.state
    head = safegit.head_from_files(run.workspace)
    assert head and run.workspace_committed == head
    everything = ["status", "--porcelain", "--ignored", "--untracked-files=all"]
    assert safegit.git(run.workspace, *everything, error=AcquireError) == ""  # what reset and clean would undo: none
    assert Run.load(workdir, run.id).workspace_committed == ""

    forked = start(workdir, tool="demo-tool", crate=local_crate(tmp_path / "demo", "demo"))
    assert forked.state["status"] == "succeeded" and forked.workspace_committed == ""


def test_the_edit_stage_vouches_a_new_crate_at_its_first_start_only(workdir: Path) -> None:
    """The edit stage started again in the process that acquired (after its first start failed on) finds the tree as
    its first start left it, and whatever was written since: that start resets and cleans as before, and the marker
    vouching for the untouched tree is not used twice (edit.py _start_clean)."""
    from flakebot.agent.workspace import WorkspaceGit
    from flakebot.stages.edit import _start_clean

    run = start(workdir, tool="plain-tool", mode="new")
    git, ctx = WorkspaceGit(run.workspace), StageContext(run, OFFLINE, "edit")
    base = _start_clean(ctx, git)  # the first start: vouched for, nothing to undo
    (run.workspace / "target").mkdir()
    (run.workspace / "target" / "left").write_text("a build's\n")
    (run.workspace / "stray.rs").write_text("// the model's\n")
    (run.workspace / "Cargo.toml").write_text("[package]\nname = 'changed'\n")
    assert _start_clean(ctx, git) == base
    assert not (run.workspace / "target").exists() and not (run.workspace / "stray.rs").exists()
    assert "changed" not in (run.workspace / "Cargo.toml").read_text()
