"""Acquire + incremental cargo: a crate from Debian's registry becomes a workspace, then `cargo test` three times.

Figures, all through flakebot's cargo runner in one run's target directory:
  first     cold target dir: every dependency compiles (what a fresh target dir per call would cost every time)
  second    nothing changed: the ratio second/first is what "one target dir per run" buys
  edited    one line of src/lib.rs changed: what an edit-loop iteration pays
Each is split into build (`cargo test --no-run`) and the whole `cargo test` (build + running the tests):
doc tests are compiled by rustdoc on every run, so a crate with many (csv has 137) never gets a
cheap second `cargo test` even when its build is entirely fresh.
Acquire itself is set against a plain recursive copy of the same directory.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flakebot.cargo.runner import Cargo
from flakebot.config import Settings
from flakebot.crates import CrateInfo
from flakebot.pipeline.run import Run
from flakebot.source.acquisition import acquire
from flakebot.stages.acquire import prepare_cargo

REGISTRY = Path("/usr/share/cargo/registry")


def _timed(cargo: Cargo, cwd: Path, *args: str) -> float:
    start = time.perf_counter()
    result = cargo.run(["test", "--quiet", *args], cwd, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"cargo test failed in {cwd}:\n{result.stderr[-2000:]}")
    return time.perf_counter() - start


def _timed_test(cargo: Cargo, cwd: Path) -> tuple[float, float]:
    """(seconds to build the tests, seconds for the whole `cargo test` after that build)."""
    return _timed(cargo, cwd, "--no-run"), _timed(cargo, cwd)


def run(crate: str = "csv", version: str = "1.1.6") -> dict[str, Any]:
    settings = Settings(offline=True)
    info = CrateInfo(name=crate, version=version, source="local", path=str(REGISTRY / f"{crate}-{version}"))
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        shutil.copytree(info.path, Path(tmp) / "plain-copy")
        copy_s = time.perf_counter() - start
        run_ = Run.create(Path(tmp), "bench")
        start = time.perf_counter()
        origin = acquire(info, run_.workspace, branch=f"flakebot/{crate}-bench", settings=settings, run=run_)
        acquire_s = time.perf_counter() - start
        cargo = Cargo.for_run(settings, run_.target_dir)
        prepare_cargo(run_.workspace, origin["crate_dir"], cargo)
        first = _timed_test(cargo, run_.workspace)
        second = _timed_test(cargo, run_.workspace)
        lib = run_.workspace / "src/lib.rs"
        lib.write_text(lib.read_text() + "\n// an edit, as the agent would make\n")
        edited = _timed_test(cargo, run_.workspace)
    return {
        "crate": f"{crate} {version}",
        "acquire_s": round(acquire_s, 3),
        "plain_copy_s": round(copy_s, 4),
        "build_first_s": round(first[0], 2),
        "build_second_s": round(second[0], 2),
        "build_after_edit_s": round(edited[0], 2),
        "cargo_test_first_s": round(first[0] + first[1], 2),
        "cargo_test_second_s": round(second[0] + second[1], 2),
        "cargo_test_after_edit_s": round(edited[0] + edited[1], 2),
        "build_incremental_ratio": round(second[0] / first[0], 3),
        "build_after_edit_ratio": round(edited[0] / first[0], 3),
        "cargo_test_incremental_ratio": round((second[0] + second[1]) / (first[0] + first[1]), 3),
    }


@dataclass(frozen=True, kw_only=True)
class AcquireResult:
    """run()'s result, as report.json holds it."""

    crate: str
    acquire_s: float
    plain_copy_s: float
    build_first_s: float
    build_second_s: float
    build_after_edit_s: float
    cargo_test_first_s: float
    cargo_test_second_s: float
    cargo_test_after_edit_s: float
    build_incremental_ratio: float
    build_after_edit_ratio: float
    cargo_test_incremental_ratio: float


RESULT = AcquireResult


if __name__ == "__main__":
    names = sys.argv[1:] or ["csv"]
    versions = {"csv": "1.1.6", "hexyl": "0.8.0"}
    print(json.dumps([run(name, versions[name]) for name in names], indent=2))
