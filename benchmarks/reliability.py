"""`make reliability`: faults, sandbox escapes, bad input, crash points and concurrent crafts, run for real.

    python -m benchmarks.reliability [--only faults,escapes,inputs,crashes,concurrency] [--quick]
                                     [--out bench] [--readme README.md | --no-readme] [--keep]

writes <out>/reliability.json (every row the scenarios produced, the machine, the commit) and
<out>/reliability.md (rendered from that JSON), and refreshes README.md's Reliability section between
its markers. `--quick` runs a small subset of each section (what tests/test_reliability.py uses).
Scenarios run in a scratch directory with their own flakebot homes; it is removed unless --keep.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import (
    reliability_concurrency,
    reliability_crashes,
    reliability_escapes,
    reliability_faults,
    reliability_inputs,
    reliability_report,
)
from benchmarks.reliability_env import REPO

SECTIONS = ("faults", "escapes", "inputs", "crashes", "concurrency")
REPORT_FORMAT = 1
# --quick: a few rows of each section, enough to prove the generator end to end in about a minute.
QUICK: dict[str, Any] = {
    "inputs": [
        "empty need",
        "unknown run id",
        "unknown --stop-after stage",
        "registry path that is not a directory source",
    ],
    "escapes": ["network", "write-outside", "symlink-out"],
    "faults": ["429"],
    "crashes": ["choose"],
    "concurrency": (1,),
}


def runners(root: Path, cache: Path, quick: bool) -> dict[str, Callable[[], list[dict[str, Any]]]]:
    pick: Callable[[str], Any] = (lambda name: QUICK[name]) if quick else (lambda name: None)
    return {
        "inputs": lambda: reliability_inputs.run(root, cache, pick("inputs")),
        "escapes": lambda: reliability_escapes.run(root, pick("escapes")),
        "faults": lambda: reliability_faults.run(root, cache, pick("faults")),
        "crashes": lambda: reliability_crashes.run(root, cache, pick("crashes")),
        "concurrency": lambda: reliability_concurrency.run(root, cache, QUICK["concurrency"] if quick else (1, 4, 8)),
    }


def run(
    sections: tuple[str, ...] = SECTIONS, quick: bool = False, scratch: Path | None = None, keep: bool = False
) -> dict[str, Any]:
    """Run the sections; the report as a dict (JSON-ready)."""
    root = Path(scratch or tempfile.mkdtemp(prefix="flakebot-reliability-"))
    root.mkdir(parents=True, exist_ok=True)
    started, load_before, commit = time.monotonic(), reliability_report.load(), _commit()
    results: dict[str, list[dict[str, Any]]] = {}
    seconds: dict[str, float] = {}
    try:
        todo = runners(root, root / "cache", quick)
        for name in (s for s in SECTIONS if s in sections):
            print(f"reliability: {name} ...", file=sys.stderr, flush=True)
            begun = time.monotonic()
            results[name] = todo[name]()
            seconds[name] = round(time.monotonic() - begun, 1)
            print(f"reliability: {name} done in {seconds[name]} s", file=sys.stderr, flush=True)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return {
        "format": REPORT_FORMAT,
        "generated": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "commit_at_end": _commit(),  # others may commit while it runs: every CLI call runs the tree as it is then
        "quick": quick,
        "runtime_s": round(time.monotonic() - started, 1),
        "section_s": seconds,
        "machine": reliability_report.machine(),
        "load_before": load_before,
        "load_after": reliability_report.load(),
        "summary": reliability_report.summarize(results),
        "sections": results,
    }


def _commit() -> str:
    head = (
        subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        or "unknown"
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "flakebot"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return f"{head}+changes" if dirty else head


def write(report: dict[str, Any], out: Path, readme: Path | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "reliability.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "reliability.md").write_text(reliability_report.render(report))
    if readme is not None:
        reliability_report.update_readme(readme, report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reliability", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections: {', '.join(SECTIONS)}")
    parser.add_argument("--quick", action="store_true", help="a small subset of each section")
    parser.add_argument("--out", type=Path, default=REPO / "bench", help="where reliability.json and reliability.md go")
    parser.add_argument(
        "--readme", type=Path, default=REPO / "README.md", help="README whose Reliability section is refreshed"
    )
    parser.add_argument("--no-readme", action="store_true", help="leave the README alone")
    parser.add_argument("--scratch", type=Path, help="scratch directory for the scenarios (default: a new temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args(argv)
    sections = tuple(s.strip() for s in args.only.split(",") if s.strip())
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; use {', '.join(SECTIONS)}")
    report = run(sections, args.quick, args.scratch, args.keep)
    write(report, args.out, None if args.no_readme else args.readme)
    print("\n".join(reliability_report.summary_lines(report["summary"])))
    print(f"wrote {args.out / 'reliability.md'} in {report['runtime_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
