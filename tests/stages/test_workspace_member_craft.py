"""A craft whose crate is a member of a cargo workspace: cloned from a git repo on loopback, edited and
tested in the member's directory, packaged and run. Real git daemon, cargo in bubblewrap, nix, the catalog."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.scenarios.gitserve import GitDaemon, make_workspace_repo
from benchmarks.scenarios.shout import SHOUT_RS, SHOUT_SPEC, write_file
from flakebot.pipeline.run import list_runs
from tests.conftest import require, run_cli


def directory_source(root: Path, repository: str) -> Path:
    """A cargo directory source holding demo-cli 0.4.0 as published, its repository pointing at the workspace."""
    crate = root / "registry" / "demo-cli-0.4.0"
    (crate / "src").mkdir(parents=True)
    manifest = f'[package]\nname = "demo-cli"\nversion = "0.4.0"\nedition = "2021"\nrepository = "{repository}"\n'
    (crate / "Cargo.toml").write_text(manifest + '\n[dependencies]\ndemo-core = "0.4.0"\n')
    (crate / "src/main.rs").write_text("fn main() {}\n")
    (crate / ".cargo-checksum.json").write_text('{"files": {}, "package": ""}')
    return crate.parent


@pytest.mark.slow
def test_craft_from_a_workspace_member_edits_tests_and_builds_the_member(workdir: Path, tmp_path: Path) -> None:
    require("bwrap", "cargo", "nix", "git")
    make_workspace_repo(tmp_path / "repos")
    script, spec = tmp_path / "script.json", tmp_path / "spec.json"
    member = '[package]\nname = "demo-cli"\nversion = "0.4.0"\nedition = "2021"\n\n[[bin]]\nname = "shout"\npath = "src/main.rs"\n'
    edits = [write_file("crates/cli/Cargo.toml", member), write_file("crates/cli/src/main.rs", SHOUT_RS)]
    script.write_text(json.dumps({"format": 1, "stages": {"edit": [{"tool_calls": edits}]}}))
    spec.write_text(json.dumps(SHOUT_SPEC))
    with GitDaemon(tmp_path / "repos") as daemon:
        registry = directory_source(tmp_path, daemon.url("tools.git"))
        args = [
            "--model",
            f"scripted:{script}",
            "--spec",
            str(spec),
            "--crate",
            "demo-cli",
            "--mode",
            "fork",
            "--method",
            "git",
        ]
        crafted = run_cli(
            "craft", "upper-case my input", *args, "--registry", str(registry), "--offline", "--keep", "--json"
        )
    assert crafted.returncode == 0, crafted.stderr

    [run] = list_runs(workdir)
    assert run.output("acquire")["crate_dir"] == "crates/cli"
    # The acceptance test sits in the member and cargo ran it there, not at the workspace root.
    assert (run.workspace / "crates/cli/tests/flakebot_acceptance.rs").is_file()
    assert not (run.workspace / "tests").exists()
    assert json.loads((run.dir / "edit.json").read_text())["verdict"]["acceptance_missing"] == []
    package = run.output("package")
    assert (package["pname"], package["main_program"]) == ("demo-cli", "shout")
    assert run.target_dir.is_dir()  # --keep: the edit loop's builds stay too (not removed while nix builds)
    assert (run.workspace / ".git").is_dir()  # and the workspace (not removed while the examples run)

    ran = run_cli("run", "shout", input="workspace member\n")
    assert (ran.returncode, ran.stdout) == (0, "WORKSPACE MEMBER\n"), ran.stderr
