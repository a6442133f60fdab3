"""Checks that run before any paid or long step: a request that cannot succeed fails at once, with one line, instead
of after the spec stage has called the model or the build has run.

    check_text(kind, text, example)    a need or an improvement: non-empty, UTF-8, bounded
    check_writable_dir(path, setting)  a directory flakebot will write (runs, catalog): creatable, writable
    check_path_name(path, what)        a name a file can have (no ENAMETOOLONG from asking whether it exists)
    check_free_space(path, least_mb)   room for a craft's workspace and target dir
    check_registry(settings, registry) the registry exists and --offline agrees with it
    check_request_flags(fork, push, delete_fork)
    host_error(exc)                    an OSError that is the machine's trouble, as a HostError (else None)

A HostError is never fed to the model: the edit loop stops with it (exit 5) instead of asking the model to fix it.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from flakebot.config import Settings
from flakebot.errors import HostError, UsageError

NEED_LIMIT = 4000  # characters: a need is a sentence or a paragraph; an argument list has room for it
FREE_SPACE_MB = 1024  # a craft's workspace, target dir and flake need about this much at the least
WORKING_FLOOR_MB = 100  # below this, mid-run, a failing build is the disk's doing, not the model's
NAME_MAX, PATH_MAX = 255, 4096  # bytes: a path's part, and the whole path (Linux's limits)
HOST_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is spent",
    errno.EROFS: "the file system is read-only",
}


def check_text(kind: str, text: str, example: str, limit: int = NEED_LIMIT) -> None:
    """`text` (a need, an improvement) is something a model and a catalog can hold; `example` shows a good one."""
    if not text.strip():
        raise UsageError(f"the {kind} is empty", fix=f"say what you want, e.g. {example}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(
            f"the {kind} is not valid UTF-8 text",
            fix=f"pass the {kind} as UTF-8 (check the terminal's or file's encoding)",
        ) from None
    if len(text) > limit:
        raise UsageError(
            f"the {kind} is {len(text):,} characters, more than {limit:,}",
            fix="say it in fewer words; put examples in a --spec file instead",
        )


def check_path_name(path: str | Path, what: str) -> None:
    """`path` is a name a file can have: no part past NAME_MAX bytes, the whole below PATH_MAX. Past them every
    system call fails with ENAMETOOLONG, an OSError where a check only asked whether the path exists."""
    encoded = os.fsencode(path)
    if len(encoded) >= PATH_MAX or any(len(part) > NAME_MAX for part in encoded.split(b"/")):
        text = str(path)
        shown = text if len(text) <= 64 else text[:64] + "..."
        raise UsageError(f"{what} {shown} is too long for a file name", fix=f"pass a shorter {what}")


def check_writable_dir(path: Path, setting: str, fix: str | None = None) -> None:
    """`path` is a directory flakebot can create and write (checked before a run, not when its result is stored). Tried
    for real, by making the directory and a file in it: root passes every permission check but not a read-only mount.
    `fix`: what to say instead of pointing the setting elsewhere (for a directory that is no setting, a run's)."""
    if path.exists() and not path.is_dir():
        raise HostError(
            f"{setting} {path} is not a directory", fix=fix or f"point {setting} at a directory, or remove {path}"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".flakebot-probe-", dir=path)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise HostError(
            f"{setting} {path} is not writable ({exc.strerror or exc})",
            fix=fix or f"make {path} writable, or point {setting} at a writable directory",
        ) from None


def check_could_be_dir(path: Path, setting: str, fix: str | None = None) -> None:
    """`path` is a directory, or one could be made there: its nearest existing ancestor is a directory in which the
    first missing component can be made (tried with a probe directory beside it, removed again, so nothing is left and
    a concurrent flakebot making the directory for real never sees it vanish). `fix`: what to say instead of
    pointing the setting elsewhere (for a path that is no setting, such as package's --out)."""
    fix = fix or f"point {setting} at a directory (--{setting.replace('_', '-')} DIR or FLAKEBOT_{setting.upper()})"
    check_path_name(path, setting)
    missing = path
    while not missing.parent.exists() and missing.parent != missing:
        missing = missing.parent
    if path.exists():
        if not path.is_dir():
            raise HostError(f"{setting} {path} is not a directory", fix=fix)
        return
    if not missing.parent.is_dir():
        raise HostError(f"{setting} {path} lies under {missing.parent}, which is not a directory", fix=fix)
    try:
        probe = tempfile.mkdtemp(prefix=".flakebot-probe-", dir=missing.parent)
    except OSError as exc:
        raise HostError(f"{setting} {path} cannot be made ({exc.strerror or exc})", fix=fix) from None
    os.rmdir(probe)


def check_free_space(path: Path, least_mb: int = FREE_SPACE_MB) -> None:
    """Room for a craft below `path` (its nearest existing ancestor)."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free_mb = shutil.disk_usage(existing).free // (1024 * 1024)
    if free_mb < least_mb:
        raise HostError(
            f"only {free_mb} MiB free on the disk holding {path}; a craft needs at least {least_mb} MiB",
            fix="free space there, or point workdir at another disk",
        )


def check_registry(settings: Settings, registry: str | None) -> None:
    """The registry named (or configured) can serve this request: a path exists, offline agrees with it."""
    choice = registry or settings.registry or "auto"
    if choice == "crates-io" and settings.offline:
        raise UsageError(
            "--registry crates-io cannot be used offline",
            fix="drop --offline (or the offline setting), or use '--registry local'",
        )
    if choice not in ("crates-io", "auto", "local"):
        from flakebot.crates.registries import is_directory

        if not is_directory(choice):
            shown = choice if len(choice) <= 64 else choice[:64] + "..."
            raise UsageError(
                f"the registry {shown} is not a directory",
                fix="pass crates-io, local, auto or the path of a cargo directory source (e.g. /usr/share/cargo/registry)",
            )
    elif (choice == "local" or settings.offline) and not Path(settings.local_registry).is_dir():
        raise UsageError(
            f"the local registry {settings.local_registry} does not exist",
            fix="install Debian's packaged crates (make setup) or set local_registry to a cargo directory source",
        )


def check_request_flags(fork: bool, push: bool, delete_fork: bool) -> None:
    """Flags that only mean something together."""
    for flag, given in (("--push", push), ("--delete-fork", delete_fork)):
        if given and not fork:
            raise UsageError(f"{flag} needs --fork", fix=f"add --fork, or drop {flag}")


def host_error(exc: OSError) -> HostError | None:
    """The machine's trouble behind `exc` (a full disk, a read-only file system), or None when it is something else."""
    what = HOST_ERRNOS.get(exc.errno or 0)
    if what is None:
        return None
    where = exc.filename or "a file flakebot writes"
    return HostError(
        f"{what}: cannot write {where}", fix="free space (or make it writable), then 'flakebot resume RUN'"
    )
