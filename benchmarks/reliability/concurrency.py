"""Concurrent crafts into one catalog: N real crafts at once (distinct tools), then a consistency check.

Each craft starts a new crate on the csv crate (`--crate csv --mode new`) from its own --spec file and a
one-turn edit session, so the model part is fixed and what runs concurrently is cargo in bubblewrap,
nix build (every tool name is new to this machine's store: `nix build` really builds), and the catalog
writes. A single craft alone gives the baseline the batches are compared with.

After a batch: the catalog (its index, catalog.db) lists every tool; each tool directory is complete (flake, lock, manifest,
usage, GC root); each GC root is a link to the entry's store path, which exists and which Nix lists
among its roots; no staging directory is left; every run succeeded; no process is left; and every tool
runs through `flakebot run`.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import records
from benchmarks.reliability.env import OFFLINE, Home, Scratch, write_json
from benchmarks.reliability.table import table, yes
from benchmarks.scenarios.shout import SHOUT_RS, SHOUT_SPEC, shout_craft_args

TOOL_FILES = ("manifest.json", "USAGE.md", "flake/flake.nix", "flake/flake.lock")


@dataclass
class CraftRun:
    """One craft of a batch."""

    tool: str
    exit_code: int | None
    seconds: float
    run_id: str
    stage_s: dict[str, float | None]
    error_line: str


@dataclass
class BatchRow:
    """N crafts at once into one catalog, and the catalog's checks afterwards."""

    crafts: int
    wall_s: float
    succeeded: int
    per_craft_s: list[float]
    stage_mean_s: dict[str, float]
    runs: list[CraftRun]
    checks: dict[str, bool]
    strays: list[Any]
    consistent: bool


def run_batch(n: int, home: Home, nonce: str) -> BatchRow:
    """Start n crafts at once, wait for all, check the catalog."""
    script = write_json(home.root / "script.json", {"format": 1, "stages": {"edit": [{"tool_calls": [_write_main()]}]}})
    names = [f"shout-{nonce}-{n}x{i}" for i in range(n)]
    started = time.monotonic()
    procs = {}
    for name in names:
        spec = write_json(home.root / f"{name}.json", {**SHOUT_SPEC, "name": name})
        argv = (
            *shout_craft_args(f"shout {name}", script, spec),
            *OFFLINE,
            "--json",
        )
        procs[name] = home.popen(*argv, log=name)
    finished = _wait_all(procs, started, timeout=1500)
    wall = time.monotonic() - started
    crafts = [_craft_row(home, name, procs[name].returncode, finished[name]) for name in names]
    checks = check_catalog(home, names)
    strays = home.strays()
    return BatchRow(
        crafts=n,
        wall_s=round(wall, 3),
        succeeded=sum(1 for c in crafts if c.exit_code == 0),
        per_craft_s=[c.seconds for c in crafts],
        stage_mean_s=_stage_means(crafts),
        runs=crafts,
        checks=checks,
        strays=strays,
        consistent=all(checks.values()) and not strays and all(c.exit_code == 0 for c in crafts),
    )


def _write_main() -> dict[str, Any]:
    return {"name": "write_file", "arguments": {"path": "src/main.rs", "content": SHOUT_RS}}


def _wait_all(procs: dict[str, subprocess.Popen[str]], started: float, timeout: float) -> dict[str, float]:
    finished: dict[str, float] = {}
    deadline = started + timeout
    while len(finished) < len(procs):
        for name, proc in procs.items():
            if name not in finished and proc.poll() is not None:
                finished[name] = round(time.monotonic() - started, 3)
        if time.monotonic() > deadline:
            for name, proc in procs.items():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                    finished[name] = round(time.monotonic() - started, 3)
        time.sleep(0.05)
    return finished


def _craft_row(home: Home, name: str, exit_code: int | None, seconds: float) -> CraftRun:
    out = (home.root / f"{name}.out").read_text()
    result: dict[str, Any] = next(
        (json.loads(line)["result"] for line in reversed(out.splitlines()) if line.startswith('{"result"')), {}
    )
    run_id = result.get("run_id", "")
    stages = home.state(run_id)["stages"] if run_id else {}
    error = [line for line in (home.root / f"{name}.err").read_text().splitlines() if line.startswith("error:")]
    return CraftRun(
        tool=name,
        exit_code=exit_code,
        seconds=seconds,
        run_id=run_id,
        stage_s={stage: record.get("seconds") for stage, record in stages.items()},
        error_line=error[-1] if error else "",
    )


def _stage_means(crafts: list[CraftRun]) -> dict[str, float]:
    means = {}
    for stage in ("edit", "package", "instruct"):
        values = [v for c in crafts if (v := c.stage_s.get(stage)) is not None]
        if values:
            means[stage] = round(sum(values) / len(values), 3)
    return means


