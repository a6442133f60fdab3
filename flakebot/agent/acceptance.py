"""The acceptance test written from the spec before any edit: rendered, named, written, and frozen.

`Frozen` is the one owner of "frozen": the toolbox asks it which paths it must refuse to write, the
sandbox binds its paths read-only over the writable workspace, and the edit loop calls `check()` after
every tool call and every verdict; a changed, removed or replaced file ends the loop as `tampered`.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast

from flakebot.agent.loop import StopLoop
from flakebot.errors import EditError, UnsafePath
from flakebot.safefs import Tree, file_below
from flakebot.sandbox import CommandResult, SandboxLimits, open_sandbox
from flakebot.sandbox.process import at_once
from flakebot.toolspec import Example, ToolSpec

R = TypeVar("R")

logger = logging.getLogger(__name__)


ACCEPTANCE_TEST = "tests/flakebot_acceptance.rs"
ACCEPTANCE_TARGET = ["--test", "flakebot_acceptance"]  # cargo's selection of that test alone


def rust_str(text: str) -> str:
    """A Rust string literal for `text`."""
    escapes = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}
    body = "".join(escapes.get(ch, ch if ch.isprintable() else f"\\u{{{ord(ch):x}}}") for ch in text)
    return f'"{body}"'


def rust_pairs(pairs: dict[str, str]) -> str:
    """The items of a Rust slice of (&str, &str) literals for `pairs`."""
    return ", ".join(f"({rust_str(k)}, {rust_str(v)})" for k, v in pairs.items())


def render_acceptance_test(spec: ToolSpec) -> str:
    """The integration test that holds the tool to its examples (a service: to its lifecycle); frozen once written."""
    from flakebot.render import render

    if spec.service:
        return render_service_test(spec)
    examples = [
        {
            "fn": fn,
            "description": e.description,
            "args": ", ".join(rust_str(a) for a in e.args),
            "stdin": rust_str(e.stdin),
            "files": rust_pairs(e.files),
            "stdout": rust_str(e.stdout),
            "exit_code": e.exit_code,
        }
        for fn, e in zip(acceptance_test_names(spec), spec.examples, strict=True)
    ]
    return render("acceptance.rs.j2", name=spec.name, summary=spec.summary, examples=examples)


def render_service_test(spec: ToolSpec) -> str:
    """The lifecycle test of a service (spec.service: its declaration and its examples, as flakebot.services.crafting
    stores them): every value is rendered as a Rust literal, so nothing of the test is read from the crate."""
    from flakebot.render import render

    declaration, examples = spec.service["declaration"], spec.service["examples"]
    health = declaration["health"]

    def exchanges(part: str) -> list[dict[str, str]]:
        return [
            {
                "method": rust_str(e["method"]),
                "path": rust_str(e["path"]),
                "body": rust_str(e.get("body", "")),
                "status": str(int(e.get("status", 200))),
                "body_out": "None" if e.get("body_out") is None else f"Some({rust_str(e['body_out'])})",
                "headers": rust_pairs(e.get("headers") or {}),  # a spec from before headers has none
                "headers_out": rust_pairs(e.get("headers_out") or {}),
            }
            for e in examples.get(part, [])
        ]

    return render(
        "acceptance_service.rs.j2",
        name=spec.name,
        summary=spec.summary,
        port_env=declaration["port_env"],
        port_env_literal=rust_str(declaration["port_env"]),
        health_path=rust_str(health["path"] if health["kind"] == "http" else ""),
        start_s=f"{float(declaration['start_s']):.3f}",
        stop_grace_s=f"{float(declaration['stop_grace_s']):.3f}",
        first=exchanges("first"),
        after_restart=exchanges("after_restart"),
    )


SERVICE_TEST = "service_lifecycle"


def acceptance_test_names(spec: ToolSpec) -> list[str]:
    """The #[test] function names of the acceptance test, one per example (a service's: its one lifecycle test)."""
    if spec.service:
        return [SERVICE_TEST]
    return [
        f"example_{i}_{_slug(e.description or ' '.join(e.args) or 'no_args')}" for i, e in enumerate(spec.examples, 1)
    ]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:40] or "case"


def write_acceptance_test(spec: ToolSpec, crate_dir: Path) -> dict[str, str]:
    """Write the acceptance test into the crate; returns {relative path: sha256} to freeze. The crate came from a
    repository or a sandboxed step (a `tests` link out of it, a link, hard link or FIFO at the name): written
    through flakebot.safefs, so a link is refused and the file replaced, never written through."""
    text = render_acceptance_test(spec)
    Tree(crate_dir).write_text(ACCEPTANCE_TEST, text, sync=False)  # a crash's resume redoes the stage writing it
    return {ACCEPTANCE_TEST: hashlib.sha256(text.encode()).hexdigest()}


