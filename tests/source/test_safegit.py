"""flakebot.source.safegit: every host git call hardened in one place. Each attack below is first shown to work with
plain git (the control), then not to work through safegit."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from flakebot.errors import FlakebotError
from flakebot.source import safegit

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def plain(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Plain git, as the old code (GitPython) ran it: the caller's environment and every configuration file."""
    ident = ["-c", "user.name=t", "-c", "user.email=t@t"]
    return subprocess.run(["git", *ident, *args], cwd=cwd, capture_output=True, text=True)


def program(proof: Path) -> str:
    """A command that leaves `proof` (with its environment) when git runs it."""
    return f"env > {proof}; false"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    top = tmp_path / "repo"
    top.mkdir()
    plain(top, "init", "-q")
    (top / "a.txt").write_text("a\n")
    plain(top, "add", "a.txt")
    plain(top, "commit", "-qm", "a")
    return top


def nested_fsmonitor(top: Path, proof: Path) -> None:
    """vendor/ a nested repository as write_file could make it: HEAD names an object git always has."""
    git_dir = top / "vendor/.git"
    for sub in ("objects", "refs"):
        (git_dir / sub).mkdir(parents=True)
    (git_dir / "HEAD").write_text(EMPTY_TREE + "\n")
    (git_dir / "config").write_text(f'[core]\n\tfsmonitor = "{program(proof)}"\n')
    (top / "vendor/notes.txt").write_text("x\n")


def test_the_repository_config_fsmonitor_does_not_run(repo: Path, tmp_path: Path) -> None:
    proof = tmp_path / "proof"
    plain(repo, "config", "core.fsmonitor", program(proof))
    (repo / "a.txt").write_text("changed\n")
    plain(repo, "status")
    assert proof.exists()  # control: plain git runs it
    proof.unlink()
    safegit.git(repo, "status", "--porcelain")
    safegit.git(repo, "add", "-A")
    assert not proof.exists()


def test_hooks_do_not_run_wherever_they_are(repo: Path, tmp_path: Path) -> None:
    proof, hooks = tmp_path / "proof", tmp_path / "hooks"
    hooks.mkdir()
    for where in (hooks, repo / ".git/hooks"):
        hook = where / "pre-commit"
        hook.write_text(f"#!/bin/sh\n{program(proof)}\nexit 0\n")
        hook.chmod(0o755)
    plain(repo, "commit", "-q", "--allow-empty", "-m", "control")
    assert proof.exists()
    proof.unlink()
    plain(repo, "config", "core.hooksPath", str(hooks))
    safegit.git(repo, "commit", "-q", "--allow-empty", "-m", "hardened")
    assert not proof.exists()


def test_a_nested_repository_never_runs_its_config(repo: Path, tmp_path: Path) -> None:
    proof = tmp_path / "proof"
    nested_fsmonitor(repo, proof)
    for _ in range(2):  # the first add records a gitlink, the second runs `git status` inside it
        plain(repo, "add", "-A")
        plain(repo, "commit", "-q", "--allow-empty", "-m", "x")
    assert proof.exists()  # control
    proof.unlink()
    repo2 = tmp_path / "repo2"
    repo2.mkdir()
    plain(repo2, "init", "-q")
    nested_fsmonitor(repo2, proof)
    for _ in range(2):
        safegit.git(repo2, "add", "-A", sweep=True)
        safegit.git(repo2, "commit", "-q", "--allow-empty", "-m", "x", sweep=True)
    assert not proof.exists()
    assert not (repo2 / "vendor/.git").exists() and (repo2 / "vendor/notes.txt").is_file()
    assert "vendor/notes.txt" in safegit.git(repo2, "ls-files")


def filter_repo(top: Path, proof: Path) -> None:
    """A real nested repository whose own config defines the clean filter its .gitattributes names."""
    inner = top / "inner"
    inner.mkdir()
    plain(inner, "init", "-q")
    (inner / "data.txt").write_text("data\n")
    (inner / ".gitattributes").write_text("* filter=evil\n")
    plain(inner, "add", ".")
    plain(inner, "commit", "-qm", "x")
    plain(inner, "config", "filter.evil.clean", f"{program(proof)}; cat")
    os.utime(inner / "data.txt", (946684800, 946684800))  # stat-dirty: git re-reads it through the filter


