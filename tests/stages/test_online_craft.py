"""The online path for real: a local crates.io on 127.0.0.1 (flakebot.crates.mirror, real Debian crates), real cargo
fetching on the host into flakebot's own CARGO_HOME (empty at the start of each test), every build and test offline
in bubblewrap, real nix with the host stand-in fetching the lock's crates by checksum from the same server."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.scenarios.online import online
from flakebot.agent.tools import Toolbox
from flakebot.cargo.runner import Cargo
from flakebot.config import Settings, cache_home
from flakebot.crates.mirror import Mirror, serve_mirror
from flakebot.sandbox import open_sandbox
from tests.conftest import DEBIAN_REGISTRY, REPO, require, run_cli

SESSION = REPO / "flakebot/data/sessions/csv-dedup.json"
CRATES_IO = "registry+https://github.com/rust-lang/crates.io-index"
CSV = "id,name\n1,ann\n2,bob\n1,ann\n3,cy\n2,bob\n"
GREETER = """\
[package]
name = "greeter"
version = "0.3.0"
edition = "2021"
description = "Greets"
license = "MIT"

[dependencies]
anyhow = "1"
"""
GREETER_MAIN = 'fn main() -> anyhow::Result<()> {\n    println!("hello from greeter");\n    Ok(())\n}\n'


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[Mirror]:
    """Debian's crates, plus greeter (a binary crate Debian lacks), as crates.io on 127.0.0.1."""
    greeter = tmp_path / "published" / "greeter-0.3.0"
    (greeter / "src").mkdir(parents=True)
    (greeter / "Cargo.toml").write_text(GREETER)
    (greeter / "src/main.rs").write_text(GREETER_MAIN)
    with serve_mirror([DEBIAN_REGISTRY, greeter.parent]) as running:
        yield running


def settings_for(mirror: Mirror) -> Settings:
    return Settings(
        registry="crates-io",
        cratesio_api_url=mirror.url,
        cratesio_static_url=mirror.url,
        cratesio_index_url=f"{mirror.url}/index",
        cratesio_interval=0.0,
    )


def cargo_home() -> Path:
    return cache_home() / "cargo-home"


def result_of(stdout: str) -> dict:
    return dict(json.loads(stdout.splitlines()[-1])["result"])


def registry_packages(lock: Path) -> list[dict]:
    return [p for p in tomllib.loads(lock.read_text())["package"] if "source" in p]


@pytest.mark.slow
def test_an_online_craft_fetches_on_the_host_builds_offline_and_a_second_craft_downloads_nothing(
    mirror: Mirror,
) -> None:
    require("bwrap", "cargo", "nix")
    assert not cargo_home().exists()
    craft = ["craft", "need a CSV deduper", "--model", f"scripted:{SESSION}", "--registry", "crates-io", "--json"]
    crafted = run_cli(*craft, env=online(mirror))
    assert crafted.returncode == 0, crafted.stderr[-3000:]
    result = result_of(crafted.stdout)
    assert result["status"] == "crafted" and result["name"] == "csv-dedup"

    lock = Path(result["manifest"]["catalog_dir"]) / "flake" / "Cargo.lock"
    packages = registry_packages(lock)
    assert {"csv", "clap"} <= {p["name"] for p in packages}
    for package in packages:
        assert package["source"] == CRATES_IO and re.fullmatch(r"[0-9a-f]{64}", package.get("checksum", "")), package
    fetched = set(mirror.downloads)
    assert {f"{p['name']}-{p['version']}" for p in packages} <= fetched  # each by cargo fetch into the empty CARGO_HOME
    assert list(cargo_home().glob("registry/src/*/clap-*"))  # clap came in through add_dependency, fetched on the host

    ran = run_cli("run", "csv-dedup", "--", "--key", "id", input=CSV)
    assert (ran.returncode, ran.stdout) == (0, "id,name\n1,ann\n2,bob\n3,cy\n"), ran.stderr[-2000:]

    before = len(mirror.downloads)
    again = run_cli(*craft, "--fresh", "--stop-after", "edit", env=online(mirror))
    assert again.returncode == 0, again.stderr[-3000:]
    assert mirror.downloads[before:] == []


@pytest.mark.slow
def test_a_crate_whose_bytes_differ_from_the_index_checksum_ends_the_craft_in_one_line(tmp_path: Path) -> None:
    require("bwrap", "cargo")
    with serve_mirror([DEBIAN_REGISTRY], corrupt={"csv-1.1.6"}) as mirror:
        crafted = run_cli(
            "craft",
            "need a CSV deduper",
            "--model",
            f"scripted:{SESSION}",
            "--registry",
            "crates-io",
            env=online(mirror),
        )
    assert crafted.returncode == 20, crafted.stderr[-3000:]  # AcquireError
    [line] = [line for line in crafted.stderr.splitlines() if "checksum" in line]
    assert "failed to verify the checksum of `csv v1.1.6" in line
    assert json.loads(run_cli("list", "--json").stdout)["result"]["tools"] == []
    assert not list(cargo_home().glob("registry/src/*/csv-1.1.6"))


