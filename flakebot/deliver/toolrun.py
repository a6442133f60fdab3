"""Running a catalogued tool for its caller: its built store path, in the sandbox.

A crafted tool is model-written code, so every run of it goes through the same sandbox as the edit loop
(`sandbox` setting, "required" by default). It sees only what its caller names: it runs at the caller's
directory path, but that directory is an empty scratch directory there; the existing paths its arguments name
are bound in read-only at the path the argument spells (relative arguments still resolve). A named directory
that holds a socket, FIFO or device is refused as a named socket is: only files and directories reach the tool.
The paths the caller lists as writable must lie beneath a grant root the user allowed (flakebot.deliver.grants:
the allow list decides first), and are never mounted writable: the tool writes a copy of each
(flakebot.deliver.writelayer), bound at every spelling of the path, and flakebot copies back only regular files and
directories, nothing under a name host programs read as configuration (.git, flakebot.toml, .envrc, ...).
/, the home directory, ancestors of the working directory, host state (/proc, /dev, /run, ...) and paths holding a
masked secret are refused as arguments; the secret masks come last, so no bind uncovers them. Its store path and
the system are read-only; no network, a minimal environment (no API keys), private /tmp and HOME, and as root an
unused uid without capabilities. `nix run` of the flake (the manifest's command) is what a user runs by hand;
flakebot runs the same store path, sandboxed. With the sandbox off the tool runs in the caller's directory with
the caller's rights.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flakebot import launcher
from flakebot.config import Settings
from flakebot.deliver import grants, outputfiles, writelayer
from flakebot.errors import CatalogError, UsageError
from flakebot.sandbox import BwrapSandbox, CommandResult, Sandbox, limits_for, open_sandbox
from flakebot.sandbox.bubblewrap import SYSTEM_DIRS, secret_files
from flakebot.sandbox.process import MIB, Spill, execute
from flakebot.trust import steering_name

logger = logging.getLogger(__name__)


def built_program(manifest: dict[str, Any], timeout: float) -> Path:
    """The tool's binary in the store; a store path that is gone (collected) is built again from its flake first."""
    main: str = manifest.get("main_program") or manifest.get("name", "")
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
    from flakebot.nix import command  # only for a collected store path: most calls never need nix

    flake, mode, standin = command.run_target(nix_run)
    argv = command.nix_argv(["build"], ["--no-link", "--json", flake], mode, standin)
    done = launcher.run(argv, capture_output=True, text=True, timeout=timeout)
    try:
        return str(json.loads(done.stdout)[0]["outputs"]["out"])
    except (json.JSONDecodeError, LookupError, TypeError):
        raise CatalogError(
            f"the tool's flake does not build again: {(done.stderr.strip().splitlines() or ['no output'])[-1]}",
            fix="craft it again with 'flakebot craft --fresh'",
        ) from None


# Host state, not data: naming these would hand a tool the machine's processes, devices or sockets.
HOST_STATE = tuple(Path(p) for p in ("/proc", "/sys", "/dev", "/run", "/var/run"))
SYSTEM = tuple(Path(p) for p in (*SYSTEM_DIRS, "/nix"))  # read-only in the sandbox already; never writable


@dataclass(frozen=True)
class Bind:
    """One path a caller named: `source` (symlinks resolved) shown at `dest` (as the argument spells it)."""

    arg: str
    source: Path
    dest: Path
    writable: bool = False
    root: Path | None = None  # a writable path's grant root: the host side is opened there, no link below followed


def named_paths(args: list[str], cwd: Path) -> list[Bind]:
    """The existing files and directories the arguments name (`PATH` or `--opt=PATH`, relative to `cwd`): the tool
    may read them, each at the path the argument spells (and at its real path)."""
    found = []
    for arg in args:
        for text in dict.fromkeys([arg, arg.partition("=")[2]]):
            bind = _bind(arg, text, cwd)
            if bind is not None:
                found.append(bind)
    return found


