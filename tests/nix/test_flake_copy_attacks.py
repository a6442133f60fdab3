"""Attacks on the package stage's copy of a tree someone else wrote (the workspace the model edited and whose code
ran in the sandbox): nothing outside the tree may reach the flake, whatever git's index still lists."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flakebot.errors import FlakebotError
from flakebot.nix.flake_files import copy_sources
from flakebot.pipeline.engine import Stage, execute
from flakebot.pipeline.request import RunRequest
from flakebot.pipeline.run import Run
from tests.fakes.nix_crates import greeter, host_settings

SECRET = "host secret: never in a flake"


def committed(crate: Path) -> Path:
    """`crate` as a git repository with everything committed (as the edit loop leaves it)."""
    subprocess.run(["git", "-C", str(crate), "init", "-q"], check=True)
    return commit_all(crate)


def commit_all(repo: Path) -> Path:
    """`git add -A` and a commit, as the edit loop's commit after a verdict."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "green"], check=True)
    return repo


def shipped_text(dest: Path) -> str:
    return "".join(p.read_text() for p in dest.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.parametrize("ignore", ["", "/src\n"], ids=["listed", "ignored"])
def test_a_directory_swapped_for_a_link_after_the_commit_copies_no_host_file(tmp_path: Path, ignore: str) -> None:
    # the index still lists src/main.rs; the work tree's src is now a link to a host directory holding a main.rs;
    # "ignored": the link also hidden from `ls-files --others --exclude-standard` by a .gitignore the sandbox wrote
    crate = committed(greeter(tmp_path / "crate"))
    host = tmp_path / "host"
    host.mkdir()
    (host / "main.rs").write_text(SECRET)
    subprocess.run(["rm", "-r", str(crate / "src")], check=True)
    (crate / "src").symlink_to(host)
    if ignore:
        (crate / ".gitignore").write_text("/target\nCargo.lock\n" + ignore)
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(FlakebotError, match="src"):
        copy_sources(crate, dest)
    assert SECRET not in shipped_text(dest)


def _package_stage(ctx: Any) -> Any:
    from flakebot.stages.package import package_stage

    return package_stage(ctx)


CRAFT_PACKAGE = [Stage("package", _package_stage)]


def test_a_crate_directory_swapped_for_a_link_to_a_host_crate_is_not_packaged(tmp_path: Path) -> None:
    # a fork's crate at tool/ in the workspace; a test in the sandbox renamed tool/ away and left a link named tool
    # to a crate of the host's, and the green commit's `git add -A` recorded the link
    run = Run.create(tmp_path / "work", f"{__name__}:CRAFT_PACKAGE", RunRequest(need="greet people"))
    committed(greeter(run.workspace / "tool").parent)
    host = greeter(tmp_path / "host-crate")
    (host / "src/main.rs").write_text((host / "src/main.rs").read_text() + f"// {SECRET}\n")
    shutil.rmtree(run.workspace / "tool")
    (run.workspace / "tool").symlink_to(host)
    commit_all(run.workspace)
    run.state["outputs"] = {
        "acquire": {"origin": {"crate_dir": "tool"}, "crate_dir": "tool"},
        "spec": {"name": "greeter", "summary": "Greets whoever you name"},
    }
    run.save()
    with pytest.raises(FlakebotError, match="tool: is a symbolic link"):
        execute(run, host_settings(tmp_path))
    assert not run.flake_dir.exists() or SECRET not in shipped_text(run.flake_dir)


def test_a_file_the_tests_used_ships_though_the_models_gitignore_kept_it_out_of_the_commit(tmp_path: Path) -> None:
    # what was tested is what is shipped: the model's .gitignore keeps data/ out of the green commit (`git add -A`),
    # but the tool the tests passed on was compiled with it (include_str!)
    run = Run.create(tmp_path / "work", f"{__name__}:CRAFT_PACKAGE", RunRequest(need="greet people"))
    crate = greeter(run.workspace)
    main = (crate / "src/main.rs").read_text()
    (crate / "src/main.rs").write_text(main.replace('"hello, {name}"', '"{} {name}", include_str!("../data/hi.txt")'))
    (crate / "data").mkdir()
    (crate / "data/hi.txt").write_text("howdy,")
    (crate / ".gitignore").write_text("/target\nCargo.lock\n/data\n")
    committed(crate)
    run.state["outputs"] = {
        "acquire": {"origin": {"crate_dir": "."}, "crate_dir": "."},
        "spec": {"name": "greeter", "summary": "Greets whoever you name"},
    }
    run.save()
    execute(run, host_settings(tmp_path))
    assert (run.flake_dir / "data/hi.txt").read_text() == "howdy,"
    built = Path(run.output("package")["store_path"], "bin", "greeter")
    assert subprocess.run([built, "you"], capture_output=True, text=True, check=True).stdout == "howdy, you\n"


def test_a_link_climbing_out_of_the_crate_and_back_in_by_its_name_is_refused(tmp_path: Path) -> None:
    # ../workspace/target/pipe resolves inside the workspace, but copied as it is into the run's flake/ beside it, the
    # same text names the workspace's own target/pipe, which the copy left out: a FIFO the host then reads the flake's
    # Cargo.toml through (declare_rust_version) and waits on forever
    workspace = tmp_path / "workspace"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src/main.rs").write_text("fn main() {}\n")
    (workspace / "target").mkdir()
    os.mkfifo(workspace / "target/pipe")
    (workspace / "Cargo.toml").symlink_to("../workspace/target/pipe")
    with pytest.raises(FlakebotError, match="Cargo.toml is a symbolic link to ../workspace/target/pipe, outside"):
        copy_sources(workspace, tmp_path / "flake", listed_by_git=False)
    assert not (tmp_path / "flake/Cargo.toml").is_symlink()