@pytest.mark.slow
def test_add_dependency_online_fetches_on_the_host_and_reports_what_it_cannot_add(
    mirror: Mirror, tmp_path: Path
) -> None:
    require("bwrap", "cargo")
    workspace, target = tmp_path / "ws", tmp_path / "target"
    (workspace / "src").mkdir(parents=True)
    (workspace / "Cargo.toml").write_text('[package]\nname = "adder"\nversion = "0.1.0"\nedition = "2021"\n')
    (workspace / "src/lib.rs").write_text(
        '#[test]\nfn formats() {\n    assert_eq!(itoa::Buffer::new().format(42), "42");\n}\n'
    )
    cargo = Cargo.for_run(settings_for(mirror), target)
    sandbox = open_sandbox("required", workspace=workspace, writable=[workspace, target], cargo_home=cargo.home)
    tools = Toolbox(workspace, sandbox, cargo)

    added = tools.call("add_dependency", {"name": "itoa"})
    assert added.ok, added.text
    assert "itoa-1.0.1" in mirror.downloads and "downloaded 1 crate(s): itoa v1.0.1" in added.text
    tested = tools.call("run_tests", {})
    assert tested.data["green"], tested.text  # offline in the sandbox, from what the host fetched
    planted = sandbox.run(["sh", "-c", 'touch "$CARGO_HOME/registry/planted"'], cwd=workspace)
    assert not planted.ok and not (cargo.home / "registry/planted").exists()  # the fetched crates are read-only inside

    manifest = (workspace / "Cargo.toml").read_text()
    missing = tools.call("add_dependency", {"name": "no-such-crate-xyz"})
    assert not missing.ok and "could not be found in registry index" in missing.text
    unresolvable = tools.call("add_dependency", {"name": "csv", "version": "99"})
    assert not unresolvable.ok and "csv" in unresolvable.text
    assert (workspace / "Cargo.toml").read_text() == manifest

    edited = tools.call(
        "edit_file", {"path": "Cargo.toml", "search": "[dependencies]\n", "replace": '[dependencies]\nryu = "1"\n'}
    )
    assert edited.ok and "dependencies fetched on the host (downloaded 1 crate(s): ryu" in edited.text
    assert "ryu-1.0.2" in mirror.downloads


@pytest.mark.slow
def test_search_and_package_a_crate_from_the_registry(mirror: Mirror) -> None:
    require("bwrap", "cargo", "nix")
    found = run_cli("search", "greets", "--registry", "crates-io", "--json", env=online(mirror))
    assert found.returncode == 0, found.stderr
    assert "greeter" in found.stdout

    packaged = run_cli("package", "greeter", "--registry", "crates-io", "--json", env=online(mirror))
    assert packaged.returncode == 0, packaged.stderr[-3000:]
    result = result_of(packaged.stdout)
    lock = registry_packages(Path(result["flake_dir"]) / "Cargo.lock")
    assert [(p["name"], len(p["checksum"])) for p in lock] == [("anyhow", 64)]
    assert "greeter-0.3.0" in mirror.downloads and "anyhow-1.0.69" in mirror.downloads
    ran = subprocess.run(result["bin_path"], capture_output=True, text=True, timeout=60)
    assert ran.stdout == "hello from greeter\n"


@pytest.mark.slow
def test_a_cargo_vendor_directory_as_registry_works_through_the_edit_loop(tmp_path: Path, workdir: Path) -> None:
    require("bwrap", "cargo")
    vendor = make_vendor_dir(tmp_path, {"csv": "1.1.6", "clap": "4.0.32"})
    crafted = run_cli(
        "craft", "need a CSV deduper", "--model", f"scripted:{SESSION}", "--registry", str(vendor), "--offline", "--stop-after", "edit", "--json",
        env={"FLAKEBOT_SANDBOX": "required"},
    )  # fmt: skip
    assert crafted.returncode == 0, crafted.stderr[-3000:]
    run_dir = next(workdir.glob("runs/*"))
    state = json.loads((run_dir / "state.json").read_text())
    assert state["outputs"]["edit"]["status"] == "green"
    assert state["outputs"]["search"]["registry"] == "local" and state["outputs"]["choose"]["crate"]["path"].startswith(
        str(vendor)
    )
    added = [
        json.loads(line)
        for line in (run_dir / "transcript.jsonl").read_text().splitlines()
        if '"add_dependency"' in line
    ]
    assert any(record.get("ok") is True for record in added), added  # cargo add in the sandbox, against the vendor dir


def make_vendor_dir(tmp_path: Path, crates: dict[str, str]) -> Path:
    """A real `cargo vendor` of `crates` (and what they need) from Debian's registry, outside every directory the sandbox sees."""
    holder = tmp_path / "holder"
    (holder / "src").mkdir(parents=True)
    deps = "".join(f'{name} = "={version}"\n' for name, version in crates.items())
    (holder / "Cargo.toml").write_text(
        f'[package]\nname = "holder"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\n{deps}'
    )
    (holder / "src/lib.rs").write_text("")
    debian = [
        "--config",
        "source.crates-io.replace-with='debian'",
        "--config",
        f"source.debian.directory='{DEBIAN_REGISTRY}'",
    ]
    vendored = subprocess.run(
        [
            "cargo",
            *debian,
            "vendor",
            "--offline",
            "--respect-source-config",
            "--versioned-dirs",
            str(tmp_path / "vendor"),
        ],
        cwd=holder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert vendored.returncode == 0, vendored.stderr
    return tmp_path / "vendor"
