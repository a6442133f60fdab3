"""flakebot's verdict on a workspace: `cargo test` in the sandbox, green only when every acceptance example ran and passed."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flakebot.agent.acceptance import ACCEPTANCE_TARGET, ACCEPTANCE_TEST, acceptance_test_names
from flakebot.agent.loop import Verdict
from flakebot.toolspec import ToolSpec

logger = logging.getLogger(__name__)


COMPILE_FAILURE = 10_000  # a crate that does not build is worse than any number of failing tests


def make_verdict(cargo_test: Callable[[list[str]], Any], spec: ToolSpec, workspace: Path, *, only_acceptance: bool = False) -> Callable[[], Verdict]:
    """flakebot's verdict on the workspace: `cargo test --tests`, then, once that is green and the
    workspace has doc tests (slow: rustdoc compiles them anew every run), the full `cargo test`.
    `cargo_test(extra_args)` runs `cargo test` (in the sandbox) and returns its CargoReport.
    `only_acceptance`: the crate's own tests cannot build (dev-dependencies left out), so run the acceptance test alone."""

    def verdict() -> Verdict:
        report = cargo_test(ACCEPTANCE_TARGET if only_acceptance else ["--tests"])
        quick = judge(report, spec)
        if only_acceptance or not quick.green or not has_doctests(report, workspace):
            return quick
        return judge(cargo_test([]), spec)

    return verdict


def judge(report: Any, spec: ToolSpec) -> Verdict:
    """flakebot's verdict from a `cargo test` report: green only when everything passed and every
    acceptance example ran, in the acceptance test binary, and passed."""
    missing = acceptance_missing(report, spec)
    compiled = not report.errors and not report.timed_out
    failed_names = {t.name.rsplit("::", 1)[-1] for t in report.failed_tests}
    failures = (report.failed + len(set(missing) - failed_names)) if compiled else COMPILE_FAILURE + report.error_count
    data = {"passed": report.passed, "failed": report.failed, "compiled": compiled, "acceptance_missing": missing}
    summary = report.summary()
    if compiled and missing:
        summary += f"\nAcceptance tests not passing in {ACCEPTANCE_TEST}: {', '.join(missing)}."
    return Verdict(
        green=report.ok and not missing, failures=max(failures, 0 if report.ok and not missing else 1), summary=summary, key=_key(report, missing), data=data
    )


def has_doctests(report: Any, workspace: Path) -> bool:
    """Whether cargo built a target of the workspace's own crates that has doc tests (a library)."""
    for line in report.result.stdout.splitlines() if report.result else []:
        if '"doctest":true' not in line:
            continue
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message.get("target", {}).get("doctest"):
            if Path(message.get("manifest_path", "/")).resolve().is_relative_to(workspace.resolve()):
                return True
    return False


def acceptance_missing(report: Any, spec: ToolSpec) -> list[str]:
    """Acceptance tests that did not run and pass (all of them if their binary never ran)."""
    names = acceptance_test_names(spec)
    result = report.result
    # cargo names the test binary it runs (relative to the package or the workspace root).
    if result is None or not re.search(rf"Running \S*{re.escape(ACCEPTANCE_TEST)}\b", result.stderr):
        return names
    passed = set(re.findall(r"^test (\w+) \.\.\. ok$", result.stdout, re.M))
    return [name for name in names if name not in passed]


def _key(report: Any, missing: list[str]) -> str:
    return "|".join(sorted(report.failure_key() | {f"acceptance {m}" for m in missing}))
