"""The edit loop's workspace on a real git repository: commits of changed states only, restores, changed files
relative to the crate, nested .git swept before every host git call, and the guard (frozen files, disk use)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from flakebot.agent.acceptance import Frozen
from flakebot.agent.loop import StopLoop
from flakebot.agent.tools import Toolbox
from flakebot.agent.workspace import Checks, Workspace, WorkspaceGit
from flakebot.cargo.runner import Cargo
from flakebot.errors import EditError
from flakebot.sandbox import open_sandbox
from flakebot.toolspec import ToolSpec
from tests.conftest import require

ACCEPTANCE = "#[test]\nfn adds() {}\n"


def make_workspace(root: Path, disk_mb: int = 1024) -> Workspace:
    """A repository holding crate/ (its acceptance test frozen) beside other/, its first commit the base."""
    for rel, text in {
        "crate/Cargo.toml": '[package]\nname = "demo"\nversion = "0.1.0"\n',
        "crate/src/main.rs": "fn main() {}\n",
        "crate/tests/acceptance.rs": ACCEPTANCE,
        "other/notes.txt": "not the crate\n",
        ".gitignore": "target/\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git = WorkspaceGit(root)
    git("init", "-q")
    base = git.commit("base")
    frozen = Frozen(root, {"crate/tests/acceptance.rs": hashlib.sha256(ACCEPTANCE.encode()).hexdigest()})
    target = root.parent / "target"
    sandbox = open_sandbox("off", workspace=root, writable=[root, target])
    spec = ToolSpec(name="demo", summary="a demo", usage="demo", examples=[])
    checks = Checks(sandbox, Cargo(target_dir=target, offline=True), spec, lambda *_: (True, None))  # type: ignore[arg-type, return-value]
    return Workspace(git, "crate", frozen, checks, base=base, scratch=[target], disk_mb=disk_mb)


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    (tmp_path / "repo").mkdir()
    return make_workspace(tmp_path / "repo")


def test_commit_makes_a_commit_only_when_something_changed(ws: Workspace) -> None:
    assert ws.commit("nothing new") == ws.base
    (ws.crate_dir / "src/main.rs").write_text('fn main() { println!("hi"); }\n')
    changed = ws.commit("an edit")
    assert changed != ws.base and ws.git("log", "-1", "--format=%s").strip() == "an edit"


def test_a_commit_with_nothing_new_takes_gits_own_status_for_it(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`git commit` says it found nothing to commit: that is the answer, the index not asked again (`diff --cached`),
    counted through a git on PATH that logs each call and runs the real git."""
    real, log = shutil.which("git"), tmp_path / "git.log"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/git").write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    (tmp_path / "bin/git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert ws.commit("nothing new") == ws.base
    asked = log.read_text().splitlines()
    assert len(asked) == 2 and " add -A" in asked[0] and " commit " in asked[1], asked  # HEAD read from .git's files


def test_a_commit_git_refuses_with_something_staged_ends_with_gits_reason(ws: Workspace) -> None:
    (ws.root / "crate/src/main.rs").write_text("fn main() { /* refused */ }\n")
    branch = ws.git("symbolic-ref", "HEAD").strip()
    (ws.root / ".git" / f"{branch}.lock").write_text("")  # another git holds the branch
    with pytest.raises(EditError, match=r"git commit failed.*\.lock"):
        ws.commit("refused")
    (ws.root / ".git" / f"{branch}.lock").unlink()
    assert ws.commit("then made") != ws.base and ws.commit("nothing new after it") == ws.git.head()


def test_a_commit_names_head_as_git_does_whether_its_ref_is_loose_or_packed(ws: Workspace) -> None:
    (ws.root / "crate/src/main.rs").write_text("fn main() { /* loose */ }\n")
    loose = ws.commit("a loose ref")
    assert loose == ws.git.head() == ws.git.head_from_files() != ws.base
    ws.git("pack-refs", "--all")  # no refs/heads file left: HEAD is read by rev-parse
    (ws.root / "crate/src/main.rs").write_text("fn main() { /* packed */ }\n")
    ws.git("add", "-A")
    ws.git("commit", "-q", "-m", "made while packed")
    ws.git("pack-refs", "--all")
    assert ws.git.head_from_files() == ""
    assert ws.commit("nothing new") == ws.git.head() != loose
    (ws.root / "crate/src/main.rs").write_text("fn main() { /* loose over packed */ }\n")
    shadowing = ws.commit("a loose ref beside the packed one")  # git reads the loose one first, as head_from_files
    assert shadowing == ws.git.head() == ws.git.head_from_files()
    assert shadowing not in (ws.root / ".git/packed-refs").read_text()  # the packed one names the commit before
    ws.git("checkout", "-q", "--detach")  # HEAD holds the commit itself
    assert ws.git.head_from_files() == ws.git.head()


