"""flakebot's verdict on a workspace: `cargo test` in the sandbox, green only when every acceptance test ran and
passed, and every acceptance example passes when flakebot runs it itself on the built binary."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flakebot.agent.acceptance import ACCEPTANCE_TEST, acceptance_test_names, example_failure
from flakebot.agent.loop import Verdict
from flakebot.sandbox import CommandResult
from flakebot.toolspec import Example, ToolSpec

ExampleRunner = Callable[[Path, Example], tuple[bool, CommandResult]]

logger = logging.getLogger(__name__)


COMPILE_FAILURE = 10_000  # a crate that does not build is worse than any number of failing tests


def make_verdict(cargo_test: Callable[[list[str]], Any], spec: ToolSpec, workspace: Path, run_example: ExampleRunner) -> Callable[[], Verdict]:
    """flakebot's verdict on the workspace: `cargo test --tests`, then, once that is green and the
    workspace has doc tests (slow: rustdoc compiles them anew every run), the full `cargo test`; once
    green, every example run by flakebot on the binary cargo built.
    `cargo_test(extra_args)` runs `cargo test` (in the sandbox) and returns its CargoReport;
    `run_example(binary, example)` runs one example (in the sandbox): (passed, result)."""

    def verdict() -> Verdict:
        report = cargo_test(["--tests"])
        result = judge(report, spec)
        if result.green and has_doctests(report, workspace):
            report = cargo_test([])
            result = judge(report, spec)
        return on_binary(result, report, spec, run_example) if result.green else result

    return verdict


def on_binary(verdict: Verdict, report: Any, spec: ToolSpec, run_example: ExampleRunner) -> Verdict:
    """A green verdict held to every example run on the built binary: any failure turns it red."""
    binary = built_binary(report, spec.name)
    if binary is None:
        failures = [f"cargo built no binary named {spec.name}: the tool must be a [[bin]] called {spec.name}"]
    else:
        outcomes = [(n, e, *run_example(binary, e)) for n, e in enumerate(spec.examples, 1)]
        failures = [example_failure(n, e, result) for n, e, passed, result in outcomes if not passed]
    if not failures:
        return verdict
    summary = f"{verdict.summary}\nThe tests passed, but flakebot's own run of the examples did not:\n" + "\n".join(failures)
    data = {**verdict.data, "examples_failed": len(failures)}
    return Verdict(green=False, failures=len(failures), summary=summary, key="|".join(sorted(f.split(":")[0] for f in failures)), data=data)


def built_binary(report: Any, name: str) -> Path | None:
    """The executable cargo built for the bin target `name` (from its compiler-artifact messages)."""
    for line in report.result.stdout.splitlines() if report.result else []:
        if '"compiler-artifact"' not in line or '"executable"' not in line:
            continue
        message = json.loads(line)
        target, as_test = message.get("target", {}), message.get("profile", {}).get("test")
        if message.get("executable") and "bin" in target.get("kind", []) and target.get("name") == name and not as_test:  # not its unit-test harness
            return Path(message["executable"])
    return None


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