def check_catalog(home: Home, names: list[str]) -> dict[str, bool]:
    """Every consistency check of the catalog after the batch, by name."""
    index = home.catalog()
    entries = [index.get(name, {}) for name in names]
    staging = home.catalog_dir / "tools/.staging"
    roots = nix_roots()
    return {
        "catalog lists every tool, and only them": sorted(index) == sorted(names),
        "each tool directory is complete": all(
            all((Path(e.get("dir", "/nonexistent")) / f).is_file() for f in TOOL_FILES) for e in entries
        ),
        "each GC root links to its entry's store path": all(_gcroot_target(e) == e.get("store_path") for e in entries),
        "each store path exists": all(Path(e.get("store_path", "/nonexistent")).is_dir() for e in entries),
        "Nix lists each GC root": roots is not None
        and all(str(Path(e.get("dir", "")) / "gcroot") in roots for e in entries),
        "no staging leftovers": not staging.exists() or not any(staging.iterdir()),
        "each run succeeded": all(_run_status(home, e.get("run_id", "")) == "succeeded" for e in entries),
        "each tool runs (flakebot run)": all(_runs(home, name) for name in names),
    }


def _gcroot_target(entry: dict[str, Any]) -> str | None:
    link = Path(entry.get("dir", "/nonexistent")) / "gcroot"
    return os.readlink(link) if link.is_symlink() else None


def nix_roots() -> set[str] | None:
    """The GC roots Nix knows (the link paths of `nix-store --gc --print-roots`), None if nix-store fails."""
    try:
        listed = subprocess.run(["nix-store", "--gc", "--print-roots"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0:
        return None
    return {line.split(" -> ", 1)[0] for line in listed.stdout.splitlines() if " -> " in line}


def _run_status(home: Home, run_id: str) -> str:
    try:
        return str(home.state(run_id)["status"])
    except (OSError, ValueError, KeyError):
        return "unreadable"


def _runs(home: Home, name: str) -> bool:
    ran = home.cli("run", name, input="abc\n", timeout=300)
    return ran.returncode == 0 and ran.stdout == "ABC\n"


def run_cases(root: Path, cache: Path, sizes: tuple[int, ...] = (1, 4, 8)) -> list[BatchRow]:
    """One batch per size, each into its own fresh catalog; tool names carry a nonce so nix builds them for real."""
    nonce = secrets.token_hex(3)
    return [run_batch(n, Home(root / f"concurrent-{n}", cache), nonce) for n in sizes]


# ------------------------------------------------------------------ the report's section

SIZES, QUICK = (1, 4, 8), (1,)


@dataclass
class Batch:
    crafts: int
    succeeded: int
    consistent: bool
    wall_s: float
    vs_sequential: float | None

    def line(self) -> str:
        ratio = (
            f", {self.vs_sequential} x the time of as many crafts one after another"
            if self.vs_sequential and self.crafts > 1
            else ""
        )
        return (
            f"- **{self.crafts} concurrent craft(s)**: {self.succeeded} succeeded, catalog consistent: {yes(self.consistent)}, "
            f"{self.wall_s:.1f} s wall{ratio}."
        )


@dataclass
class ConcurrencySummary:
    batches: list[Batch]

    def lines(self) -> list[str]:
        return [batch.line() for batch in self.batches]

    def json(self) -> Any:
        return records.dump(self.batches)


class Concurrency:
    name = "concurrency"

    def run(self, setup: Scratch) -> list[BatchRow]:
        return run_cases(setup.root, setup.cache, QUICK if setup.quick else SIZES)

    def load(self, data: Any) -> list[BatchRow]:
        return records.load_all(BatchRow, data)

    def summarize(self, record: list[BatchRow]) -> ConcurrencySummary:
        single = _single(record)
        return ConcurrencySummary(
            [
                Batch(
                    crafts=r.crafts,
                    succeeded=r.succeeded,
                    consistent=r.consistent,
                    wall_s=r.wall_s,
                    vs_sequential=round(r.wall_s / (single * r.crafts), 2) if single else None,
                )
                for r in record
            ]
        )

    def markdown(self, record: list[BatchRow]) -> list[str]:
        lines = [
            "## Concurrent crafts",
            "",
            "N crafts started at once into one catalog, each a new crate on csv (`--crate csv --mode new`) from its own `--spec` and a one-turn "
            "edit session; tool names are new to the Nix store, so every `nix build` really builds. Mean stage times show the contention.",
            "",
        ]
        single = _single(record)
        header = [
            "crafts",
            "succeeded",
            "wall",
            "wall / (N x one craft)",
            "each craft",
            "mean stage time",
            "consistent",
        ]
        lines += table(header, [_row(r, single) for r in record])
        checks = list(record[0].checks) if record else []
        lines += table(
            ["check"] + [f"{r.crafts} craft(s)" for r in record],
            [[check] + [yes(r.checks[check]) for r in record] for check in checks],
        )
        return lines


def _single(record: list[BatchRow]) -> float | None:
    return next((r.wall_s for r in record if r.crafts == 1), None)


def _row(r: BatchRow, single: float | None) -> list[Any]:
    ratio = f"{r.wall_s / (single * r.crafts):.2f}" if single else ""
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in r.stage_mean_s.items())
    each = f"{min(r.per_craft_s):.1f}-{max(r.per_craft_s):.1f} s"
    return [r.crafts, f"{r.succeeded}/{r.crafts}", f"{r.wall_s:.1f} s", ratio, each, stages, yes(r.consistent)]