def writable_paths(paths: list[str], cwd: Path, settings: Settings) -> list[Bind]:
    """The paths the caller lets the tool write (`--writable`, MCP `writable`): each must exist and lie beneath a
    grant root (deliver.grants: the allow list decides first), and none may hold or lie in flakebot's own
    directories (Settings.own_dirs: a tool there could rewrite what runs next)."""
    binds: list[Bind] = []
    if not paths:
        return binds
    allowed, own = grants.grants(settings, cwd), settings.own_dirs()
    for text in paths:
        resolved = _resolved(text, cwd)
        if resolved is not None:  # before anything else is looked at: the allow list decides first
            allowed.check(text, resolved)
        bind = _bind(text, text, cwd, writable=True)
        if bind is not None and any(bind.source.is_relative_to(d) or d.is_relative_to(bind.source) for d in own):
            raise UsageError(
                f"--writable path '{text}' holds or lies in flakebot's own files (catalog, caches, workdir or config)",
                fix="let the tool write a file or directory of your own, e.g. --writable ./out",
            )
        if bind is None:
            raise UsageError(
                f"writable path '{text}' does not exist",
                fix=f"create it first (mkdir -p {text}, or touch {text} for a file), then run the tool again",
            )
        reader = steering_name(bind.dest) or steering_name(bind.source)
        if reader:
            raise UsageError(
                f"--writable path '{text}' is read as configuration by {reader}: a tool's writes land only as data",
                fix="let the tool write a data file or directory, e.g. --writable ./out",
            )
        # the path staged and copied back is the bind's ('..' folded before links): it must lie beneath a root too
        binds.append(dataclasses.replace(bind, root=allowed.check(text, bind.source)))
    return binds


def _refuse_team_reads(args: list[str], named: list[Bind], cwd: Path, settings: Settings) -> None:
    """A tenant's call (team mode) shows a tool no file of flakebot's own (Settings.own_dirs), nor a directory holding
    one: they hold every tenant's catalog and signing keys, runs and services, and the token store, and a tool reading
    its argument would hand them to the caller. A path spelled into them is refused whether it exists or not (else
    the refusal would tell which of another tenant's files exist). A lone user's own files are the user's to name."""
    if not settings.tenant:
        return
    own = settings.own_dirs()
    spelled = [(arg, text) for arg in args for text in dict.fromkeys([arg, arg.partition("=")[2]]) if "/" in text]
    for arg, source in [*((a, _resolved(t, cwd)) for a, t in spelled), *((b.arg, b.source) for b in named)]:
        if source is not None and any(source.is_relative_to(d) or d.is_relative_to(source) for d in own):
            raise UsageError(
                f"argument '{arg}' names a path that holds or lies in flakebot's own files (catalogs, keys, runs, "
                "services): refusing to show it to the tool",
                fix="name only the files or directories of your own the tool needs (e.g. ./data.csv)",
            )


def _resolved(text: str, cwd: Path) -> Path | None:
    """`text` from `cwd` with every link followed and '..' folded; None when it is no path."""
    try:
        return Path(os.path.realpath(cwd / text)) if text and text != "-" else None
    except (OSError, ValueError):
        return None


def _bind(arg: str, text: str, cwd: Path, *, writable: bool = False) -> Bind | None:
    if not text or text == "-":
        return None
    try:
        dest = Path(os.path.normpath(cwd / text))
        source = Path(os.path.realpath(dest if Path(text).is_absolute() else cwd / text))
        if not source.exists():
            return None
    except (OSError, ValueError):  # not a path after all (too long, NUL bytes)
        return None
    problem = _refusal(source, dest, cwd, writable)
    if problem:
        what = "--writable path" if writable else "argument"
        raise UsageError(
            f"{what} '{arg}' names {source}, {problem}: refusing to show it to the tool",
            fix="name only the files or directories the tool needs (e.g. ./data.csv, ./out/)",
        )
    return Bind(arg, source, dest, writable)


def _refusal(source: Path, dest: Path, cwd: Path, writable: bool) -> str:
    """Why the tool may not see `source` (at `dest`); '' when it may."""
    home = Path.home().resolve()
    if source == Path("/"):
        return "the whole machine"
    if source == home or home.is_relative_to(source):
        return "your home directory" if source == home else f"which holds your home directory {home}"
    if source != cwd and cwd.is_relative_to(source):
        return f"which holds the working directory {cwd}"
    if any(source.is_relative_to(d) for d in HOST_STATE):
        return "host state, not data"
    if not (source.is_file() or source.is_dir()):
        return "not a regular file or directory (a socket, device or pipe)"
    if source.is_dir() and not _visible(source) and (special := _special_inside(source)):
        return f"which holds a {special[1]} ({special[0]}): only files and directories may reach the tool"
    if writable and any(source.is_relative_to(d) for d in SYSTEM):
        return "part of the system"
    # Named where it is, a system path needs no bind (the masks cover it); elsewhere (a symlink) it would uncover one.
    secrets = [str(f) for f in secret_files() if f.is_relative_to(source)]
    if secrets and (writable or dest != source):
        return f"which holds a secret file ({secrets[0]})"
    return ""


