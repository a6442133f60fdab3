"""cargo check/build/test in the sandbox, turned into the compact report the model reads.

`run_cargo()` runs cargo with `--message-format=json` and reads: the compiler's diagnostics (deduplicated,
errors before warnings, first errors first, capped, each with its `rendered` text, which shows the source
lines), the test harness's verdicts and panic messages, and cargo's own errors (a broken manifest, a crashed
test binary). `CargoReport.summary()` is the text for the model; `failure_key()` identifies the failures
for loop detection.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from flakebot.cargo.runner import Cargo
from flakebot.errors import UsageError
from flakebot.events import waiting_on
from flakebot.sandbox import CommandResult, Sandbox

SUBCOMMANDS = ("check", "build", "test")
MAX_DIAGNOSTICS = 20  # kept in the report (errors first)
FULL_ERRORS = 5  # distinct error messages shown rendered; repeats and the rest as one line each
SHOWN_WARNINGS = 3  # warning one-liners shown when there is no error
RENDERED_LINES = 40  # lines kept of one rendered diagnostic or one panic message
SUMMARY_CHARS = 6000
NOISE = re.compile(
    r"^(aborting due to|Some errors have detailed explanations|For more information about|\d+ warnings? emitted|.* generated \d+ warnings?)"
)
TEST_LINE = re.compile(r"^test (.+?) \.\.\. (ok|FAILED|ignored)")
BLOCK_START = re.compile(r"^---- (.+?) std(?:out|err) ----$")
RESULT_LINE = re.compile(r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored")
TARGET_FAILED = re.compile(r"^error: (test failed, to rerun pass|\d+ targets? failed)")
STATUS_LINE = re.compile(
    r"^\s*(Compiling|Checking|Running|Finished|Doc-tests|Fresh|Locking|Adding|Updating|Blocking|Building|Documenting|Downloaded)\b"
)
GUTTER = re.compile(r"^\s*\|?\s*$")
BACKTRACE_NOTE = "note: run with `RUST_BACKTRACE=1`"
MAX_ARTIFACTS = 64  # distinct bins (and doc-tested targets) kept from one cargo command: its crate's own, a handful


@dataclass
class Diagnostic:
    """One compiler message: level, code (E0425), message, primary location and rustc's rendered text."""

    level: str
    code: str
    message: str
    file: str
    line: int
    column: int
    rendered: str
    source: str = ""  # the primary span's source line, stripped

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}:{self.column}" if self.file else "(no location)"

    def one_line(self) -> str:
        code = f"[{self.code}]" if self.code else ""
        return f"{self.level}{code}: {self.message} ({self.location})"


class FailedTest(NamedTuple):
    """A failing test and its panic message (what the harness printed for it)."""

    name: str
    message: str


