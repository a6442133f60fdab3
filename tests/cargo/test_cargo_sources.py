"""The source allow-list of host cargo calls (flakebot/cargo/sources.py), through real cargo on real manifests."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.scenarios.gitserve import crate_manifest
from flakebot.cargo import sources
from flakebot.cargo.runner import Cargo
from flakebot.cargo.sources import git_refusal, git_sources
from tests.conftest import require

DEFAULT = git_sources("github.com,gitlab.com,codeberg.org,git.sr.ht,bitbucket.org")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("file:///root/repo", "file:// is not https://"),
        ("ssh://git@github.com/a/b", "credentials in the URL"),
        ("git@github.com:a/b.git", "not https://"),
        ("http://github.com/a/b", "http:// is not https://"),
        ("git://github.com/a/b", "git:// is not https://"),
        ("https://127.0.0.1:8443/a", "127.0.0.1 is a local or private address"),
        ("https://localhost/a", "localhost is a local or private address"),
        ("https://[::1]/a", "::1 is a local or private address"),
        ("https://192.168.1.5/a", "is a local or private address"),
        ("https://169.254.169.254/latest", "is a local or private address"),
        ("https://github.com.evil.example/a", "is not an allowed host"),
        ("https://github.com@evil.example/a", "credentials in the URL"),
        ("https://github.com:8443/a", "port 8443"),
        ("https://example.org/a", "example.org is not an allowed host"),
    ],
)
def test_refused_git_urls_name_the_rule(url: str, why: str) -> None:
    reason = git_refusal(url, DEFAULT)
    assert why in reason and "git_sources setting" in reason, reason


@pytest.mark.parametrize(
    "url", ["https://github.com/a/b", "https://GitLab.com/a/b.git", "https://codeberg.org/a/b?branch=x#abc"]
)
def test_allowed_git_urls(url: str) -> None:
    assert git_refusal(url, DEFAULT) == ""


def test_an_entry_with_a_scheme_allows_exactly_that_prefix() -> None:
    allowed = ("git://127.0.0.1", "https://git.example.org/team")
    assert git_refusal("git://127.0.0.1:9418/x.git", allowed) == ""
    assert git_refusal("https://git.example.org/team/x", allowed) == ""
    assert git_refusal("https://git.example.org/other/x", allowed)
    assert git_refusal("git://127.0.0.2/x.git", allowed)


def _crate(root: Path, deps: str = "", extra: str = "") -> Path:
    crate = root / "app"
    (crate / "src").mkdir(parents=True)
    (crate / "src/main.rs").write_text("fn main() {}\n")
    (crate / "Cargo.toml").write_text(crate_manifest("app", "0.1.0", deps) + extra)
    return crate


SHAPES = {
    "dependency": ('x = { git = "file:///root/x" }\n', ""),
    "dev-dependency": ("", '[dev-dependencies]\nx = { git = "file:///root/x" }\n'),
    "build-dependency": ("", '[build-dependencies]\nx = { git = "file:///root/x" }\n'),
    "target-specific": ("", "[target.'cfg(unix)'.dependencies]\nx = { git = \"file:///root/x\" }\n"),
    "renamed": ('y = { package = "x", git = "ssh://git@host/x" }\n', ""),
    "patch": ("", '[patch.crates-io]\nx = { git = "file:///root/x" }\n'),
    "patch of a git source": ("", '[patch."https://github.com/a/b"]\nx = { git = "http://127.0.0.1:8000/x" }\n'),
    "replace": ("", '[replace]\n"x:0.1.0" = { git = "file:///root/x" }\n'),
    "registry-index": ('x = { version = "1", registry-index = "https://evil.example/index" }\n', ""),
    "path outside": ('x = { path = "/etc/x" }\n', ""),
    "path escaping by ..": ('x = { path = "../../outside" }\n', ""),
    "workspace dependency": ("", '[workspace]\n[workspace.dependencies]\nx = { git = "file:///root/x" }\n'),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_refused_shape_stops_the_host_call_before_cargo_fetches(tmp_path: Path, shape: str) -> None:
    require("cargo")
    deps, extra = SHAPES[shape]
    crate = _crate(tmp_path, deps, extra)
    cargo = Cargo(target_dir=tmp_path / "target", home=tmp_path / "cargo-home", tree=crate)
    result = cargo.run(["generate-lockfile"], crate, timeout=120)
    assert result.returncode == 101 and result.stderr.startswith("error: ") and "refused" in result.stderr, (
        result.stderr
    )
    assert not (crate / "Cargo.lock").exists() and not (tmp_path / "cargo-home/git").exists()


def test_a_planted_lock_naming_a_refused_source_is_refused(tmp_path: Path) -> None:
    require("cargo")
    crate = _crate(tmp_path)
    (crate / "Cargo.lock").write_text(
        'version = 3\n\n[[package]]\nname = "x"\nversion = "0.1.0"\nsource = "git+file:///root/x#0123456789abcdef0123456789abcdef01234567"\n'
    )
    result = Cargo(target_dir=tmp_path / "t", home=tmp_path / "h", tree=crate).run(["fetch"], crate, timeout=120)
    assert result.returncode == 101 and "git source file:///root/x refused" in result.stderr


def test_allowed_shapes_run(tmp_path: Path) -> None:
    """crates.io-less manifests with paths inside the tree and an allowed git URL under a patch that nothing uses
    (offline: cargo resolves without the network, so the call itself shows the check let it through)."""
    require("cargo")
    crate = _crate(tmp_path, 'lib = { path = "lib" }\n')
    (crate / "lib/src").mkdir(parents=True)
    (crate / "lib/src/lib.rs").write_text("")
    (crate / "lib/Cargo.toml").write_text(crate_manifest("lib", "0.1.0"))
    cargo = Cargo(target_dir=tmp_path / "t", home=tmp_path / "h", tree=crate, offline=True)
    result = cargo.run(["generate-lockfile"], crate, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (crate / "Cargo.lock").is_file()


def test_the_settings_allow_list_reaches_host_calls(tmp_path: Path) -> None:
    from flakebot.config import Settings

    cargo = Cargo.for_run(Settings(git_sources="git://127.0.0.1, example.org"), tmp_path / "t", tmp_path / "run")
    assert cargo.git_sources == ("git://127.0.0.1", "example.org")
    assert cargo.tree == tmp_path / "run/workspace" and cargo.git_view == tmp_path / "run/cargo-git"


def test_a_patch_in_a_linked_manifest_is_not_skipped(tmp_path: Path) -> None:
    """Cargo.toml a symbolic link to a file of the tree: cargo reads its [patch] through the link, so the check must
    not pass it by (a manifest it cannot read as a file is refused, not skipped)."""
    require("cargo")
    crate = _crate(tmp_path, "", SHAPES["patch"][1])
    (crate / "manifest.txt").write_text((crate / "Cargo.toml").read_text())
    (crate / "Cargo.toml").unlink()
    (crate / "Cargo.toml").symlink_to("manifest.txt")
    cargo = Cargo(target_dir=tmp_path / "target", home=tmp_path / "cargo-home", tree=crate)
    result = cargo.run(["generate-lockfile"], crate, timeout=120)
    assert result.returncode == 101 and result.stderr.startswith("error: ") and "refused" in result.stderr, (
        result.stderr
    )
    assert not (tmp_path / "cargo-home/git").exists()


def test_a_member_outside_the_tree_is_refused(tmp_path: Path) -> None:
    """A workspace member outside the tree (the run's target dir, which the sandbox writes) is a path source outside
    it: refused like a path dependency there."""
    require("cargo")
    crate = _crate(tmp_path, "", '\n[workspace]\nmembers = ["../target/evil"]\n')
    evil = tmp_path / "target/evil"
    (evil / "src").mkdir(parents=True)
    (evil / "src/main.rs").write_text("fn main() {}\n")
    (evil / "Cargo.toml").write_text(
        crate_manifest("evil", "0.1.0").replace("[package]\n", '[package]\nworkspace = "../../app"\n')
    )
    cargo = Cargo(target_dir=tmp_path / "target", home=tmp_path / "cargo-home", tree=crate, offline=True)
    result = cargo.run(["generate-lockfile"], crate, timeout=120)
    assert result.returncode == 101 and "outside the crate's tree" in result.stderr, result.stderr
    assert not (crate / "Cargo.lock").exists()


def test_a_listing_given_spares_cargo_yet_the_manifests_are_read_as_they_are_now(tmp_path: Path) -> None:
    """The caller's `metadata --no-deps` answer (the package stage's, for its own copy of the tree) stands for the
    check's: no cargo process lists the members again, yet each manifest is read at the check, so a [patch] written
    after the listing is refused as one cargo had listed (nix/crate.py's Resolution takes the flake's listing)."""
    import json

    from tests.fakes.spawns import cargo_subcommands, spawns

    require("cargo")
    crate = _crate(tmp_path)
    cargo = Cargo(target_dir=tmp_path / "target", home=tmp_path / "cargo-home", tree=crate, offline=True)
    listing = json.loads(cargo.call(["metadata", "--format-version", "1", "--no-deps"], crate, timeout=120).stdout)
    with spawns() as started:
        assert cargo.run(["generate-lockfile"], crate, timeout=120, listed=listing).returncode == 0
    assert cargo_subcommands(started) == ["generate-lockfile"], started  # no second listing of the members

    (crate / "Cargo.toml").write_text((crate / "Cargo.toml").read_text() + SHAPES["patch"][1])
    (crate / "Cargo.lock").unlink()
    with spawns() as started:
        result = cargo.run(["generate-lockfile"], crate, timeout=120, listed=listing)
    assert result.returncode == 101 and "refused" in result.stderr, result.stderr
    assert not started and not (crate / "Cargo.lock").exists()


LISTED_LATE = [shape for shape in SHAPES if not shape.startswith(("patch", "replace", "workspace"))]


@pytest.mark.parametrize("shape", LISTED_LATE)
def test_a_dependency_written_after_the_listing_given_is_refused(tmp_path: Path, shape: str) -> None:
    """A listing the caller kept (nix/crate.py's Resolution takes the flake's) may be older than the manifests: a
    dependency written since is in no listing, yet refused as cargo's own listing of the tree now would have it."""
    import json

    from tests.fakes.spawns import spawns

    require("cargo")
    crate = _crate(tmp_path)
    cargo = Cargo(target_dir=tmp_path / "target", home=tmp_path / "cargo-home", tree=crate, offline=True)
    listing = json.loads(cargo.call(["metadata", "--format-version", "1", "--no-deps"], crate, timeout=120).stdout)
    deps, extra = SHAPES[shape]
    (crate / "Cargo.toml").write_text(crate_manifest("app", "0.1.0", deps) + extra)
    with spawns() as started:
        result = cargo.run(["generate-lockfile"], crate, timeout=120, listed=listing)
    assert result.returncode == 101 and "refused" in result.stderr, result.stderr
    assert not started and not (crate / "Cargo.lock").exists()


def test_a_crates_io_dependency_named_by_its_registry_passes_a_kept_listing(tmp_path: Path) -> None:
    """`registry = "crates-io"` is crates.io (as cargo lists it): the manifest read at the check does not refuse it."""
    import json

    require("cargo")
    crate = _crate(tmp_path)
    cargo = Cargo(target_dir=tmp_path / "target", home=tmp_path / "cargo-home", tree=crate, offline=True)
    (crate / "Cargo.toml").write_text(crate_manifest("app", "0.1.0", 'x = { version = "1", registry = "crates-io" }\n'))
    listing = json.loads(cargo.call(["metadata", "--format-version", "1", "--no-deps"], crate, timeout=120).stdout)
    assert sources.check(cargo, crate, listing) is None
