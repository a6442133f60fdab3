"""Craft end to end, offline: scripted model behind the stub server (the real SDK the script names), Debian's
registry, real cargo in bubblewrap, real nix with the host stand-in, the catalog, the MCP server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from benchmarks.scenarios.shout import SHOUT_RS, SHOUT_SPEC, shout_craft_args, write_file
from flakebot.deliver.catalog import Catalog
from flakebot.errors import EditError
from flakebot.nix.lock import PINNED_RUSTC
from flakebot.pipeline.run import Run, list_runs
from tests.conftest import REPO, json_result, require, run_cli, wait_for
from tests.fakes.mcp_call import mcp_call

SESSION = REPO / "flakebot/data/sessions/csv-dedup.json"
OFFLINE = ["--registry", "local", "--offline"]
AUDIT_FILES = {
    ".lock",
    "events.jsonl",
    "run.log",
    "state.json",
    "transcript.jsonl",
    "flake",
    "edit.json",
    "manifest.json",
    "USAGE.md",
}
CSV = "id,name\n1,ann\n2,bob\n1,ann\n3,cy\n2,bob\n"


def result_of(stdout: str) -> dict[str, Any]:
    return json.loads(stdout.splitlines()[-1])["result"]


@pytest.mark.slow
def test_craft_csv_deduper_end_to_end(workdir: Path, flakebot_home: Path, tmp_path: Path) -> None:
    require("bwrap", "cargo", "nix")
    crafted = run_cli("craft", "need a CSV deduper", "--model", f"scripted:{SESSION}", *OFFLINE, "--json")
    assert crafted.returncode == 0, crafted.stderr
    result = result_of(crafted.stdout)
    manifest = result["manifest"]
    assert result["status"] == "crafted" and result["name"] == "csv-dedup"
    assert result["choice"] == {"crate": "csv", "mode": "new", "reason": result["choice"]["reason"], "by": "model"}

    # nix run of the produced tool, exactly as the manifest says, dedupes a CSV.
    deduped = subprocess.run(
        [*manifest["nix_run_argv"], "--", "--key", "id"], input=CSV, capture_output=True, text=True, timeout=300
    )
    assert (deduped.returncode, deduped.stdout) == (0, "id,name\n1,ann\n2,bob\n3,cy\n"), deduped.stderr
    # The verification command flakebot ran passes when run here, as printed.
    verification = manifest["verification_command"]
    assert verification["passed"] is True
    rerun = subprocess.run(verification["command"], shell=True, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0 and rerun.stdout == "id,name\n1,ann\n2,bob\n3,cy\n"
    # Facts, not prose: the real --help, real outputs of every example, schemas from the clap help.
    assert "Usage: csv-dedup [OPTIONS] [FILE]" in manifest["help_text"]
    assert all(e["passed"] for e in manifest["examples"]) and len(manifest["examples"]) == 5
    properties = manifest["openai_tool"]["function"]["parameters"]["properties"]
    assert {"file", "key", "no_header", "stdin"} <= set(properties)
    assert manifest["mcp_tool"]["inputSchema"] == manifest["openai_tool"]["function"]["parameters"]
    assert manifest["openai_tool"]["function"]["strict"] is True and properties["key"]["type"] == ["array", "null"]

    # Built with the host stand-in: the manifest says the commands are for this machine only, and show says so.
    assert manifest["portable"] is False and "stand-in for nixpkgs" in manifest["portable_reason"]
    assert "portable: no" in run_cli("show", "csv-dedup").stdout
    # The flake's crate declares the pinned nixpkgs' rustc (written by flakebot after the model's edits).
    flake_crate = tomllib.loads((Path(manifest["flake_ref"]) / "Cargo.toml").read_text())
    assert flake_crate["package"]["rust-version"] == PINNED_RUSTC

    # Clean kept only the audit record.
    run = Run.load(workdir, result["run_id"])
    assert {p.name for p in run.dir.iterdir()} <= AUDIT_FILES
    # the workspace, removed while instruct ran the examples, is clean's to report as it removed it
    assert f"path:{run.workspace}" in run.output("clean")["removed"]
    assert (run.dir / "USAGE.md").read_text().startswith("# csv-dedup")

    # The same need again comes from the catalog, at once, without a model.
    again = run_cli("craft", "Need a CSV deduper!", "--model", "scripted:/nonexistent.json", *OFFLINE, "--json")
    assert again.returncode == 0, again.stderr
    cached = result_of(again.stdout)
    assert cached["status"] == "cached" and cached["from_catalog"] is True and cached["run_id"] == result["run_id"]
    assert len(list_runs(workdir)) == 1  # no run was started

    # Differently worded, so not the same normalized need: the model judges the catalogued tool equivalent.
    reuse = tmp_path / "reuse.json"
    turn = {
        "expect": {"tools_include": ["use_existing"], "last_user_contains": "csv-dedup"},
        "tool_calls": [{"name": "use_existing", "arguments": {"name": "csv-dedup", "reason": "same job"}}],
    }
    reuse.write_text(json.dumps({"format": 1, "stages": {"spec": [turn]}}))
    judged = run_cli(
        "craft", "drop repeated rows from comma separated files", "--model", f"scripted:{reuse}", *OFFLINE, "--json"
    )
    assert judged.returncode == 0, judged.stderr
    assert result_of(judged.stdout)["status"] == "cached" and result_of(judged.stdout)["name"] == "csv-dedup"
    reused_run = Run.load(workdir, result_of(judged.stdout)["run_id"])
    assert reused_run.output("spec")["reuse"] == "csv-dedup" and reused_run.stage_status("search") == "pending"
    assert reused_run.state["status"] == "succeeded" and reused_run.stage_status("clean") == "finished"

    # The catalog commands and the MCP server use the same tool.
    assert [tool["name"] for tool in json_result(run_cli("list", "--json"))["tools"]] == ["csv-dedup"]
    ran = run_cli("run", "csv-dedup", "--", "--key", "name", input="id,name\n1,a\n2,a\n")
    assert (ran.returncode, ran.stdout) == (0, "id,name\n1,a\n"), ran.stderr
    # The tool's schema arguments, as a function-calling agent passes them: the same mapping as MCP.
    by_schema = run_cli("run", "csv-dedup", "--args-json", json.dumps({"key": "name", "stdin": "id,name\n1,a\n2,a\n"}))
    assert (by_schema.returncode, by_schema.stdout) == (0, "id,name\n1,a\n"), by_schema.stderr
    refused = run_cli("run", "csv-dedup", "--", "--key", "zip", input="id,name\n1,a\n")
    assert refused.returncode == 1 and "no column named 'zip'" in refused.stderr
    assert "not writing modified lock file" not in refused.stderr + ran.stderr
    mcp = mcp_call("run", {"tool": "csv-dedup", "args": [], "stdin": CSV})
    assert mcp["ok"] and mcp["stdout"] == "id,name\n1,ann\n2,bob\n3,cy\n"
    removed = run_cli("rm", "csv-dedup")
    assert removed.returncode == 0 and json_result(run_cli("list", "--json")) == {"tools": []}


@pytest.mark.slow
def test_sigkill_during_edit_then_resume_completes(workdir: Path) -> None:
    require("bwrap", "cargo", "nix")
    argv = [
        sys.executable,
        "-m",
        "flakebot",
        "craft",
        "need a CSV deduper",
        "--model",
        f"scripted:{SESSION}",
        *OFFLINE,
        "--json",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        events = wait_for(lambda: next(workdir.glob("runs/*/events.jsonl"), None))
        wait_for(lambda: '"stage": "edit", "message": "' in events.read_text(), timeout=120)  # its first word
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    run = Run.load(workdir, events.parent.name)
    assert run.status == "interrupted" and run.stage_status("edit") == "running"

    resumed = run_cli("resume", run.id, "--json")
    assert resumed.returncode == 0, resumed.stderr
    done = Run.load(workdir, run.id)
    assert done.state["status"] == "succeeded"
    assert [done.state["stages"][s]["attempts"] for s in ("spec", "search", "choose", "acquire", "edit")] == [
        1,
        1,
        1,
        1,
        2,
    ]
    assert done.output("instruct")["manifest"]["verification_command"]["passed"] is True


@pytest.mark.slow
def test_a_failed_craft_leaves_only_the_run_record(workdir: Path, tmp_path: Path) -> None:
    require("bwrap", "cargo")
    script = tmp_path / "script.json"
    same = {"tool_calls": [write_file("src/main.rs", "fn main() { broken }")]}
    script.write_text(json.dumps({"format": 1, "stages": {"edit": [same, same, same]}}))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SHOUT_SPEC))
    failed = run_cli(
        *shout_craft_args("shout", script, spec),
        *OFFLINE,
        "--json",
    )
    assert failed.returncode == EditError.exit_code
    (run,) = list_runs(workdir)
    # --json: the events, then one error object naming the run, on stdout; the human line on stderr.
    error = json.loads(failed.stdout.splitlines()[-1])
    assert (error["exit_code"], error["stage"], error["run_id"]) == (EditError.exit_code, "edit", run.id) and error[
        "fix"
    ]
    assert json.loads(failed.stdout.splitlines()[-2])["event"] == "run_failed" and "error: [edit]" in failed.stderr
    assert run.state["status"] == "failed" and run.stage_status("clean") == "finished"
    assert {p.name for p in run.dir.iterdir()} <= AUDIT_FILES
    assert not run.workspace.exists() and not run.target_dir.exists()


@pytest.mark.slow
def test_four_concurrent_crafts_leave_a_consistent_catalog(workdir: Path, tmp_path: Path, flakebot_home: Path) -> None:
    require("bwrap", "cargo", "nix")
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps({"format": 1, "stages": {"edit": [{"tool_calls": [write_file("src/main.rs", SHOUT_RS)]}]}})
    )
    procs = []
    for i in range(4):
        spec = tmp_path / f"spec{i}.json"
        spec.write_text(json.dumps({**SHOUT_SPEC, "name": f"shout-{i}"}))
        argv = [
            *shout_craft_args(f"shout number {i}", script, spec),
            *OFFLINE,
        ]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "flakebot", *argv, "--json"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outcomes = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [err[-2000:] for _, err in outcomes]
    catalog_dir = flakebot_home / "data/flakebot"
    tools = Catalog(catalog_dir).tools()
    assert sorted(tools) == ["shout-0", "shout-1", "shout-2", "shout-3"]
    for entry in tools.values():
        tool = Path(entry["dir"])
        assert (tool / "manifest.json").is_file() and (tool / "flake/flake.nix").is_file()
        assert Path(entry["store_path"]).is_dir() and os.readlink(tool / "gcroot") == entry["store_path"]
        assert Path(os.readlink(tool / "deps-gcroot")).name.endswith("-cargo-deps-0")  # its dependencies' output too
    assert not any((catalog_dir / "tools/.staging").iterdir())
    shouted = run_cli("run", "shout-2", input="abc\n")
    assert shouted.stdout == "ABC\n"


def test_sandbox_off_is_only_by_request_and_warned_on_every_run(workdir: Path, tmp_path: Path) -> None:
    spec, script = tmp_path / "spec.json", tmp_path / "script.json"
    spec.write_text(json.dumps(SHOUT_SPEC))
    script.write_text(json.dumps({"format": 1, "stages": {}}))
    args = [
        *shout_craft_args("shout", script, spec),
        *OFFLINE,
        "--stop-after",
        "spec",
    ]
    default = run_cli(*args)
    assert default.returncode == 0 and "sandbox off" not in default.stderr, default.stderr
    off = run_cli(*args, "--sandbox", "off")
    assert off.returncode == 0 and "sandbox off (asked for)" in off.stderr, off.stderr
    started = [
        json.loads(line)
        for run in list_runs(workdir)
        for line in run.events_path.read_text().splitlines()
        if '"run_started"' in line
    ]
    assert sorted(e["data"]["sandbox"] for e in started) == ["off", "required"]


def test_a_craft_never_loads_what_only_other_crafts_need(tmp_path: Path) -> None:
    """flakebot's own seconds in a craft (benchmarks P1-own): an offline craft of a tool, no shared catalog set, through
    the real CLI, with every stage module of the craft pipeline imported too, loads no httpx (only a fork on GitHub
    asks over it here: 0.1-0.2 s of import) and not the installer of shared catalogs (after the catalog is asked)."""
    code = (
        "import atexit, importlib, sys\n"
        "from flakebot.stages import CRAFT\n"
        "for stage in CRAFT:  # before the craft: a module importing concurrent.futures cannot once it has ended\n"
        "    importlib.import_module(f'flakebot.stages.{stage.name}')\n"
        "def loaded():\n"
        "    unwanted = ('httpx', 'flakebot.deliver.install', 'flakebot.deliver.shared')\n"
        "    print('loaded:', ' '.join(sorted(set(unwanted) & set(sys.modules))) or 'none')\n"
        "atexit.register(loaded)\n"
        "sys.argv = ['flakebot', *sys.argv[1:]]\n"
        "from flakebot.cli.entry import main\n"
        "main()\n"
    )
    offline = ["--registry", "local", "--offline", "--json"]
    session = tmp_path / "session.json"  # through the openai SDK, which loads no httpx (the groq SDK is built on it)
    session.write_text(json.dumps({**json.loads(SESSION.read_text()), "sdk": "openai"}))
    # to the spec stage (no catalog asked), and a whole craft's start (the catalog asked) stopped by a missing script
    for model, more, status in ((session, ["--stop-after", "spec"], "stopped"), (tmp_path / "none.json", [], None)):
        argv = ["craft", "need a CSV deduper", "--model", f"scripted:{model}", *offline, *more]
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
        *printed, loaded = done.stdout.splitlines()
        assert json.loads(printed[-1]).get("result", {}).get("status") == status, done.stderr[-2000:]
        assert loaded == "loaded: none"
