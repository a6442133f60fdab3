"""The stand-in's host facts and toolchain answers are asked once per machine state (nix/standin.py), not once per
build: counted through Python's audit event for every process started (tests/fakes/spawns.py), with the real rustc."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from flakebot import probecache
from flakebot.nix import standin
from tests.fakes.nix_crates import host_settings
from tests.fakes.spawns import spawns


@pytest.fixture
def spawned() -> Iterator[list[list[str]]]:
    """Every process started while the test runs; the stand-in's kept answers forgotten first (the probes' record
    is in this test's own cache directory)."""
    standin._facts.clear()
    probecache.forget()
    with spawns() as started:
        yield started


def _registry(root: Path, *crates: str) -> Path:
    """A directory source whose crates each vouch for a package checksum (what registryChecksums lists)."""
    for crate in crates:
        (root / crate).mkdir(parents=True)
        (root / crate / ".cargo-checksum.json").write_text(json.dumps({"files": {}, "package": crate[-1] * 64}))
    return root


def test_host_facts_are_asked_once_while_nothing_they_read_changes(tmp_path: Path, spawned: list[list[str]]) -> None:
    registry = _registry(tmp_path / "registry", "a-1.0.0")
    settings = dataclasses.replace(host_settings(tmp_path), local_registry=str(registry))
    first = standin.host_facts(settings)
    asked = len(spawned)
    assert asked >= 2  # rustc's sysroot and its host triple, the first time
    assert standin.host_facts(settings) == first and len(spawned) == asked  # the second: no process at all
    first["hostTriple"] = "changed by the caller"
    assert standin.host_facts(settings)["hostTriple"] != "changed by the caller"  # each caller gets its own copy

    _registry(registry, "b-2.0.0")  # a crate installed: seen
    assert standin.host_facts(settings)["registryChecksums"] == {"a-1.0.0": "0" * 64, "b-2.0.0": "0" * 64}
    checksum = registry / "a-1.0.0" / ".cargo-checksum.json"
    checksum.write_text(json.dumps({"files": {}, "package": "f" * 64}))  # rewritten in place: seen
    assert standin.host_facts(settings)["registryChecksums"]["a-1.0.0"] == "f" * 64


def test_a_toolchains_version_report_is_asked_once_per_binary(spawned: list[list[str]]) -> None:
    rustc = standin.rust_sysroot() / "bin" / "rustc"
    report = standin.rustc_report(rustc)
    assert "host: " in report and standin.rust_sysroot() / "bin" / "rustc" == rustc
    assert standin.rustc_report(rustc) == report
    assert [argv[1:] for argv in spawned] == [["--print", "sysroot"], ["-vV"]]


def _program(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_a_c_compiler_switched_behind_a_link_is_seen_by_the_builders_feature(
    tmp_path: Path, spawned: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """update-alternatives switches cc by retargeting /etc/alternatives/cc: /usr/bin (stamped) is unchanged, yet with
    nix_builders the feature digests `cc --version`, so the kept facts must see the compiler behind the link."""
    compilers = {name: _program(tmp_path / "compilers" / name, f"echo {name} 1.0") for name in ("gcc", "clang")}
    alternative = tmp_path / "alternatives" / "cc"
    alternative.parent.mkdir()
    alternative.symlink_to(compilers["gcc"])
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "cc").symlink_to(alternative)
    monkeypatch.setattr(standin, "HOST_BIN_DIRS", (str(tmp_path / "bin"),))
    registry = _registry(tmp_path / "registry", "a-1.0.0")
    settings = dataclasses.replace(
        host_settings(tmp_path), local_registry=str(registry), nix_builders="ssh://builder x86_64-linux"
    )
    with_gcc = standin.host_facts(settings)["systemFeature"]
    switched = alternative.with_name("cc.new")
    switched.symlink_to(compilers["clang"])
    switched.rename(alternative)  # as update-alternatives does: the link replaced, bin/ untouched
    assert standin.host_facts(settings)["systemFeature"] != with_gcc
