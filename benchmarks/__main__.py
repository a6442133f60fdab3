"""`python -m benchmarks` (what `make bench` runs): measure flakebot against the raw cargo and nix work it
runs, write bench/report.{md,json} and stages.png, and rewrite docs/performance.md's generated section.

The benchmarks live in the repository, not in the installed wheel; run them from the checkout's root.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.perf import report as report_module
from flakebot.errors import FlakebotError, UsageError

logger = logging.getLogger(__name__)


def run(
    *,
    profile: str = "full",
    only: list[str] | None = None,
    out_dir: Path | None = None,
    readme: Path | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Measure, write report.json, report.md and stages.png to out_dir (default: the checkout's bench/), rewrite the
    docs/performance.md's generated section when `readme` is given (and nothing failed). Returns {"report": ..., "paths": {...}}; raises after
    writing when a benchmark failed."""
    report = report_module
    _check(report, profile, only)
    built = report.run(profile, only, progress)
    paths = report.write(built, out_dir or report.REPO / "bench")
    failed = sorted(name for name, result in built["results"].items() if "error" in result)
    if readme is not None and not failed:  # the page publishes complete runs only
        report.update_readme(readme, built)
        paths["readme"] = readme
    if failed:
        raise FlakebotError(
            f"benchmark(s) failed: {', '.join(failed)}",
            fix=f"read the errors in {paths['markdown']} (and the log with -v)",
            failed=failed,
        )
    return {"report": built, "paths": {k: str(v) for k, v in paths.items()}}


def default_readme() -> Path:
    """The performance page of the checkout the benchmarks come from."""
    return Path(report_module.REPO) / "docs" / "performance.md"


def _check(report: ModuleType, profile: str, only: list[str] | None) -> None:
    if profile not in report.PROFILES:
        raise UsageError(f"unknown bench profile '{profile}'", fix=f"use one of: {', '.join(report.PROFILES)}")
    unknown = sorted(set(only or []) - set(report.PROFILES[profile]))
    if unknown:
        names = ", ".join(report.PROFILES[profile])
        raise UsageError(f"no benchmark named {', '.join(unknown)} in profile '{profile}'", fix=f"choose from: {names}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="start-up and search on small sizes only: checks the report, not speed"
    )
    parser.add_argument(
        "--only",
        help="comma-separated benchmarks: " + ", ".join(report_module.ORDER),
    )
    parser.add_argument("--out", type=Path, help="where report.md, report.json and stages.png go (default: bench/)")
    parser.add_argument(
        "--readme", action=argparse.BooleanOptionalAction, help="rewrite docs/performance.md's generated section"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    readme = (not args.quick and not names) if args.readme is None else args.readme
    try:
        result = run(
            profile="quick" if args.quick else "full",
            only=names,
            out_dir=args.out,
            readme=default_readme() if readme else None,
            progress=print,
        )
    except FlakebotError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        print(json.dumps({"figures": result["report"]["figures"], "paths": result["paths"]}))
        return 0
    for figure in result["report"]["figures"]:
        verdict = {True: "met", False: "NOT met", None: ""}[figure["met"]]
        print(f"{figure['id']:>4}  {figure['title']}: {figure['value']} {figure['unit']} {verdict}")
    print("report: " + ", ".join(result["paths"].values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
