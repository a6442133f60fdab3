"""The reliability report generator on a small subset, and the flakebot bugs the full report found (each pinned here)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.scenarios.shout import SHOUT_RS, SHOUT_SPEC, shout_craft_args
from flakebot import config
from flakebot.errors import ModelError, NixError, UsageError
from flakebot.pipeline import engine as pipeline
from flakebot.pipeline.engine import Stage, StageContext
from flakebot.pipeline.request import RunRequest
from flakebot.pipeline.run import Run, list_runs
from tests.conftest import REPO, require, run_cli

SESSION = REPO / "flakebot/data/sessions/csv-dedup.json"


@pytest.mark.slow
def test_quick_report_has_every_section_rendered_from_its_data(tmp_path: Path) -> None:
    require("bwrap", "cargo", "nix")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# x\n\n## Reliability\n\n<!-- reliability:start -->\nold figures\n<!-- reliability:end -->\n\n## After\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.reliability",
            "--quick",
            "--out",
            str(tmp_path / "bench"),
            "--readme",
            str(readme),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "bench/reliability.json").read_text())
    sections = report["sections"]
    assert list(sections) == [
        "faults",
        "escapes",
        "hostfiles",
        "steering",
        "inputs",
        "crashes",
        "concurrency",
        "catalogs",
        "text",
        "limits",
        "services",
    ]
    assert all(sections.values()), "every section produced rows"
    # The rows say what happened; the subset is one where everything must hold.
    assert all(
        row["ok"] for name in ("faults", "inputs", "crashes", "catalogs", "text", "services") for row in sections[name]
    ), sections
    assert all(row["bounded"] for row in sections["limits"]), sections["limits"]
    assert {(r["sandbox"], r["contained"]) for r in sections["escapes"]} == {
        ("bubblewrap", True),
        ("plain process", False),
        ("hostile session (pipeline)", True),
    }
    assert all(batch["consistent"] for batch in sections["concurrency"])
    assert all(row["contained"] for row in sections["hostfiles"]), sections["hostfiles"]
    assert all(row["contained"] for row in sections["steering"]), sections["steering"]
    fault = sections["faults"][0]
    assert fault["http_requests"] == fault["flakebot_calls"] + 1 and fault["how"] == "the SDK retried 1 time(s)"
    # The Markdown and the README carry the JSON's figures, not typed ones.
    markdown = (tmp_path / "bench/reliability.md").read_text()
    for heading in (
        "## Model-server faults",
        "## Sandbox escapes",
        "## Host file access in untrusted trees",
        "## Processes steered by where they start",
        "## Bad input",
        "## Crash points",
        "## Concurrent crafts",
        "## Limits",
    ):
        assert heading in markdown
    assert sections["inputs"][0]["error_line"] in markdown
    text = readme.read_text()
    assert "old figures" not in text and text.endswith("<!-- reliability:end -->\n\n## After\n")
    assert f"commit `{report['commit']}`" in text and report["machine"]["cpu"] in text
    assert f"{report['summary']['inputs']['ok']} of {report['summary']['inputs']['cases']} invocations" in text


# ------------------------------------------------------------------ bugs found by the report


def test_an_error_with_a_stage_keeps_its_brackets(tmp_path: Path) -> None:
    """Rich markup used to swallow "[spec]" (and "[[bin]]") in the red error line."""
    with_closed_port = f"openai-compatible:m@http://127.0.0.1:{_closed_port()}/v1"
    failed = run_cli(
        "craft",
        "need a CSV deduper",
        "--model",
        with_closed_port,
        "--registry",
        "local",
        "--offline",
        env={"FLAKEBOT_MODEL_RETRIES": "0"},
    )
    assert failed.returncode == 30
    assert failed.stderr.strip().splitlines()[-1].startswith("error: [spec] cannot reach openai-compatible:m@http")


@pytest.mark.parametrize(
    "args",
    [
        ["--stop-after", "bogus"],
        ["--mode", "sideways", "--crate", "csv"],
        ["--mode", "new"],
        ["--spec", "/nonexistent/spec.json"],
        ["--max-iterations", "0"],
        ["--max-tokens", "0"],
    ],
)
def test_bad_craft_options_fail_before_a_run_exists(workdir: Path, args: list[str]) -> None:
    failed = run_cli(
        "craft", "need a CSV deduper", "--model", f"scripted:{SESSION}", "--registry", "local", "--offline", *args
    )
    assert failed.returncode == UsageError.exit_code, failed.stderr
    assert failed.stderr.startswith("error: ") and "Fix: " in failed.stderr
    assert not (workdir / "runs").exists() or not any((workdir / "runs").iterdir())


def test_craft_without_nix_fails_before_any_model_call(workdir: Path, tmp_path: Path) -> None:
    shim = tmp_path / "bin"
    shim.mkdir()
    for program in ("git", "cargo", "bwrap"):
        found = shutil.which(program)
        if found:
            (shim / program).symlink_to(found)
    failed = run_cli(
        "craft",
        "need a CSV deduper",
        "--model",
        f"scripted:{SESSION}",
        "--registry",
        "local",
        "--offline",
        env={"PATH": str(shim)},
    )
    assert failed.returncode == NixError.exit_code and "nix is not installed" in failed.stderr
    assert not (workdir / "runs").exists() or not any((workdir / "runs").iterdir())


def test_nix_started_by_flakebot_dies_with_it(tmp_path: Path) -> None:
    """run_streaming puts nix in its own session; a SIGKILLed flakebot used to leave it building."""
    pid_file = tmp_path / "child.pid"
    code = "import sys; from flakebot.nix.command import run_streaming; run_streaming(['sh', '-c', 'echo $$ > ' + sys.argv[1] + '; exec sleep 300'], 600)"
    parent = subprocess.Popen([sys.executable, "-c", code, str(pid_file)])
    try:
        child = int(
            _wait_for(
                lambda: pid_file.read_text().strip() if pid_file.exists() and pid_file.read_text().strip() else None
            )
        )
        assert _alive(child)
        parent.kill()
    finally:
        parent.wait(timeout=30)
    assert _wait_for(lambda: not _alive(child), timeout=5), f"process {child} outlived its flakebot"


def test_a_stage_whose_work_was_removed_runs_again_with_every_later_stage(workdir: Path, tmp_path: Path) -> None:
    """The pipeline mechanism behind resuming a failed craft: clean removed what `make` produced."""
    flag = tmp_path / "fail-once"
    flag.write_text("")
    with pytest.raises(UsageError):
        pipeline.start(f"{__name__}:REMOVABLE", workdir, config.load(), RunRequest(target=str(flag)))
    (run,) = list_runs(workdir)
    assert run.stage_status("use") == "failed" and not (run.dir / "made").exists()
    done = pipeline.resume(workdir, run.id, config.load())
    assert done.state["status"] == "succeeded"
    assert {name: record["attempts"] for name, record in done.state["stages"].items()} == {
        "make": 2,
        "use": 2,
        "clean": 2,
    }


def _make(ctx: StageContext) -> dict[str, Any]:
    (ctx.run.dir / "made").write_text("work")
    return {}


def _use(ctx: StageContext) -> dict[str, Any]:
    flag = Path(ctx.request.target or "")  # the test's flag file
    if flag.exists():
        flag.unlink()
        raise UsageError("failing once", fix="resume")
    return {"read": (ctx.run.dir / "made").read_text()}


def _clean(ctx: StageContext) -> dict[str, Any]:
    (ctx.run.dir / "made").unlink(missing_ok=True)
    return {}


REMOVABLE = [
    Stage("make", _make, valid=lambda run: (run.dir / "made").exists()),
    Stage("use", _use),
    Stage("clean", _clean, always=True),
]


@pytest.mark.slow
def test_resume_after_a_failed_craft_whose_workspace_clean_removed(workdir: Path, tmp_path: Path) -> None:
    """A provider failing beyond the retries ends the craft (clean removes the workspace); resume used to crash on the missing workspace."""
    require("bwrap", "cargo", "nix")
    script, spec = tmp_path / "script.json", tmp_path / "spec.json"
    spec.write_text(json.dumps({**SHOUT_SPEC, "name": "shout-resumed"}))
    write = {"tool_calls": [{"name": "write_file", "arguments": {"path": "src/main.rs", "content": SHOUT_RS}}]}
    script.write_text(json.dumps({"format": 1, "stages": {"edit": [{"fault": {"kind": "500"}}] * 2 + [write]}}))
    args = [
        *shout_craft_args("shout", script, spec),
        "--registry",
        "local",
        "--offline",
    ]
    failed = run_cli(*args, env={"FLAKEBOT_MODEL_RETRIES": "1"})
    assert failed.returncode == ModelError.exit_code  # the provider's trouble, not the loop's
    assert (
        "failed with 500 (2 attempt(s))" in failed.stderr
        and "Fix: try again later; 'flakebot resume RUN' continues a run" in failed.stderr
    )
    (run,) = list_runs(workdir)
    assert not run.workspace.exists()

    script.write_text(json.dumps({"format": 1, "stages": {"edit": [write]}}))  # the provider is healthy again
    resumed = run_cli("resume", run.id)
    assert resumed.returncode == 0, resumed.stderr
    done = Run.load(workdir, run.id)
    assert done.state["status"] == "succeeded"
    assert [
        done.state["stages"][s]["attempts"] for s in ("spec", "search", "choose", "acquire", "edit", "package")
    ] == [1, 1, 1, 2, 2, 1]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1][:1]
    except OSError:
        return False
    return state != "Z"


def _wait_for(probe: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.05)
    return None
