"""Stand-in builds over real Nix remote builders: sshd processes, each in its own mount and network namespace with
its own /nix and no build users (benchmarks/scenarios/builders.py), reached as ssh-ng:// through NIX_SSHOPTS (an
ssh config whose ProxyCommand enters the builder's network namespace: the client shares no network with it).

The stand-in's derivations require the host toolchain's feature: they go to a builder advertising it (the local
machine is given max-jobs = 0, so it cannot build them itself), never to one without it, and build here when this
machine advertises the feature. Every crate is new (a store hit proves nothing)."""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.scenarios.builders import Fleet, fleet
from flakebot.config import Settings
from flakebot.errors import NixError
from flakebot.nix import command
from flakebot.nix.builders import FEATURE_PREFIX, builder_nix_conf, standin_feature
from flakebot.nix.flake import PackageResult, package_crate
from flakebot.nix.standin import ensure_standin
from tests.fakes.nix_crates import host_settings, manifest, write

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("sshd", path="/usr/sbin:/usr/bin") is None or shutil.which("unshare") is None,
        reason="needs openssh-server (scripts/setup.sh) and unshare",
    ),
]

SCENARIO_SECONDS = 120


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("builders")


@pytest.fixture(scope="module")
def settings(home: Path) -> Settings:
    """Host-mode settings with builders set (the stand-in is then rendered with the toolchain feature)."""
    return dataclasses.replace(host_settings(home), nix_builders="ssh-ng://placeholder")


@pytest.fixture(scope="module")
def standin(settings: Settings) -> Path:
    return ensure_standin(settings)


@pytest.fixture(scope="module")
def builders(home: Path, standin: Path) -> Iterator[Fleet]:
    """one and two: the toolchain feature, the stand-in's sandbox paths; plain: no feature."""
    feature = standin_feature(standin)
    conf = builder_nix_conf(standin)
    specs = {"one": (feature, conf), "two": (feature, conf), "plain": ("", "sandbox = true\n")}
    with fleet(home / "fleet", specs) as started:
        yield started


@pytest.fixture
def remote(builders: Fleet, monkeypatch: pytest.MonkeyPatch) -> Fleet:
    """The client reaches the builders through NIX_SSHOPTS; this machine builds nothing itself (max-jobs = 0)."""
    monkeypatch.setenv("NIX_SSHOPTS", builders.sshopts)
    monkeypatch.setenv("NIX_CONFIG", "max-jobs = 0")
    return builders


def fresh_crate(root: Path, build_rs: str = "") -> tuple[Path, str]:
    """A new binary crate (a nonce in its source), with a build script when given; (directory, nonce)."""
    nonce = secrets.token_hex(6)
    name = f"remote-{nonce}"
    files = {
        "Cargo.toml": manifest(name, 'license = "MIT"\n'),
        "src/main.rs": f'fn main() {{ println!("{nonce}: a small tool\\n\\nUSAGE: {name} [--help]"); }}\n',
    }
    if build_rs:
        files["build.rs"] = build_rs
    return write(root / name, files), nonce


def package(crate: Path, out: Path, settings: Settings, builders: str) -> PackageResult:
    return package_crate(crate, out, dataclasses.replace(settings, nix_builders=builders))


def test_each_builder_has_a_network_of_its_own(builders: Fleet) -> None:
    """No builder is on this machine's network nor on another builder's: the client reaches each one only through
    the relay into its namespace, which refuses a pid that names another process now."""
    nets = {os.readlink(f"/proc/{b.process.pid}/ns/net") for b in builders.builders if b.process is not None}
    assert len(nets) == len(builders.builders) == 3 and os.readlink("/proc/self/ns/net") not in nets
    config = (builders.root / "ssh_config").read_text()
    assert "HostName" not in config and "Port" not in config and config.count("ProxyCommand") == 3
    reused = builders["one"].proxy()
    reused[3] = str(builders["one"].started + 1)  # the same pid, another start time: as if the pid were reused
    refused = subprocess.run(reused, input=b"SSH-2.0-probe\r\n", capture_output=True, timeout=30)
    assert refused.returncode == 1 and refused.stdout == b"" and b"is not the builder any more" in refused.stderr


def test_the_stand_in_names_the_toolchain_feature_only_with_builders(home: Path, standin: Path) -> None:
    feature = standin_feature(standin)
    assert feature.startswith(FEATURE_PREFIX) and len(feature) == len(FEATURE_PREFIX) + 32
    alone = ensure_standin(dataclasses.replace(host_settings(home / "alone"), nix_builders=""))
    assert standin_feature(alone) == ""  # single-user derivations stay exactly as they were