@dataclass
class Frozen:
    """Files of the workspace nothing may change (the acceptance test), by sha256 of their content."""

    workspace: Path
    digests: dict[str, str]  # path relative to the workspace -> sha256

    def __post_init__(self) -> None:
        self.workspace = self.workspace.resolve()
        for rel in self.digests:
            if Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise EditError(
                    f"frozen file {rel!r} is not a path inside the workspace",
                    fix="record frozen files relative to the workspace root",
                )
        if self.changed():
            raise EditError(
                f"frozen file {', '.join(self.changed())} does not match its recorded sha256",
                fix="write the acceptance tests again (re-run the spec stage) before editing",
            )

    def paths(self) -> list[Path]:
        """Absolute paths, for the sandbox's read-only binds."""
        return [self.workspace / rel for rel in self.digests]

    def covers(self, path: Path) -> bool:
        """Whether `path` (absolute, resolved) is a frozen file."""
        return any(path == self.workspace / rel for rel in self.digests)

    def changed(self) -> list[str]:
        """Frozen files whose content differs from the recorded hash, or that are gone or replaced by a link."""
        return [rel for rel, digest in self.digests.items() if _digest(self.workspace, rel) != digest]

    def check(self) -> None:
        """Stop the edit loop as `tampered` if any frozen file changed."""
        changed = self.changed()
        if changed:
            logger.warning("frozen file changed: %s", ", ".join(changed))
            raise StopLoop(
                "tampered",
                f"{', '.join(changed)} was changed (it is frozen: the acceptance tests written from the need)",
            )


def _digest(workspace: Path, rel: str) -> str:
    """sha256 of the regular file at `rel`, reached through real directories only; '' otherwise (a link, a FIFO)."""
    try:
        return hashlib.sha256(Tree(workspace).read_bytes(rel)).hexdigest()
    except OSError:  # missing, a link, not a regular file (flakebot.safefs.UnsafePath is an OSError)
        return ""


REFUSED = {  # safefs's rule, as the model is told it
    "link": "a symbolic link, or reached through one",
    "outside": "it lies outside",
    "not-a-file": "not a file",
    "not-a-directory": "reached through something that is not a directory",
}


def built_file(binary: Path, inside: Path, where: str = "the run's target dir") -> Path:
    """`binary` as a regular file below `inside` (the run's target dir, a store path), through real directories
    only (safefs.file_below): cargo's JSON naming it can be forged by a test's output and the build writes that
    tree, so a path elsewhere or a link is refused (UnsafePath), never resolved."""
    try:
        return file_below(inside, binary)
    except OSError as exc:  # UnsafePath, or missing
        why = exc.details.get("rule", "") if isinstance(exc, UnsafePath) else str(exc.strerror)
        shown = REFUSED.get(why, why)
        raise UnsafePath(
            f"{binary} is not a regular file in {where} ({shown})",
            fix="build the tool as a [[bin]] target of the crate (cargo test builds it in the target dir)",
            path=str(binary),
            rule="not-built-here",
        ) from None


def run_example(
    binary: Path, example: Example, mode: str, limits: SandboxLimits, inside: Path, where: str = "the run's target dir"
) -> tuple[bool, CommandResult]:
    """Run one acceptance example on a built binary, in a fresh sandbox holding the example's files; (passed, result).

    flakebot's own check, beside the test harness: it needs nothing from the workspace, so no rewrite
    of the acceptance test (and no trick inside `cargo test`) can make it pass. The binary must be a regular file
    below `inside` (built_file): only its own directory there is shown to the sandbox, read-only."""
    try:
        binary = built_file(binary, inside, where)
    except UnsafePath as exc:
        return False, CommandResult([str(binary)], 126, "", f"flakebot: refused to run it: {exc}\n", 0.0)
    with tempfile.TemporaryDirectory(prefix="flakebot-example-") as tmp:
        cwd = Path(tmp)
        for name, content in example.files.items():
            path = (cwd / name).resolve()
            if not path.is_relative_to(cwd.resolve()):
                raise EditError(
                    f"example file {name!r} leaves the example's directory", fix="give example files relative names"
                )
            # a scratch directory removed after the run: no fsync (it cost two per file, most of the files' part)
            Tree(cwd).write_from(
                str(path.relative_to(cwd.resolve())), io.BytesIO(content.encode()), mode=0o644, sync=False
            )
        sandbox = open_sandbox(mode, workspace=cwd, writable=[cwd], readable=[binary.parent], limits=limits, adopt=True)
        result = sandbox.run([str(binary), *example.args], cwd=cwd, stdin=example.stdin)
    return result.stdout == example.stdout and result.returncode == example.exit_code and not result.timed_out, result


@dataclass(frozen=True)
class Snapshot:
    """The binary cargo built, copied the moment cargo said so (its artifact message) into a directory of flakebot's
    own that no sandbox writes: what the examples run, whatever the build's other steps or the tests then do to the
    target dir. `sha256` is the copy's; `unchanged()` says whether the file cargo named is still the very file copied
    (`identity`) holding it: bytes alone are not enough, as a build step that planted a file before cargo's message
    can plant the same bytes again over what rustc then wrote, before cargo's own message of it is read."""

    source: Path  # the file in the target dir, as built_file spelled it
    inside: Path  # the target dir
    copy: Path
    sha256: str
    identity: tuple[int, int, int]  # (device, inode, ctime_ns) of the file copied: any file written since differs

    def unchanged(self) -> bool:
        try:
            with _open_built(self.source, self.inside) as file:
                return _identity(file) == self.identity and _Hashed(file).rest() == self.sha256
        except OSError:  # gone, or a link now
            return False

    def remove(self) -> None:
        shutil.rmtree(self.copy.parent, ignore_errors=True)


