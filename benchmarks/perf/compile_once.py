"""P14: a cold craft's cargo + nix build seconds against one `cargo build --release` of the same crate from nothing.

Three measurements in one run, each taken ROUNDS times (cold, release, today, release, then again) and averaged, on the offline scripted csv-dedup session (benchmarks.perf.repeat's craft: a new
process, every child traced, each craft its own dependency set so Nix really builds):
  cold     the craft as a new user meets it (`dependency_cache` on, its cache and the store cold): the edit loop starts
           from the flake's deps derivation (nix/loopdeps.py), so each dependency compiles once
  today    the same craft with `dependency_cache = false`: the loop compiles the dependencies (debug), the flake's
           deps derivation again (release)
  release  one plain `cargo build --release` of the cold craft's crate (its Cargo.toml, Cargo.lock and src/) into an
           empty target dir against the same registry: the least a build of that tool can cost on this machine.
           Measured twice, right after the cold craft and again after today's, and averaged: on a shared machine the
           load moves within a run, and a single sample taken at a different moment from the craft skews the ratio.
P14 = cold (cargo + nix build) / release, goal <= 1.2 (issue 45), with each round's own ratio (its craft over the two
release builds beside it) as its spread: when those fall either side of the goal, the report says the run cannot tell; P14-shared = cold / today, goal <= 0.7 (issue 36).
Each craft's nix build seconds are also split into the cargo inside its builds (as cargo reports it: the "Finished ...
in X s" line of each derivation's log, which run.log keeps) and Nix's own (evaluation, sandbox, the stand-in's steps
before and after cargo, registering the output): nix_cargo_s.
P14-heavy: one more cold craft and release build, the crate also depending on tokio (HEAVIER: an async runtime with
its proc macros, which services bring), the program unchanged: the same ratio on a set whose build dominates.
"""

from __future__ import annotations

import json
import os
import re
import resource
import secrets
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.perf.craft import DEBIAN_REGISTRY
from benchmarks.perf.repeat import RepeatRun, craft

GOAL = 1.2
GOAL_SHARED = 0.7
HEAVIER = {"name": "tokio", "version": "1", "features": ["rt", "macros", "time", "io-util", "sync"]}  # add_dependency
# Each craft's cargo + nix seconds move by a third between samples on this shared machine: three rounds, averaged,
# each round's ratio kept as the figure's spread.
ROUNDS = 3


# cargo's closing line in a derivation's build log as flakebot's run.log keeps it: the loop's deps derivation logs it as
# "nix: NAME>     Finished ...", the package stage as "package: Finished ..."
NIX_CARGO_FINISHED = re.compile(
    r"(?:nix: [^ ]+>|package:) +Finished `[^`]+` profile \[[^]]*\] target\(s\) in ([0-9.]+)s$"
)


def nix_cargo_seconds(run_log: Path) -> float:
    """The seconds cargo reported for its builds inside a craft's nix builds (every "Finished" line of a derivation's
    log in the run's run.log): what of the nix build seconds is cargo's own work; the rest is Nix's."""
    found = (NIX_CARGO_FINISHED.search(line) for line in run_log.read_text(errors="replace").splitlines())
    return round(sum(float(m.group(1)) for m in found if m), 3)


def _run_dir(env: dict[str, str], result: dict[str, Any]) -> Path:
    return Path(env["FLAKEBOT_WORKDIR"]) / "runs" / str(result["run_id"])


def crate_copy(flake: Path, dest: Path) -> Path:
    """The crafted crate alone (manifest, lock, sources, tests): what a plain build of the tool compiles."""
    dest.mkdir(parents=True)
    for name in ("Cargo.toml", "Cargo.lock"):
        shutil.copy2(flake / name, dest / name)
    for name in ("src", "tests"):
        if (flake / name).is_dir():
            shutil.copytree(flake / name, dest / name)
    return dest


