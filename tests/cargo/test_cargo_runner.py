"""flakebot's cargo runner: which crate source and network mode each registry setting gives cargo."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from flakebot.cargo.runner import RESOLVER_ARGS, Cargo, active_toolchain, cargo_program, toolchain_versions
from flakebot.config import Settings, rustup_home
from flakebot.nix.lock import PINNED_RUSTC
from tests.conftest import DEBIAN_REGISTRY


def test_registry_setting_picks_the_source(tmp_path: Path) -> None:
    online = Cargo.for_run(Settings(registry="crates-io"), tmp_path)
    assert online.config_args() == RESOLVER_ARGS
    local = Cargo.for_run(Settings(registry="local", local_registry=str(DEBIAN_REGISTRY)), tmp_path)
    assert local.offline and local.registry_dir == DEBIAN_REGISTRY
    vendored = Cargo.for_run(Settings(registry=str(tmp_path / "vendor")), tmp_path)
    assert vendored.registry_dir == tmp_path / "vendor" and "--offline" in vendored.config_args()
    forced = Cargo.for_run(Settings(registry="crates-io", offline=True, local_registry=str(DEBIAN_REGISTRY)), tmp_path)
    assert forced.offline and forced.registry_dir == DEBIAN_REGISTRY


def test_settings_reach_cargo_without_touching_the_crate(tmp_path: Path) -> None:
    crate = tmp_path / "c"
    subprocess.run(
        ["cargo", "init", "--bin", "--vcs", "none", "--name", "c", str(crate)], check=True, capture_output=True
    )
    cargo = Cargo.for_run(Settings(registry="local"), tmp_path / "target")
    added = cargo.run(["add", "anyhow"], crate, timeout=120)
    assert added.returncode == 0, added.stderr
    assert 'anyhow = "1' in (crate / "Cargo.toml").read_text()
    assert not (crate / ".cargo").exists()  # flakebot's source settings are flags, not files in the tool's tree


def test_host_calls_ignore_the_trees_cargo_config_and_toolchain_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree planted with .cargo/config.toml (a bogus crate source, a rustc wrapper) and rust-toolchain.toml (a
    toolchain that does not exist): flakebot's host calls resolve against its own source and toolchain, run nothing planted."""
    marker = tmp_path / "wrapper-ran"
    crate = tmp_path / "planted"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text(
        '[package]\nname = "planted"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\nitoa = "1"\n'
    )
    (crate / "src/main.rs").write_text("fn main() {}\n")
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text(f'#!/bin/sh\ntouch {marker}\nexec "$@"\n')
    wrapper.chmod(0o755)
    (crate / ".cargo").mkdir()
    (crate / ".cargo/config.toml").write_text(
        f'[source.crates-io]\nreplace-with = "evil"\n\n[source.evil]\ndirectory = "/nonexistent"\n\n[build]\nrustc-wrapper = "{wrapper}"\n'
    )
    (crate / "rust-toolchain.toml").write_text('[toolchain]\nchannel = "1.2.3"\n')
    in_tree = subprocess.run(
        ["cargo", "metadata", "--format-version", "1"], cwd=crate, capture_output=True, text=True, timeout=120
    )
    assert in_tree.returncode != 0  # control: run from the tree, cargo obeys the planted files

    monkeypatch.setenv("GROQ_API_KEY", "gsk_planted_secret")
    cargo = Cargo.for_run(Settings(registry="local"), tmp_path / "target")
    locked = cargo.run(["generate-lockfile"], crate, timeout=120)
    assert locked.returncode == 0, locked.stderr
    resolved = cargo.run(["metadata", "--format-version", "1"], crate, timeout=120)
    assert resolved.returncode == 0, resolved.stderr
    assert "itoa" in {p["name"] for p in json.loads(resolved.stdout)["packages"]}
    assert not marker.exists()
    env = cargo.host_env()
    assert "GROQ_API_KEY" not in env and env["CARGO_HOME"] == str(Settings().path("cache_dir") / "cargo-home")
    assert set(env) <= {
        "PATH",
        "HOME",
        "LANG",
        "CARGO_HOME",
        "CARGO_TARGET_DIR",
        "CARGO_TERM_COLOR",
        "CARGO_TERM_PROGRESS_WHEN",
        "RUSTUP_HOME",
        "RUSTUP_TOOLCHAIN",
        "CARGO_NET_GIT_FETCH_WITH_CLI",  # git fetched by the git program, speaking only the allowed protocols
        "GIT_ALLOW_PROTOCOL",
        "GIT_CONFIG_NOSYSTEM",
        "GIT_TERMINAL_PROMPT",
    }
    assert env["GIT_ALLOW_PROTOCOL"] == "https"
    assert env["HOME"] != str(Path.home()) and env.get("RUSTUP_TOOLCHAIN")


