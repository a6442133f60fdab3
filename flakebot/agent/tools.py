"""The tools the model calls during the edit loop, kept inside the workspace.

`Toolbox.schemas()` gives the OpenAI function-tool definitions; `Toolbox.call(name, arguments)` runs one
and always returns a ToolResult (an unknown tool, bad arguments, a path leading out of the workspace or an
edit to a frozen file become `ok=False` with the exact problem, never an exception). File tools act in
flakebot's own process on paths it has checked; every command (cargo) runs in the sandbox.

Frozen files (the acceptance test, flakebot.agent.acceptance.Frozen) and the files that would steer
cargo or rustup (flakebot.trust.steering_reason: `.cargo/`, `rust-toolchain*`) are refused to the file tools;
so is every path with a `.git` part, in any case, for every file tool (flakebot.trust.git_reason).

Online, the sandbox has no network and cargo in it runs --offline: after any call that changed a Cargo.toml
or Cargo.lock, the toolbox fetches on the host (cargo/fetch.py) and says so in the result. `add_dependency`
online is `cargo add` on the host, then that fetch; a crate that cannot be added or fetched leaves the
manifests as they were and comes back as the tool's result.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flakebot import preflight
from flakebot.agent.acceptance import ACCEPTANCE_TARGET, Frozen
from flakebot.cargo.diagnostics import CargoReport, run_cargo
from flakebot.cargo.fetch import ManifestWatch, sync
from flakebot.cargo.metadata import cargo_error
from flakebot.cargo.runner import Cargo
from flakebot.errors import FlakebotError, HostError, UnsafePath
from flakebot.safefs import Tree
from flakebot.sandbox import Sandbox
from flakebot.toolschema import BadArguments, declare
from flakebot.trust import git_reason, steering_reason

SKIP_DIRS = {"target", "node_modules"}  # and every .git (trust.git_reason)
# cannot change a manifest: no manifest check after them
READ_ONLY_TOOLS = {
    "list_files",
    "read_file",
    "search",
    "done",
}
MAX_LIST = 400  # entries list_files returns
MAX_READ_LINES = 400  # lines read_file returns per call
MAX_LINE_CHARS = 1000
MAX_SEARCH_RESULTS = 100
MAX_FILE_BYTES = 1_000_000  # larger files are neither read, searched nor written
CRATE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
VERSION_REQ = re.compile(r"^[=^~<>]*\s*[0-9][0-9A-Za-z.+*-]*$")
FEATURE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_+./-]*$")
_COMMENT = r"^\s*(?://+!?|#|/\*+|\*|<!--)\s*"
PLACEHOLDERS = [
    re.compile(_COMMENT + r"(\.{3}|…)"),  # "// ... existing code", "/* ... */", "# ..."
    re.compile(  # "// existing code here", "// rest of the file unchanged"; not "// existing tests cover the edge cases"
        _COMMENT + r"(keep(ing)? )?(the )?(existing|remaining|rest of( the)?|previous|other|unchanged) "
        r"(code|implementation|functions?|methods?|tests?|file|content|items?|imports?)\b(\W+\w+){0,3}\W*$",
        re.I,
    ),
    re.compile(
        r"^\s*(\.{3}|…)\s*((rest|existing|remaining|unchanged)\b.*)?$", re.I
    ),  # a bare "..." line, "...rest of file"
]


@dataclass
class ToolResult:
    """One tool call's outcome. `ok`: the tool did what was asked (for cargo_check and run_tests: cargo ran;
    whether the build or tests passed is data["green"]). `text` goes to the model; `data` is for the log."""

    ok: bool
    text: str
    data: dict[str, Any] = field(default_factory=dict)
    report: CargoReport | None = field(default=None, repr=False)  # cargo tools: the full report


class Refused(Exception):
    """A tool call flakebot will not carry out; the message tells the model why and what to do instead."""


class Toolbox:
    """The model's tools over one workspace: file tools checked to stay inside it, cargo in the sandbox."""

    def __init__(
        self,
        workspace: Path,
        sandbox: Sandbox,
        cargo: Cargo,
        *,
        crate_dir: str = "",
        frozen: Frozen | None = None,
        read_only: bool = False,
        command_timeout: float | None = None,
        only_acceptance: bool = False,
        before_test: Callable[[], None] = lambda: None,
    ) -> None:
        self.workspace = Path(workspace).resolve()
        # what the verdict's own `cargo test` does first (the loop's dependencies seeded, again after a change of
        # them): the model's test runs start from them too, instead of compiling them in the loop once more
        self.before_test = before_test
        self.sandbox = sandbox
        self.cargo = cargo
        self.crate_dir = self.workspace / crate_dir
        self.read_only = read_only
        self.command_timeout = command_timeout
        self.only_acceptance = (
            only_acceptance  # the crate's own tests cannot build: cargo sees the binaries and the acceptance test
        )
        self.tools = {t.name: t for t in TOOLS if not (read_only and t.extra.get("writes"))}
        self.frozen = frozen or Frozen(self.workspace, {})
        self._manifests = ManifestWatch(self.workspace) if cargo.online else None

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI function-tool definitions of the available tools."""
        return [tool.schema() for tool in self.tools.values()]

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one tool; every problem comes back as ToolResult(ok=False) with the exact reason."""
        tool = self.tools.get(name)
        if tool is None:
            return ToolResult(
                False,
                f"unknown tool '{name}'; available tools: {', '.join(self.tools)}",
                {"tool": name, "error": "unknown_tool"},
            )
        try:
            args = tool.check(arguments)
        except BadArguments as exc:
            return ToolResult(False, f"bad arguments for {name}: {exc}", {"tool": name, "error": "bad_arguments"})
        result = self._dispatch(name, args)
        result.data["tool"] = name
        if name not in READ_ONLY_TOOLS:
            self._fetch_if_manifests_changed(result)
        return result

    def _dispatch(self, name: str, args: dict[str, Any]) -> ToolResult:
        handler: Callable[..., ToolResult] = getattr(self, f"_{name}")
        try:
            return handler(**args)
        except Refused as exc:
            return ToolResult(False, str(exc), {"error": "refused"})
        except UnicodeDecodeError:
            return ToolResult(False, f"{args.get('path', 'the file')} is not UTF-8 text", {"error": "failed"})
        except OSError as exc:
            if (trouble := preflight.host_error(exc)) is not None:  # the machine's trouble: not the model's to fix
                raise trouble from None
            return ToolResult(
                False, f"{name} failed: {exc.strerror or exc} ({exc.filename or ''})", {"error": "failed"}
            )
        except HostError:
            raise
        except FlakebotError as exc:
            return ToolResult(False, f"{name} failed: {exc.one_line()}", {"error": "failed"})

    # --- host fetch ---------------------------------------------------------------------------------

    def _fetch_if_manifests_changed(self, result: ToolResult) -> None:
        """Online: a changed Cargo.toml/Cargo.lock may name crates the offline sandbox lacks; fetch them on the host."""
        if self._manifests is None or not self._manifests.changed():
            return
        fetched = sync(self.cargo, self.crate_dir, timeout=self.command_timeout or 600)
        self._manifests.changed()  # the fetch may have rewritten Cargo.lock: that is the new baseline
        result.text += f"\n\nCargo.toml or Cargo.lock changed: {fetched.summary()}"
        if not fetched.ok:
            result.text += (
                ". Builds in the sandbox are offline: only crates fetched here can be used; fix the manifest."
            )
        result.data["fetch"] = {
            "ok": fetched.ok,
            "downloaded": fetched.downloaded,
            "error": fetched.error,
            "seconds": round(fetched.seconds, 3),
        }

    def refreeze(self, rel: str, digest: str) -> None:
        """Freeze the file's new content: flakebot rewrote it (a corrected acceptance example)."""
        self.frozen.digests[rel] = digest

    # --- paths --------------------------------------------------------------------------------------

    def _inside(self, raw: str) -> Path:
        """`raw` resolved inside the workspace; absolute paths, '..' and symlinks leading out are refused."""
        if not raw or "\0" in raw:
            raise Refused("the path is empty; give a path relative to the workspace root, such as src/main.rs")
        if os.path.isabs(raw) or raw.startswith("~"):
            raise Refused(
                f"absolute path '{raw}' refused; give a path relative to the workspace root, such as src/main.rs"
            )
        if ".." in Path(raw).parts:
            raise Refused(f"path '{raw}' contains '..'; paths must stay inside the workspace")
        path = (self.workspace / raw).resolve()
        if not path.is_relative_to(self.workspace):
            raise Refused(f"path '{raw}' leads outside the workspace (through a symbolic link)")
        reason = git_reason(raw) or git_reason(path.relative_to(self.workspace))
        if reason:
            raise Refused(f"'{raw}' refused: {reason}. No path may have a .git part (any case)")
        return path

    def _writable(self, raw: str) -> Path:
        path = self._inside(raw)
        rel = path.relative_to(self.workspace)
        if self.frozen.covers(path):
            raise Refused(
                f"{rel} is frozen: it holds the acceptance tests written from the need. Change the code so that they pass instead"
            )
        steering = steering_reason(rel)
        if steering:
            raise Refused(f"'{raw}' refused: {steering}. Put settings in Cargo.toml instead")
        if path.is_dir():
            raise Refused(f"'{raw}' is a directory")
        return path

    def _rel(self, path: Path) -> str:
        return str(path.relative_to(self.workspace)) or "."

    # --- the tools ----------------------------------------------------------------------------------

    def _list_files(self, path: str = ".") -> ToolResult:
        """List the files under a directory of the workspace (recursively; .git and target are skipped).

        path: Directory relative to the workspace root; default '.'.
        """
        base = self._inside(path)
        if not base.exists():
            raise Refused(f"'{path}' does not exist")
        files = [self._rel(p) for p in _walk(base, self.workspace)]
        shown = files[:MAX_LIST]
        text = "\n".join(shown) or "(no files)"
        if len(files) > MAX_LIST:
            text += f"\n(... {len(files) - MAX_LIST} more files; list a subdirectory to see them)"
        return ToolResult(True, text, {"path": path, "count": len(files)})

    def _read_file(self, path: str, start_line: int = 1, end_line: int | None = None) -> ToolResult:
        """Read a text file with line numbers (the numbers are not part of the file). At most {MAX_READ_LINES} lines per
        call.

        path: File path relative to the workspace root, e.g. src/main.rs.
        start_line: First line to show (1-based); default 1.
        end_line: Last line to show (inclusive); default the end of the file.
        """
        file = self._existing_file(path)
        lines = _text(self.workspace, file).splitlines()
        if not lines:
            return ToolResult(True, f"{self._rel(file)} is empty", {"path": self._rel(file), "start": 0, "end": 0})
        if end_line is not None and end_line < start_line:
            raise Refused(f"end_line {end_line} is before start_line {start_line}")
        start = max(start_line, 1)
        end = min(end_line or len(lines), len(lines), start + MAX_READ_LINES - 1)
        if start > len(lines):
            raise Refused(f"{path} has {len(lines)} lines; start_line {start_line} is past the end")
        body = "\n".join(_numbered(lines, start, end))
        more = f" (more: call read_file with start_line={end + 1})" if end < len(lines) else ""
        return ToolResult(
            True,
            f"{self._rel(file)}: lines {start}-{end} of {len(lines)}{more}\n{body}",
            {"path": self._rel(file), "start": start, "end": end},
        )

    def _search(self, pattern: str, path: str = ".") -> ToolResult:
        """Search the workspace's text files for a Python regular expression; returns path:line: text (at most
        {MAX_SEARCH_RESULTS} matches).

        pattern: Regular expression, e.g. 'fn main' or 'struct \\w+Config'.
        path: Directory or file to search; default '.'.
        """
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise Refused(f"invalid regular expression {pattern!r}: {exc}") from None
        base = self._inside(path)
        hits: list[str] = []
        total = 0
        for file in _walk(base, self.workspace):
            for number, line in _search_file(self.workspace, file, regex):
                total += 1
                if len(hits) < MAX_SEARCH_RESULTS:
                    hits.append(f"{self._rel(file)}:{number}: {line.strip()[:200]}")
        text = "\n".join(hits) or f"no match for {pattern!r}"
        if total > len(hits):
            text += f"\n(... {total - len(hits)} more matches; narrow the pattern or the path)"
        return ToolResult(True, text, {"pattern": pattern, "matches": total})

    def _write_file(self, path: str, content: str) -> ToolResult:
        """Create or overwrite a file with the complete content given. Write the whole file: placeholders such as
        '// ... existing code' are refused.

        path: File path relative to the workspace root.
        content: The complete new content of the file.
        """
        file = self._writable(path)
        _refuse_placeholder(content, "")
        if len(content.encode()) > MAX_FILE_BYTES:
            raise Refused(f"content is larger than {MAX_FILE_BYTES} bytes; split it into modules")
        created = not file.exists()
        _replace_file(self.workspace, file, content.encode())
        lines = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
        verb = "created" if created else "overwrote"
        return ToolResult(
            True,
            f"{verb} {self._rel(file)} ({lines} lines)",
            {"path": self._rel(file), "lines": lines, "created": created},
        )

    def _edit_file(self, path: str, search: str, replace: str) -> ToolResult:
        """Replace one exact occurrence of `search` in a file by `replace`. `search` must match the file exactly,
        whitespace included, and only once (add surrounding lines to make it unique). Write real code in `replace`,
        never placeholders such as '// ... existing code'.

        path: File path relative to the workspace root.
        search: The exact text to find (copied from read_file output, without the line numbers).
        replace: The text to put in its place (may be empty to delete).
        """
        file = self._writable(path)
        if not file.is_file():
            raise Refused(f"'{path}' does not exist; use write_file to create it")
        if not search:
            raise Refused("`search` is empty; copy the exact lines to replace from read_file output")
        text = _text(self.workspace, file)
        _refuse_placeholder(replace, search)
        count = text.count(search)
        if count == 0:
            raise Refused(_no_match(self._rel(file), text, search))
        if count > 1:
            starts = _match_lines(text, search)
            raise Refused(
                f"`search` matches {count} times in {self._rel(file)} (at lines {', '.join(map(str, starts))}); "
                "include more surrounding lines to make it unique"
            )
        offset = text.index(search)
        new = text[:offset] + replace + text[offset + len(search) :]
        _replace_file(self.workspace, file, new.encode())
        first = text.count("\n", 0, offset) + 1
        return ToolResult(
            True,
            _edit_report(self._rel(file), new, first, replace),
            {
                "path": self._rel(file),
                "line": first,
                "removed": search.count("\n") + 1,
                "added": replace.count("\n") + 1,
            },
        )

    def _cargo_check(self) -> ToolResult:
        """Run `cargo check --all-targets` in the sandbox; returns the compiler errors (deduplicated, first errors
        first)."""
        return self._cargo("check", ["--bins", *ACCEPTANCE_TARGET] if self.only_acceptance else ["--all-targets"])

    def _run_tests(self, filter: str | None = None) -> ToolResult:
        """Run `cargo test` in the sandbox (all tests, the frozen acceptance tests included); returns compiler errors or
        failing tests with their panic messages.

        filter: Only run tests whose name contains this text; default all.
        """
        return self._cargo("test", (ACCEPTANCE_TARGET if self.only_acceptance else []) + ([filter] if filter else []))

    def _cargo(self, subcommand: str, extra: list[str]) -> ToolResult:
        if subcommand == "test":
            self.before_test()
        report = run_cargo(
            self.sandbox, self.cargo, subcommand, cwd=self.crate_dir, extra=extra, timeout=self.command_timeout
        )
        data = {
            "green": report.ok,
            "failure_key": sorted(report.failure_key()),
            "errors": report.error_count,
            "tests_passed": report.passed,
            "tests_failed": report.failed,
            "timed_out": report.timed_out,
            "seconds": round(report.seconds, 3),
            "argv": report.result.argv if report.result else [],
        }
        return ToolResult(True, report.summary(), data, report)

    def _add_dependency(self, name: str, version: str | None = None, features: list[str] | None = None) -> ToolResult:
        """Add a crate to [dependencies] with `cargo add` from the configured crate registry, and fetch it for the
        (offline) builds.

        name: Crate name, e.g. anyhow.
        version: Version requirement, e.g. 1.0; default the newest available.
        features: Features to enable.
        """
        spec = _dependency_spec(name, version, features or [])
        if not (self.crate_dir / "Cargo.toml").is_file():
            raise Refused(f"no Cargo.toml in {self._rel(self.crate_dir)}")
        if self._manifests is not None:
            return self._add_online(name, spec)
        result = self.sandbox.run(
            self.cargo.argv("add", *spec), cwd=self.crate_dir, env=self.cargo.env(), timeout=self.command_timeout or 120
        )
        output = (result.stderr + result.stdout).strip()
        if not result.ok:
            return ToolResult(
                False,
                f"cargo add {' '.join(spec)} failed:\n{output[-3000:]}",
                {"error": "failed", "argv": result.argv, "returncode": result.returncode},
            )
        return ToolResult(
            True,
            output or f"added {name}",
            {"crate": name, "version": version, "features": features or [], "argv": result.argv},
        )

    def _add_online(self, name: str, spec: list[str]) -> ToolResult:
        """`cargo add` as a trusted host call (it resolves against the registry, runs no crate code), then the host fetch;
        when either fails the manifests are put back and cargo's error is the result."""
        assert self._manifests is not None
        before = self._manifests.snapshot()
        added = self.cargo.run(["add", *spec], self.crate_dir, timeout=self.command_timeout or 300)
        if added.returncode != 0:
            self._manifests.restore(before)
            return ToolResult(
                False,
                f"cargo add {' '.join(spec)} failed: {cargo_error(added.stderr)}",
                {"error": "failed", "returncode": added.returncode},
            )
        fetched = sync(self.cargo, self.crate_dir, timeout=self.command_timeout or 600)
        if not fetched.ok:
            self._manifests.restore(before)
            return ToolResult(
                False,
                f"cargo add {' '.join(spec)} was undone: {fetched.summary()}",
                {"error": "failed", "fetch_error": fetched.error},
            )
        self._manifests.changed()  # fetched already: no second fetch after this call
        output = "\n".join(
            line.strip()
            for line in added.stderr.splitlines()
            if line.strip() and not line.strip().startswith("Updating ")
        )
        return ToolResult(
            True,
            f"{output or 'added ' + name}\n{fetched.summary()}",
            {"crate": name, "spec": spec, "downloaded": fetched.downloaded},
        )

    def _done(self, summary: str) -> ToolResult:
        """Say the work is finished. flakebot then runs the tests itself; the loop ends only if they pass.

        summary: What you changed and how the tool is used.
        """
        return ToolResult(
            True,
            "Noted. flakebot now runs the tests itself; the work ends only if they pass.",
            {"done": True, "summary": summary},
        )

    def _existing_file(self, path: str) -> Path:
        file = self._inside(path)
        if not file.is_file():
            raise Refused(
                f"'{path}' is {'a directory' if file.is_dir() else 'not a file in the workspace'}; call list_files to see the files"
            )
        return file