@dataclass
class CargoReport:
    """What one cargo command found, in the form the model and the loop need."""

    subcommand: str
    ok: bool
    returncode: int
    timed_out: bool = False
    seconds: float = 0.0
    diagnostics: list[Diagnostic] = field(default_factory=list)
    error_count: int = 0  # unique errors, including those beyond the cap
    warning_count: int = 0
    failed_tests: list[FailedTest] = field(default_factory=list)
    passed: int = 0
    failed: int = 0
    ignored: int = 0
    # cargo's own errors: manifest, resolution, crashed test binaries
    cargo_errors: list[str] = field(default_factory=list)
    raw_output_lines: int = 0
    truncated: bool = False  # the sandbox's output cap cut cargo's output
    result: CommandResult | None = field(default=None, repr=False)
    # (bin target, executable) of every compiler-artifact message on stdout, distinct, in order: read from each line
    # as it came, as the capped stdout may have lost them (its middle dropped)
    binaries: list[tuple[str, str]] = field(default_factory=list)
    binaries_overflowed: bool = False  # more than MAX_ARTIFACTS were named: printed by the build, not by cargo
    doctests: list[str] = field(default_factory=list)  # the manifest of each target with doc tests, as `binaries`

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.level == "error"]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.level != "error"]

    def summary(self, max_chars: int = SUMMARY_CHARS) -> str:
        """The compact text for the model: a verdict line, errors (rendered), test failures, cargo's errors."""
        parts = [self._headline(), *self._error_parts(), *self._test_parts(), *self.cargo_errors]
        if self.truncated:
            parts.append("(cargo's output exceeded the output cap; its middle was dropped)")
        return _fit("\n".join(p.rstrip() for p in parts if p), max_chars)

    def failure_key(self) -> frozenset[str]:
        """Stable identities of the failures (no line numbers, which shift with every edit)."""
        keys = {f"error[{d.code}] {d.message} @ {d.file}" for d in self.errors}
        keys |= {f"test {t.name}" for t in self.failed_tests}
        keys |= {f"cargo {e.splitlines()[0]}" for e in self.cargo_errors}
        if self.error_count > len(self.errors):
            keys.add(f"errors: {self.error_count}")  # errors beyond the cap still count
        if self.timed_out:
            keys.add("timeout")
        if not self.ok and not keys:
            keys.add(f"exit {self.returncode}")
        return frozenset(keys)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("result")
        data["failure_key"] = sorted(self.failure_key())
        data["argv"] = self.result.argv if self.result else []
        return data

    def _headline(self) -> str:
        verdict = "ok" if self.ok else "timed out (killed)" if self.timed_out else "FAILED"
        facts = []
        if self.error_count:
            facts.append(f"build failed with {_plural(self.error_count, 'error')}")
        if self.subcommand == "test" and not self.error_count:
            facts.append(f"{self.passed} passed, {self.failed} failed, {self.ignored} ignored")
        if self.warning_count:
            facts.append(_plural(self.warning_count, "warning"))
        return f"cargo {self.subcommand}: {verdict}" + (f" ({'; '.join(facts)})" if facts else "")

    def _error_parts(self) -> list[str]:
        """Each distinct error message rendered once (compacted), its repeats as `also at` lines, then the overflow."""
        groups: dict[str, list[Diagnostic]] = {}
        for d in self.errors:
            groups.setdefault(d.message, []).append(d)
        parts = []
        for number, (_, group) in enumerate(groups.items()):
            if number >= FULL_ERRORS:
                parts += [d.one_line() for d in group]
                continue
            parts.append(cut_middle(_compact(group[0].rendered) or group[0].one_line(), RENDERED_LINES))
            parts += _repeats(group[0], group[1:])
        if self.error_count > len(self.errors):
            parts.append(f"(... {self.error_count - len(self.errors)} more errors not shown)")
        if not self.errors:
            parts += [d.one_line() for d in self.warnings[:SHOWN_WARNINGS]]
        return parts

    def _test_parts(self) -> list[str]:
        return [f"---- {t.name} ----\n{t.message or '(no output)'}" for t in self.failed_tests]


def run_cargo(
    sandbox: Sandbox,
    cargo: Cargo,
    subcommand: str,
    *,
    cwd: Path,
    extra: list[str] | None = None,
    timeout: float | None = None,
    on_line: Callable[[str], None] | None = None,
) -> CargoReport:
    """Run `cargo SUBCOMMAND --message-format=json EXTRA` in the sandbox and read what it says. `on_line`: each
    stdout line as cargo writes it (its JSON messages, then the test harness's output)."""
    if subcommand not in SUBCOMMANDS:
        raise UsageError(f"unsupported cargo subcommand '{subcommand}'", fix=f"use one of: {', '.join(SUBCOMMANDS)}")
    args = [subcommand, "--message-format=json", *(["--features", ",".join(cargo.features)] if cargo.features else [])]
    if subcommand == "test":
        args.append("--no-fail-fast")  # every test binary runs, so unit and acceptance failures both show
    artifacts = Artifacts()

    def each(line: str) -> None:
        artifacts.add(line)
        if on_line:
            on_line(line)

    with waiting_on(f"cargo {subcommand} (sandboxed)"):
        result = sandbox.run(cargo.argv(*args, *(extra or [])), cwd=cwd, env=cargo.env(), timeout=timeout, on_line=each)
    return parse_output(subcommand, result, artifacts)


class Artifacts:
    """What cargo's compiler-artifact messages on stdout say, read from every line as it comes (the stdout kept in the
    report is capped: its middle dropped). A proc macro's stdout reaches cargo's (rustc's is passed on) and a test's
    is cargo's own, so a line may look like cargo's and name another file: each distinct one is kept, for the verdict
    to refuse a bin named twice."""

    def __init__(self) -> None:
        self.binaries: list[tuple[str, str]] = []  # (bin target, executable)
        self.doctests: list[str] = []  # the manifest of each target with doc tests
        self.binaries_overflowed = False

    def add(self, line: str) -> None:
        message = artifact_message(line)
        if message is None:
            return
        named = _bin_of(message)
        if named is not None and not _kept(self.binaries, named):
            self.binaries_overflowed = True
        target, manifest = message.get("target"), message.get("manifest_path")
        if isinstance(target, dict) and target.get("doctest") is True and isinstance(manifest, str):
            _kept(self.doctests, manifest)


