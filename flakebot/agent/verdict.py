"""flakebot's verdict on a workspace: `cargo test` in the sandbox, green only when every acceptance test ran and
passed, and every acceptance example passes when flakebot runs it itself on the built binary."""

from __future__ import annotations

import logging
import re
import stat
import threading
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from flakebot.agent.acceptance import (
    ACCEPTANCE_TARGET,
    ACCEPTANCE_TEST,
    Snapshot,
    acceptance_test_names,
    each_example,
    example_failure,
)
from flakebot.agent.loop import Verdict
from flakebot.cargo.diagnostics import bin_artifact
from flakebot.errors import UnsafePath
from flakebot.safefs import Tree
from flakebot.sandbox import CommandResult
from flakebot.sandbox.process import at_once
from flakebot.toolspec import Example, ToolSpec

ExampleRunner = Callable[[Path, Example], tuple[bool, CommandResult]]
Snapshotter = Callable[[Path], Snapshot]  # the built binary copied where no sandbox writes (BuiltRunner.snapshot)
Outcomes = list[tuple[bool, CommandResult]]
# A service's lifecycle run by flakebot on the built binary: what failed, for the model ([] when it passed).
LifecycleCheck = Callable[[Path], list[str]]

logger = logging.getLogger(__name__)


SOURCE_LIMIT = 1 << 20  # an integration test's source file read to select tests; a larger one is not
COMPILE_FAILURE = 10_000  # a crate that does not build is worse than any number of failing tests


def make_verdict(
    cargo_test: Callable[..., Any],  # (extra_args) or (extra_args, on_line)
    spec: ToolSpec,
    workspace: Path,
    run_example: ExampleRunner,
    *,
    only_acceptance: bool = False,
    lifecycle: LifecycleCheck | None = None,
    snapshot: Snapshotter | None = None,
) -> Callable[..., Verdict]:
    """flakebot's verdict on the workspace: `cargo test --tests`, then, once that is green and the
    workspace has doc tests (slow: rustdoc compiles them anew every run), the full `cargo test`; once
    green, every example run by flakebot on the binary cargo built.
    `cargo_test(extra_args)` runs `cargo test` (in the sandbox) and returns its CargoReport;
    `run_example(binary, example)` runs one example (in the sandbox): (passed, result).
    `only_acceptance`: the crate's own tests cannot build (dev-dependencies left out), so run the acceptance test alone.
    `snapshot`: with it, the binary is copied at cargo's artifact message (Early) and the examples (a service: its
    lifecycle) judge the copy, the file cargo named holding it still after cargo: a test that wrote over the binary
    would otherwise be what they judge. A tool's examples start beside the tests when the verdict is called with
    `claimed` (the model said it is done): only then is green likely, and only a green verdict runs them; in a red
    iteration they would take the cores from its tests (on 2 cores P2 rose from 1.08 to 1.17-1.21). Otherwise they
    run after cargo, as a service's lifecycle always does (its frozen test starts the service too, and the two starts
    would share the cores within their start timeouts).
    `on_tested()`, given to a claimed verdict, is called (on cargo's thread) once its last cargo run has ended with every
    test passing while the examples still run beside: the tree is then as judged (the examples write nothing of it),
    so the loop guards and commits it beside them rather than after them.
    """

    def last(extra: list[str], report: Any) -> bool:
        """Whether no other cargo run follows this green one (the full `cargo test`, for doc tests)."""
        return only_acceptance or not extra or not has_doctests(report, workspace)

    def tested(
        extra: list[str], early: bool, started: list[Early], on_tested: Callable[[], None] | None
    ) -> tuple[Any, Verdict, Early | None]:
        if snapshot is None:
            report = cargo_test(extra)
            return report, judge(report, spec), None
        beside = Early(spec, run_example, snapshot, lifecycle)
        started.append(beside)
        at_once_examples = early and not spec.service

        done: list[tuple[Any, Verdict]] = []

        def cargo() -> None:
            try:
                report = cargo_test(extra, beside.on_line)
            finally:
                beside.ready.set()  # no artifact message: the examples' thread stops waiting
            judged = judge(report, spec)
            if judged.green:  # a red run's binary is never judged: its file is not read again (a few MB hashed)
                beside.after_cargo()  # the file cargo named held to the copy now, beside the examples still running
            done.append((report, judged))
            if at_once_examples and on_tested is not None and done[0][1].green and last(extra, report):
                on_tested()

        if at_once_examples:
            at_once([cargo, beside.examples], 2)
        else:
            cargo()
        return *done[0], beside

    def verdict(claimed: bool = False, on_tested: Callable[[], None] | None = None) -> Verdict:
        early, started = claimed, list[Early]()
        try:
            extra = ACCEPTANCE_TARGET if only_acceptance else ["--tests"]
            report, result, beside = tested(extra, early, started, on_tested)
            if result.green and not last(extra, report):
                report, result, beside = tested([], early, started, on_tested)
            if not result.green:
                return result  # red as the tests say: the examples' results (if any ran) are not shown
            if beside and beside.named is not None:
                if beside.snap is not None and beside.failures is None:
                    beside.examples()  # after cargo, on the copy taken at its message
                return beside.judge(result, report)
            return on_binary(result, report, spec, run_example, lifecycle)
        finally:
            for each in started:  # every copy taken, whatever ended the verdict (an example raising, Ctrl-C)
                each.drop()

    return verdict