# The model's tools, declared by the methods themselves (flakebot.toolschema): name, description and parameters.
TOOLS = [
    declare(Toolbox._list_files),
    declare(Toolbox._read_file),
    declare(Toolbox._search),
    declare(Toolbox._write_file, writes=True),
    declare(Toolbox._edit_file, writes=True),
    declare(Toolbox._cargo_check),
    declare(Toolbox._run_tests),
    declare(Toolbox._add_dependency, writes=True),
    declare(Toolbox._done),
]


def _walk(base: Path, workspace: Path) -> Iterator[Path]:
    """Regular files under `base` (sorted), skipping .git/target and anything leading out of the workspace."""
    if base.is_file():
        yield base
        return
    for root, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not git_reason(d))
        for name in sorted(files):
            path = Path(root) / name
            if git_reason(name):
                continue
            if path.is_file() and path.resolve().is_relative_to(workspace):
                yield path


def _search_file(workspace: Path, file: Path, regex: re.Pattern[str]) -> Iterator[tuple[int, str]]:
    try:
        data = _bytes(workspace, file)
    except UnsafePath:  # too large, or no longer a regular file reached without a link: not searched
        return
    if b"\0" in data[:8192]:
        return
    for number, line in enumerate(data.decode(errors="replace").splitlines(), 1):
        if regex.search(line):
            yield number, line