def _visible(path: Path) -> bool:
    """Whether the sandbox shows `path` already, read-only, with its secrets masked (the system directories)."""
    return any(path.is_relative_to(d) for d in SYSTEM_DIRS)


def _special_inside(directory: Path) -> tuple[Path, str] | None:
    """The first socket, FIFO or device under `directory` (links not followed), and its kind; None when there is none.
    Refused rather than hidden: a mask made now would not cover one made later, and the caller learns what it named."""
    for top, dirs, files in os.walk(directory):
        for name in [*dirs, *files]:
            kind = writelayer.kind_of(Path(top, name))
            if kind not in ("dir", "file", "link"):
                return Path(top, name), kind
    return None


def _binds(named: list[Bind], writable: list[Bind], layers: list[writelayer.Layer]) -> list[tuple[bool, Path, Path]]:
    """The sandbox's binds in order: named paths read-only, then each writable path's staged copy, at every
    spelling of it (the path the caller gave and its real path), so no spelling reaches the host's files."""
    binds: list[tuple[bool, Path, Path]] = []
    for bind in [*named, *writable]:
        source = _staged(bind.source, layers) if bind.writable else bind.source
        for dest in dict.fromkeys([bind.dest, bind.source]):
            if not _visible(dest):  # the system is shown read-only already (and a read-only mount takes no binds)
                binds.append((bind.writable, source, dest))
    return binds


def _stage(writable: list[Bind], root: Path, limit: int) -> list[writelayer.Layer]:
    """One staged copy per outermost writable path (a writable path inside another is part of its copy)."""
    tops: list[Bind] = []
    for bind in sorted(writable, key=lambda b: len(b.source.parts)):
        if not any(bind.source.is_relative_to(top.source) for top in tops):
            tops.append(bind)
    return [
        writelayer.stage(top.source, root, index, limit, base=top.root.parent if top.root else None)
        for index, top in enumerate(tops)
    ]


def _staged(source: Path, layers: list[writelayer.Layer]) -> Path:
    layer = next(layer for layer in layers if source.is_relative_to(layer.host))
    return layer.stage / source.relative_to(layer.host)


def _copy_back(layers: list[writelayer.Layer], limit: int) -> str:
    """Write the tool's data back to the caller's paths; what was not copied and why, as one line ('' when all
    was), also logged. The names are the tool's: quoted and escaped, so none reaches a terminal or agent as text."""
    why: dict[str, list[str]] = {}
    for layer in layers:
        for rel, reason in writelayer.copy_back(layer, limit):
            shown = str(layer.host / rel) if len(layers) > 1 else (layer.host.name if rel == "." else rel)
            why.setdefault(reason.split(" (")[0], []).append(json.dumps(shown))
    if not why:
        return ""
    where = ", ".join(json.dumps(str(layer.host)) for layer in layers)
    line = f"not copied back from the tool's writes in {where}: " + "; ".join(
        f"{reason}: {', '.join(paths)}" for reason, paths in why.items()
    )
    logger.warning("%s", line)
    return line


@contextmanager
def tool_sandbox(
    binary: Path,
    args: list[str],
    cwd: Path,
    settings: Settings,
    timeout: float,
    writable: list[str] | None = None,
    notes: list[str] | None = None,
) -> Iterator[tuple[Sandbox, Path]]:
    """The sandbox for one run of a tool, and the directory it runs in: the caller's directory path, but holding an
    empty scratch directory with only the paths the arguments name (read-only) and `writable` (read-write) bound
    in. Where the caller's directory is / or a system directory, the tool runs in the scratch directory itself."""
    cwd = cwd.resolve()
    named, allowed = [], []
    if settings.sandbox != "off":  # off, by request: a plain process in the caller's directory, as it always was
        named, allowed = named_paths(args, cwd), writable_paths(writable or [], cwd, settings)
        _refuse_team_reads(args, named, cwd, settings)
    limit = settings.sandbox_disk_mb * MIB
    with (
        tempfile.TemporaryDirectory(prefix="flakebot-tool-") as scratch,
        tempfile.TemporaryDirectory(prefix="flakebot-writes-") as staging,
    ):
        layers = _stage(allowed, Path(staging), limit)
        at = None if cwd == Path("/") or _visible(cwd) else cwd
        limits = dataclasses.replace(limits_for(settings, timeout=timeout), spill=output_spill(settings))
        sandbox = open_sandbox(
            settings.sandbox,
            workspace=Path(scratch),
            writable=[],
            readable=[binary.parent],
            limits=limits,
            workspace_at=at,
            binds=_binds(named, allowed, layers),
            # As root: an unused uid that owns only the scratch directory and the staged copies (the process limit
            # holds; root-only files stay unreadable). Nothing of the caller's is writable in the sandbox.
            adopt=True,
        )
        yield sandbox, (cwd if at or not isinstance(sandbox, BwrapSandbox) else Path(scratch))
        if isinstance(sandbox, BwrapSandbox):  # a plain process (auto, no bubblewrap) wrote the caller's paths itself
            left_out = _copy_back(layers, limit)
            if left_out and notes is not None:
                notes.append(left_out)
        _warn_discarded(Path(scratch), cwd if at else Path(scratch), sandbox)