REPEATS = 4  # later artifact messages of the bin compared with the copy; past them it counts as replaced


class Early:
    """The examples run on the bin target's executable from the moment cargo reports it built (its compiler-artifact
    message, before the test binaries run), beside the tests: the binary is copied then (Snapshot, outside every
    sandbox), so what the examples judge is what cargo built, not what a build script, proc macro or test writes in
    its place afterwards; after cargo, the file it named must still hold the copy's bytes (else red: swapped).
    `examples()` runs on its own thread of at_once beside `cargo test` and waits for the message (or cargo's end);
    when the model did not say it is done, it runs after cargo, still on the copy. A service's lifecycle (`lifecycle`)
    runs on the copy in the examples' place."""

    def __init__(
        self, spec: ToolSpec, run_example: ExampleRunner, snapshot: Snapshotter, lifecycle: LifecycleCheck | None = None
    ) -> None:
        self.spec, self.run_example, self.snapshot, self.lifecycle = spec, run_example, snapshot, lifecycle
        self.ready = threading.Event()
        self.named: Path | None = None  # the executable the artifact message named
        self.snap: Snapshot | None = None
        self.failures: list[str] | None = None  # of the run on the copy, once it ran
        self.refused = ""  # why the file named could not be copied (then no copy: red, never the file after cargo)
        self.moved = False  # a later message of the bin found another file, or other bytes, than the copy's
        self.repeats = 0  # later messages of the bin
        self.kept: bool | None = None  # after cargo: the file cargo named still the very file copied (after_cargo)

    def on_line(self, line: str) -> None:
        """cargo's stdout, line by line, on cargo's thread: the first artifact message of the bin target whose file
        can be copied starts it. A proc macro's line may come before cargo's own and name the same file while it is a
        link or the macro's own file: a later message of the bin must find the copy's bytes there still."""
        binary = bin_executable(line, self.spec.name)
        if binary is None:
            return
        if self.snap is not None:  # cargo prints one; each repeat is read whole again, so a few are judged at most
            self.repeats += 1
            self.moved = self.moved or self.repeats > REPEATS or binary != self.named or not self.snap.unchanged()
            return
        self.named = binary
        try:
            self.snap = self.snapshot(binary)
        except (UnsafePath, OSError) as exc:  # cargo's own message, after the macro's, may still be copied
            self.refused = f"{binary} run by flakebot on the built binary: not copied when cargo reported it ({exc})"
            logger.info("no early examples: %s", exc)
            return
        self.ready.set()

    def after_cargo(self) -> None:
        """Once cargo has ended: whether the file it named is still the very file copied. Nothing of the build runs
        after its end, so this holds for the judgement too; taken here, it is read while the examples still run."""
        if self.snap is not None:
            self.kept = self.snap.unchanged()

    def examples(self) -> None:
        """The examples (a service: its lifecycle) on the snapshot, once it is taken; nothing when cargo ends without one."""
        self.ready.wait()
        if self.snap is not None:
            self.failures = failures_on(self.snap.copy, self.spec, self.run_example, self.lifecycle)

    def judge(self, verdict: Verdict, report: Any) -> Verdict:
        """A green test verdict held to the run on the snapshot, and to the binary being what cargo built."""
        named, unclear = built_binary(report, self.spec.name)
        if unclear:
            failures = [unclear]
        elif self.snap is None:
            failures = [f"{self.refused}: flakebot runs {_judged(self.spec)} only on what cargo built"]
        elif named != self.named or self.moved or not (self.snap.unchanged() if self.kept is None else self.kept):
            failures = [
                f"{self.snap.source} run by flakebot on the built binary: the file cargo built was replaced after cargo "
                f"reported it (by a build script, a proc macro or a test): flakebot runs {_judged(self.spec)} on what "
                "cargo built"
            ]
        else:
            assert self.failures is not None
            failures = self.failures
        return _held(verdict, failures, _judged(self.spec))

    def drop(self) -> None:
        if self.snap is not None:
            self.snap.remove()


