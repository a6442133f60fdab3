"""acquire() by git clone: real repositories served by a real git daemon (git://) and file://."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import git as gitpython
import pytest

from benchmarks.scenarios.gitserve import (
    GitDaemon,
    free_port,
    git,
    make_crate_repo,
    make_plain_repo,
    make_workspace_repo,
)
from flakebot.config import Settings
from flakebot.crates import CrateInfo
from flakebot.errors import AcquireError
from flakebot.source.acquisition import acquire

BRANCH = "flakebot/demo-tool"


@pytest.fixture(scope="session")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repos")
    make_crate_repo(root, "demo", ["0.1.0", "0.2.0"], head_version="0.3.0-dev")
    make_crate_repo(root, "bare-tags", ["1.0.0"], tag="{version}")
    make_crate_repo(root, "name-v-tags", ["1.0.0"], tag="{name}-v{version}")
    make_crate_repo(root, "name-tags", ["1.0.0"], tag="{name}-{version}")
    make_workspace_repo(root, "tools")
    make_plain_repo(root, "docs-only")
    return root


@pytest.fixture(scope="session")
def daemon(repos: Path) -> Iterator[GitDaemon]:
    with GitDaemon(repos) as server:
        yield server


def crate(name: str, version: str, repository: str) -> CrateInfo:
    # Not source="crates-io": that would let auto fall back to downloading the .crate (tested in test_source_archive).
    return CrateInfo(name=name, version=version, repository=repository)


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir()) if parent.exists() else []


def test_clone_over_git_daemon_checks_out_the_version_tag(daemon: GitDaemon, repos: Path, tmp_path: Path) -> None:
    dest = tmp_path / "workspace"
    origin = acquire(crate("demo", "0.1.0", daemon.url("demo.git")), dest, branch=BRANCH, settings=Settings())

    tagged = git("rev-parse", "v0.1.0^{commit}", cwd=repos / "demo.git")
    assert origin == {
        "method": "git",
        "crate": "demo",
        "url": daemon.url("demo.git"),
        "revision": tagged,
        "version": "0.1.0",
        "crate_dir": "",
        "branch": BRANCH,
        "tag": "v0.1.0",
    }
    with gitpython.Repo(dest) as repo:
        assert repo.active_branch.name == BRANCH
        assert repo.head.commit.hexsha == tagged
        assert not repo.is_dirty(untracked_files=True)
    assert 'version = "0.1.0"' in (dest / "Cargo.toml").read_text()
    assert leftovers(tmp_path) == ["workspace"]


@pytest.mark.parametrize(
    ("name", "tag"), [("bare-tags", "1.0.0"), ("name-v-tags", "name-v-tags-v1.0.0"), ("name-tags", "name-tags-1.0.0")]
)
def test_every_tag_style_is_found_over_file_urls(repos: Path, tmp_path: Path, name: str, tag: str) -> None:
    origin = acquire(
        crate(name, "1.0.0", (repos / f"{name}.git").as_uri()), tmp_path / "ws", branch=BRANCH, settings=Settings()
    )
    assert origin["tag"] == tag
    assert origin["revision"] == git("rev-parse", f"{tag}^{{commit}}", cwd=repos / f"{name}.git")
    assert "notice" not in origin


def test_missing_tag_falls_back_to_the_default_branch_with_a_notice(
    daemon: GitDaemon, repos: Path, tmp_path: Path
) -> None:
    origin = acquire(
        crate("demo", "9.9.9", daemon.url("demo.git")), tmp_path / "ws", branch=BRANCH, settings=Settings()
    )
    assert origin["tag"] is None
    assert origin["revision"] == git("rev-parse", "main", cwd=repos / "demo.git")
    assert origin["version"] == "0.3.0-dev"
    assert (
        "no tag for version 9.9.9 (looked for v9.9.9, 9.9.9, demo-v9.9.9, demo-9.9.9); using the default branch main"
        in origin["notice"]
    )
    assert "version 0.3.0-dev, not 9.9.9" in origin["notice"]


def test_a_member_of_a_cargo_workspace_is_located(daemon: GitDaemon, tmp_path: Path) -> None:
    dest = tmp_path / "ws"
    origin = acquire(crate("demo-cli", "0.4.0", daemon.url("tools.git")), dest, branch=BRANCH, settings=Settings())
    assert origin["crate_dir"] == "crates/cli"
    assert origin["tag"] == "demo-cli-v0.4.0"
    assert (dest / origin["crate_dir"] / "src/main.rs").is_file()


def test_a_crate_missing_from_the_workspace_is_an_error_and_leaves_nothing(daemon: GitDaemon, tmp_path: Path) -> None:
    with pytest.raises(AcquireError) as caught:
        acquire(
            crate("demo-gui", "0.4.0", daemon.url("tools.git")), tmp_path / "ws", branch=BRANCH, settings=Settings()
        )
    message = caught.value.message
    assert message.startswith("cannot acquire demo-gui 0.4.0: crate demo-gui is not in the cargo workspace")
    assert "members: demo-cli, demo-core" in message
    assert caught.value.details["crate"] == "demo-gui"
    assert leftovers(tmp_path) == []


def test_a_repository_without_cargo_toml_is_an_error(daemon: GitDaemon, tmp_path: Path) -> None:
    with pytest.raises(AcquireError, match=r"^cannot acquire docs 1\.0\.0: there is no Cargo\.toml") as caught:
        acquire(
            crate("docs", "1.0.0", daemon.url("docs-only.git")), tmp_path / "ws", branch=BRANCH, settings=Settings()
        )
    assert caught.value.fix
    bad = make_plain_repo(tmp_path / "repos", "bad-manifest", {"Cargo.toml": "[dependencies]\n"})
    with pytest.raises(
        AcquireError, match=r"^cannot acquire bad 1\.0\.0: cargo metadata failed: .*virtual manifest"
    ) as caught:
        acquire(crate("bad", "1.0.0", bad.as_uri()), tmp_path / "ws", branch=BRANCH, settings=Settings())
    assert str(tmp_path / "ws" / "Cargo.toml") in caught.value.message  # the destination, not the hidden staging dir
    assert leftovers(tmp_path) == ["repos"]


def test_an_unreachable_repository_names_the_crate_and_the_cause(tmp_path: Path) -> None:
    url = f"git://127.0.0.1:{free_port()}/gone.git"  # nothing listens there
    with pytest.raises(AcquireError) as caught:
        acquire(crate("gone", "1.0.0", url), tmp_path / "ws", branch=BRANCH, settings=Settings(offline=True))
    assert caught.value.message.startswith(
        f"cannot acquire gone 1.0.0: git clone {url} failed: fatal: unable to connect to 127.0.0.1"
    )
    assert "Connection refused" in caught.value.message
    assert leftovers(tmp_path) == []


def test_a_repository_the_daemon_does_not_have_is_an_error(daemon: GitDaemon, tmp_path: Path) -> None:
    with pytest.raises(
        AcquireError, match=r"cannot acquire ghost 1\.0\.0: git clone .* failed: fatal: remote error: .*ghost\.git"
    ):
        acquire(
            crate("ghost", "1.0.0", daemon.url("ghost.git")),
            tmp_path / "ws",
            branch=BRANCH,
            settings=Settings(offline=True),
        )
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("url", ["ext::sh -c touch% {marker}", "-uhello", "ftp://example.org/x.git"])
def test_urls_git_should_not_run_are_refused(tmp_path: Path, url: str) -> None:
    marker = tmp_path / "pwned"
    with pytest.raises(AcquireError, match="is not an http"):
        acquire(
            crate("evil", "1.0.0", url.format(marker=marker)),
            tmp_path / "ws",
            branch=BRANCH,
            settings=Settings(offline=True),
        )
    assert leftovers(tmp_path) == []


def test_a_non_empty_destination_is_refused(daemon: GitDaemon, tmp_path: Path) -> None:
    dest = tmp_path / "ws"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(AcquireError, match="already exists and is not empty"):
        acquire(crate("demo", "0.1.0", daemon.url("demo.git")), dest, branch=BRANCH, settings=Settings())
    assert leftovers(dest) == ["keep.txt"]


FULL_DISK_SCRIPT = """
import json, sys
from pathlib import Path
from flakebot.config import Settings
from flakebot.crates import CrateInfo
from flakebot.errors import AcquireError
from flakebot.source.acquisition import acquire
mount, url = Path(sys.argv[1]), sys.argv[2]
try:
    acquire(CrateInfo(name="big", version="0.1.0", repository=url), mount / "ws", branch="flakebot/t", settings=Settings(offline=True))
    print(json.dumps({"error": None}))
except AcquireError as exc:
    print(json.dumps({"error": exc.message, "left": sorted(p.name for p in mount.iterdir())}))
"""


def test_a_full_disk_fails_cleanly_and_removes_the_partial_clone(tmp_path: Path) -> None:
    big = make_plain_repo(tmp_path / "repos", "big", {"Cargo.toml": "", "blob.bin": os.urandom(2_000_000)})
    mount = tmp_path / "tiny"
    mount.mkdir()
    # A 512 KiB tmpfs in a private mount namespace: it vanishes with the process, even if the test dies.
    shell = 'mount -t tmpfs -o size=512k tmpfs "$1" || exit 99; exec "$2" -c "$3" "$1" "$4"'
    argv = [
        "unshare",
        "--mount",
        "--map-root-user",
        "sh",
        "-c",
        shell,
        "sh",
        str(mount),
        sys.executable,
        FULL_DISK_SCRIPT,
        big.as_uri(),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if result.returncode == 99 or "unshare failed" in result.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["error"].startswith(f"cannot acquire big 0.1.0: git clone {big.as_uri()} failed")
    assert "No space left on device" in outcome["error"]
    assert outcome["left"] == []