def _text(workspace: Path, file: Path) -> str:
    try:
        data = _bytes(workspace, file)
    except UnsafePath as exc:
        rel = file.relative_to(workspace)
        if exc.details.get("rule") == "too-large":
            raise Refused(
                f"{rel} is larger than {MAX_FILE_BYTES} bytes; read_file and edit_file take files up to that"
            ) from None
        raise Refused(f"{rel} is not a regular file reached without a symbolic link; it was not read") from None
    if b"\0" in data[:8192]:
        raise Refused(f"{file.name} is a binary file")
    return data.decode()


def _bytes(workspace: Path, file: Path) -> bytes:
    """`file`'s bytes, read beneath the workspace through safefs (no link followed; a regular file only) and at most
    MAX_FILE_BYTES of them: the sandbox writes this tree, and a sparse file of gigabytes read whole would be the
    host's memory."""
    return Tree(workspace).read_bytes(str(file.relative_to(workspace)), limit=MAX_FILE_BYTES)


def _numbered(lines: list[str], start: int, end: int) -> list[str]:
    out = []
    for number in range(start, end + 1):
        line = lines[number - 1]
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + f" [... {len(line) - MAX_LINE_CHARS} more characters]"
        out.append(f"{number:6}\t{line}")
    return out


def _refuse_placeholder(text: str, search: str) -> None:
    """Refuse '// ... existing code' and the like, unless the same line is in the text being replaced."""
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() and line.strip() not in search and any(p.search(line) for p in PLACEHOLDERS):
            raise Refused(
                f"line {number} of the new text is a placeholder ({line.strip()[:80]!r}). Write the real code: "
                "edit_file replaces only the `search` text, so unchanged code need not be repeated; write_file needs the complete file"
            )


