"""P8: `flakebot package CRATE` over real binary crates of Debian's registry, each beside a plain `cargo build --release`.

For each crate (installed by scripts/bench-setup.sh, which `make bench` runs): `flakebot package PATH` of a fresh
copy of it, through the library API (offline, host stand-in), which must build it with nix and smoke-run it (`--help` or `--version`
exits 0, or level usage, runs or starts-only: docs/smoke-levels.md); then `cargo build --release` of the same source in a fresh target directory: the flake's copy
(its Cargo.lock, with any dev-dependency flakebot left out and the binary's required features), or the
registry's own source when flakebot failed (with the dev-dependencies the registry lacks left out, as flakebot leaves them out: resolving needs them, building a binary does not). Every failure is kept with its reason. Each row says which native
inputs the flake declared from the lock's crates, which the build log added (the strict stand-in sees only declared
inputs), and which the build still lacked; a crate that plain cargo cannot build either fails outside flakebot.
`python -m benchmarks.perf.corpus --rows FILE` appends each row to FILE (JSON lines) as it is measured.
"""

from __future__ import annotations

import argparse
import datetime
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

from benchmarks.perf import machine
from flakebot.cargo.runner import Cargo
from flakebot.config import Settings
from flakebot.errors import FlakebotError
from flakebot.nix.devdeps import lock_without_unresolvable

# The corpus rule: every crate NAME for which one Debian bookworm (amd64) source package builds both librust-NAME-dev
# and a program package (one that is not librust-*, not *-dev or *-doc, not a shared library libNAME<N>): crates
# Debian itself ships as programs (program_crates() reads apt's package lists; a test keeps CORPUS equal to it).
# 30 crates, the 16 of the first corpus among them, ordered by the -dev package's installed size (small ones first,
# so a run cut short still measures most crates). scripts/bench-setup.sh installs librust-<name>-dev for each.
# Native inputs among them: libgit2 and zlib (git-absorb, bat), pam by -l (pleaser), nasm (rav1e), oniguruma (bat),
# libpcap (sniffglue), nettle and libclang (sequoia-sop, sequoia-wot), openssl, curl, libssh2 (cargo-c),
# libslirp and glib (libslirp). The registry's rsass is the library alone (its source package's program is not in
# the registry): it stays in the corpus the rule gives, and counts as a crate plain cargo builds no binary of.
CORPUS = (
    *("resource-proof", "dotenv", "git-absorb", "libslirp", "hexyl", "lscolors", "cargo-binutils", "sequoia-sop"),
    *("rustdoc-stripper", "cargo-c", "cargo-lock", "filespooler", "difference", "protobuf-codegen", "zram-generator"),
    *("markdown", "xml-rs", "pleaser", "sniffglue", "grcov", "debcargo", "pulldown-cmark", "cbindgen", "bindgen"),
    *("sha1collisiondetection", "lalrpop", "sequoia-wot", "bat", "rsass", "rav1e"),
)
# P8's goal: of the crates plain `cargo build --release` builds, the share flakebot packages.
GOAL_SHARE = 95.0
# False (--no-plain): the plain cargo build only for crates flakebot failed on (is the failure flakebot's?).
PLAIN_BUILD_WHEN_PACKAGED = True


def run(crates: tuple[str, ...] | list[str] = CORPUS, rows_file: Path | None = None) -> dict[str, Any]:
    rows = []
    code = code_version()  # the code this process loaded when it started (later commits do not change it)
    for name in crates:
        load_before = machine.load()[0]
        row = _measure_or_say_why(name)
        # when, under what load and from which code each row was measured: a rows file may join several runs
        row["measured"] = {
            "at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "load_before": load_before,
            "load_after": machine.load()[0],
            "code": code,
        }
        rows.append(row)
        if rows_file is not None:
            with rows_file.open("a") as out:
                out.write(json.dumps(rows[-1]) + "\n")
    return summary(rows)