def test_restore_brings_back_a_commit_and_removes_new_files_but_not_ignored_ones(ws: Workspace) -> None:
    (ws.crate_dir / "src/main.rs").write_text("broken\n")
    (ws.crate_dir / "src/new.rs").write_text("// new\n")
    (ws.root / "target").mkdir()
    (ws.root / "target/kept").write_text("build output\n")
    ws.restore(ws.base)
    assert (ws.crate_dir / "src/main.rs").read_text() == "fn main() {}\n"
    assert not (ws.crate_dir / "src/new.rs").exists() and (ws.root / "target/kept").exists()


def test_changed_files_are_the_crates_own_relative_to_it_new_files_included(ws: Workspace) -> None:
    (ws.crate_dir / "src/main.rs").write_text("fn main() { }\n")
    (ws.crate_dir / "src/extra.rs").write_text("// new\n")
    (ws.root / "other/notes.txt").write_text("changed, outside the crate\n")
    assert ws.changed_files() == ["src/extra.rs", "src/main.rs"]
    ws.commit("committed changes still count: they are measured from the base")
    assert ws.changed_files() == ["src/extra.rs", "src/main.rs"]


def test_a_nested_repository_is_removed_before_host_git_runs(ws: Workspace, tmp_path: Path) -> None:
    """A sandboxed command can leave crate/sub/.git whose config names a program; host git must never run it."""
    ran = tmp_path / "fsmonitor-ran"
    hook = tmp_path / "hook.sh"
    hook.write_text(f"#!/bin/sh\ntouch {ran}\n")
    hook.chmod(0o755)
    nested = ws.crate_dir / "sub"
    (nested / ".git").mkdir(parents=True)
    (nested / ".git/config").write_text(f"[core]\n\tfsmonitor = {hook}\n")
    (nested / ".git/HEAD").write_text("ref: refs/heads/main\n")
    (nested / "file.txt").write_text("inside the nested repository\n")
    ws.commit("after a command planted a repository")
    assert not ran.exists()
    assert not (nested / ".git").exists()
    assert "crate/sub/file.txt" in ws.git("ls-files").split()  # the files stay, as plain files of the workspace


def test_guard_stops_the_loop_when_a_frozen_file_changes(ws: Workspace) -> None:
    ws.guard()
    (ws.crate_dir / "tests/acceptance.rs").write_text("#[test]\nfn nothing() {}\n")
    with pytest.raises(StopLoop, match="crate/tests/acceptance.rs was changed") as stop:
        ws.guard()
    assert stop.value.status == "tampered"


