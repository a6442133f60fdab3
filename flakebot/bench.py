"""`flakebot bench`: run the benchmarks of a source checkout and publish their report.

The benchmarks live in the repository's benchmarks/ package, not in the installed wheel: they are imported only
here, only when asked for, from the checkout this flakebot was installed from (an editable install) or from
wherever `benchmarks` is already importable.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from flakebot.errors import FlakebotError, UsageError

logger = logging.getLogger(__name__)

CHECKOUT = Path(__file__).resolve().parent.parent  # the repository root, when flakebot runs from a checkout


def report_module() -> ModuleType:
    """benchmarks.report, from the checkout beside this package if it is not importable as it is."""
    try:
        return importlib.import_module("benchmarks.report")
    except ModuleNotFoundError as exc:
        if exc.name not in ("benchmarks", "benchmarks.report") or not (CHECKOUT / "benchmarks/report.py").is_file():
            raise UsageError(
                "flakebot bench needs a source checkout: the benchmarks/ package is not installed with flakebot",
                fix="clone flakebot's repository and run 'make bench' there (or put the clone's root on PYTHONPATH)",
            ) from None
    sys.path.insert(0, str(CHECKOUT))
    return importlib.import_module("benchmarks.report")


def run(
    *,
    profile: str = "full",
    only: list[str] | None = None,
    out_dir: Path | None = None,
    readme: Path | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Measure, write report.json, report.md and stages.png to out_dir (default: the checkout's bench/), rewrite the
    README's Performance section when `readme` is given (and nothing failed). Returns {"report": ..., "paths": {...}}; raises after
    writing when a benchmark failed."""
    report = report_module()
    _check(report, profile, only)
    built = report.run(profile, only, progress)
    paths = report.write(built, out_dir or report.REPO / "bench")
    failed = sorted(name for name, result in built["results"].items() if "error" in result)
    if readme is not None and not failed:  # the README publishes complete runs only
        report.update_readme(readme, built)
        paths["readme"] = readme
    if failed:
        raise FlakebotError(f"benchmark(s) failed: {', '.join(failed)}", fix=f"read the errors in {paths['markdown']} (and the log with -v)", failed=failed)
    return {"report": built, "paths": {k: str(v) for k, v in paths.items()}}


def default_readme() -> Path:
    """The README of the checkout the benchmarks come from."""
    return Path(report_module().REPO) / "README.md"


def _check(report: ModuleType, profile: str, only: list[str] | None) -> None:
    if profile not in report.PROFILES:
        raise UsageError(f"unknown bench profile '{profile}'", fix=f"use one of: {', '.join(report.PROFILES)}")
    unknown = sorted(set(only or []) - set(report.PROFILES[profile]))
    if unknown:
        names = ", ".join(report.PROFILES[profile])
        raise UsageError(f"no benchmark named {', '.join(unknown)} in profile '{profile}'", fix=f"choose from: {names}")