def on_binary(
    verdict: Verdict, report: Any, spec: ToolSpec, run_example: ExampleRunner, lifecycle: LifecycleCheck | None = None
) -> Verdict:
    """A green verdict held to every example run on the built binary (a service: to its lifecycle run by flakebot):
    any failure turns it red."""
    binary, unclear = built_binary(report, spec.name)
    failures = [unclear] if binary is None else failures_on(binary, spec, run_example, lifecycle)
    return _held(verdict, failures, _judged(spec))


def failures_on(
    binary: Path, spec: ToolSpec, run_example: ExampleRunner, lifecycle: LifecycleCheck | None
) -> list[str]:
    """What failed when flakebot ran the spec on `binary` (the copy, or the file cargo named): every example of a
    tool, a service's lifecycle."""
    if spec.service:
        return lifecycle(binary) if lifecycle else ["no lifecycle check for a service: flakebot cannot judge it"]
    return example_failures(spec, each_example(lambda e: run_example(binary, e), spec.examples))


def _judged(spec: ToolSpec) -> str:
    return "its lifecycle" if spec.service else "the examples"


def example_failures(spec: ToolSpec, outcomes: Outcomes) -> list[str]:
    """What each failed example run says, numbered as the spec lists them."""
    return [
        example_failure(n, e, result)
        for (n, e), (passed, result) in zip(enumerate(spec.examples, 1), outcomes, strict=True)
        if not passed
    ]


def _held(verdict: Verdict, failures: list[str], what: str) -> Verdict:
    """The green `verdict`, red with `failures` when there are any."""
    if not failures:
        return verdict
    summary = f"{verdict.summary}\nThe tests passed, but flakebot's own run of {what} did not:\n" + "\n".join(failures)
    data = {**verdict.data, "examples_failed": len(failures)}
    return Verdict(
        green=False,
        failures=len(failures),
        summary=summary,
        key="|".join(sorted(f.split(":")[0] for f in failures)),
        data=data,
    )


def built_binary(report: Any, name: str) -> tuple[Path | None, str]:
    """The executable cargo built for the bin target `name`, from its compiler-artifact messages (every stdout line,
    not only those the output cap kept), or None and why: none named, or several (the others printed in cargo's words
    by a proc macro, whose stdout cargo passes on, or by a test)."""
    named = [Path(path) for target, path in report.binaries if target == name]
    if len(named) > 1 or (named and report.binaries_overflowed):
        shown = ", ".join(str(p) for p in named[:3]) + (", ..." if len(named) > 3 or report.binaries_overflowed else "")
        return None, (
            f"cargo's output named more than one file as the executable of the bin target {name} ({shown}): a build "
            "script, proc macro or test printed a line in cargo's words; flakebot runs the examples only on the one "
            "file cargo built"
        )
    if not named:
        return None, f"cargo built no binary named {name}: the tool must be a [[bin]] called {name}"
    return named[0], ""


def bin_executable(line: str, name: str) -> Path | None:
    """The executable of the bin target `name` when `line` is cargo's compiler-artifact message for it."""
    named = bin_artifact(line)
    return Path(named[1]) if named and named[0] == name else None


def not_run(why: str) -> Verdict:
    """The verdict before any test ran: ranked as a crate that does not build, so any run that compiles is better."""
    return Verdict(
        green=False, failures=COMPILE_FAILURE, summary=f"Not run yet: {why}.", key="not-run", data={"not_run": True}
    )


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
        green=report.ok and not missing,
        failures=max(failures, 0 if report.ok and not missing else 1),
        summary=summary,
        key=_key(report, missing),
        data=data,
    )


def has_doctests(report: Any, workspace: Path) -> bool:
    """Whether cargo built a target of the workspace's own crates that has doc tests (a library)."""
    return any(Path(manifest).resolve().is_relative_to(workspace.resolve()) for manifest in report.doctests)


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


# ------------------------------------------------------------------ fork mode: fast steps, complete verdict


