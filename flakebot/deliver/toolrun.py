"""Running a catalogued tool for its caller: its built store path, in the sandbox.

A crafted tool is model-written code, so every run of it goes through the same sandbox as the edit loop
(`sandbox` setting, "required" by default): the working directory is the one writable place, the paths
its arguments name outside it are readable, its store path and the system are read-only, and it gets no
network, a minimal environment (no API keys) and private /tmp and HOME. `nix run` of the flake (the
manifest's command) is what a user runs by hand; flakebot runs the same store path, sandboxed.
"""

from __future__ import annotations

import json
import logging
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.errors import CatalogError
from flakebot.nix import command
from flakebot.sandbox import CommandResult, Sandbox, limits_for, open_sandbox

logger = logging.getLogger(__name__)


def built_program(manifest: dict[str, Any], timeout: float) -> Path:
    """The tool's binary in the store; a store path that is gone (collected) is built again from its flake first."""
    main = manifest.get("main_program") or manifest.get("name", "")
    binary = Path(manifest.get("store_path") or "/nonexistent") / "bin" / main
    if binary.is_file():
        return binary
    if manifest.get("nix_run_argv"):
        logger.info("%s is not in the store; building the tool's flake again", binary)
        binary = Path(_realise(manifest["nix_run_argv"], timeout)) / "bin" / main
        if binary.is_file():
            return binary
    raise CatalogError(
        f"tool '{manifest.get('name')}' has no built program", fix="craft it again with 'flakebot craft --fresh'"
    )


def _realise(nix_run: list[str], timeout: float) -> str:
    """`nix build` of the flake `nix run` would run (same nixpkgs, flakebot's machine options); its store path."""
    flake, mode, standin = command.run_target(nix_run)
    argv = command.nix_argv(["build"], ["--no-link", "--json", flake], mode, standin)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    try:
        return str(json.loads(done.stdout)[0]["outputs"]["out"])
    except (json.JSONDecodeError, LookupError, TypeError):
        raise CatalogError(
            f"the tool's flake does not build again: {(done.stderr.strip().splitlines() or ['no output'])[-1]}",
            fix="craft it again with 'flakebot craft --fresh'",
        ) from None


def named_paths(args: list[str], cwd: Path) -> list[Path]:
    """Existing files and directories the arguments name outside `cwd` (`PATH` or `--opt=PATH`): the tool may read them."""
    found = []
    for arg in args:
        for text in {arg, arg.partition("=")[2]} - {""}:
            path = (cwd / text) if not Path(text).is_absolute() else Path(text)
            try:
                if path.exists() and not path.resolve().is_relative_to(cwd.resolve()):
                    found.append(path.resolve())
            except (OSError, ValueError):  # not a path after all (too long, NUL bytes)
                continue
    return found


@contextmanager
def tool_sandbox(
    binary: Path, args: list[str], cwd: Path, settings: Settings, timeout: float
) -> Iterator[tuple[Sandbox, Path]]:
    """The sandbox for one run of a tool, and the directory it runs in: `cwd` writable, or a scratch directory
    when `cwd` is / (which would bind the whole machine writable)."""
    with tempfile.TemporaryDirectory(prefix="flakebot-tool-") as scratch:
        where = Path(scratch) if cwd.resolve() == Path("/") else cwd.resolve()
        readable = [binary.parent, *named_paths(args, cwd)]
        limits = limits_for(settings, timeout=timeout)
        yield open_sandbox(settings.sandbox, workspace=where, writable=[where], readable=readable, limits=limits), where


def run_captured(
    manifest: dict[str, Any], args: list[str], stdin: str | None, *, settings: Settings, cwd: Path | None = None
) -> CommandResult:
    """Run the tool in the sandbox with its output captured (capped) and `settings.tool_timeout`; `stdin` None
    passes the caller's own standard input as it is (the tool decides whether to read it)."""
    timeout = settings.tool_timeout
    binary = built_program(manifest, settings.nix_build_timeout)
    with tool_sandbox(binary, args, cwd or Path.cwd(), settings, timeout) as (sandbox, where):
        if stdin is not None:
            return sandbox.run([str(binary), *args], cwd=where, stdin=stdin, timeout=timeout)
        return _inheriting_stdin(sandbox, [str(binary), *args], where, timeout)


def _inheriting_stdin(sandbox: Sandbox, argv: list[str], cwd: Path, timeout: float) -> CommandResult:
    full, env = sandbox.command(argv, cwd=cwd)
    start = time.perf_counter()
    try:
        done = subprocess.run(full, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:  # bubblewrap dies with its parent's kill, and the tool with it
        out, err = (_text(expired.stdout), _text(expired.stderr))
        return CommandResult(argv, -9, out, err, time.perf_counter() - start, timed_out=True)
    return CommandResult(argv, done.returncode, done.stdout, done.stderr, time.perf_counter() - start)


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def run_attached(
    manifest: dict[str, Any], args: list[str], *, settings: Settings, stdin: str | None = None, cwd: Path | None = None
) -> int:
    """Run the tool in the sandbox attached to the caller's terminal: the caller's stdin (or `stdin`), stdout and
    stderr as they come, no timeout (the caller stops it); returns its exit code."""
    binary = built_program(manifest, settings.nix_build_timeout)
    with tool_sandbox(binary, args, cwd or Path.cwd(), settings, settings.tool_timeout) as (sandbox, where):
        argv, env = sandbox.command([str(binary), *args], cwd=where)
        proc = subprocess.Popen(argv, cwd=where, env=env, stdin=subprocess.PIPE if stdin is not None else None)
        try:
            if proc.stdin is not None:
                _feed(proc.stdin, stdin or "")
            return proc.wait()
        finally:  # also on Ctrl-C: bubblewrap (--die-with-parent) takes the tool down with it
            if proc.poll() is None:
                proc.terminate()
                proc.wait()


def _feed(pipe: Any, text: str) -> None:
    try:
        pipe.write(text.encode())
        pipe.close()
    except BrokenPipeError:  # the tool stopped reading: its exit code says how it ended
        pass