def _no_match(rel: str, text: str, search: str) -> str:
    """The refusal for a search text that is not in the file, showing the most similar lines."""
    lines = text.splitlines()
    target = search.splitlines() or [search]
    start, ratio = _closest(lines, target)
    if not lines or ratio < 0.3:
        return f"`search` was not found in {rel} and nothing in it is similar; read_file {rel} and copy the exact text"
    end = min(start + len(target), len(lines))
    hint = ""
    if [s.strip() for s in lines[start:end]] == [s.strip() for s in target]:
        hint = " They differ from `search` only in whitespace or indentation."
    shown = "\n".join(_numbered(lines, max(start - 1, 1), min(end + 2, len(lines))))
    return (
        f"`search` was not found in {rel}. The closest lines ({ratio:.0%} similar) are {start + 1}-{end}:{hint}\n{shown}\n"
        "Copy the text exactly, whitespace included, without the line numbers."
    )


def _closest(lines: list[str], target: list[str]) -> tuple[int, float]:
    """Index of the window of len(target) lines most similar to `target` (difflib), and the similarity."""
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2("\n".join(target))
    best = (0, 0.0)
    for i in range(max(len(lines) - len(target) + 1, 1)):
        matcher.set_seq1("\n".join(lines[i : i + len(target)]))
        if matcher.real_quick_ratio() > best[1] and matcher.quick_ratio() > best[1]:
            ratio = matcher.ratio()
            if ratio > best[1]:
                best = (i, ratio)
    return best


