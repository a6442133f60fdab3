"""What an agent gets from the CLI: --json failure objects, craft --from (a git repository on loopback, a local
directory), package --out, and names a new tool never takes from another need's tool."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from benchmarks.scenarios.gitserve import GitDaemon, crate_manifest, make_crate_repo
from benchmarks.scenarios.shout import SHOUT_RS, SHOUT_SPEC, write_file
from flakebot import config
from flakebot.deliver.catalog import Catalog
from flakebot.pipeline.run import Run, list_runs
from tests.conftest import REPO, json_result, require, run_cli
from tests.fakes.nix_crates import greeter

SESSION = REPO / "flakebot/data/sessions/csv-dedup.json"
OFFLINE = ["--registry", "local", "--offline"]


def error_object(completed: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The error object a failed --json command printed last on stdout; stderr keeps the human line."""
    last = json.loads(completed.stdout.splitlines()[-1])
    assert {"error", "fix", "exit_code", "run_id", "stage"} <= set(last), last
    assert last["exit_code"] == completed.returncode and "error:" in completed.stderr
    return dict(last)


def shout_files(tmp_path: Path) -> tuple[Path, Path]:
    """(spec file, scripted model writing the shout program in one edit)."""
    spec, script = tmp_path / "spec.json", tmp_path / "script.json"
    spec.write_text(json.dumps(SHOUT_SPEC))
    script.write_text(
        json.dumps({"format": 1, "stages": {"edit": [{"tool_calls": [write_file("src/main.rs", SHOUT_RS)]}]}})
    )
    return spec, script


def test_json_failures_before_a_run_exists(tmp_path: Path) -> None:
    bad_need = error_object(run_cli("craft", "  ", "--json"))
    assert (bad_need["exit_code"], bad_need["run_id"], bad_need["type"]) == (2, None, "UsageError") and bad_need["fix"]

    unknown_model = error_object(run_cli("craft", "need a CSV deduper", "--model", "nope:zz", "--json"))
    assert unknown_model["exit_code"] == 30 and "unknown model provider" in unknown_model["error"]

    no_nix = error_object(
        run_cli(
            "craft",
            "need a CSV deduper",
            "--model",
            f"scripted:{SESSION}",
            *OFFLINE,
            "--json",
            env={"PATH": str(tmp_path)},
        )
    )
    assert no_nix["exit_code"] == 50 and "nix is not installed" in no_nix["error"] and no_nix["run_id"] is None

    for command in (("resume", "no-such-run"), ("show", "no-such-run"), ("run", "no-such-tool", "--args-json", "{}")):
        unknown = error_object(run_cli(*command, "--json"))
        assert unknown["exit_code"] in (4, 60) and unknown["fix"], command

    usage = error_object(run_cli("craft", "x", "--no-such-option", "--json"))
    assert usage["exit_code"] == 2 and "No such option" in usage["error"]
    assert list_runs(Path(config.load().workdir)) == []


def test_a_name_held_by_another_need_is_never_taken(tmp_path: Path, workdir: Path) -> None:
    catalog = Catalog.open(config.load())
    flake = tmp_path / "flake"
    flake.mkdir()
    (flake / "flake.nix").write_text("{ }\n")
    catalog.add(
        "shout",
        need="shout at me",
        flake_dir=flake,
        manifest={},
        usage_md="",
        store_path="/nonexistent",
        run_id="r1",
        origin={},
    )
    spec, script = shout_files(tmp_path)
    args = ("--model", f"scripted:{script}", "--spec", str(spec), "--crate", "csv", *OFFLINE, "--json")

    refused = error_object(run_cli("craft", "upper-case my input", "--name", "shout", *args))
    assert refused["exit_code"] == 2 and "--name shout-2" in refused["fix"] and list_runs(workdir) == []

    renamed = run_cli("craft", "upper-case my input", *args, "--stop-after", "spec")
    assert renamed.returncode == 0, renamed.stderr
    assert Run.load(workdir, json_result(renamed)["run_id"]).output("spec")["name"] == "shout-2"

    with pytest.raises(Exception, match="already has a tool named shout for another need"):
        catalog.add(
            "shout",
            need="upper-case my input",
            flake_dir=flake,
            manifest={},
            usage_md="",
            store_path="/nonexistent",
            run_id="r2",
            origin={},
        )
    assert catalog.get("shout")["run_id"] == "r1"


def test_craft_from_a_local_directory_skips_search_and_choice(tmp_path: Path, workdir: Path) -> None:
    require("cargo")
    crate = tmp_path / "mine"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text(crate_manifest("shout", "0.3.0"))
    (crate / "src/lib.rs").write_text("pub fn x() {}\n")
    spec, script = shout_files(tmp_path)
    done = run_cli(
        "craft",
        "shout",
        "--from",
        str(crate),
        "--model",
        f"scripted:{script}",
        "--spec",
        str(spec),
        *OFFLINE,
        "--stop-after",
        "acquire",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    run = Run.load(workdir, json_result(done)["run_id"])
    assert run.output("search")["candidates"] == [] and run.output("choose")["by"] == "option"
    origin = run.output("acquire")["origin"]
    assert (origin["method"], origin["package"], origin["version"], origin["crate_dir"]) == (
        "local",
        "shout",
        "0.3.0",
        "",
    )
    assert (run.workspace / "src/lib.rs").is_file()


@pytest.mark.slow
def test_craft_from_a_git_repository_at_a_ref(tmp_path: Path, workdir: Path) -> None:
    require("bwrap", "cargo", "nix", "git")
    make_crate_repo(tmp_path / "repos", "shout", ["0.1.0", "0.2.0"])
    spec, script = shout_files(tmp_path)
    with GitDaemon(tmp_path / "repos") as daemon:
        url = daemon.url("shout.git") + "#v0.1.0"
        crafted = run_cli(
            "craft", "shout", "--from", url, "--model", f"scripted:{script}", "--spec", str(spec), *OFFLINE, "--json"
        )
    assert crafted.returncode == 0, crafted.stderr
    result = json_result(crafted)
    origin = result["manifest"]["origin"]
    assert (origin["method"], origin["ref"], origin["version"]) == ("git", "v0.1.0", "0.1.0")  # HEAD is 0.2.0
    assert result["status"] == "crafted" and result["choice"]["by"] == "option"
    shouted = run_cli("run", "shout", "--args-json", json.dumps({"stdin": "from git\n"}), "--json")
    assert json_result(shouted) == {"tool": "shout", "argv": [], "exit_code": 0, "stdout": "FROM GIT\n", "stderr": ""}


@pytest.mark.slow
def test_package_out_writes_the_flake_where_asked_and_clean_keeps_it(tmp_path: Path, workdir: Path) -> None:
    require("nix", "cargo")
    source, out = greeter(tmp_path / "greeter"), tmp_path / "out" / "greeter-flake"
    packaged = run_cli("package", str(source), "--nixpkgs", "host", "--out", str(out), "--json")
    assert packaged.returncode == 0, packaged.stderr
    result = json_result(packaged)
    assert Path(result["flake_dir"]) == out and (out / "flake.nix").is_file() and (out / "flake.lock").is_file()
    assert run_cli("clean", result["run_id"]).returncode == 0
    assert not (workdir / "runs" / result["run_id"]).exists() and (out / "flake.nix").is_file()
    ran = subprocess.run(
        [str(Path(result["store_path"]) / "bin" / result["main_program"]), "bob"], capture_output=True, text=True
    )
    assert (ran.returncode, ran.stdout) == (0, "hello, bob\n"), ran.stderr