def code_version() -> str:
    """The checkout's commit, with "+changes" when flakebot's or the benchmarks' files differ from it."""
    repo = Path(__file__).resolve().parents[2]
    git = ["git", "-C", str(repo)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    changed = subprocess.run(
        [*git, "status", "--porcelain", "--", "flakebot", "benchmarks", "templates"], capture_output=True, text=True
    )
    return (head or "unknown") + ("+changes" if changed.stdout.strip() else "")


def latest_rows(lines: list[str]) -> list[dict[str, Any]]:
    """A rows file's crates, one row each: the latest (a second run over some crates appends to the same file), in
    CORPUS order (then any other crate in the order first measured)."""
    latest: dict[str, dict[str, Any]] = {}
    for line in lines:
        if line.strip():
            row = json.loads(line)
            latest[row["crate"]] = row
    order = {name: i for i, name in enumerate(CORPUS)}
    return sorted(latest.values(), key=lambda row: order.get(row["crate"], len(order)))


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """P8: packaged / buildable by plain cargo (a crate flakebot packaged, or one plain `cargo build --release`
    builds), with the raw share of the whole corpus beside it."""
    packaged = [r for r in rows if r["packaged"]]
    buildable = [r for r in rows if r["packaged"] or r.get("cargo_build_release_s")]
    return {
        "crates": rows,
        "packaged": len(packaged),
        "total": len(rows),
        "share_percent": round(100.0 * len(packaged) / len(rows), 1) if rows else 0.0,
        "buildable": len(buildable),
        "share_of_buildable_percent": round(100.0 * len(packaged) / len(buildable), 1) if buildable else 0.0,
        "goal_percent": GOAL_SHARE,
    }


def program_crates(dumpavail: str) -> list[str]:
    """The corpus rule over apt's package lists (`apt-cache dumpavail`): every crate NAME whose source package builds
    both librust-NAME-dev and a program package, ordered by the -dev package's installed size (then name)."""
    by_source: dict[str, list[dict[str, str]]] = {}
    for stanza in dumpavail.split("\n\n"):
        fields: dict[str, str] = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.M))
        if "Package" in fields:
            source = fields.get("Source", fields["Package"]).split()[0]
            by_source.setdefault(source, []).append(fields)
    found: dict[str, int] = {}
    for packages in by_source.values():
        names = {p["Package"] for p in packages}
        if not any(_is_program(name) for name in names):
            continue
        for package in packages:
            crate = re.fullmatch(r"librust-([a-z0-9-]+)-dev", package["Package"])
            if crate:
                found[crate.group(1)] = int(package.get("Installed-Size", "0") or 0)
    return sorted(found, key=lambda name: (found[name], name))


def _is_program(package: str) -> bool:
    """Not a crate's -dev package, documentation, or a versioned shared library (librav1e0)."""
    return not (
        package.startswith("librust-") or package.endswith(("-dev", "-doc")) or re.fullmatch(r"lib.*\d", package)
    )


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


def scratch_settings(root: Path) -> Settings:
    """Offline settings (Debian's registry, the host stand-in) whose workdir, cache and catalog are below `root`."""
    return Settings(
        workdir=str(root / "work"),
        cache_dir=str(root / "cache"),
        catalog_dir=str(root / "catalog"),
        nixpkgs="host",
        registry="local",
    )


def measure(name: str) -> dict[str, Any]:
    """One crate: flakebot package (build + smoke run), then cargo build --release of the same source."""
    with tempfile.TemporaryDirectory(prefix=f"flakebot-bench-corpus-{name}-") as tmp:
        root = Path(tmp)
        settings = scratch_settings(root)
        row: dict[str, Any] = {"crate": name, **package_one(name, settings)}
        if row["packaged"] and not PLAIN_BUILD_WHEN_PACKAGED:
            row["cargo_build_release_s"] = None
            row["cargo_error"] = "not measured (--no-plain: only failures get the plain build)"
            return row
        row.update(_cargo_build(name, row, settings, root))
        if row["packaged"] and row.get("cargo_build_release_s"):
            row["ratio"] = round(row["package_s"] / row["cargo_build_release_s"], 3)
        # plain cargo fails too: the crate does not build on this toolchain and registry, whatever flakebot does
        row["outside_flakebot"] = not row["packaged"] and row.get("cargo_build_release_s") is None
    return row


def input_origins(native_inputs: dict[str, Any], reason: str = "") -> dict[str, list[str]]:
    """The flake's native inputs by origin: declared from the lock's crates (build_inputs.PACKAGES), added from the build
    log, and (for a failed build) those its error says it lacked."""
    because = native_inputs.get("because", {})
    from_log = sorted(n for n, why in because.items() if any(str(w).startswith("build log") for w in why))
    declared = sorted(n for n in because if n not in from_log)
    missing = sorted(set(_missing_inputs(reason)) - set(declared) - set(from_log))
    return {"declared": declared, "from_evidence": from_log, "missing": missing}


