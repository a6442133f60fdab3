"""`make reliability`: faults, sandbox escapes, bad input, crash points and concurrent crafts, run for real.

    python -m benchmarks.reliability [--only faults,escapes,hostfiles,steering,inputs,crashes,concurrency,catalogs,text,limits,services] [--quick]
                                     [--out bench] [--readme docs/reliability.md | --no-readme] [--keep]
    python -m benchmarks.reliability --rerender bench/reliability.json [--out bench] [--readme docs/reliability.md]

writes <out>/reliability.json (every row the scenarios produced, the machine, the commit) and
<out>/reliability.md (rendered from that JSON), and refreshes docs/reliability.md's section between
its markers. `--quick` runs a small subset of each section (what tests/test_reliability.py uses);
`--rerender` runs nothing and writes the Markdown and the docs section again from an existing JSON.
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
from pathlib import Path
from typing import Any

from benchmarks.reliability import NAMES, section
from benchmarks.reliability import report as reliability_report
from benchmarks.reliability.env import REPO, Scratch
from benchmarks.reliability.report import Report


def run(
    sections: tuple[str, ...] = NAMES, quick: bool = False, scratch: Path | None = None, keep: bool = False
) -> Report:
    """Run the sections, in report order."""
    root = Path(scratch or tempfile.mkdtemp(prefix="flakebot-reliability-"))
    root.mkdir(parents=True, exist_ok=True)
    started, load_before, commit = time.monotonic(), reliability_report.load(), _commit()
    results: dict[str, list[Any]] = {}
    seconds: dict[str, float] = {}
    try:
        setup = Scratch(root, root / "cache", quick)
        for name in (s for s in NAMES if s in sections):
            print(f"reliability: {name} ...", file=sys.stderr, flush=True)
            begun = time.monotonic()
            results[name] = section(name).run(setup)
            seconds[name] = round(time.monotonic() - begun, 1)
            print(f"reliability: {name} done in {seconds[name]} s", file=sys.stderr, flush=True)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return Report(
        generated=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        commit=commit,
        commit_at_end=_commit(),
        quick=quick,
        runtime_s=round(time.monotonic() - started, 1),
        section_s=seconds,
        machine=reliability_report.machine(),
        load_before=load_before,
        load_after=reliability_report.load(),
        sections=results,
    )


def _commit() -> str:
    head = (
        subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        or "unknown"
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "flakebot"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return f"{head}+changes" if dirty else head


def write(report: Report, out: Path, readme: Path | None, data: bool = True) -> None:
    """reliability.json (unless `data` is False: a rerender keeps the JSON it read) and reliability.md in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    if data:
        (out / "reliability.json").write_text(json.dumps(report.json(), indent=1) + "\n")
    (out / "reliability.md").write_text(reliability_report.render(report))
    if readme is not None:
        reliability_report.update_readme(readme, report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reliability", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(NAMES), help=f"comma-separated sections: {', '.join(NAMES)}")
    parser.add_argument("--quick", action="store_true", help="a small subset of each section")
    parser.add_argument("--out", type=Path, default=REPO / "bench", help="where reliability.json and reliability.md go")
    parser.add_argument(
        "--readme",
        type=Path,
        default=REPO / "docs" / "reliability.md",
        help="page whose Reliability section is refreshed",
    )
    parser.add_argument("--no-readme", action="store_true", help="leave the README alone")
    parser.add_argument("--scratch", type=Path, help="scratch directory for the scenarios (default: a new temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--rerender", type=Path, metavar="JSON", help="run nothing: render this reliability.json again")
    args = parser.parse_args(argv)
    readme = None if args.no_readme else args.readme
    if args.rerender:
        report = reliability_report.load_report(json.loads(args.rerender.read_text()))
        write(report, args.out, readme, data=args.out.resolve() != args.rerender.parent.resolve())
        print(f"wrote {args.out / 'reliability.md'} from {args.rerender}")
        return 0
    sections = tuple(s.strip() for s in args.only.split(",") if s.strip())
    unknown = sorted(set(sections) - set(NAMES))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; use {', '.join(NAMES)}")
    report = run(sections, args.quick, args.scratch, args.keep)
    write(report, args.out, readme)
    print("\n".join(reliability_report.summary_lines(report)))
    print(f"wrote {args.out / 'reliability.md'} in {report.runtime_s:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
