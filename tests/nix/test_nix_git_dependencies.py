"""Git dependencies, as nixpkgs' importCargoLock builds them: the stand-in clones each locked commit with the host's
git (a fixed-output derivation hashed by cargoLock.outputHashes) from a real `git daemon` on 127.0.0.1, vendors the
package's folder and points cargo at it; flakebot writes the hash nix got on the first build into flake.nix and
builds again. Locks are written by real cargo; nothing of nix, cargo or git is mocked."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import git
import pytest

from benchmarks.scenarios.gitserve import GitDaemon, make_workspace_repo
from benchmarks.scenarios.gitserve import git as run_git
from benchmarks.scenarios.gitserve import write as write_files
from flakebot.config import Settings
from flakebot.crates.mirror import Mirror, serve_mirror
from flakebot.errors import NixError
from flakebot.loopback import LoopbackServer
from flakebot.nix import gitdeps
from flakebot.nix.build import build
from flakebot.nix.flake import PackageResult, package_crate
from flakebot.nix.standin import ensure_standin
from tests.conftest import require
from tests.fakes.nix_crates import NIX, greeter, host_settings, standin_eval, write

LOOPBACK = "git://127.0.0.1"  # the served repositories: loopback git, allowed explicitly (never by default)
HELPER_LIB = 'pub fn greet() -> &\'static str {\n    "hello from helper"\n}\n'
GREETER_MAIN = """\
fn main() {
    if std::env::args().any(|a| a == "--help") {
        println!("greeter: prints a greeting from its git dependencies");
        return;
    }
    println!("{}{}", helper::greet(), EXTRA);
}
"""


@dataclass
class Served:
    """Repositories served by `git daemon`: helper (one library crate, tagged v0.1.0) and tools (a workspace)."""

    daemon: GitDaemon
    helper_commit: str
    tools_commit: str

    def url(self, repo: str) -> str:
        return self.daemon.url(f"{repo}.git")


def _helper_repo(root: Path) -> str:
    """A bare repository root/helper.git holding the library crate helper 0.1.0; returns its commit."""
    work = root / "work-helper"
    write_files(
        work,
        {
            "Cargo.toml": '[package]\nname = "helper"\nversion = "0.1.0"\nedition = "2021"\n',
            "src/lib.rs": HELPER_LIB,
            "README.md": "helper\n",
        },
    )
    run_git("init", "--quiet", "--initial-branch=main", cwd=work)
    run_git("add", "-A", cwd=work)
    run_git("commit", "--quiet", "-m", "helper 0.1.0", cwd=work)
    run_git("tag", "-a", "-m", "release 0.1.0", "v0.1.0", cwd=work)
    run_git("clone", "--quiet", "--bare", str(work), str(root / "helper.git"), cwd=root)
    return run_git("rev-parse", "HEAD", cwd=work)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    require("git", "nix", "cargo")
    root = tmp_path_factory.mktemp("repos")
    helper = _helper_repo(root)
    make_workspace_repo(root)  # crates/core is demo-core 0.4.0, inside a workspace
    tools = run_git("rev-parse", "HEAD", cwd=root / "tools.git")
    with GitDaemon(root) as daemon:
        yield Served(daemon, helper, tools)


def _greeter(root: Path, dependencies: str, extra: str = "String::new()", cargo_args: tuple[str, ...] = ()) -> Path:
    """The binary crate greeter with `dependencies`, its Cargo.lock written by real cargo (fresh CARGO_HOME)."""
    crate = write(
        root,
        {
            "Cargo.toml": f'[package]\nname = "greeter"\nversion = "0.2.0"\nedition = "2021"\nlicense = "MIT"\n\n[dependencies]\n{dependencies}',
            "src/main.rs": GREETER_MAIN.replace("EXTRA", extra),
        },
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARGO_")} | {"CARGO_HOME": str(root / "cargo-home")}
    result = subprocess.run(
        ["cargo", *cargo_args, "generate-lockfile"], cwd=crate, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    shutil.rmtree(root / "cargo-home")
    return crate


def _settings(home: Path) -> Settings:
    """The host stand-in for nixpkgs; flakebot's own cargo steps online, so cargo reads the git repositories itself.
    The crates.io index points at a closed port: these crates have no registry dependencies."""
    return dataclasses.replace(
        host_settings(home), registry="crates-io", cratesio_index_url="http://127.0.0.1:9/index", git_sources=LOOPBACK
    )


def _nar_hash(served: Served, repo: str, commit: str, dest: Path) -> str:
    """The recursive sha256 (SRI) of the repository at `commit` without .git, computed apart from flakebot."""
    run_git("clone", "--quiet", served.url(repo), str(dest), cwd=dest.parent)
    run_git("-c", "advice.detachedHead=false", "checkout", "--quiet", commit, cwd=dest)
    shutil.rmtree(dest / ".git")
    result = subprocess.run([*NIX, "hash", "path", "--type", "sha256", str(dest)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _output_hashes(flake_dir: Path) -> dict[str, str]:
    """cargoLock.outputHashes of the generated flake.nix: the attribute set cut from its text, evaluated by nix."""
    text = (flake_dir / "flake.nix").read_text()
    block = re.search(r"outputHashes = \{\n(.*?)\n\s*\};", text, re.S)
    assert block is not None, text
    parsed = subprocess.run(
        [*NIX, "eval", "--json", "--expr", f'let lib.fakeHash = "{gitdeps.FAKE_HASH}"; in {{ {block.group(1)} }}'],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert parsed.returncode == 0, parsed.stderr
    return dict(json.loads(parsed.stdout))


@pytest.fixture(scope="module")
def packaged(served: Served, tmp_path_factory: pytest.TempPathFactory) -> tuple[PackageResult, list[str], Path]:
    """greeter with helper as a plain git dependency (the default branch), packaged once: result, progress, home."""
    home = tmp_path_factory.mktemp("githome")
    crate = _greeter(home / "greeter", f'helper = {{ git = "{served.url("helper")}" }}\n')
    messages: list[str] = []
    result = package_crate(crate, home / "flake", _settings(home), progress=messages.append)
    return result, messages, home


@pytest.mark.slow
def test_the_first_build_s_hash_is_written_and_the_tool_runs(
    packaged: tuple[PackageResult, list[str], Path], served: Served
) -> None:
    result, messages, home = packaged
    flake_dir = Path(result.flake_dir)
    expected = _nar_hash(served, "helper", served.helper_commit, home / "helper-tree")
    assert _output_hashes(flake_dir) == {"helper-0.1.0": expected}
    assert expected != gitdeps.FAKE_HASH and "= lib.fakeHash;" not in (flake_dir / "flake.nix").read_text()
    assert "git dependency helper-0.1.0: hash from the first build, building again" in messages
    assert sum(m.startswith("git dependency ") for m in messages) == 1, "one more build, not one per step"
    with git.Repo(flake_dir) as repo:
        subjects = [c.summary for c in repo.iter_commits()]
        assert not repo.is_dirty(untracked_files=True), "the flake nix built is the one committed"
    assert subjects[0] == "flakebot: cargoLock.outputHashes of helper-0.1.0 from the build"
    ran = subprocess.run([result.bin_path], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout == "hello from helper\n", ran.stderr
    assert "fakeHash" not in result.portable_reason and "stand-in for nixpkgs" in result.portable_reason
    assert not any("fakeHash" in notice for notice in result.notices)
    assert any("helper-0.1.0" in notice and "first build" in notice for notice in result.notices)


def test_offline_a_git_dependency_cargo_never_fetched_is_named_in_the_fix(served: Served, tmp_path: Path) -> None:
    crate = _greeter(tmp_path / "greeter", f'helper = {{ git = "{served.url("helper")}" }}\n')
    offline = dataclasses.replace(_settings(tmp_path), registry="local", offline=True)
    with pytest.raises(NixError) as failed:
        package_crate(crate, tmp_path / "flake", offline)
    assert "git dependencies, which cargo must fetch once online" in failed.value.fix


@pytest.mark.slow
def test_a_wrong_hash_is_one_line_naming_the_dependency_and_the_hash_received(
    packaged: tuple[PackageResult, list[str], Path], tmp_path: Path
) -> None:
    result, _, home = packaged
    flake_dir = tmp_path / "flake"
    shutil.copytree(result.flake_dir, flake_dir, symlinks=True)
    real = _output_hashes(flake_dir)["helper-0.1.0"]
    wrong = "sha256-" + base64.b64encode(hashlib.sha256(b"not the helper repository").digest()).decode()
    flake = flake_dir / "flake.nix"
    flake.write_text(flake.read_text().replace(real, wrong))
    with git.Repo(flake_dir) as repo:
        repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-am", "a wrong hash"])
    settings = _settings(home)
    with pytest.raises(NixError) as failed:
        build(flake_dir, "host", ensure_standin(settings), settings, "greeter", lambda message: None)
    error = failed.value
    assert error.message == (
        "nix build of greeter failed: git dependency helper-0.1.0 does not match its cargoLock.outputHashes entry: "
        f"expected {wrong}, got {real}"
    )
    assert "\n" not in error.one_line() and error.fix and "outputHashes" in error.fix
    assert error.details["git_dependencies"] == ["helper-0.1.0"] and error.details["got"] == real


@pytest.fixture(scope="module")
def tag_and_rev(served: Served, tmp_path_factory: pytest.TempPathFactory) -> tuple[PackageResult, list[str], Path]:
    """greeter with helper at a tag and demo-core (a workspace member) at a rev, packaged once: result, progress,
    home."""
    home = tmp_path_factory.mktemp("tagrev")
    dependencies = (
        f'helper = {{ git = "{served.url("helper")}", tag = "v0.1.0" }}\n'
        f'demo-core = {{ git = "{served.url("tools")}", rev = "{served.tools_commit[:10]}" }}\n'
    )
    crate = _greeter(home / "greeter", dependencies, extra='format!(" and demo-core {}", demo_core::version())')
    lock = (crate / "Cargo.lock").read_text()
    assert "?tag=v0.1.0#" in lock and f"?rev={served.tools_commit[:10]}#" in lock, lock
    messages: list[str] = []
    result = package_crate(crate, home / "flake", _settings(home), progress=messages.append)
    return result, messages, home


@pytest.mark.slow
def test_a_tag_and_a_workspace_member_at_a_rev_each_get_their_hash(
    tag_and_rev: tuple[PackageResult, list[str], Path], served: Served
) -> None:
    result, messages, home = tag_and_rev
    learned = [m for m in messages if m.startswith("git dependency ")]
    assert learned == ["git dependency demo-core-0.4.0, helper-0.1.0: hash from the first build, building again"], (
        "the first build (--keep-going) reports both clones' hashes: one more build, not one per dependency"
    )
    hashes = _output_hashes(home / "flake")
    assert hashes == {
        "demo-core-0.4.0": _nar_hash(served, "tools", served.tools_commit, home / "tools-tree"),
        "helper-0.1.0": _nar_hash(served, "helper", served.helper_commit, home / "helper-tree"),
    }
    ran = subprocess.run([result.bin_path], capture_output=True, text=True, timeout=60)
    assert ran.stdout == "hello from helper and demo-core 0.4.0\n", ran.stderr
    assert "fakeHash" not in result.portable_reason


@pytest.mark.slow
def test_a_wrong_hash_beside_a_placeholder_is_the_error(
    tag_and_rev: tuple[PackageResult, list[str], Path], tmp_path: Path
) -> None:
    """The --keep-going build reports every clone's mismatch in the order nix builds them (here helper's first): the
    one worth an error is the recorded hash that no longer matches, not the lib.fakeHash flakebot fills in itself."""
    result, _, home = tag_and_rev
    flake_dir = tmp_path / "flake"
    shutil.copytree(result.flake_dir, flake_dir, symlinks=True)
    real = _output_hashes(flake_dir)
    wrong = "sha256-" + base64.b64encode(hashlib.sha256(b"not the tools repository").digest()).decode()
    flake = flake_dir / "flake.nix"
    text = flake.read_text().replace(real["demo-core-0.4.0"], wrong)
    flake.write_text(text.replace(f'"{real["helper-0.1.0"]}"', "lib.fakeHash"))
    assert _output_hashes(flake_dir) == {"demo-core-0.4.0": wrong, "helper-0.1.0": gitdeps.FAKE_HASH}
    with git.Repo(flake_dir) as repo:
        repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-am", "wrong, fake"])
    settings = _settings(home)
    with pytest.raises(NixError) as failed:
        build(flake_dir, "host", ensure_standin(settings), settings, "greeter", lambda message: None, keep_going=True)
    error = failed.value
    assert error.message == (
        "nix build of greeter failed: git dependency demo-core-0.4.0 does not match its cargoLock.outputHashes "
        f"entry: expected {wrong}, got {real['demo-core-0.4.0']}"
    )
    assert sorted(error.details["git_mismatches"], key=lambda m: m["git_dependencies"]) == [
        {"git_dependencies": ["demo-core-0.4.0"], "specified": wrong, "got": real["demo-core-0.4.0"]},
        {"git_dependencies": ["helper-0.1.0"], "specified": gitdeps.FAKE_HASH, "got": real["helper-0.1.0"]},
    ], "both clones ran and reported: nix kept going past the first mismatch"


# How long each .crate answer of nix's crate server takes: far longer than the git clone, so the first build's hash
# mismatch comes while nix still downloads the crate.
SLOW_LINK = 3.0


class SlowCrates(LoopbackServer):
    """nix's crate server (cratesio_static_url) on a slow link: the mirror's .crate answers, each after SLOW_LINK
    seconds. `requests` records each path as it arrives, so a download nix gave up on counts too; cargo downloads
    from the mirror itself, so every request here is nix's."""

    def __init__(self, mirror: Mirror) -> None:
        super().__init__(_SlowCrateHandler)
        self.mirror = mirror
        self.requests: list[str] = []


