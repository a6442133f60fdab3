"""Packaging cost: `nix build` of a fresh flake against `cargo build --release` of the same crate, in the same run.

Also a no-op rebuild (the flake built again, unchanged) against a no-op `cargo build --release`.
The crate comes from the local registry (hexyl by default); nix builds offline with the host stand-in
unless --nixpkgs pinned is given. Figures are ratios over the raw cargo work (goal: fresh <= 1.2).
CPU seconds (user + system of the finished child processes, nix's builders included) are set side by side too:
on a shared machine they move far less with the load than wall seconds do.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import secrets
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.perf.craft import salt_table
from flakebot.cargo.runner import Cargo
from flakebot.config import Settings
from flakebot.nix import command
from flakebot.nix.flake import package_crate
from flakebot.nix.standin import standin_dir
from flakebot.source.tree import copy_crate

GOAL_FRESH_RATIO = 1.2


def _timed(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, check=True)
    return time.perf_counter() - started


def children_cpu() -> float:
    """CPU seconds (user + system) of every child process reaped so far, with their own reaped children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cargo_builds(crate: Path, settings: Settings, target: Path) -> tuple[float, float, float]:
    """(fresh, no-op) seconds of `cargo build --release` in a new target directory, and the fresh build's CPU seconds."""
    cargo = Cargo.for_run(settings, target)
    argv = cargo.argv("build", "--release", "--locked")
    cpu = children_cpu()
    fresh = _timed(argv, crate, cargo.env())
    cpu = children_cpu() - cpu
    return fresh, _timed(argv, crate, cargo.env()), cpu


def _nix_noop(flake_dir: Path, mode: str, standin: Path | None) -> float:
    return _timed(command.nix_argv(["build"], ["--json", "--no-link", str(flake_dir)], mode, standin), flake_dir)


def run(crate: str = "hexyl", nixpkgs: str = "host") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-nix-") as tmp:
        root = Path(tmp)
        settings = Settings(
            workdir=str(root / "work"), cache_dir=str(root / "cache"), nixpkgs=nixpkgs, registry="local"
        )
        source = _crate_source(crate, settings, root / "src")
        cargo_fresh, cargo_noop, cargo_cpu = _cargo_builds(source, settings, root / "target")
        cpu, started = children_cpu(), time.perf_counter()
        inner: list[float] = []
        # A unique description gives the flake a new source hash, and the salt (_crate_source) its dependencies a
        # derivation of their own: nix really builds both from scratch.
        result = package_crate(
            source,
            root / "flake",
            settings,
            description=f"benchmark {secrets.token_hex(4)}",
            progress=_inner_cargo(inner),
        )
        package_total, package_cpu = time.perf_counter() - started, children_cpu() - cpu
        standin = standin_dir(settings) if result.nixpkgs_mode == "host" else None
        nix_noop = _nix_noop(Path(result.flake_dir), result.nixpkgs_mode, standin)
    return {
        "crate": f"{result.pname} {result.version}",
        "nixpkgs_mode": result.nixpkgs_mode,
        "cargo_build_release_s": round(cargo_fresh, 3),
        "nix_build_fresh_s": result.build_seconds,
        "fresh_ratio": round(result.build_seconds / cargo_fresh, 3),
        # cargo's own time inside the nix build (the dependencies' derivation and the crate's, one "Finished" line
        # each): separates nix's overhead from machine noise (shared cores)
        "cargo_inside_nix_s": round(sum(inner), 3) if inner else None,
        "nix_overhead_s": round(result.build_seconds - sum(inner), 3) if inner else None,
        "package_crate_total_s": round(package_total, 3),
        "package_total_ratio": round(package_total / cargo_fresh, 3),
        "cargo_build_release_cpu_s": round(cargo_cpu, 2),
        "package_crate_cpu_s": round(
            package_cpu, 2
        ),  # the nix build with its builder, and package_crate's few cargo/nix calls
        "cpu_ratio": round(package_cpu / cargo_cpu, 3),
        "cargo_noop_s": round(cargo_noop, 3),
        "nix_noop_s": round(nix_noop, 3),
        "noop_ratio": round(nix_noop / cargo_noop, 3),
        "goal_fresh_ratio": GOAL_FRESH_RATIO,
        "met": result.build_seconds / cargo_fresh <= GOAL_FRESH_RATIO,
    }


def _inner_cargo(found: list[float]) -> Callable[[str], None]:
    """A progress callback keeping the seconds of each cargo "Finished `release` profile ... in 17.5s" line."""

    def on_progress(message: str) -> None:
        match = re.search(r"Finished .* in ([0-9.]+)s", message)
        if match:
            found.append(float(match.group(1)))

    return on_progress


def _crate_source(name: str, settings: Settings, dest: Path) -> Path:
    """The registry crate as a plain source tree with a Cargo.lock (both builds then use the same lock)."""
    from flakebot.crates.registries import local_registry

    info = local_registry(settings).get(name)
    dest.mkdir(parents=True)
    copy_crate(Path(info.path), dest)
    _salt(dest / "Cargo.toml")
    cargo = Cargo.for_run(settings, dest / "target")
    subprocess.run(
        cargo.argv("generate-lockfile"), cwd=dest, env={**os.environ, **cargo.env()}, capture_output=True, check=True
    )
    return dest


def _salt(manifest: Path) -> None:
    """Give the crate a dependency set of its own, as perf/craft.salted does for a craft: the salt keys the flake's
    dependency derivation, so nix builds the dependencies too (an earlier run's in the store would make the fresh
    build a build of the crate alone)."""
    manifest.write_text(manifest.read_text() + f"\n{salt_table(secrets.token_hex(4))}\n")
    tomllib.loads(manifest.read_text())  # still one valid manifest (the crate had no such table)


@dataclass(frozen=True, kw_only=True)
class NixResult:
    """run()'s result, as report.json holds it (cargo's time inside the nix build is None when its log lacks it)."""

    crate: str
    nixpkgs_mode: str
    cargo_build_release_s: float
    nix_build_fresh_s: float
    fresh_ratio: float
    cargo_inside_nix_s: float | None
    nix_overhead_s: float | None
    package_crate_total_s: float
    package_total_ratio: float
    cargo_build_release_cpu_s: float | None = None
    package_crate_cpu_s: float | None = None
    cpu_ratio: float | None = None
    cargo_noop_s: float
    nix_noop_s: float
    noop_ratio: float
    goal_fresh_ratio: float
    met: bool


RESULT = NixResult


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--crate", default="hexyl")
    parser.add_argument("--nixpkgs", default="host", choices=("host", "pinned"))
    options = parser.parse_args()
    print(json.dumps(run(options.crate, options.nixpkgs), indent=2))
