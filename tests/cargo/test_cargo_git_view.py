"""The sandbox sees only the git checkouts its own Cargo.lock names (cargo/fetch.py refresh_git_view): real cargo
fetching from a real `git daemon` on 127.0.0.1 (allowed explicitly), then a real offline build in bubblewrap."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.scenarios.gitserve import GitDaemon, crate_manifest, make_crate_repo
from flakebot.cargo.fetch import sync
from flakebot.cargo.runner import Cargo
from flakebot.sandbox import open_sandbox
from tests.conftest import require

LOOPBACK = ("git://127.0.0.1",)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[GitDaemon]:
    require("git", "cargo", "bwrap")
    served = tmp_path / "served"
    make_crate_repo(served, "helper", ["0.1.0"])
    make_crate_repo(served, "private", ["0.1.0"])
    with GitDaemon(served) as running:
        yield running


def _crate(root: Path, dep: str, url: str) -> Path:
    crate = root / f"uses-{dep}"
    (crate / "src").mkdir(parents=True)
    (crate / "src/main.rs").write_text(f'fn main() {{ println!("{{}}", {dep}::version()); }}\n')
    (crate / "Cargo.toml").write_text(crate_manifest(f"uses-{dep}", "0.1.0", f'{dep} = {{ git = "{url}" }}\n'))
    return crate


def test_the_sandbox_sees_only_the_checkouts_its_lock_names(daemon: GitDaemon, tmp_path: Path) -> None:
    home = tmp_path / "cargo-home"  # shared by both crates, as flakebot's CARGO_HOME is by every run
    earlier = _crate(tmp_path, "private", daemon.url("private.git"))
    assert sync(
        Cargo(tmp_path / "t1", home=home, git_sources=LOOPBACK, tree=earlier), earlier, earlier / "Cargo.lock"
    ).ok
    crate = _crate(tmp_path, "helper", daemon.url("helper.git"))
    cargo = Cargo(tmp_path / "target", home=home, git_sources=LOOPBACK, tree=crate, git_view=tmp_path / "run/cargo-git")
    fetched = sync(cargo, crate, crate / "Cargo.lock")
    assert fetched.ok, fetched.error
    shared = sorted(p.name.split("-")[0] for p in (home / "git/checkouts").iterdir())
    assert shared == ["helper", "private"]
    view = tmp_path / "run/cargo-git"
    assert sorted(p.name.split("-")[0] for p in (view / "checkouts").iterdir()) == ["helper"]
    assert sorted(p.name.split("-")[0] for p in (view / "db").iterdir()) == ["helper"]
    sandbox = open_sandbox(
        "required", workspace=crate, writable=[cargo.target_dir], cargo_home=home, cargo_git=view, adopt=True
    )
    script = "ls $CARGO_HOME/git/checkouts; " + shlex.join(cargo.argv("run", "-q"))
    result = sandbox.run(["bash", "-c", script], cwd=crate, env=cargo.env())
    assert result.ok, result.stderr
    listed, printed = result.stdout.split()
    assert listed.startswith("helper-") and printed == "0.1.0"


def test_a_git_source_no_longer_allowed_leaves_the_view_empty(daemon: GitDaemon, tmp_path: Path) -> None:
    crate = _crate(tmp_path, "helper", daemon.url("helper.git"))
    view = tmp_path / "run/cargo-git"
    allowed = Cargo(tmp_path / "t", home=tmp_path / "h", git_sources=LOOPBACK, tree=crate, git_view=view)
    assert sync(allowed, crate, crate / "Cargo.lock").ok and any((view / "checkouts").iterdir())
    refused = Cargo(tmp_path / "t", home=tmp_path / "h", tree=crate, git_view=view)  # the default list
    again = sync(refused, crate, crate / "Cargo.lock")
    assert not again.ok and "git://" in again.error and "git_sources setting" in again.error
    assert list(view.iterdir()) == []


def test_an_allowed_repository_naming_a_file_url_gets_no_clone_of_it(daemon: GitDaemon, tmp_path: Path) -> None:
    """A git dependency's own Cargo.toml is not the tree's: cargo's git fetch itself only speaks the allowed protocols."""
    from benchmarks.scenarios.gitserve import git, write

    hidden = tmp_path / "hidden"
    write(hidden, {"Cargo.toml": crate_manifest("hidden", "0.1.0"), "src/lib.rs": "", "SECRET.txt": "hidden secret"})
    git("init", "--quiet", "--initial-branch=main", cwd=hidden)
    git("add", "-A", cwd=hidden)
    git("commit", "--quiet", "-m", "hidden", cwd=hidden)
    relay = tmp_path / "relay"
    write(
        relay,
        {"Cargo.toml": crate_manifest("relay", "0.1.0", f'hidden = {{ git = "file://{hidden}" }}\n'), "src/lib.rs": ""},
    )
    git("init", "--quiet", "--initial-branch=main", cwd=relay)
    git("add", "-A", cwd=relay)
    git("commit", "--quiet", "-m", "relay", cwd=relay)
    git("clone", "--quiet", "--bare", str(relay), str(daemon.base / "relay.git"), cwd=tmp_path)
    crate = _crate(tmp_path, "relay", daemon.url("relay.git"))
    home = tmp_path / "h"
    fetched = sync(Cargo(tmp_path / "t", home=home, git_sources=LOOPBACK, tree=crate), crate, crate / "Cargo.lock")
    assert not fetched.ok
    assert not list(home.rglob("SECRET.txt")), "cargo cloned the file:// repository the relay names"


def test_a_keyed_view_is_kept_only_while_its_manifests_are_unchanged(daemon: GitDaemon, tmp_path: Path) -> None:
    """The edit stage asks for the view the acquire stage made (one `cargo metadata` fewer), keyed by the workspace's
    manifests: an edit of Cargo.toml, or a view made since without a key (the loop's own fetches), makes it again."""
    from flakebot.cargo.fetch import refresh_git_view

    crate = _crate(tmp_path, "helper", daemon.url("helper.git"))
    view = tmp_path / "run/cargo-git"
    cargo = Cargo(tmp_path / "t", home=tmp_path / "h", git_sources=LOOPBACK, tree=crate, git_view=view)
    assert sync(cargo, crate, crate / "Cargo.lock", watch=crate).ok
    first = {name: (crate / name).read_bytes() for name in ("Cargo.toml", "Cargo.lock")}
    marker = view / "marker"
    marker.write_text("made by the acquire stage's sync")
    assert refresh_git_view(cargo, crate, watch=crate)[0].startswith("checkouts/helper-")
    assert marker.exists()  # kept: no cargo call, no copy

    (crate / "Cargo.toml").write_text(
        crate_manifest("uses-helper", "0.1.0", f'private = {{ git = "{daemon.url("private.git")}" }}\n')
    )
    assert sync(cargo, crate, crate / "Cargo.lock").ok  # as the loop's toolbox fetches: no key
    assert sorted(p.name.split("-")[0] for p in (view / "checkouts").iterdir()) == ["private"]
    marker.write_text("made by a fetch without a key")
    for name, content in first.items():  # the manifests the key was made for (the workspace reset to its base)
        (crate / name).write_bytes(content)
    refresh_git_view(cargo, crate, watch=crate)  # the same manifests, but the view is not the one made for them
    assert not marker.exists()
    assert sorted(p.name.split("-")[0] for p in (view / "checkouts").iterdir()) == ["helper"]
