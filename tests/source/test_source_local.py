"""acquire() from a local directory source (Debian's /usr/share/cargo/registry) and new_crate()."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import git as gitpython
import pytest

from flakebot.config import Settings
from flakebot.crates import CrateInfo
from flakebot.errors import AcquireError
from flakebot.source.acquisition import acquire
from flakebot.source.newcrate import new_crate
from tests.conftest import DEBIAN_REGISTRY
from tests.fakes.spawns import cargo_subcommands, spawns

CSV = CrateInfo(
    name="csv",
    version="1.1.6",
    repository="https://github.com/BurntSushi/rust-csv",
    source="local",
    path=str(DEBIAN_REGISTRY / "csv-1.1.6"),
)
OFFLINE = Settings(offline=True, local_registry=str(DEBIAN_REGISTRY))
LEFT_OUT = {".cargo-checksum.json", ".cargo_vcs_info.json", "debian"}


def files_under(root: Path, skip: set[str]) -> set[str]:
    return {
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] not in skip
    }


def test_csv_is_copied_from_the_registry_without_its_packaging(tmp_path: Path) -> None:
    dest = tmp_path / "ws"
    origin = acquire(CSV, dest, branch="flakebot/csv-tool", settings=OFFLINE)

    assert origin["method"] == "local"
    assert origin["url"] == (DEBIAN_REGISTRY / "csv-1.1.6").resolve().as_uri()  # the crate, not the link to it
    assert origin["version"] == "1.1.6"
    assert origin["crate_dir"] == ""
    assert origin["upstream_revision"] == "d1fe79738d4948d3167f8f3331d4eed4b67c4a10"
    assert origin["debian_patches"] == ["relax-dep.diff", "disable-tests-that-fail-when-build-with-all-targets.diff"]
    source = Path(CSV.path)
    assert files_under(dest, {".git"}) == files_under(source, LEFT_OUT)
    assert (dest / "tests/tests.rs").read_bytes() == (source / "tests/tests.rs").read_bytes()
    assert os.access(dest / "src/lib.rs", os.W_OK)
    with gitpython.Repo(dest) as repo:
        assert repo.head.commit.message.strip() == "upstream csv 1.1.6"
        assert repo.head.commit.hexsha == origin["revision"]
        assert repo.active_branch.name == "flakebot/csv-tool"
        assert [b.name for b in repo.branches] == ["flakebot/csv-tool", "upstream"]
        assert not repo.is_dirty(untracked_files=True)
        # csv's own .gitignore lists files it ships (examples/ss10pusa.csv is not shipped; Cargo.lock is ignored):
        # everything that was copied is committed regardless.
        assert set(repo.git.ls_files().splitlines()) == files_under(dest, {".git"})


def test_a_local_directory_without_cargo_toml_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    broken = CrateInfo(name="broken", version="1.0.0", path=str(empty))
    with pytest.raises(
        AcquireError, match=rf"^cannot acquire broken 1\.0\.0: the local crate directory {empty} has no Cargo\.toml"
    ):
        acquire(broken, tmp_path / "ws", branch="flakebot/x", settings=OFFLINE)
    assert not (tmp_path / "ws").exists()


def test_an_unknown_method_is_refused() -> None:
    with pytest.raises(AcquireError, match="unknown acquisition method 'svn'"):
        acquire(CSV, Path("/nonexistent/ws"), branch="flakebot/x", settings=OFFLINE, method="svn")


def test_new_crate_depends_on_the_library_at_the_registry_version(tmp_path: Path) -> None:
    dest = tmp_path / "ws"
    origin = new_crate("csv-dedupe", dest, library=CSV, settings=OFFLINE)

    assert origin == {
        "method": "new",
        "crate": "csv-dedupe",
        "url": "",
        "revision": origin["revision"],
        "version": "0.1.0",
        "crate_dir": "",
        "branch": "flakebot/csv-dedupe",
        "library": {"name": "csv", "version": "1.1.6"},
    }
    manifest = tomllib.loads((dest / "Cargo.toml").read_text())
    assert manifest["package"]["name"] == "csv-dedupe"
    assert manifest["dependencies"] == {"csv": "1.1.6"}
    lock = tomllib.loads((dest / "Cargo.lock").read_text())
    assert {"name": "csv", "version": "1.1.6"}.items() <= next(p for p in lock["package"] if p["name"] == "csv").items()
    assert (dest / "src/main.rs").is_file()
    with gitpython.Repo(dest) as repo:
        assert repo.active_branch.name == "flakebot/csv-dedupe"
        assert repo.head.commit.message.strip() == "new csv-dedupe using csv 1.1.6"
        assert not repo.is_dirty(untracked_files=True)


def test_new_crate_asks_cargo_metadata_only_to_check_sources_before_adding_the_library(tmp_path: Path) -> None:
    # the version is read from the manifest cargo init wrote (a `cargo metadata` read it back before)
    with spawns() as started:
        origin = new_crate("csv-count", tmp_path / "ws", library=CSV, settings=OFFLINE)
    assert origin["version"] == "0.1.0"
    assert cargo_subcommands(started) == ["init", "metadata", "add"]  # the metadata: the sources check of `add`


def test_new_crate_without_a_library(tmp_path: Path) -> None:
    origin = new_crate("hello", tmp_path / "ws", library=None, settings=OFFLINE)
    assert "library" not in origin
    assert tomllib.loads((tmp_path / "ws/Cargo.toml").read_text()).get("dependencies", {}) == {}


@pytest.mark.parametrize(
    ("name", "library", "cause"),
    [
        ("bad name!", None, "cargo init --bin failed: invalid character"),
        (
            "tool",
            CrateInfo(name="no-such-crate", version="1.0.0"),
            "cargo add no-such-crate@1.0.0 failed: the crate `no-such-crate@1.0.0` could not",
        ),
    ],
)
def test_new_crate_errors_name_the_crate_and_leave_nothing(
    tmp_path: Path, name: str, library: CrateInfo | None, cause: str
) -> None:
    with pytest.raises(AcquireError) as caught:
        new_crate(name, tmp_path / "ws", library=library, settings=OFFLINE)
    assert caught.value.message.startswith(f"cannot start new crate {name}: {cause}")
    assert list(tmp_path.iterdir()) == []


def test_git_without_a_repository_url_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(AcquireError, match=r"^cannot acquire csv 1\.1\.6: it has no repository URL to clone"):
        acquire(
            CrateInfo(name="csv", version="1.1.6"), tmp_path / "ws", branch="flakebot/x", settings=OFFLINE, method="git"
        )
    assert list(tmp_path.iterdir()) == []
