"""Bad input to packaging: each ends in a FlakebotError naming the problem and a fix, leaving nothing behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from flakebot.config import Settings
from flakebot.errors import NixError, UsageError
from flakebot.nix import command
from flakebot.nix.command import resolve_mode
from flakebot.nix.flake import package_crate
from flakebot.nix.lock import NIXPKGS_BRANCH, NIXPKGS_MIN_NIX
from flakebot.nix.smoke import smoke_run
from tests.conftest import run_cli
from tests.fakes.nix_crates import broken, greeter, host_settings, library, many_errors, two_binaries, unresolvable
from tests.fakes.processes import descendants, own_processes


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    for made in (path, path.parent):  # as a store path is: the smoke run's unprivileged uid reads and runs it
        made.chmod(0o755)
    return path


def test_nix_not_installed_says_how_to_install_it(tmp_path: Path, workdir: Path) -> None:
    crate = greeter(tmp_path / "greeter")
    result = run_cli("package", str(crate), "--nixpkgs", "host", env={"PATH": str(tmp_path / "no-nix-here")})
    assert result.returncode == NixError.exit_code, result.stderr
    assert "nix is not installed" in result.stderr and "apt-get install nix-bin" in result.stderr
    assert not list(workdir.glob("runs/*/flake")), "no flake directory is left behind"


def test_library_crate_has_no_binary(tmp_path: Path) -> None:
    out = tmp_path / "flake"
    with pytest.raises(UsageError) as caught:
        package_crate(library(tmp_path / "lib"), out, host_settings(tmp_path))
    assert "lib has no binary target (it is a library crate)" in caught.value.message
    assert caught.value.fix and not out.exists()


def test_cargo_lock_that_cannot_be_produced_offline(tmp_path: Path) -> None:
    out = tmp_path / "flake"
    with pytest.raises(NixError) as caught:
        package_crate(unresolvable(tmp_path / "missing"), out, host_settings(tmp_path))
    assert "cannot produce Cargo.lock for missing offline" in caught.value.message
    assert "flakebot-no-such-crate" in caught.value.message
    assert "apt-get install librust-" in (caught.value.fix or "")
    assert not out.exists()


def test_several_binaries_need_a_choice(tmp_path: Path) -> None:
    crate = two_binaries(tmp_path / "ws")
    with pytest.raises(UsageError, match=r"ws has several binaries \(alpha, beta\)"):
        package_crate(crate, tmp_path / "flake", host_settings(tmp_path))
    with pytest.raises(UsageError, match=r"no binary named 'gamma' \(binaries: alpha, beta\)") as caught:
        package_crate(crate, tmp_path / "flake", host_settings(tmp_path), bin_name="gamma")
    assert caught.value.fix == "pass --bin with one of: alpha, beta"


def test_not_a_crate_and_a_foreign_output_directory(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is not a crate"):
        package_crate(tmp_path, tmp_path / "flake", host_settings(tmp_path))
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError, match="already holds files that flakebot did not write"):
        package_crate(greeter(tmp_path / "greeter"), out, host_settings(tmp_path))
    assert (out / "notes.txt").read_text() == "keep me"


def test_smoke_run_that_hangs_is_killed_at_its_timeout(tmp_path: Path) -> None:
    marker = f"600.{os.getpid()}"  # the sleep to find leftovers by
    tool = _script(tmp_path / "hangs", f"sleep {marker} &\nwait\n")
    started = time.monotonic()
    with own_processes():  # a sleep left behind stays in this test's tree, where _running looks
        with pytest.raises(NixError) as caught:
            smoke_run(tool, timeout=1.0)
        assert time.monotonic() - started < 10
        assert caught.value.message == "smoke run 'hangs --help' hung and was killed after 1 s"
        assert caught.value.details["smoke"]["timed_out"] is True
        assert not _running(marker), "the tool's children are killed too"


def _running(marker: str) -> bool:
    """Whether a live process of this test's tree has `marker` in its command line."""
    return any(marker in " ".join(argv) for _, argv in descendants())