def _kept(kept: list[Any], item: Any) -> bool:
    """Add `item` to `kept` unless it is there; False when it is not and there is no room (MAX_ARTIFACTS)."""
    if item in kept:
        return True
    if len(kept) >= MAX_ARTIFACTS:
        return False
    kept.append(item)
    return True


def artifact_message(line: str) -> dict[str, Any] | None:
    """The compiler-artifact message `line` holds, or None (another message, the harness's text, a broken line)."""
    if '"compiler-artifact"' not in line:
        return None
    try:
        message = json.loads(line)
    except json.JSONDecodeError:
        return None
    return message if isinstance(message, dict) and message.get("reason") == "compiler-artifact" else None


def bin_artifact(line: str) -> tuple[str, str] | None:
    """(target name, executable) when `line` is a compiler-artifact message of a bin target (not its unit tests)."""
    message = artifact_message(line) if '"executable"' in line else None
    return None if message is None else _bin_of(message)


def _bin_of(message: dict[str, Any]) -> tuple[str, str] | None:
    target, profile, executable = message.get("target"), message.get("profile"), message.get("executable")
    if not isinstance(target, dict) or not isinstance(profile, dict) or not isinstance(executable, str):
        return None
    kinds, name = target.get("kind"), target.get("name")
    if not executable or not isinstance(kinds, list) or "bin" not in kinds or not isinstance(name, str):
        return None
    return None if profile.get("test") else (name, executable)


def parse_output(subcommand: str, result: CommandResult, artifacts: Artifacts | None = None) -> CargoReport:
    """A CargoReport from the stdout (JSON messages + test harness text) and stderr of one cargo command.
    `artifacts`: read from every stdout line as it came (else from the stdout kept, which the cap may have cut)."""
    if artifacts is None:
        artifacts = Artifacts()
        for line in result.stdout.splitlines():
            artifacts.add(line)
    messages, harness = _split_stdout(result.stdout)
    diagnostics = _diagnostics(messages)
    errors = [d for d in diagnostics if d.level == "error"]
    warnings = [d for d in diagnostics if d.level != "error"]
    tests = _parse_harness(harness)
    report = CargoReport(
        subcommand=subcommand,
        ok=result.ok,
        returncode=result.returncode,
        timed_out=result.timed_out,
        seconds=result.seconds,
        diagnostics=(errors + warnings)[:MAX_DIAGNOSTICS],
        error_count=len(errors),
        warning_count=len(warnings),
        failed_tests=tests.failures,
        passed=tests.passed,
        failed=tests.failed,
        ignored=tests.ignored,
        raw_output_lines=result.stdout.count("\n") + result.stderr.count("\n"),
        truncated=result.truncated,
        result=result,
        binaries=artifacts.binaries,
        binaries_overflowed=artifacts.binaries_overflowed,
        doctests=artifacts.doctests,
    )
    report.cargo_errors = _cargo_errors(result.stderr, report)
    return report


def _split_stdout(stdout: str) -> tuple[list[dict[str, Any]], list[str]]:
    """cargo's JSON messages, and every other line (the test harness's output)."""
    messages, other = [], []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                message = None
            if isinstance(message, dict) and "reason" in message:
                messages.append(message)
                continue
        other.append(line)
    return messages, other


def _diagnostics(messages: list[dict[str, Any]]) -> list[Diagnostic]:
    """Compiler messages, deduplicated (lib and lib-test builds repeat them), in the compiler's order."""
    seen: dict[tuple[Any, ...], Diagnostic] = {}
    for message in messages:
        if message.get("reason") != "compiler-message":
            continue
        diagnostic = _diagnostic(message.get("message") or {})
        if diagnostic is None:
            continue
        key = (
            diagnostic.level,
            diagnostic.code,
            diagnostic.message,
            diagnostic.file,
            diagnostic.line,
            diagnostic.column,
        )
        seen.setdefault(key, diagnostic)
    return list(seen.values())


def _diagnostic(message: dict[str, Any]) -> Diagnostic | None:
    level = str(message.get("level", ""))
    text = str(message.get("message", ""))
    if level not in ("error", "warning") or NOISE.match(text):
        return None
    spans = message.get("spans") or []
    primary = next((s for s in spans if s.get("is_primary")), spans[0] if spans else {})
    code = (message.get("code") or {}).get("code") or ""
    rendered = message.get("rendered") or ""
    source = ((primary.get("text") or [{}])[0].get("text") or "").strip()
    return Diagnostic(
        level,
        code,
        text,
        primary.get("file_name", ""),
        primary.get("line_start", 0),
        primary.get("column_start", 0),
        rendered,
        source,
    )