def _missing_inputs(reason: str) -> list[str]:
    """Inputs a failed build's one-line error names as not found (flakebot's own wording: "found no NAME")."""
    marker = "found no "
    if marker not in reason:
        return []
    names = reason.split(marker, 1)[1].split(" (", 1)[0]
    return [n.strip() for n in names.split(",") if n.strip()]


def package_one(name: str, settings: Settings, fresh: bool = True) -> dict[str, Any]:
    """`flakebot package` of a copy of the registry crate; `fresh`: with a unique file in it, so nix builds it anew
    (the benchmark's timing) rather than finding an earlier build of the same source in the store (make test's repeats)."""
    from flakebot import api

    source = _fresh_copy(name, settings, settings.path("workdir") / f"src-{name}", unique=fresh)
    started = time.perf_counter()
    try:
        out = api.package(str(source), nixpkgs="host", settings=settings)
    except FlakebotError as exc:
        native = exc.details.get("native_inputs") or {}
        return {
            "packaged": False,
            "package_s": round(time.perf_counter() - started, 1),
            "reason": exc.one_line(),
            "inputs": input_origins(native if isinstance(native, dict) else {}, exc.one_line()),
        }
    return {
        "packaged": True,
        "package_s": round(time.perf_counter() - started, 1),
        "nix_build_s": out.build_seconds,
        "version": out.version,
        "binary": out.main_program,
        "smoke": " ".join([Path(out.smoke["argv"][0]).name, *out.smoke["argv"][1:]]),
        "smoke_level": out.smoke.get("level", "help"),
        "smoke_exit_code": out.smoke.get("exit_code", 0),
        "notices": [n for n in out.notices if "placeholder checksums" not in n],
        "native_inputs": out.native_inputs,
        "inputs": input_origins(out.native_inputs),
        "portable_reason": out.portable_reason,
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
    # Resolving needs every dev-dependency, building a binary none: one the registry lacks would fail the plain build
    # before it compiles anything. Leave those out as flakebot does (cargo's verdict, nix/devdeps.py), and say which.
    dropped: list[str] = []
    if not row["packaged"] and cargo.run(["generate-lockfile"], source, timeout=300).returncode != 0:
        dropped = [d.name for d in lock_without_unresolvable(cargo, source, 300) or []]
    argv = cargo.argv("build", "--release", *(["--features", ",".join(features)] if features else []))
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=source, env={**os.environ, **cargo.env()}, capture_output=True, text=True)
    seconds = round(time.perf_counter() - started, 1)
    if result.returncode != 0:
        error = next(
            (line for line in result.stderr.splitlines() if line.startswith("error")), f"exit code {result.returncode}"
        )
        return {"cargo_build_release_s": None, "cargo_error": error[:300], "cargo_dropped_dev_dependencies": dropped}
    if not _built_programs(root / "plain-target" / "release"):  # a library only: no binary crate to package
        return {"cargo_build_release_s": None, "cargo_error": "builds no binary: the crate has no bin target"}
    return {"cargo_build_release_s": seconds, "cargo_features": features, "cargo_dropped_dev_dependencies": dropped}


def _built_programs(release_dir: Path) -> list[str]:
    """The executables a release build left in its target directory (build scripts live under build/, not here)."""
    if not release_dir.is_dir():
        return []
    return sorted(p.name for p in release_dir.iterdir() if p.is_file() and os.access(p, os.X_OK) and "." not in p.name)


@dataclass(frozen=True, kw_only=True)
class CorpusResult:
    """run()'s result, as report.json holds it. A crate's row stays a dict: a packaged crate's and a failed one's
    differ (measure()'s keys), and older runs lack some; `note` is added by hand to a merged report."""

    crates: list[dict[str, Any]]
    packaged: int
    total: int
    share_percent: float  # packaged / total (the raw count beside P8)
    goal_percent: float
    note: str | None = None
    buildable: int | None = None  # packaged, or built by plain cargo (absent in reports before P8 counted it)
    share_of_buildable_percent: float | None = None  # P8: packaged / buildable


RESULT = CorpusResult


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("crates", nargs="*", default=list(CORPUS))
    parser.add_argument("--rows", type=Path, help="append each crate's row to this file (JSON lines) as it is measured")
    parser.add_argument("--no-plain", action="store_true", help="no plain cargo build beside a crate flakebot packaged")
    args = parser.parse_args()
    PLAIN_BUILD_WHEN_PACKAGED = not args.no_plain
    print(json.dumps(run(args.crates, args.rows), indent=2))