def snapshot_binary(binary: Path, inside: Path, where: str = "the run's target dir") -> Snapshot:
    """A Snapshot of `binary`, a regular file below `inside` (built_file: UnsafePath otherwise), read without following
    a link. The copy's directory is readable by the sandbox's uid, writable by flakebot alone."""
    source = built_file(binary, inside, where)
    directory = Path(tempfile.mkdtemp(prefix="flakebot-built-"))
    try:
        directory.chmod(0o755)  # the examples run as the sandbox's uid (as root): it reads, it cannot write
        with _open_built(source, inside) as file:
            identity = _identity(file)  # before reading: a write while it is copied changes the ctime after this
            hashed = _Hashed(file)  # streamed: the build may leave a binary as large as the sandbox's file limit
            Tree(directory).write_from(source.name, cast(BinaryIO, hashed), mode=0o755, sync=False)  # a scratch copy
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return Snapshot(source, inside, directory / source.name, hashed.sha256.hexdigest(), identity)


def _identity(file: BinaryIO) -> tuple[int, int, int]:
    """Which file this is, and its last change: a file made anew (a new inode, or a freed one reused) or written in
    place gets a later ctime, which no unprivileged process can set back."""
    status = os.fstat(file.fileno())
    return status.st_dev, status.st_ino, status.st_ctime_ns


def _open_built(source: Path, inside: Path) -> AbstractContextManager[BinaryIO]:
    """The built file opened below `inside` without following a link (safefs), to stream."""
    root = inside.resolve()
    return Tree(root).open_read(str(source.relative_to(root)))


class _Hashed:
    """A stream read through (all write_from's copy asks of it), its sha256 taken of what was read."""

    def __init__(self, inner: BinaryIO) -> None:
        self.inner, self.sha256 = inner, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        chunk = self.inner.read(size)
        self.sha256.update(chunk)
        return chunk

    def rest(self) -> str:
        """The sha256 of the whole stream, read to its end in chunks."""
        while self.read(1 << 20):
            pass
        return self.sha256.hexdigest()


class BuiltRunner:
    """Runs an example (run_example) on a binary cargo built in `target_dir`, or on a Snapshot this runner made of one
    (`snapshot`): a copy is accepted only in a directory the runner made itself (`inside`, which a service's lifecycle
    check asks too)."""

    def __init__(self, mode: str, limits: SandboxLimits, target_dir: Path) -> None:
        self.mode, self.limits, self.target_dir = mode, limits, target_dir
        self.made: set[Path] = set()

    def __call__(self, binary: Path, example: Example) -> tuple[bool, CommandResult]:
        return run_example(binary, example, self.mode, self.limits, self.inside(binary))

    def inside(self, binary: Path) -> Path:
        """Where `binary` must be a regular file (built_file): a copy's own directory, else the run's target dir."""
        return binary.parent if binary.parent in self.made else self.target_dir

    def snapshot(self, binary: Path) -> Snapshot:
        snap = snapshot_binary(binary, self.target_dir)
        self.made.add(snap.copy.parent)
        return snap


EXAMPLES_AT_ONCE = 6  # a spec's 3 to 6 examples in one wave (with 4 the 5th and 6th waited for the first)


def each_example(run: Callable[[Example], R], examples: Sequence[Example]) -> list[R]:
    """run(example) for every example, several at once, the results in the examples' order. Each example runs in a
    sandbox and a directory of its own (run_example), so they cannot meet; one after another, a tool's five examples
    took 0.3 s of the green iteration and as much again in the instruct stage, mostly waiting for bubblewrap (its
    namespaces and mounts: about 10 ms of a 15 ms example here)."""
    if len(examples) < 2:
        return [run(example) for example in examples]
    return at_once([functools.partial(run, example) for example in examples], min(EXAMPLES_AT_ONCE, len(examples)))


def example_failure(number: int, example: Example, result: CommandResult) -> str:
    """What the model is shown when flakebot's own run of an example on the built binary fails."""
    got = f"exit {result.returncode}" + (" (timed out)" if result.timed_out else "")
    return (
        f"example {number} ({example.description or ' '.join(example.args)}) run by flakebot on the built binary: "
        f"expected exit {example.exit_code} and stdout {example.stdout[:300]!r}; got {got} and stdout {result.stdout[:300]!r}"
        + (f", stderr {result.stderr[-300:]!r}" if result.stderr.strip() else "")
    )


def example_record(example: Example, passed: bool, result: CommandResult) -> dict[str, Any]:
    """One example's outcome as the manifest keeps it."""
    return {
        "description": example.description,
        "args": example.args,
        "stdin": example.stdin,
        "files": sorted(example.files),
        "stdout": result.stdout,
        "exit_code": result.returncode,
        "expected_stdout": example.stdout,
        "expected_exit_code": example.exit_code,
        "passed": passed,
    }