def _repeats(first: Diagnostic, repeats: list[Diagnostic]) -> list[str]:
    """`also at` lines of an error's repeats; two or more in the file of the rendered one go under one `also in FILE`
    line, each as `LINE:COLUMN: source` (the file's name said once: a renamed item's repeats are many, in one file)."""
    same = [d for d in repeats if d.file and d.file == first.file]
    if len(same) < 2:
        return [f"  also at {d.location}{_code_if_other(d, first)}: {d.source}" for d in repeats]
    lines = [f"  also in {first.file}:"]
    lines += [f"    {d.line}:{d.column}{_code_if_other(d, first)}: {d.source}" for d in same]
    return lines + [f"  also at {d.location}{_code_if_other(d, first)}: {d.source}" for d in repeats if d not in same]


def _code_if_other(diagnostic: Diagnostic, first: Diagnostic) -> str:
    return f" (error[{diagnostic.code}])" if diagnostic.code != first.code else ""


def _compact(rendered: str) -> str:
    """rustc's rendering without its empty gutter lines (`   |`), which carry no information."""
    return "\n".join(line for line in rendered.strip().splitlines() if not GUTTER.match(line))


@dataclass
class _Harness:
    failures: list[FailedTest] = field(default_factory=list)
    passed: int = 0
    failed: int = 0
    ignored: int = 0


def _parse_harness(lines: list[str]) -> _Harness:
    """Verdicts, failure blocks and totals from libtest's text output (all test binaries, doc tests included)."""
    harness = _Harness()
    failing: list[str] = []
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if match := TEST_LINE.match(line):
            if match[2] == "FAILED" and match[1] not in failing:
                failing.append(match[1])
        elif match := BLOCK_START.match(line):
            current = blocks.setdefault(match[1], [])
        elif match := RESULT_LINE.match(line):
            current = None
            harness.passed += int(match[1])
            harness.failed += int(match[2])
            harness.ignored += int(match[3])
        elif line == "failures:":
            current = None
        elif current is not None and not line.startswith(BACKTRACE_NOTE):
            current.append(line)
    harness.failures = [
        FailedTest(name, cut_middle("\n".join(blocks.get(name, [])).strip(), RENDERED_LINES)) for name in failing
    ]
    return harness


def _cargo_errors(stderr: str, report: CargoReport) -> list[str]:
    """cargo's own `error:` blocks from stderr, minus those that only repeat what the report already says."""
    blocks: list[list[str]] = []
    for line in stderr.splitlines():
        if line.startswith("error"):
            blocks.append([line])
        elif STATUS_LINE.match(line) or line.startswith("warning"):
            blocks.append([])  # cargo moved on: the error block ended
        elif blocks:
            blocks[-1].append(line)
    texts = ["\n".join(b).strip() for b in blocks if b and b[0].startswith("error")]
    return [cut_middle(t, RENDERED_LINES) for t in texts if not _redundant(t, report)]


def _redundant(text: str, report: CargoReport) -> bool:
    if text.startswith("error: could not compile") and report.error_count:
        return True
    if TARGET_FAILED.match(text):
        return "signal" not in text and bool(report.failed_tests)
    return text.startswith("error: build failed") and bool(report.error_count)


def cut_middle(text: str, max_lines: int) -> str:
    """`text` with at most `max_lines` lines: its head and tail, and a line saying how many were dropped."""
    lines = text.splitlines()
    if len(lines) <= max_lines:
        return text
    head = max((max_lines - 1) // 2, 1)
    tail = max(max_lines - 1 - head, 1)
    dropped = len(lines) - head - tail
    return "\n".join([*lines[:head], f"[... {dropped} lines dropped ...]", *lines[-tail:]])


def _fit(text: str, max_chars: int) -> str:
    """Cut `text` in the middle, by whole lines, until it has at most `max_chars` characters."""
    if len(text) <= max_chars:
        return text
    lines = text.splitlines()
    keep = len(lines)
    while keep > 2:
        keep = keep * 3 // 4
        cut = cut_middle(text, keep)
        if len(cut) <= max_chars:
            return cut
    return text[: max_chars // 2] + "\n[... output cut ...]\n" + text[-max_chars // 2 :]


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"