def _match_lines(text: str, search: str) -> list[int]:
    starts, offset = [], text.find(search)
    while offset >= 0:
        starts.append(text.count("\n", 0, offset) + 1)
        offset = text.find(search, offset + len(search))
    return starts


def _edit_report(rel: str, new: str, first: int, replace: str) -> str:
    lines = new.splitlines()
    last = first + max(replace.count("\n"), 0)
    shown = "\n".join(_numbered(lines, max(first - 2, 1), min(last + 2, len(lines)))) if lines else ""
    return f"edited {rel} at line {first}; the lines around the change now read:\n{shown}"


def _dependency_spec(name: str, version: str | None, features: list[str]) -> list[str]:
    if not CRATE_NAME.match(name):
        raise Refused(f"'{name}' is not a crate name (letters, digits, '-' and '_')")
    if version is not None and not VERSION_REQ.match(version.strip()):
        raise Refused(f"'{version}' is not a version requirement such as 1.0 or ^0.4.2")
    bad = [f for f in features if not FEATURE.match(f)]
    if bad:
        raise Refused(f"invalid feature name(s): {', '.join(bad)}")
    spec = [f"{name}@{version.strip()}" if version else name]
    return spec + (["--features", ",".join(features)] if features else [])


def _replace_file(workspace: Path, path: Path, content: bytes) -> None:
    """Write `content` to `path` atomically, replacing whatever is there (a file, a symlink, a directory). The
    workspace is the sandbox's to write between calls: the write goes through flakebot.safefs, beneath the
    workspace's descriptor, so a link swapped in after `_inside` checked the path is refused, never followed."""
    tree, rel = Tree(workspace), str(path.relative_to(workspace))
    try:
        info: os.stat_result | None = tree.lstat(rel)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISDIR(info.st_mode):
        tree.remove(rel)
    mode = stat.S_IMODE(info.st_mode) if info is not None and stat.S_ISREG(info.st_mode) else 0o644
    # not synced: after a crash the edit stage starts over from edit_base (git reset), as unsynced as cargo's writes
    tree.write_bytes(rel, content, mode=mode, sync=False)