def test_options_alone_do_not_undefine_a_nested_filter_so_nested_repositories_are_swept(
    repo: Path, tmp_path: Path
) -> None:
    proof = tmp_path / "proof"
    filter_repo(repo, proof)
    for _ in range(2):
        safegit.git(repo, "add", "-A")  # hardened, but no sweep
        safegit.git(repo, "commit", "-q", "--allow-empty", "-m", "x")
    assert proof.exists()  # the -c options hold in the nested git too, yet its own filter runs
    proof.unlink()
    repo3 = tmp_path / "repo3"
    repo3.mkdir()
    plain(repo3, "init", "-q")
    filter_repo(repo3, proof)
    for _ in range(2):
        safegit.git(repo3, "add", "-A", sweep=True)
        safegit.git(repo3, "commit", "-q", "--allow-empty", "-m", "x", sweep=True)
    assert not proof.exists()


def test_sweep_removes_every_nested_git_entry_and_follows_no_link(tmp_path: Path) -> None:
    top, outside = tmp_path / "top", tmp_path / "outside"
    (top / ".git").mkdir(parents=True)
    outside.mkdir()
    (outside / "keep").write_text("k")
    (top / "a/.git").mkdir(parents=True)
    (top / "b").mkdir()
    (top / "b/.git").write_text("gitdir: ../planted\n")
    (top / "c").mkdir()
    (top / "c/.git").symlink_to(outside)
    (top / "d/.GIT").mkdir(parents=True)
    (top / "e/.Git/deeper/.git").mkdir(parents=True)
    removed = safegit.sweep_nested(top)
    assert sorted(removed) == ["a/.git", "b/.git", "c/.git", "d/.GIT", "e/.Git"]
    assert (top / ".git").is_dir() and (outside / "keep").is_file()


def test_gitattributes_drivers_without_config_are_ignored(repo: Path, tmp_path: Path) -> None:
    """A tree's .gitattributes can name a filter or a diff driver; no config defines them, so git runs nothing and
    stores the file as it is."""
    (repo / ".gitattributes").write_text("* filter=evil diff=evil merge=evil\n")
    (repo / "b.txt").write_text("content\n")
    safegit.git(repo, "add", "-A")
    safegit.git(repo, "commit", "-qm", "attrs")
    assert safegit.git(repo, "show", "HEAD:b.txt") == "content\n"
    (repo / "b.txt").write_text("changed\n")
    assert "b.txt" in safegit.git(repo, "diff", "HEAD")


def test_no_key_and_no_user_configuration_reach_a_git_child(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proof, home = tmp_path / "proof", tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(f'[core]\n\tfsmonitor = "{program(proof)}"\n')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SOME_API_KEY", "sk-secret-value")
    (repo / "a.txt").write_text("changed\n")
    plain(repo, "status")
    assert proof.exists()  # control: the user's global config
    proof.unlink()
    dumped = safegit.git(repo, "-c", "alias.envdump=!env", "envdump")
    safegit.git(repo, "status")
    assert not proof.exists()
    assert "sk-secret-value" not in dumped and "SOME_API_KEY" not in dumped
    assert f"HOME={os.devnull}" in dumped and "GIT_CONFIG_NOSYSTEM=1" in dumped


def test_a_failure_is_one_line_naming_the_command_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FlakebotError) as caught:
        safegit.git(tmp_path, "rev-parse", "HEAD", fix="make it a repository")
    line = caught.value.one_line()
    assert "git rev-parse failed" in line and "not a git repository" in line and "make it a repository" in line
    assert "\n" not in line


def test_a_clone_gets_no_hooks_no_submodules_and_keeps_the_hardening(repo: Path, tmp_path: Path) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    plain(sub, "init", "-q")
    plain(sub, "commit", "-q", "--allow-empty", "-m", "s")
    plain(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", sub.as_uri(), "sub")
    plain(repo, "commit", "-qm", "with a submodule")
    dest = tmp_path / "clone"
    safegit.clone(repo.as_uri(), dest, timeout=60)
    assert not (dest / ".git/hooks").exists()
    assert (dest / "sub").is_dir() and not any((dest / "sub").iterdir())  # not recursed
    config = (dest / ".git/config").read_text()
    assert "hookspath = /dev/null" in config.lower() and "fsmonitor = false" in config.lower()