class _SlowCrateHandler(BaseHTTPRequestHandler):
    server: SlowCrates

    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        time.sleep(SLOW_LINK)
        answer = self.server.mirror.respond("GET", self.path, {})
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        self.wfile.write(answer.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.slow
def test_git_packages_join_the_crates_fetched_by_checksum(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock with crates.io checksums (written against a mirror of crates.io) and a git package: the stand-in fetches
    the registry crate by its checksum and the git package by its hash, into one vendor directory. On a slow link,
    with nix running two jobs at once (max-jobs in a user's nix.conf), the first build's git hash mismatch comes while
    the crate still downloads: that download finishes and lands in the store, and the crate is downloaded once."""
    shout = write(
        tmp_path / "published" / "shout-1.0.0",
        {
            "Cargo.toml": '[package]\nname = "shout"\nversion = "1.0.0"\nedition = "2021"\nlicense = "MIT"\n',
            # new bytes each run (so a new checksum): no earlier run left this crate in the store, nix must fetch it
            "src/lib.rs": f"// {uuid.uuid4()}\npub fn shout(text: &str) -> String {{\n    text.to_uppercase()\n}}\n",
        },
    )
    monkeypatch.setenv("NIX_CONFIG", f"{os.environ.get('NIX_CONFIG', '')}\nmax-jobs = 2")
    with serve_mirror([shout.parent]) as mirror, SlowCrates(mirror) as nix_crates:
        crate = _greeter(
            tmp_path / "greeter",
            f'helper = {{ git = "{served.url("helper")}" }}\nshout = "1"\n',
            extra='shout::shout("!")',
            cargo_args=tuple(mirror.cargo_config()),
        )
        settings = Settings(
            workdir=str(tmp_path / "work"),
            cache_dir=str(tmp_path / "cache"),
            catalog_dir=str(tmp_path / "catalog"),
            nixpkgs="host",
            registry="crates-io",
            cratesio_index_url=f"{mirror.url}/index",
            cratesio_static_url=nix_crates.url,
            git_sources=LOOPBACK,
        )
        messages: list[str] = []
        result = package_crate(crate, tmp_path / "flake", settings, progress=messages.append)
    assert "git dependency helper-0.1.0: hash from the first build, building again" in messages
    assert nix_crates.requests == ["/crates/shout/shout-1.0.0.crate"], "nix downloaded the crate once, by its checksum"
    ran = subprocess.run([result.bin_path], capture_output=True, text=True, timeout=60)
    assert ran.stdout == "hello from helper!\n", ran.stderr
    assert list(_output_hashes(tmp_path / "flake")) == ["helper-0.1.0"]


# ---------------------------------------------------------------- the stand-in's evaluation (no build)

CRATES_IO = "registry+https://github.com/rust-lang/crates.io-index"
COMMIT_A, COMMIT_B, COMMIT_C = "a" * 40, "b" * 40, "c" * 40


def _lock(*packages: tuple[str, str, str]) -> str:
    text = 'version = 4\n\n[[package]]\nname = "tool"\nversion = "0.1.0"\n'
    for name, version, source in packages:
        text += f'\n[[package]]\nname = "{name}"\nversion = "{version}"\nsource = "{source}"\n'
        if source == CRATES_IO:
            text += f'checksum = "{"ab" * 32}"\n'
    return text


def _eval(tmp_path: Path, lock: str, output_hashes: str, attr: str) -> subprocess.CompletedProcess[str]:
    standin = ensure_standin(host_settings(tmp_path))
    src = greeter(tmp_path / "src")
    call = (
        f'pkgs.rustPlatform.buildRustPackage {{ pname = "tool"; version = "0.1.0"; src = {src}; '
        f"cargoLock = {{ lockFileContents = {json.dumps(lock)}; outputHashes = {output_hashes}; }}; }}"
    )
    return standin_eval(standin, f"let p = {call}; in {attr}")


def test_each_git_source_is_replaced_as_import_cargo_lock_writes_it(tmp_path: Path) -> None:
    lock = _lock(
        ("anyhow", "1.0.69", CRATES_IO),
        ("plain", "0.1.0", f"git+https://example.org/plain#{COMMIT_A}"),
        ("pinned", "0.2.0", f"git+https://example.org/pinned.git?rev=abc123#{COMMIT_B}"),
        ("core", "0.4.0", f"git+ssh://git@example.org/ws.git?branch=feat%2Fx#{COMMIT_C}"),
        ("cli", "0.4.0", f"git+ssh://git@example.org/ws.git?branch=feat%2Fx#{COMMIT_C}"),
        ("tagged", "1.0.0", f"git+https://example.org/tagged?tag=v1.0.0#{COMMIT_B}"),
    )
    keys = ("plain-0.1.0", "pinned-0.2.0", "core-0.4.0", "tagged-1.0.0")  # one per commit: cli-0.4.0 shares core's
    hashes = "{ " + " ".join(f'"{key}" = lib.fakeHash;' for key in keys) + " }"
    attr = "{ inherit (p) flakebotCratesIo; inherit (p.flakebotVendorDir) crates gitCrates gitSources; }"
    result = _eval(tmp_path, lock, hashes, attr)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["flakebotCratesIo"] == "vendored-sources" and found["crates"].startswith("anyhow 1.0.69 ")
    assert [line.split()[0] for line in found["gitCrates"].splitlines()] == [
        "plain-0.1.0",
        "pinned-0.2.0",
        "core-0.4.0",
        "cli-0.4.0",
        "tagged-1.0.0",
    ]
    assert found["gitSources"] == (
        f'[source."git+https://example.org/plain#{COMMIT_A}"]\ngit = "https://example.org/plain"\n'
        'replace-with = "vendored-sources"\n\n'
        f'[source."git+https://example.org/pinned.git?rev=abc123#{COMMIT_B}"]\ngit = "https://example.org/pinned.git"\n'
        'rev = "abc123"\nreplace-with = "vendored-sources"\n\n'
        f'[source."git+ssh://git@example.org/ws.git?branch=feat%2Fx#{COMMIT_C}"]\ngit = "ssh://git@example.org/ws.git"\n'
        'branch = "feat/x"\nreplace-with = "vendored-sources"\n\n'
        f'[source."git+https://example.org/tagged?tag=v1.0.0#{COMMIT_B}"]\ngit = "https://example.org/tagged"\n'
        'tag = "v1.0.0"\nreplace-with = "vendored-sources"\n'
    ), "one section per source: the workspace's two packages share theirs"


def test_git_packages_beside_the_local_directory_source(tmp_path: Path) -> None:
    lock = _lock(("plain", "0.1.0", f"git+https://example.org/plain#{COMMIT_A}"))
    attr = "{ inherit (p) flakebotCratesIo; inherit (p.flakebotVendorDir) crates gitCrates; }"
    result = _eval(tmp_path, lock, '{ "plain-0.1.0" = lib.fakeHash; }', attr)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["flakebotCratesIo"] == "flakebot-local" and found["crates"] == ""
    assert found["gitCrates"].startswith("plain-0.1.0 /nix/store/")


@pytest.mark.parametrize(
    "url",
    [
        "https://example.org/owner/repo",
        "https://example.org/owner/repo.git",
        "https://example.org/owner/repo/",
        "git://127.0.0.1:9418/helper.git",
        "ssh://git@example.org/owner/archive.tar.gz",
    ],
)
def test_clones_are_named_as_fetchgit_names_them_and_as_flakebot_reads_them(tmp_path: Path, url: str) -> None:
    source = f"git+{url}#{COMMIT_A}"
    lock = _lock(("dep", "0.1.0", source))
    attr = "map (crate: crate.tree.name) p.flakebotVendorDir.gitPackages"
    result = _eval(tmp_path, lock, '{ "dep-0.1.0" = lib.fakeHash; }', attr)
    assert result.returncode == 0, result.stderr
    name = gitdeps.fetch_name(source)
    assert json.loads(result.stdout) == [name]
    assert name is not None and name.endswith(f"-{COMMIT_A[:7]}") and "/" not in name


def test_a_git_dependency_without_a_hash_fails_as_import_cargo_lock_does(tmp_path: Path) -> None:
    lock = _lock(
        ("plain", "0.1.0", f"git+https://example.org/plain#{COMMIT_A}"),
        ("other", "0.3.0", f"git+https://example.org/other#{COMMIT_B}"),
    )
    result = _eval(tmp_path, lock, '{ "plain-0.1.0" = lib.fakeHash; }', "p.drvPath")
    assert result.returncode != 0
    assert "No hash was found while vendoring the git dependency other-0.3.0" in result.stderr
    assert re.search(r'outputHashes = \{\s+"other-0.3.0" = "<hash>";\s+\};', result.stderr), result.stderr


def test_a_hash_for_no_git_dependency_fails(tmp_path: Path) -> None:
    lock = _lock(("plain", "0.1.0", f"git+https://example.org/plain#{COMMIT_A}"))
    hashes = '{ "plain-0.1.0" = lib.fakeHash; "gone-1.0.0" = lib.fakeHash; }'
    result = _eval(tmp_path, lock, hashes, "p.drvPath")
    assert result.returncode != 0
    assert "A hash was specified for gone-1.0.0, but there is no corresponding git dependency." in result.stderr


def test_allow_builtin_fetch_git_clones_at_evaluation_without_a_hash(served: Served, tmp_path: Path) -> None:
    lock = _lock(("helper", "0.1.0", f"git+{served.url('helper')}#{served.helper_commit}"))
    standin = ensure_standin(host_settings(tmp_path))
    src = greeter(tmp_path / "src")
    call = (
        f'pkgs.rustPlatform.buildRustPackage {{ pname = "tool"; version = "0.1.0"; src = {src}; '
        f"cargoLock = {{ lockFileContents = {json.dumps(lock)}; allowBuiltinFetchGit = true; }}; }}"
    )
    attr = 'map (crate: builtins.readFile "${crate.tree}/src/lib.rs") p.flakebotVendorDir.gitPackages'
    result = standin_eval(standin, f"let p = {call}; in {attr}")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [HELPER_LIB]