def test_smoke_run_falls_back_to_version_then_fails(tmp_path: Path) -> None:
    version_only = _script(
        tmp_path / "version-only",
        'if [ "$1" = --version ]; then echo "v 1.0"; exit 0; fi\necho "no help" >&2\nexit 2\n',
    )
    record = smoke_run(version_only, timeout=10)
    assert record["argv"] == [str(version_only), "--version"] and record["exit_code"] == 0
    assert record["output_head"] == "v 1.0\n" and record["level"] == "help"
    failing = _script(tmp_path / "fails", "exit 3\n")
    with pytest.raises(NixError) as caught:
        smoke_run(failing, timeout=10)
    assert caught.value.message == (  # then the input tries: no arguments, an empty file (docs/smoke-levels.md)
        "smoke run failed: 'fails --help' exited 3, 'fails --version' exited 3, 'fails' exited 3 and "
        "'fails empty-input' exited 3"
    )


def test_smoke_run_of_a_cargo_subcommand_asks_as_cargo_calls_it(tmp_path: Path) -> None:
    """cargo-lock answers only `cargo-lock lock --help` (cargo runs cargo-NAME with NAME first)."""
    script = 'if [ "$1 $2" = "lock --help" ]; then echo "cargo-lock lock: reads Cargo.lock"; exit 0; fi\nexit 2\n'
    record = smoke_run(_script(tmp_path / "cargo-lock", script), timeout=10)
    assert record["argv"][1:] == ["lock", "--help"] and record["exit_code"] == 0
    with pytest.raises(NixError) as caught:
        smoke_run(_script(tmp_path / "cargo-nope", "exit 2\n"), timeout=10)
    assert caught.value.message == (
        "smoke run failed: 'cargo-nope --help' exited 2, 'cargo-nope --version' exited 2, "
        "'cargo-nope nope --help' exited 2, 'cargo-nope' exited 2 and 'cargo-nope empty-input' exited 2"
    )


def test_nixpkgs_mode_is_recorded_choice_or_offline_fallback() -> None:
    assert resolve_mode(Settings(nixpkgs="host")) == ("host", "")
    mode, notice = resolve_mode(Settings(nixpkgs="auto", offline=True))
    assert mode == "host" and "host-toolchain stand-in" in notice


def test_a_nix_too_old_for_the_pin_builds_with_the_stand_in_and_refuses_pinned() -> None:
    """nixpkgs 26.05 evaluates only with Nix >= 2.18: the real `nix --version` decides (Debian's nix-bin is 2.8)."""
    version = command.nix_version()
    assert version and version[0].isdigit()
    if command.nix_too_old(NIXPKGS_MIN_NIX) != version:
        assert resolve_mode(Settings(nixpkgs="pinned")) == ("pinned", "")
        pytest.skip(f"Nix {version} evaluates nixpkgs {NIXPKGS_BRANCH}: nothing to refuse")
    with pytest.raises(NixError) as caught:
        resolve_mode(Settings(nixpkgs="pinned"))
    assert caught.value.message == (
        f"Nix {version} cannot evaluate nixpkgs {NIXPKGS_BRANCH}, which needs Nix >= {NIXPKGS_MIN_NIX}"
    )
    assert "--nixpkgs host" in (caught.value.fix or "")
    mode, notice = resolve_mode(Settings(nixpkgs="auto"))
    assert mode == "host" and notice.startswith(f"Nix {version} is older than {NIXPKGS_MIN_NIX}")


@pytest.mark.slow
def test_failing_build_carries_the_last_30_lines_of_the_nix_log(tmp_path: Path) -> None:
    out = tmp_path / "flake"
    with pytest.raises(NixError) as caught:
        package_crate(broken(tmp_path / "broken"), out, host_settings(tmp_path))
    error = caught.value
    assert error.message.startswith("nix build of broken failed: error[E0425]: cannot find value `undefined_value`")
    tail = error.details["log_tail"].splitlines()
    assert 0 < len(tail) <= 30
    assert any("undefined_value" in line for line in tail) and any("builder for" in line for line in tail)
    assert error.details["drv"].endswith("-broken-0.3.1.drv") and f"nix log {error.details['drv']}" in (error.fix or "")
    assert not out.exists()


@pytest.mark.slow
def test_failing_build_names_the_first_compiler_error_not_cargos_summary(tmp_path: Path) -> None:
    with pytest.raises(NixError) as caught:
        package_crate(many_errors(tmp_path / "many"), tmp_path / "flake", host_settings(tmp_path))
    error = caught.value
    assert error.message.startswith("nix build of many-errors failed: error[E0425]: cannot find value `undefined_0`")
    tail = error.details["log_tail"]
    assert "undefined_0`" not in tail and "could not compile" in tail  # the cause had scrolled out of the tail