def output_spill(settings: Settings) -> Spill:
    """A tool call's stdout comes back whole: up to tool_output_limit bytes in the result, past it in a file in
    the state directory's outputs/ (deliver.outputfiles: at most output_file_mb, the directory under outputs_mb)."""
    return outputfiles.spill(settings)


def _warn_discarded(scratch: Path, at: Path, sandbox: Sandbox) -> None:
    """Say which files the tool wrote into its scratch directory (gone now): the caller may have wanted them."""
    if not isinstance(sandbox, BwrapSandbox):
        return
    mounts = {dest for _, _, dest in sandbox.binds if dest.is_relative_to(at)}
    holders = mounts | {parent for dest in mounts for parent in dest.parents}
    written = [p.relative_to(scratch) for p in sorted(scratch.rglob("*")) if at / p.relative_to(scratch) not in holders]
    if written:
        # the names are the tool's: quoted and escaped (as _copy_back's), so none reaches a terminal as text
        shown = ", ".join(json.dumps(str(p)) for p in written[:5]) + (" ..." if len(written) > 5 else "")
        logger.warning(
            "the tool wrote %s in its scratch directory, discarded now: pass --writable . (MCP: writable) to let it "
            "write here, or --writable PATH for one existing file or directory",
            shown,
        )


def run_captured(
    manifest: dict[str, Any],
    args: list[str],
    stdin: str | None,
    *,
    settings: Settings,
    cwd: Path | None = None,
    writable: list[str] | None = None,
) -> CommandResult:
    """Run the tool in the sandbox with `settings.tool_timeout`, its stdout captured whole (past tool_output_limit
    in a file: CommandResult.stdout_file) and stderr capped; `stdin` None passes the caller's own standard input as
    it is (the tool decides whether to read it). What of its writes was not copied back is said after its stderr,
    as the other notes flakebot adds there (a caller over MCP sees no log)."""
    timeout = settings.tool_timeout
    binary = built_program(manifest, settings.nix_build_timeout)
    notes: list[str] = []
    with tool_sandbox(binary, args, cwd or Path.cwd(), settings, timeout, writable, notes) as (sandbox, where):
        if stdin is not None:
            result = sandbox.run([str(binary), *args], cwd=where, stdin=stdin, timeout=timeout)
        else:
            full, env = sandbox.command([str(binary), *args], cwd=where)  # as sandbox.run would, with caller's stdin
            result = execute([str(binary), *args], full, cwd=where, env=env, timeout=timeout, stdin=None,
                             output_cap=settings.output_cap, spill=output_spill(settings), inherit_stdin=True)  # fmt: skip
    if result.stdout_file:  # outputs/ stays under its quota: older files go
        notes += [note for note in [outputfiles.settle(settings, result.stdout_file)] if note]
    extra = "".join(f"\n[flakebot: {note}]\n" for note in notes)
    return dataclasses.replace(result, stderr=result.stderr + extra) if extra else result


def run_attached(
    manifest: dict[str, Any],
    args: list[str],
    *,
    settings: Settings,
    stdin: str | None = None,
    cwd: Path | None = None,
    writable: list[str] | None = None,
) -> int:
    """Run the tool in the sandbox attached to the caller's terminal: the caller's stdin (or `stdin`), stdout and
    stderr as they come, no timeout (the caller stops it); returns its exit code."""
    binary = built_program(manifest, settings.nix_build_timeout)
    with tool_sandbox(binary, args, cwd or Path.cwd(), settings, settings.tool_timeout, writable) as (sandbox, where):
        argv, env = sandbox.command([str(binary), *args], cwd=where)
        proc = launcher.popen(argv, cwd=where, env=env, stdin=subprocess.PIPE if stdin is not None else None)
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