def test_host_calls_run_the_pinned_toolchains_own_cargo(tmp_path: Path) -> None:
    """rustup's proxy would only choose the toolchain RUSTUP_TOOLCHAIN names on every call: host calls skip it (several
    ms a call) and run that toolchain's own cargo, which answers as the proxy does; sandboxed calls keep the proxy."""
    program = cargo_program()
    if "rustup" not in Path(program).resolve().name:
        pytest.skip(f"cargo here is not rustup's proxy ({program})")
    cargo = Cargo.for_run(Settings(registry="local"), tmp_path / "target")
    crate = tmp_path / "c"
    assert cargo.run(["init", "--bin", "--vcs", "none", "--name", "c", str(crate)], None, timeout=120).returncode == 0
    argv = cargo.host_argv(["metadata", "--format-version", "1", "--no-deps"], crate)
    assert argv[0] == str(rustup_home() / "toolchains" / str(active_toolchain()) / "bin/cargo")
    assert cargo.argv("test")[0] == program
    direct = cargo.call(["metadata", "--format-version", "1", "--no-deps"], crate, timeout=120)
    env = cargo.host_env()
    proxied = subprocess.run([program, *argv[1:]], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert direct.returncode == proxied.returncode == 0, proxied.stderr
    assert json.loads(direct.stdout) == json.loads(proxied.stdout)
    versions = [subprocess.run([c, "-V"], env=env, capture_output=True, text=True).stdout for c in (argv[0], program)]
    assert versions[0] == versions[1] != ""


def test_a_sparse_index_setting_replaces_crates_io_by_name() -> None:
    cargo = Cargo.for_run(Settings(registry="crates-io", cratesio_index_url="http://127.0.0.1:9/index"), Path("/t"))
    assert cargo.online and cargo.config_args() == [
        "--config",
        "source.crates-io.replace-with='flakebot-mirror'",
        "--config",
        "source.flakebot-mirror.registry='sparse+http://127.0.0.1:9/index/'",
        *RESOLVER_ARGS,
    ]
    assert cargo.argv("test")[1:] == [*cargo.config_args(), "--offline", "test"]  # sandboxed calls are always offline
    assert Cargo.for_run(Settings(registry="crates-io"), Path("/t")).config_args() == RESOLVER_ARGS


def test_cargo_calls_use_a_toolchain_of_the_pins_rustc_when_one_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toolchain every cargo call gets is one whose real `rustc -V` is the pinned nixpkgs' rustc, when rustup has
    one installed; otherwise rustup's active toolchain (this machine: rustup's stable is rustc 1.95.0)."""
    monkeypatch.delenv("RUSTUP_TOOLCHAIN", raising=False)
    active_toolchain.cache_clear()
    try:
        versions = toolchain_versions()
        chosen = active_toolchain()
    finally:
        active_toolchain.cache_clear()
    if PINNED_RUSTC not in versions.values():
        pytest.skip(f"no installed toolchain has rustc {PINNED_RUSTC} (installed: {versions})")
    assert chosen is not None and versions[chosen] == PINNED_RUSTC
    shown = subprocess.run(
        ["rustc", "-V"],
        env={**Cargo(target_dir=Path("/t")).env(), "PATH": "/root/.cargo/bin:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.stdout.split()[1] == PINNED_RUSTC, shown.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user's needs root")
def test_another_users_cargo_config_above_the_calls_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cargo reads .cargo/config.toml above its working directory (under a shared /tmp): another user's there would
    steer the host call (a [patch], a source replacing crates.io), so the call is refused before cargo runs."""
    import tempfile

    temp = tmp_path / "tmp"
    (temp / ".cargo").mkdir(parents=True)
    (temp / ".cargo/config.toml").write_text('[patch.crates-io]\nitoa = { path = "/nonexistent/itoa" }\n')
    os.chown(temp / ".cargo/config.toml", 65534, 65534)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    crate = tmp_path / "run/workspace"
    (crate / "src").mkdir(parents=True)
    (crate / "src/main.rs").write_text("fn main() {}\n")
    (crate / "Cargo.toml").write_text('[package]\nname = "m"\nversion = "0.1.0"\nedition = "2021"\n')
    cargo = Cargo.for_run(Settings(registry="local"), tmp_path / "run/target", tmp_path / "run")
    refused = cargo.run(["metadata", "--format-version", "1"], crate, timeout=120)
    assert refused.returncode == 101 and "another user's" in refused.stderr, refused.stderr
    os.chown(temp / ".cargo/config.toml", 0, 0)
    assert cargo.run(["metadata", "--format-version", "1", "--no-deps"], crate, timeout=120).returncode == 0
