"""The processes one scripted offline craft starts around its builds, traced as the benchmark traces them
(benchmarks.perf.proctrace): each toolchain question asked once, the store not queried for what the build named, the
new crate's version not asked of cargo nor its lock resolved again, the tool's GC root made by its own nix build,
what `nix run` starts evaluated and the crafted crate resolved beside that build, neither the crafted crate (at its
workspace's top) nor the deps derivation's stub (a crate flakebot wrote) asked of cargo where its workspace root is,
the stub not asked of git what to copy and asked of cargo once, for its members alone, its skeleton's lock not
relocked by cargo, HEAD read rather than asked of git, the built tool's --help run once (the smoke run's, read by
instruct too), the packaged flake's members listed by cargo once, no
reset nor clean of the new crate's workspace at the edit stage's start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.perf.proctrace import command_of
from tests.conftest import REPO, require

pytestmark = pytest.mark.slow
SESSION = REPO / "flakebot/data/sessions/csv-dedup.json"


def test_a_craft_asks_each_toolchain_question_once_and_reads_what_its_build_named(tmp_path: Path) -> None:
    require("nix", "bwrap")
    log = tmp_path / "processes.json"
    craft = ["craft", "need a CSV deduper", "--model", f"scripted:{SESSION}", "--registry", "local", "--offline"]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.perf.proctrace", str(log), *craft, "--json"],
        env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    argvs = [command_of(record["argv"]) for record in json.loads(log.read_text())["processes"]]
    named = [(Path(argv[0]).name, argv) for argv in argvs if argv]

    rustc = [argv for name, argv in named if name == "rustc"]
    assert [argv[1:] for argv in rustc].count(["--print", "sysroot"]) == 1  # the stand-in's host facts: once
    reports = [argv[0] for argv in rustc if argv[1:] == ["-vV"]]
    assert reports and len(reports) == len(set(reports)), reports  # each toolchain binary's -vV: once
    assert not [argv for name, argv in named if name == "nix-store" and "--query" in argv]  # the drv files read
    new_crate = [argv for name, argv in named if name == "cargo" and any(".workspace.partial" in a for a in argv)]
    metadata = [argv for argv in new_crate if "metadata" in argv]
    assert len(metadata) == 1 and "--no-deps" in metadata[0]  # the sources check of `cargo add` alone
    # the new crate's lock is the one its `cargo add` wrote, and it names no git source: not resolved again (for an
    # error to report, or a git view to fill)
    resolving = [
        argv
        for name, argv in named
        if name == "cargo" and "metadata" in argv and "--no-deps" not in argv
        and any(a.endswith("/workspace/Cargo.toml") for a in argv)
    ]  # fmt: skip
    assert not resolving, resolving

    builds = [argv for name, argv in named if name == "nix" and "build" in argv]
    tool = [argv for argv in builds if not any(a.endswith("#cargo-deps") for a in argv)]
    assert tool and all(
        "--out-link" in argv and argv[argv.index("--out-link") + 1].endswith("/flake/result") for argv in tool
    )
    roots = [argv[argv.index("--add-root") + 1] for name, argv in named if name == "nix-store" and "--add-root" in argv]
    assert not [link for link in roots if link.endswith("/flake/result")], roots  # nix build made it
    assert sum(link.endswith("/flake/result-deps") for link in roots) == 1, roots
    # the crafted crate is at its workspace's top, the stub is flakebot's own: neither's workspace root is asked of cargo
    assert not [argv for name, argv in named if name == "cargo" and "locate-project" in argv]
    records = json.loads(log.read_text())["processes"]
    evals = [r for r in records if "eval" in command_of(r["argv"]) and any(".default.program" in a for a in r["argv"])]
    tool_builds = [r for r in records if command_of(r["argv"]) in tool]
    # what nix run starts is evaluated once, beside the tool's nix build (started before that build ended)
    assert len(evals) == 1 and len(tool_builds) == 1, (evals, tool_builds)
    assert evals[0]["start"] < tool_builds[0]["start"] + tool_builds[0]["seconds"], (evals, tool_builds)
    # the crafted crate (a lone registry package) is resolved beside its build: its flake needs cargo's --no-deps alone
    resolving = [
        r for r in records if "--locked" in r["argv"] and any(a.endswith("/flake/Cargo.toml") for a in r["argv"])
    ]
    assert len(resolving) == 1 and resolving[0]["start"] < tool_builds[0]["start"] + tool_builds[0]["seconds"]
    # and cargo lists the flake's members once: that resolution's sources check reads the listing the flake was
    # written from (one `cargo metadata --no-deps` per workspace state), it does not ask cargo again
    listings = [
        argv
        for name, argv in named
        if name == "cargo" and "metadata" in argv and "--no-deps" in argv
        and any(a.endswith("/flake/Cargo.toml") and "/loop-deps/" not in a for a in argv)
    ]  # fmt: skip
    assert len(listings) == 1, listings
    stub = [
        argv
        for name, argv in named
        if name == "cargo"
        and "metadata" in argv
        and any("/loop-deps/" in a and a.endswith("/flake/Cargo.toml") for a in argv)
    ]
    assert len(stub) == 1 and "--no-deps" in stub[0], stub  # the stub's members alone: no sources check, no resolution
    # the stub's skeleton lock is flakebot's rename (its deps build proved it), which the package stage's skeleton takes
    relocked = [argv for name, argv in named if name == "cargo" and any("/flakebot-deps/Cargo.toml" in a for a in argv)]
    assert not relocked, relocked
    listed = [record for record in json.loads(log.read_text())["processes"] if "ls-files" in record["argv"]]
    assert not listed, listed  # the flake holds the tree its tests passed on, walked through safefs (the stub too)
    # HEAD after acquire's branch and at the edit stage's start is read from .git's files (safegit.head_from_files)
    assert not [argv for name, argv in named if name == "git" and "rev-parse" in argv]
    # the new crate acquire committed whole in this process is the edit stage's start as it is: nothing to restore
    assert not [argv for name, argv in named if name == "git" and ("reset" in argv or "clean" in argv)]
    # the built tool's --help runs once (sandboxed): the package stage's smoke run, whose stdout the instruct stage reads
    helps = [argv for name, argv in named if argv[0].startswith("/nix/store/") and argv[1:] == ["--help"]]
    assert len(helps) == 1 and Path(helps[0][0]).name == "csv-dedup", helps