class ForkVerdict:
    """flakebot's verdict on a fork, fast per step and complete when it counts.

    full()      the whole `cargo test` (doc tests included): the baseline
    __call__()  a step: the acceptance test binary first; once it passes, the unit tests and the
                integration tests the change can affect; once those pass, the whole `cargo test`,
                so a green verdict always comes from the complete suite.
    Each cargo run is recorded (scope, arguments, seconds) so a run shows where the full suite ran."""

    def __init__(
        self,
        cargo_test: Callable[..., Any],  # (extra_args) or (extra_args, on_line)
        spec: ToolSpec,
        crate_dir: Path,
        changed: Callable[[], list[str]],
        run_example: ExampleRunner,
        record: Callable[..., None] = lambda *_, **__: None,
        lifecycle: LifecycleCheck | None = None,
        snapshot: Snapshotter | None = None,
        within: Path | None = None,  # the workspace holding crate_dir: the crate is reached beneath it
    ) -> None:
        self.cargo_test, self.spec, self.crate_dir, self.within = cargo_test, spec, crate_dir, within
        self.changed, self.run_example, self.record, self.lifecycle = changed, run_example, record, lifecycle
        self.snapshot = snapshot  # as make_verdict's: the examples judge the copy taken at cargo's artifact message

    def full(self) -> Verdict:
        return self._scoped(self._complete(), ["full"])

    def _complete(self) -> Verdict:
        """The whole `cargo test`; when green, held to every example run on the built binary (as make_verdict does)."""
        copied = Early(self.spec, self.run_example, self.snapshot, self.lifecycle) if self.snapshot else None
        try:
            report = self._run("full", [], copied.on_line if copied else None)
            verdict = judge(report, self.spec)
            if not verdict.green:
                return verdict
            if copied and copied.named is not None:
                if copied.snap is not None:
                    copied.examples()
                return copied.judge(verdict, report)
            return on_binary(verdict, report, self.spec, self.run_example, self.lifecycle)
        finally:
            if copied:
                copied.drop()

    def __call__(self) -> Verdict:
        acceptance = judge(self._run("acceptance", ["--test", Path(ACCEPTANCE_TEST).stem]), self.spec)
        if not acceptance.green:
            return self._scoped(acceptance, ["acceptance"])
        targets = affected_targets(self.crate_dir, self.changed(), within=self.within)
        if targets:
            affected = _partial(self._run("affected", targets))
            if not affected.green:
                return self._scoped(affected, ["acceptance", "affected"])
        return self._scoped(self._complete(), ["acceptance", "affected", "full"] if targets else ["acceptance", "full"])

    def _run(self, scope: str, args: list[str], on_line: Callable[[str], None] | None = None) -> Any:
        report = self.cargo_test(args, on_line) if on_line else self.cargo_test(args)
        self.record("cargo_test", scope=scope, args=args, ok=report.ok, seconds=round(report.seconds, 3))
        return report

    @staticmethod
    def _scoped(verdict: Verdict, scopes: list[str]) -> Verdict:
        verdict.data["scopes"] = scopes
        if scopes[-1] != "full":
            verdict.summary += (
                f"\n(flakebot ran {' and '.join(scopes)} tests only; the whole suite runs once these pass.)"
            )
        return verdict


def _partial(report: Any) -> Verdict:
    """The verdict of a run without the acceptance binary (it passed just before)."""
    compiled = not report.errors and not report.timed_out
    failures = report.failed if compiled else COMPILE_FAILURE + report.error_count
    data = {"passed": report.passed, "failed": report.failed, "compiled": compiled, "acceptance_missing": []}
    return Verdict(
        green=report.ok,
        failures=max(failures, 0 if report.ok else 1),
        summary=report.summary(),
        key=_key(report, []),
        data=data,
    )


def affected_targets(crate_dir: Path, changed: list[str], *, within: Path | None = None) -> list[str]:
    """`cargo test` arguments selecting the tests a change to `changed` (paths relative to the crate) can affect:
    the unit tests of the library and binaries when their sources or the manifest changed, and each integration
    test whose own files changed or whose source names the library or a binary. Doc tests are left to the full run.
    The crate is read through safefs beneath `within` (the workspace; default the crate itself): a crate directory the
    sandbox swapped for a link is UnsafePath, never read."""
    with _crate(crate_dir, within) as tree:
        targets = _targets(tree)
        code_changed = any(p == "Cargo.toml" or p == "build.rs" or p.startswith("src/") for p in changed)
        args = []
        if code_changed and targets["lib"]:
            args.append("--lib")
        if code_changed and targets["bins"]:
            args.append("--bins")
        for name, files in targets["tests"].items():
            if any(_owns(file, path) for file in files for path in changed) or (
                code_changed and _uses_crate(tree, files, targets)
            ):
                args += ["--test", name]
    return args