def test_guard_stops_the_loop_when_the_tree_and_target_dir_outgrow_the_disk_limit(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    ws = make_workspace(tmp_path / "repo", disk_mb=1)
    ws.guard()
    (tmp_path / "target").mkdir()
    # what a command in the sandbox leaves: the target dir counts too
    ws.checks.sandbox.run(["dd", "if=/dev/zero", "of=big", "bs=1M", "count=2"], cwd=tmp_path / "target")
    assert (tmp_path / "target/big").stat().st_size == 2 * 1024 * 1024
    with pytest.raises(StopLoop, match="more than sandbox_disk_mb") as stop:
        ws.guard()
    assert stop.value.status == "disk"


def test_guard_counts_the_blocks_a_command_allocated_past_its_files_sizes(tmp_path: Path) -> None:
    """A command can hold disk without growing a file's size (fallocate --keep-size: the blocks are the file's, its
    size stays 0, and RLIMIT_FSIZE does not apply): the guard counts what the files hold on disk, not their sizes."""
    require("fallocate")
    (tmp_path / "repo").mkdir()
    ws = make_workspace(tmp_path / "repo", disk_mb=1)
    ws.guard()
    result = ws.checks.sandbox.run(["sh", "-c", ": > held && fallocate --keep-size -l 4MiB held"], cwd=ws.crate_dir)
    assert result.ok, result.stderr
    assert (ws.crate_dir / "held").stat().st_size == 0
    with pytest.raises(StopLoop, match="more than sandbox_disk_mb") as stop:
        ws.guard()
    assert stop.value.status == "disk"


def test_guard_counts_the_blocks_of_the_directories_a_command_made(tmp_path: Path) -> None:
    """Empty directories hold no file bytes but a block each: a command making many of them holds disk the guard
    must count (a million hold gigabytes)."""
    (tmp_path / "repo").mkdir()
    ws = make_workspace(tmp_path / "repo", disk_mb=1)
    ws.guard()
    result = ws.checks.sandbox.run(["sh", "-c", "mkdir -p d && cd d && mkdir $(seq 1 600)"], cwd=ws.crate_dir)
    assert result.ok, result.stderr
    with pytest.raises(StopLoop, match="more than sandbox_disk_mb") as stop:
        ws.guard()
    assert stop.value.status == "disk"


def test_guard_totals_the_trees_again_once_a_sandboxed_command_ran_and_counts_flakebots_own_writes_then(
    tmp_path: Path,
) -> None:
    """The disk total is taken again only when a command may have written since the last one: between commands only
    flakebot's own writes land (a tool's file, a commit), and the guard after the next command counts them too."""
    (tmp_path / "repo").mkdir()
    ws = make_workspace(tmp_path / "repo", disk_mb=1)
    ws.guard()
    (ws.crate_dir / "src/data.rs").write_bytes(b"\0" * (2 * 1024 * 1024))  # as write_file would (host, not a command)
    ws.guard()  # no command since the last total: nothing a command could have grown
    with pytest.raises(StopLoop, match="hold 2 MiB, more than sandbox_disk_mb") as stop:
        ws.checks.sandbox.run(["true"], cwd=ws.crate_dir)  # the verdict's cargo, a tool's command
        ws.guard()
    assert stop.value.status == "disk"
    (ws.crate_dir / "src/data.rs").unlink()
    ws.guard()  # still taken again: the last total found too much
    ws.guard()
    (ws.crate_dir / "src/tests.rs").write_bytes(b"\0" * (2 * 1024 * 1024))
    ws.guard()
    ws.checks.sandbox.run(["true"], cwd=ws.crate_dir)
    with pytest.raises(StopLoop, match="more than sandbox_disk_mb"):
        ws.guard()


def test_head_read_from_git_files_cannot_be_changed_from_the_sandbox_or_through_the_edit_tools(ws: Workspace) -> None:
    """head_from_files trusts .git's files because only flakebot's git writes them: a sandboxed command (the model's
    code) and the edit tools try every way to point HEAD elsewhere."""
    require("bwrap")
    (ws.root / "crate/src/main.rs").write_text("fn main() { /* judged */ }\n")
    head = ws.commit("judged")
    branch = ws.git("symbolic-ref", "HEAD").strip()
    sandbox = open_sandbox("required", workspace=ws.root, writable=[ws.root.parent / "target"], adopt=True)
    attempts = [
        f"echo 0000000000000000000000000000000000000000 > .git/{branch}",
        "echo 'ref: refs/heads/../../x' > .git/HEAD",
        f"printf '# pack-refs\\n{ws.base} {branch}\\n' > .git/packed-refs",
        f"rm -f .git/{branch}",
        "mv .git elsewhere",
        "rm -rf .git",
        "ln -s crate .git",
        "ln -s ../.git/HEAD crate/head && ln -s ../.git crate/git && echo ok-links",
    ]
    ran = sandbox.run(["bash", "-c", "; ".join(f"({a}) 2>/dev/null || echo refused" for a in attempts)], cwd=ws.root)
    assert ran.stdout.split() == ["refused"] * (len(attempts) - 1) + ["ok-links"], ran
    tools = Toolbox(ws.root, sandbox, ws.checks.cargo, crate_dir="crate")
    for path in (".git/HEAD", ".GIT/HEAD", "crate/../.git/HEAD", "../repo/.git/HEAD", "crate/head", "crate/git/HEAD"):
        for content in (f"{ws.base}\n", "ref: refs/heads/elsewhere\n"):
            assert not tools.call("write_file", {"path": path, "content": content}).ok, path
    assert ws.git.head_from_files() == head == ws.git.head(sweep=False)
    assert (ws.root / ".git/HEAD").read_text() == f"ref: {branch}\n"


def test_a_gitdir_file_leaves_the_head_to_rev_parse(tmp_path: Path) -> None:
    """A .git that is a file naming the repository elsewhere (`git init --separate-git-dir`) holds no HEAD of its
    own: head_from_files says '' and rev-parse names the commit."""
    import subprocess

    tree = tmp_path / "tree"
    subprocess.run(["git", "init", "-q", "--separate-git-dir", str(tmp_path / "repo.git"), str(tree)], check=True)
    git = WorkspaceGit(tree)
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    (tree / "file").write_text("one\n")
    assert git.head_from_files() == ""
    made = git.commit("first")
    assert made == git.head() and len(made) == 40
