"""P14: a cold craft's cargo + nix build seconds against one `cargo build --release` of the same crate from nothing.

One traced cold craft of the offline scripted csv-dedup session (benchmarks.perf.repeat's craft: a new process, its own
dependency set, the dependency cache on and empty, as a new user meets it), then, in the same run, one plain
`cargo build --release` of the crafted flake's crate (its Cargo.toml, Cargo.lock and src/) into an empty target dir
against the same Debian registry: the least a build of that tool can cost on this machine. P14 = the craft's
(cargo + nix build) / that build; goal <= 1.3 (issue 36: each dependency compiled once).
P14-shared: what the craft would cost if its edit loop started from the flake's deps derivation instead of building
the dependencies again (debug, in the dependency cache). Not a measured craft: the craft's cargo + nix less the cache's
dependency build (its progress line's seconds), plus the measured reuse check: the flake's `cargo-deps-0` output copied
(files dated now, as the flake's preBuild does) into a private target dir and the crate's
`cargo test --release --target TRIPLE --no-run` run on it in bubblewrap with the registry bound where the Nix build saw
it; cargo's JSON messages count the artifacts it took as fresh and those it compiled. Goal <= 0.7 of the craft.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.perf.craft import DEBIAN_REGISTRY, Attributed
from benchmarks.perf.repeat import craft

GOAL = 1.3
GOAL_SHARED = 0.7
NIX_REGISTRY = "/flakebot/registry"  # where the stand-in's sandboxed nix build sees the Debian registry
# The edit loop's profile on the deps derivation: release (what the flake builds), incremental for the crate only
# (cargo never builds a registry dependency incrementally, so the dependencies stay fresh).
LOOP_PROFILE = ("--release", "--config", "profile.release.incremental=true")


def host_triple() -> str:
    done = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True, timeout=60)
    return next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("host:"))


def crate_copy(flake: Path, dest: Path) -> Path:
    """The crafted crate alone (manifest, lock, sources, tests): what a plain build of the tool compiles."""
    dest.mkdir(parents=True)
    for name in ("Cargo.toml", "Cargo.lock"):
        shutil.copy2(flake / name, dest / name)
    for name in ("src", "tests"):
        if (flake / name).is_dir():
            shutil.copytree(flake / name, dest / name)
    return dest


def cargo_home(dest: Path, registry: str) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.toml").write_text(
        f'[source.crates-io]\nreplace-with = "flakebot-local"\n\n[source.flakebot-local]\ndirectory = "{registry}"\n\n'
        "[net]\noffline = true\n"
    )
    return dest


def release_build(crate: Path, home: Path, target: Path) -> float:
    """Seconds of one `cargo build --release` of `crate` into the empty `target`."""
    env = {**os.environ, "CARGO_HOME": str(home), "CARGO_TARGET_DIR": str(target), "CARGO_TERM_COLOR": "never"}
    started = time.perf_counter()
    subprocess.run(["cargo", "build", "--release", "--locked"], cwd=crate, env=env, check=True, capture_output=True,
                   timeout=1800)  # fmt: skip
    return time.perf_counter() - started


def seed_from_store(deps_output: Path, target: Path) -> None:
    """The deps derivation's target dir copied (never linked: the store stays read-only), every file dated now."""
    subprocess.run(["cp", "--reflink=auto", "-r", "--", f"{deps_output}/target", str(target)], check=True, timeout=600)
    subprocess.run(["chmod", "-R", "u+w", str(target)], check=True, timeout=60)
    stamp = target / ".dependencies-copied"
    stamp.touch()
    subprocess.run(["find", str(target), "-exec", "touch", "-h", "-r", str(stamp), "{}", "+"], check=True, timeout=600)


def reuse_check(crate: Path, home: Path, target: Path, triple: str) -> dict[str, Any]:
    """The crate's release `cargo test --no-run` on the seeded `target`, sandboxed, the registry at NIX_REGISTRY: the
    artifacts cargo took as fresh and the packages it compiled, and its seconds."""
    work = crate.parent
    argv = [
        "bwrap", "--die-with-parent", "--unshare-net", "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
        "--ro-bind", "/etc", "/etc", "--ro-bind", str(Path.home()), str(Path.home()), "--dev", "/dev",
        "--proc", "/proc", "--tmpfs", "/tmp", "--bind", str(work), str(work),
        "--tmpfs", "/flakebot", "--ro-bind", str(DEBIAN_REGISTRY), NIX_REGISTRY,
        "--setenv", "CARGO_HOME", str(home), "--setenv", "CARGO_TARGET_DIR", str(target), "--chdir", str(crate),
        "cargo", "test", *LOOP_PROFILE, "--target", triple, "--no-run", "--locked", "--message-format=json",
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"the reuse check failed: {done.stderr[-1500:]}")
    fresh, compiled = 0, set[str]()
    for line in done.stdout.splitlines():
        message = json.loads(line) if line.startswith("{") else {}
        if message.get("reason") != "compiler-artifact":
            continue
        if message["fresh"]:
            fresh += 1
        else:
            compiled.add(message["package_id"].rsplit("#", 1)[-1])
    return {"seconds": round(seconds, 3), "fresh": fresh, "compiled": sorted(compiled)}


def cache_build_seconds(line: str) -> float:
    """The seconds the dependency cache's progress line gives for its build and copy ("(23.5s)")."""
    found = re.search(r"\(([0-9.]+)s\)\s*$", line)
    return float(found.group(1)) if found else 0.0


def run() -> dict[str, Any]:
    triple = host_triple()
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-compile-once-") as tmp:
        root = Path(tmp)
        figures, env = craft(root, "cold", salt=secrets.token_hex(4))
        result = figures.pop("result")
        flake = Path(env["FLAKEBOT_WORKDIR"]) / "runs" / result["run_id"] / "flake"
        crate = crate_copy(flake, root / "plain" / "crate")
        release_s = release_build(crate, cargo_home(root / "plain" / "home", str(DEBIAN_REGISTRY)), root / "plain/t")
        deps_output = (flake / "result-deps").resolve()
        reused = crate_copy(flake, root / "reuse" / "crate")
        seed_from_store(deps_output, root / "reuse" / "target")
        reuse = reuse_check(reused, cargo_home(root / "reuse" / "home", NIX_REGISTRY), root / "reuse/target", triple)
    raw = figures["raw_s"]
    shared = raw - cache_build_seconds(figures["dependency_cache"]) + reuse["seconds"]
    return {
        "craft": figures,
        "release_build_s": round(release_s, 3),
        "ratio": round(raw / release_s, 3),
        "goal": GOAL,
        "reuse": reuse,
        "shared_estimate_s": round(shared, 3),
        "shared_ratio": round(shared / raw, 3),
        "goal_shared": GOAL_SHARED,
        "triple": triple,
    }


@dataclass(frozen=True, kw_only=True)
class CompileCraft(Attributed):
    dependency_cache: str


@dataclass(frozen=True, kw_only=True)
class Reuse:
    seconds: float
    fresh: int
    compiled: list[str]


@dataclass(frozen=True, kw_only=True)
class CompileOnceResult:
    """run()'s result, as report.json holds it."""

    craft: CompileCraft
    release_build_s: float
    ratio: float
    goal: float
    reuse: Reuse
    shared_estimate_s: float
    shared_ratio: float
    goal_shared: float
    triple: str


RESULT = CompileOnceResult


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