def release_build(crate: Path, home: Path, target: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one `cargo build --release` of `crate` into the empty `target`, offline against the
    registry (CPU: cargo's and every rustc's it reaped, as the craft's trace counts them)."""
    home.mkdir(parents=True)
    (home / "config.toml").write_text(
        '[source.crates-io]\nreplace-with = "local"\n\n'
        f'[source.local]\ndirectory = "{DEBIAN_REGISTRY}"\n\n[net]\noffline = true\n'
    )
    env = {**os.environ, "CARGO_HOME": str(home), "CARGO_TARGET_DIR": str(target), "CARGO_TERM_COLOR": "never"}
    before, started = _children_cpu(), time.perf_counter()
    subprocess.run(["cargo", "build", "--release", "--locked"], cwd=crate, env=env, check=True, capture_output=True,
                   timeout=1800)  # fmt: skip
    return time.perf_counter() - started, _children_cpu() - before


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(rounds: int = ROUNDS, heavy: bool = True) -> dict[str, Any]:
    colds: list[dict[str, Any]] = []
    todays: list[dict[str, Any]] = []
    samples: list[float] = []
    cpu_samples: list[float] = []
    cold_nix_cargo: list[float] = []
    today_nix_cargo: list[float] = []
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-compile-once-") as tmp:
        root = Path(tmp)
        for n in range(rounds):  # alternating, so a load that moves within the run weighs on both crafts alike
            cold, env = craft(root, f"cold-{n}", salt=secrets.token_hex(4))
            run_dir = _run_dir(env, cold.pop("result"))
            flake = run_dir / "flake"
            cold_nix_cargo.append(nix_cargo_seconds(run_dir / "run.log"))
            plain = root / f"plain-{n}"
            crate = crate_copy(flake, plain / "crate")
            after_cold = release_build(crate, plain / "home-1", plain / "target-1")
            today, today_env = craft(root, f"today-{n}", salt=secrets.token_hex(4), cache=False)
            today_nix_cargo.append(nix_cargo_seconds(_run_dir(today_env, today.pop("result")) / "run.log"))
            after_today = release_build(crate, plain / "home-2", plain / "target-2")
            samples += [after_cold[0], after_today[0]]
            cpu_samples += [after_cold[1], after_today[1]]
            colds.append(cold)
            todays.append(today)
        # Debian's librust-tokio-dev comes with the corpus make bench-setup installs (several of its crates need it)
        heavier = _heavier(root) if heavy and any(DEBIAN_REGISTRY.glob("tokio-1.*")) else None
    release_s = sum(samples) / len(samples)
    cold_s = sum(c["raw_s"] for c in colds) / len(colds)
    today_s = sum(t["raw_s"] for t in todays) / len(todays)
    release_cpu = sum(cpu_samples) / len(cpu_samples)
    return {
        "runs": {"cold": colds[0], "today": todays[0]},
        "cold_samples_s": [round(c["raw_s"], 3) for c in colds],
        "today_samples_s": [round(t["raw_s"], 3) for t in todays],
        "cold_nix_cargo_s": cold_nix_cargo,
        "today_nix_cargo_s": today_nix_cargo,
        "release_build_s": round(release_s, 3),
        "release_samples_s": [round(s, 3) for s in samples],
        "ratio": round(cold_s / release_s, 3),
        "round_ratios": [
            round(c["raw_s"] / ((samples[2 * n] + samples[2 * n + 1]) / 2), 3) for n, c in enumerate(colds)
        ],
        # the same ratio in CPU seconds, which the machine's other load moves far less than wall seconds
        "release_cpu_samples_s": [round(s, 3) for s in cpu_samples],
        "cold_cpu_samples_s": [round(c["raw_cpu_s"], 3) for c in colds],
        "cpu_ratio": round(sum(c["raw_cpu_s"] for c in colds) / len(colds) / release_cpu, 3),
        "cpu_round_ratios": [
            round(c["raw_cpu_s"] / ((cpu_samples[2 * n] + cpu_samples[2 * n + 1]) / 2), 3) for n, c in enumerate(colds)
        ],
        "goal": GOAL,
        "shared_ratio": round(cold_s / today_s, 3),
        "goal_shared": GOAL_SHARED,
        **({"heavy": heavier} if heavier else {}),
    }


def _heavier(root: Path) -> dict[str, Any]:
    """One cold craft on the heavier set, then one release build of its crate."""
    cold, env = craft(root, "heavy", salt=secrets.token_hex(4), extra=HEAVIER)
    flake = Path(env["FLAKEBOT_WORKDIR"]) / "runs" / cold.pop("result")["run_id"] / "flake"
    crate = crate_copy(flake, root / "heavy-plain" / "crate")
    release_s, release_cpu = release_build(crate, root / "heavy-plain" / "home", root / "heavy-plain" / "target")
    return {
        "cold": cold,
        "release_build_s": round(release_s, 3),
        "ratio": round(cold["raw_s"] / release_s, 3),
        "release_cpu_s": round(release_cpu, 3),
        "cpu_ratio": round(cold["raw_cpu_s"] / release_cpu, 3),
    }


@dataclass(frozen=True, kw_only=True)
class HeavierRun:
    """The cold craft on the heavier set (HEAVIER) and one release build of its crate."""

    cold: RepeatRun
    release_build_s: float
    ratio: float
    release_cpu_s: float = 0.0  # older reports: not counted
    cpu_ratio: float | None = None


@dataclass(frozen=True, kw_only=True)
class CompileOnceResult:
    """run()'s result, as report.json holds it (runs: cold and today)."""

    runs: dict[str, RepeatRun]
    release_build_s: float
    ratio: float
    goal: float
    shared_ratio: float
    goal_shared: float
    release_samples_s: tuple[float, ...] = ()  # older reports measured the release build once
    cold_samples_s: tuple[float, ...] = ()  # and each craft once
    today_samples_s: tuple[float, ...] = ()
    heavy: HeavierRun | None = None  # older reports did not measure it
    round_ratios: tuple[float, ...] = ()  # each round's cold craft over its two release builds (older: none)
    # the same in CPU seconds (older reports: not counted)
    release_cpu_samples_s: tuple[float, ...] = ()
    cold_cpu_samples_s: tuple[float, ...] = ()
    cpu_ratio: float | None = None
    cpu_round_ratios: tuple[float, ...] = ()
    # each round's cargo seconds inside its crafts' nix builds (nix_cargo_seconds; older reports: not split)
    cold_nix_cargo_s: tuple[float, ...] = ()
    today_nix_cargo_s: tuple[float, ...] = ()


RESULT = CompileOnceResult


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
