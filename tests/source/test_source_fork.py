"""--fork: the real httpx GitHub client against a GitHub stand-in on 127.0.0.1, forks served by a real git daemon."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from pathlib import Path

import git as gitpython
import pytest

from benchmarks.scenarios.gitserve import GitDaemon, free_port, git, make_crate_repo
from flakebot.config import Settings
from flakebot.crates import CrateInfo
from flakebot.errors import AcquireError
from flakebot.pipeline.request import RunRequest
from flakebot.pipeline.run import Run
from flakebot.source.acquisition import acquire
from flakebot.source.gitrepo import git_env
from flakebot.source.remote import push_branch, release_fork, release_run_forks
from tests.fakes.github_server import GitHubStub

TOKEN = "ghp_test_token_never_logged_0123456789"
BRANCH = "flakebot/demo-tool"
DEMO = CrateInfo(
    name="demo", version="0.2.0", repository="https://github.com/upstream/demo/tree/main", source="crates-io"
)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[GitDaemon, Path]]:
    base = tmp_path / "served"
    make_crate_repo(base / "upstream", "demo", ["0.1.0", "0.2.0"])
    with GitDaemon(base) as daemon:
        yield daemon, base


def stub_for(served: tuple[GitDaemon, Path], **kwargs: object) -> GitHubStub:
    daemon, base = served
    return GitHubStub({"upstream/demo": base / "upstream/demo.git"}, base / "forks", daemon.url, TOKEN, **kwargs)  # type: ignore[arg-type]


def settings_for(stub: GitHubStub, **kwargs: object) -> Settings:
    values: dict[str, object] = {"github_api_url": stub.url, "fork_poll_interval": 0.02, "fork_timeout": 10.0, **kwargs}
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    return TOKEN


def test_fork_waits_until_ready_then_clones_the_fork(
    served: tuple[GitDaemon, Path], token: str, workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    run = Run.create(workdir, "craft")
    with stub_for(served, not_ready_polls=3) as stub:
        origin = acquire(DEMO, run.workspace, branch=BRANCH, settings=settings_for(stub), fork=True, run=run)

    daemon, base = served
    assert [(r.method, r.path) for r in stub.requests][:2] == [
        ("POST", "/repos/upstream/demo/forks"),
        ("GET", "/repos/flakebot-user/demo/commits?per_page=1"),
    ]
    assert len(stub.requests) == 5  # the fork, 3 answers "not ready", 1 "ready"
    assert all(r.authorized and r.headers["X-GitHub-Api-Version"] == "2022-11-28" for r in stub.requests)
    assert origin["method"] == "fork"
    assert origin["fork"] == "flakebot-user/demo"
    assert origin["url"] == daemon.url("forks/flakebot-user/demo.git")
    assert origin["upstream"] == DEMO.repository
    assert origin["tag"] == "v0.2.0"
    assert origin["revision"] == git("rev-parse", "v0.2.0^{commit}", cwd=base / "upstream/demo.git")
    assert {
        "kind": "fork",
        "url": "https://github.com/flakebot-user/demo",
        "full_name": "flakebot-user/demo",
        "api": stub.url,
    } in run.state["resources"]
    assert TOKEN not in caplog.text
    assert TOKEN not in (run.workspace / ".git/config").read_text()


def test_the_wait_for_a_fork_is_bounded_and_leaves_nothing_but_the_registered_fork(
    served: tuple[GitDaemon, Path], token: str, workdir: Path
) -> None:
    run = Run.create(workdir, "craft")
    with stub_for(served, not_ready_polls=10_000) as stub:
        with pytest.raises(AcquireError) as caught:
            acquire(
                DEMO, run.workspace, branch=BRANCH, settings=settings_for(stub, fork_timeout=0.3), fork=True, run=run
            )
    assert caught.value.message.startswith(
        "cannot acquire demo 0.2.0: fork flakebot-user/demo was not ready after 0.3s ("
    )
    assert 2 <= len(stub.requests) <= 20  # bounded: 0.3 s of 0.02 s polls
    assert not run.workspace.exists()
    assert sorted(p.name for p in run.dir.iterdir()) == ["state.json"]
    assert any(r["kind"] == "fork" for r in run.state["resources"])  # so the clean stage can still delete it


def test_fork_needs_a_token(served: tuple[GitDaemon, Path], tmp_path: Path) -> None:
    with stub_for(served) as stub:
        with pytest.raises(AcquireError, match=r"^cannot acquire demo 0\.2\.0: GITHUB_TOKEN is not set") as caught:
            acquire(DEMO, tmp_path / "ws", branch=BRANCH, settings=settings_for(stub), fork=True)
    assert "GITHUB_TOKEN" in (caught.value.fix or "")
    assert stub.requests == []


def test_a_rejected_token_is_reported(
    served: tuple[GitDaemon, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "wrong")
    with stub_for(served) as stub:
        with pytest.raises(
            AcquireError, match=r"GitHub refused to fork upstream/demo: HTTP 401 Bad credentials"
        ) as caught:
            acquire(DEMO, tmp_path / "ws", branch=BRANCH, settings=settings_for(stub), fork=True)
    assert "invalid or expired" in (caught.value.fix or "")
    assert not (tmp_path / "ws").exists()


def test_fork_needs_a_github_repository(tmp_path: Path, token: str) -> None:
    elsewhere = CrateInfo(name="demo", version="0.2.0", repository="https://gitlab.com/upstream/demo")
    with pytest.raises(AcquireError, match="--fork needs a GitHub repository"):
        acquire(
            elsewhere, tmp_path / "ws", branch=BRANCH, settings=Settings(github_api_url="http://127.0.0.1:9"), fork=True
        )


def test_an_unreachable_api_is_reported(tmp_path: Path, token: str) -> None:
    with pytest.raises(AcquireError, match=r"cannot reach the GitHub API at http://127\.0\.0\.1:\d+ \(ConnectError"):
        acquire(
            DEMO,
            tmp_path / "ws",
            branch=BRANCH,
            settings=Settings(github_api_url=f"http://127.0.0.1:{free_port()}"),
            fork=True,
        )


def test_push_sends_the_branch_to_the_fork(served: tuple[GitDaemon, Path], token: str, tmp_path: Path) -> None:
    with stub_for(served, not_ready_polls=0) as stub:
        origin = acquire(DEMO, tmp_path / "ws", branch=BRANCH, settings=settings_for(stub), fork=True)
    (tmp_path / "ws/src/main.rs").write_text("fn main() {}\n")
    with gitpython.Repo(tmp_path / "ws") as repo:
        repo.git.add("-A")
        repo.git.commit("-q", "-m", "add a binary")
        head = repo.head.commit.hexsha

    pushed = push_branch(tmp_path / "ws", origin, settings_for(stub))

    assert pushed == {"pushed": BRANCH, "url": origin["url"], "revision": head}
    _, base = served
    assert git("rev-parse", BRANCH, cwd=base / "forks/flakebot-user/demo.git") == head


def test_push_refuses_a_workspace_without_a_repository(tmp_path: Path) -> None:
    with pytest.raises(AcquireError, match="cannot push csv: its workspace came from local"):
        push_branch(tmp_path, {"method": "local", "crate": "csv", "url": "file:///x"}, Settings())


def test_release_fork_deletes_it_with_the_scope(served: tuple[GitDaemon, Path], token: str, tmp_path: Path) -> None:
    with stub_for(served, not_ready_polls=0, scopes=("public_repo", "delete_repo")) as stub:
        origin = acquire(DEMO, tmp_path / "ws", branch=BRANCH, settings=settings_for(stub), fork=True)
        fork_dir = stub.fork_path("flakebot-user/demo")
        assert fork_dir.is_dir()
        released = release_fork(origin, settings_for(stub))
    assert released == {"fork": "flakebot-user/demo", "deleted": True}
    assert not fork_dir.exists()
    assert stub.requests[-1].method == "DELETE"


def test_release_fork_without_the_scope_is_a_warning(
    served: tuple[GitDaemon, Path], token: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with stub_for(served, not_ready_polls=0) as stub:
        origin = acquire(DEMO, tmp_path / "ws", branch=BRANCH, settings=settings_for(stub), fork=True)
        released = release_fork(origin, settings_for(stub))
        assert stub.fork_path("flakebot-user/demo").is_dir()
    assert released["deleted"] is False
    assert "HTTP 403 Must have admin rights to Repository" in released["warning"]
    assert "delete_repo" in released["warning"]
    assert any(r.levelname == "WARNING" and "flakebot-user/demo" in r.getMessage() for r in caplog.records)


def test_release_fork_ignores_workspaces_that_are_not_forks() -> None:
    assert release_fork({"method": "git", "url": "git://x"}, Settings())["deleted"] is False


def test_clean_deletes_the_forks_of_a_run_that_asked_for_it(
    served: tuple[GitDaemon, Path], token: str, workdir: Path
) -> None:
    keep = Run.create(workdir, "craft")
    drop = Run.create(workdir, "craft", RunRequest(fork=True, delete_fork=True))
    with stub_for(served, not_ready_polls=0, scopes=("public_repo", "delete_repo")) as stub:
        acquire(DEMO, keep.workspace, branch=BRANCH, settings=settings_for(stub), fork=True, run=keep)
        assert release_run_forks(keep, settings_for(stub)) == []
        acquire(DEMO, drop.workspace, branch=BRANCH, settings=settings_for(stub), fork=True, run=drop)
        assert release_run_forks(drop, settings_for(stub)) == [{"fork": "flakebot-user/demo", "deleted": True}]
        assert not stub.fork_path("flakebot-user/demo").exists()


def test_the_token_travels_only_as_a_header_for_the_https_host(
    token: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = git_env("https://github.com/flakebot-user/demo.git", TOKEN)
    assert env["GIT_CONFIG_KEY_0"] == "http.https://github.com/.extraHeader"
    assert (
        base64.b64decode(env["GIT_CONFIG_VALUE_0"].removeprefix("Authorization: Basic ")).decode()
        == f"x-access-token:{TOKEN}"
    )
    assert "GIT_CONFIG_KEY_0" not in git_env("git://127.0.0.1/demo.git", TOKEN)  # never in clear over git:// or http://
    assert "GIT_CONFIG_KEY_0" not in git_env("http://127.0.0.1/demo.git", TOKEN)

    caplog.set_level(logging.DEBUG)
    bare = make_crate_repo(tmp_path / "repos", "demo", ["0.2.0"])
    origin = acquire(
        CrateInfo(name="demo", version="0.2.0", repository=bare.as_uri()),
        tmp_path / "ws",
        branch=BRANCH,
        settings=Settings(),
    )
    unreachable = {**origin, "method": "fork", "url": f"https://127.0.0.1:{free_port()}/flakebot-user/demo.git"}
    with pytest.raises(
        AcquireError, match=r"^cannot push demo: git push to https://127\.0\.0\.1:\d+/flakebot-user/demo\.git failed"
    ) as caught:
        push_branch(tmp_path / "ws", unreachable, Settings(git_timeout=30))
    assert TOKEN not in caught.value.one_line()
    assert TOKEN not in caplog.text
    assert TOKEN not in (tmp_path / "ws/.git/config").read_text()