def _crate(crate_dir: Path, within: Path | None) -> Tree:
    """The crate directory as a Tree reached from `within` through real directories only."""
    root = within or crate_dir
    rel = crate_dir.relative_to(root).as_posix()
    with Tree(root) as top:
        return top.subtree("" if rel == "." else rel)


def _owns(test_file: str, path: str) -> bool:
    """Whether `path` is part of the integration test whose root is `test_file` (tests/x.rs, or tests/x/**)."""
    return path == test_file or (test_file.endswith("/main.rs") and path.startswith(test_file.removesuffix("main.rs")))


def _targets(tree: Tree) -> dict[str, Any]:
    """The library, binaries and integration tests of the crate (cargo's auto-discovery plus [[bin]]/[[test]]). The
    crate's directories are listed beneath it through safefs: a src/bin or tests (or a src/main.rs) the sandbox
    swapped for a link to the host's counts as absent, so no host file name decides which tests run."""
    manifest = tomllib.loads(tree.read_text("Cargo.toml"))  # a FIFO or link there: refused
    package = manifest.get("package", {}).get("name", "")
    lib = manifest.get("lib", {}).get("name") or (
        package.replace("-", "_") if _is_file(tree, "src/lib.rs") or "lib" in manifest else ""
    )
    bins = {b.get("name", "") for b in manifest.get("bin", [])}
    bins |= {package} if _is_file(tree, "src/main.rs") else set()
    bins |= {
        n.removesuffix(".rs") for n in _listed(tree, "src/bin") if n.endswith(".rs") and _is_file(tree, f"src/bin/{n}")
    }
    tests: dict[str, list[str]] = {}
    listed = _listed(tree, "tests")
    for name in listed:
        if name.endswith(".rs") and _is_file(tree, f"tests/{name}"):
            tests[name.removesuffix(".rs")] = [f"tests/{name}"]
    for name in listed:  # after every tests/NAME.rs: a tests/NAME/main.rs takes its name, as cargo's discovery does
        if _is_file(tree, f"tests/{name}/main.rs"):
            tests[name] = [f"tests/{name}/main.rs"]
    for entry in manifest.get("test", []):
        if entry.get("name"):
            tests[entry["name"]] = [entry.get("path", f"tests/{entry['name']}.rs")]
    tests.pop(Path(ACCEPTANCE_TEST).stem, None)  # already ran first
    return {"lib": lib, "bins": sorted(b for b in bins if b), "tests": tests}


def _is_file(tree: Tree, rel: str) -> bool:
    """A regular file at `rel` reached through real directories (a link on the way or at the name: no)."""
    try:
        return stat.S_ISREG(tree.lstat(rel).st_mode)
    except OSError:  # missing, or refused (UnsafePath is one)
        return False


def _listed(tree: Tree, rel: str) -> list[str]:
    """The names in the crate's directory `rel` (sorted); none when it is missing, a link or not a directory."""
    try:
        return tree.listdir(rel)
    except OSError:  # UnsafePath is one
        return []


def _uses_crate(tree: Tree, files: list[str], targets: dict[str, Any]) -> bool:
    """Whether an integration test's source names the library (`lib::`, `use lib`) or runs one of the binaries. The
    sources are read beneath the crate through safefs: a link, a path leaving the crate (a manifest's absolute
    [[test]] path) or a file over SOURCE_LIMIT is not read, so nothing of the host's decides (the full suite runs
    before green anyway)."""
    names = [rf"\b{re.escape(targets['lib'])}::", rf"\buse {re.escape(targets['lib'])}\b"] if targets["lib"] else []
    names += [rf"CARGO_BIN_EXE_{re.escape(b)}\b|cargo_bin\(\"{re.escape(b)}\"\)" for b in targets["bins"]]
    if not names:
        return False
    pattern = re.compile("|".join(names))
    return any(pattern.search(text) for rel in files for text in _sources(tree, rel))


def _sources(tree: Tree, rel: str) -> Iterator[str]:
    """The text of an integration test's Rust sources (all below its directory for a tests/NAME/main.rs); what is
    refused (a link, a path outside, a file too large) or gone is logged and skipped."""
    try:
        paths = [rel]
        if rel.endswith("/main.rs"):
            below = tree.walk(rel.removesuffix("/main.rs"))
            paths = [p for p, info in below if stat.S_ISREG(info.st_mode) and p.endswith(".rs")]
        for path in paths:
            try:
                yield tree.read_bytes(path, limit=SOURCE_LIMIT).decode(errors="replace")
            except OSError as exc:  # UnsafePath is one
                logger.info("not read to select tests: %s", exc)
    except OSError as exc:
        logger.info("not read to select tests: %s", exc)