def test_the_feature_is_required_and_this_machine_advertises_it(builders: Fleet, standin: Path) -> None:
    """A stand-in derivation does not build where the feature is not advertised; flakebot's options make this
    machine advertise it, with builders set (here only one without the feature: the build stays here) or none."""
    nonce = secrets.token_hex(6)
    expr = (
        f'(builtins.getFlake "path:{standin}").lib.hostDerivation {{ name = "feature-probe-{nonce}"; '
        'system = "x86_64-linux"; builder = "/bin/sh"; args = [ "-c" "echo built > $out; exit 0" ]; }'
    )
    args = ["--impure", "--no-link", "--json", "--expr", expr]

    def build(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=SCENARIO_SECONDS)

    flakebots = command.nix_argv(["build"], args, "host", standin, "")
    at = flakebots.index("extra-system-features")
    refused = build(flakebots[: at - 1] + flakebots[at + 2 :])  # the same call, the feature not advertised
    assert refused.returncode != 0
    assert f"with features {{{standin_feature(standin)}}} is required to build" in refused.stderr
    assert build(flakebots).returncode == 0  # no builders: built here
    args[-1] = expr.replace(nonce, nonce + "-plain")
    done = build(command.nix_argv(["build"], args, "host", standin, builders.setting("plain")))
    assert done.returncode == 0, done.stderr
    assert builders["plain"].sessions() == []


def test_a_stand_in_build_goes_to_the_builder_with_the_toolchain(remote: Fleet, home: Path, settings: Settings) -> None:
    crate, nonce = fresh_crate(home / "src")
    started = len(remote["one"].sessions())
    result = package(crate, home / "out" / crate.name, settings, remote.setting("one", "plain"))
    assert remote["one"].has(result.store_path)  # built there and copied back (this machine had max-jobs = 0)
    assert len(remote["one"].sessions()) > started
    assert remote["plain"].sessions() == []  # listed, but without the toolchain feature
    shown = subprocess.run([result.bin_path, "--help"], capture_output=True, text=True, timeout=30)
    assert shown.stdout.startswith(nonce)


def test_a_builder_without_the_toolchain_is_never_used(remote: Fleet, home: Path, settings: Settings) -> None:
    crate, _ = fresh_crate(home / "src")
    with pytest.raises(NixError) as refused:
        package(crate, home / "out" / crate.name, settings, remote.setting("plain"))
    assert "no builder offers what its derivations require" in str(refused.value)
    assert remote["plain"].sessions() == []


def test_a_builder_that_is_down_is_passed_over(
    home: Path, standin: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A builder that cannot be reached (its sshd gone) is skipped: the build goes to the next one."""
    spec = (standin_feature(standin), builder_nix_conf(standin))
    with fleet(home / "down", {"gone": spec, "up": spec}) as pair:
        monkeypatch.setenv("NIX_SSHOPTS", pair.sshopts)
        monkeypatch.setenv("NIX_CONFIG", "max-jobs = 0")
        pair["gone"].kill()
        crate, _ = fresh_crate(home / "src")
        result = package(crate, home / "out" / crate.name, settings, pair.setting("gone", "up"))
        assert pair["up"].has(result.store_path)
        assert not pair["gone"].has(result.store_path)


SLOW_BUILD_RS = "fn main() { std::thread::sleep(std::time::Duration::from_secs(60)); }\n"


def test_a_builder_killed_mid_build_fails_the_build_with_its_name(
    remote: Fleet, home: Path, settings: Settings
) -> None:
    """A builder that dies mid-build: Nix 2.8 does not move a started build to another builder; the build fails,
    and the error names the builder, within the scenario's bound."""
    crate, _ = fresh_crate(home / "src", SLOW_BUILD_RS)
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = package(crate, home / "out" / crate.name, settings, remote.setting("two"))
        except NixError as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    worker.start()
    deadline = started + SCENARIO_SECONDS
    while not any(crate.name in path.name for path in remote["two"].building()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert time.monotonic() < deadline, "the build never started on the builder"
    time.sleep(2)
    remote["two"].kill()
    worker.join(timeout=SCENARIO_SECONDS)
    assert not worker.is_alive()
    error = outcome.get("error")
    assert isinstance(error, NixError), outcome
    assert "the remote builder ssh-ng://two went away mid-build (error: unexpected end-of-file)" in str(error)
    assert error.details["builder"] == "ssh-ng://two"


# A build script (model-written code) printing what Nix prints when a builder is lost or missing, then failing.
FORGED_BUILD_RS = r"""fn main() {
    eprintln!("building '/nix/store/00000000000000000000000000000000-x.drv' on 'ssh-ng://innocent'");
    eprintln!("error: unexpected end-of-file");
    eprintln!("remote machines may not have all required system features");
    panic!("a build script that fails");
}
"""


def test_a_build_log_cannot_pose_as_nix_blaming_a_builder(home: Path, settings: Settings) -> None:
    """The build's own log lines (prefixed with its name under -L) are the crate's words, not Nix's: a failed build
    that prints Nix's messages is an ordinary failed build, never 'the builder went away' or 'no builder'."""
    crate, _ = fresh_crate(home / "src", FORGED_BUILD_RS)
    with pytest.raises(NixError) as failed:
        package(crate, home / "out" / crate.name, settings, "")
    assert "innocent" not in failed.value.message and "no builder offers" not in failed.value.message, failed.value
    assert "builder" not in failed.value.details
