"""P8: `flakebot package CRATE` over real binary crates of Debian's registry, each beside a plain `cargo build --release`.

For each crate (installed by scripts/bench-setup.sh, which `make bench` runs): `flakebot package PATH` of a fresh
copy of it, through the library API (offline, host stand-in), which must build it with nix and smoke-run it (`--help` or `--version`
exits 0); then `cargo build --release` of the same source in a fresh target directory: the flake's copy
(its Cargo.lock, with any dev-dependency flakebot left out and the binary's required features), or the
registry's own source when flakebot failed. Every failure is kept with its reason.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from flakebot.cargo.runner import Cargo
from flakebot.config import Settings
from flakebot.errors import FlakebotError

# Debian package librust-<name>-dev for each; scripts/bench-setup.sh installs them.
CORPUS = ("hexyl", "bat", "cbindgen", "grcov", "sniffglue", "bindgen", "sequoia-sop")
GOAL_SHARE = 100.0


def run(crates: tuple[str, ...] | list[str] = CORPUS) -> dict[str, Any]:
    rows = [_measure_or_say_why(name) for name in crates]
    packaged = [r for r in rows if r["packaged"]]
    return {
        "crates": rows,
        "packaged": len(packaged),
        "total": len(rows),
        "share_percent": round(100.0 * len(packaged) / len(rows), 1) if rows else 0.0,
        "goal_percent": GOAL_SHARE,
    }


def _measure_or_say_why(name: str) -> dict[str, Any]:
    """measure(), with a crash of the benchmark itself kept as that crate's failure (the others still count)."""
    try:
        return measure(name)
    except Exception as exc:  # noqa: BLE001 - reported in the figure with its type and message
        return {
            "crate": name,
            "packaged": False,
            "package_s": 0.0,
            "reason": f"benchmark error: {type(exc).__name__}: {exc}"[:400],
        }


def measure(name: str) -> dict[str, Any]:
    """One crate: flakebot package (build + smoke run), then cargo build --release of the same source."""
    with tempfile.TemporaryDirectory(prefix=f"flakebot-bench-corpus-{name}-") as tmp:
        root = Path(tmp)
        settings = Settings(
            workdir=str(root / "work"),
            cache_dir=str(root / "cache"),
            catalog_dir=str(root / "catalog"),
            nixpkgs="host",
            registry="local",
        )
        row: dict[str, Any] = {"crate": name, **package_one(name, settings)}
        row.update(_cargo_build(name, row, settings, root))
        if row["packaged"] and row.get("cargo_build_release_s"):
            row["ratio"] = round(row["package_s"] / row["cargo_build_release_s"], 3)
    return row


def package_one(name: str, settings: Settings, fresh: bool = True) -> dict[str, Any]:
    """`flakebot package` of a copy of the registry crate; `fresh`: with a unique file in it, so nix builds it anew
    (the benchmark's timing) rather than finding an earlier build of the same source in the store (make test's repeats)."""
    from flakebot import api

    source = _fresh_copy(name, settings, settings.path("workdir") / f"src-{name}", unique=fresh)
    started = time.perf_counter()
    try:
        out = api.package(str(source), nixpkgs="host", settings=settings)
    except FlakebotError as exc:
        return {"packaged": False, "package_s": round(time.perf_counter() - started, 1), "reason": exc.one_line()}
    return {
        "packaged": True,
        "package_s": round(time.perf_counter() - started, 1),
        "nix_build_s": out.build_seconds,
        "version": out.version,
        "binary": out.main_program,
        "smoke": " ".join([Path(out.smoke["argv"][0]).name, *out.smoke["argv"][1:]]),
        "notices": [n for n in out.notices if "placeholder checksums" not in n],
        "native_inputs": out.native_inputs,
        "flake_dir": out.flake_dir,
        "build_features": out.build_features,
        "dropped_dev_dependencies": [d["name"] for d in out.dropped_dev_dependencies],
    }


def _fresh_copy(name: str, settings: Settings, dest: Path, unique: bool = True) -> Path:
    from flakebot.crates.registries import local_registry
    from flakebot.source.tree import copy_crate

    dest.mkdir(parents=True)
    copy_crate(Path(local_registry(settings).get(name).path), dest)
    if unique:
        (dest / ".flakebot-bench").write_text(secrets.token_hex(8) + "\n")
    return dest


def _cargo_build(name: str, row: dict[str, Any], settings: Settings, root: Path) -> dict[str, Any]:
    """`cargo build --release` in a fresh target directory, of a copy of the flake's source (or the registry's)."""
    source = root / "plain"
    features: list[str] = []
    if row["packaged"]:
        shutil.copytree(row["flake_dir"], source, ignore=shutil.ignore_patterns(".git", "result"))
        features = row["build_features"]
    else:
        _fresh_copy(name, settings, source)
    cargo = Cargo.for_run(settings, root / "plain-target")
    argv = cargo.argv("build", "--release", *(["--features", ",".join(features)] if features else []))
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=source, env={**os.environ, **cargo.env()}, capture_output=True, text=True)
    seconds = round(time.perf_counter() - started, 1)
    if result.returncode != 0:
        error = next(
            (line for line in result.stderr.splitlines() if line.startswith("error")), f"exit code {result.returncode}"
        )
        return {"cargo_build_release_s": None, "cargo_error": error[:300]}
    return {"cargo_build_release_s": seconds, "cargo_features": features}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("crates", nargs="*", default=list(CORPUS))
    print(json.dumps(run(parser.parse_args().crates), indent=2))
