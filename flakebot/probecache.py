"""Answers of toolchain probes (`rustc -vV`, `rustc -V`, `rustc --print sysroot`, `nix --version`) and of the
sandbox's bubblewrap probe (sandbox/probed.py) remembered across processes: each craft is a new process, and asking
the same binaries the same questions cost about 0.1 s a craft.

An answer is kept under a digest of the question (argv, environment, directory) and of the stamp of every file it
depends on: the binary's resolved path, device, inode, size, mtime and ctime, and for rustup's proxies the files
that choose a toolchain. An update replaces or rewrites the binary, so its stamp changes and the question is asked
again. The record lives in flakebot's cache directory, never in a tree a model edited, and is written atomically; a
record that cannot be read or written only costs a probe.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from flakebot import launcher
from flakebot.fsutil import atomic_write_text, sha256_hex
from flakebot.homes import cache_home

logger = logging.getLogger(__name__)

KEPT = 64  # answers in the record: a machine has a few toolchains and one Nix
READ_LIMIT = 1024 * 1024  # a record is a few KB; a bigger one is not read whole (then it is not JSON: ignored)
_answers: dict[str, str] = {}  # this process's, by key
_lock = threading.Lock()


def stamp(path: Path | str) -> list[object]:
    """What identifies a file's content without reading it: resolved path, device, inode, size, mtime, ctime (a
    missing file has a stamp of its own, so its appearing changes the key)."""
    resolved = os.path.realpath(path)
    try:
        info = os.stat(resolved)
    except OSError as exc:
        return [resolved, "missing", exc.errno or 0]
    return [resolved, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def key(question: object, files: Iterable[Path | str]) -> str:
    """The digest an answer is kept under: the question (any JSON value) and the stamps of `files`."""
    material = json.dumps([question, [stamp(path) for path in files]], sort_keys=True, default=str)
    return sha256_hex(material.encode())  # not hashlib: the supervisor keys its sandbox probe here


def toolchain_choice(home: Path, where: str) -> list[Path]:
    """The files rustup's proxy reads to choose a toolchain (its settings, each installed toolchain's rustc, the
    toolchain files in `where` and above it): a question to the proxy is asked again when one changes, appears
    or goes away."""
    toolchains = home / "toolchains"
    files = [home / "settings.toml", toolchains]
    files += sorted(toolchains.glob("*/bin/rustc")) if toolchains.is_dir() else []
    if where:
        for directory in [Path(where), *Path(where).parents]:
            files += [directory / "rust-toolchain", directory / "rust-toolchain.toml"]
    return files


def remembered(question: object, files: Iterable[Path | str], ask: Callable[[], str]) -> str:
    """`ask()`'s answer to `question`, given again while the stamps of `files` (the binary first) are unchanged. An
    exception from `ask` is not kept: the next call asks again."""
    digest = key(question, files)
    kept = recalled(digest)
    if kept is not None:
        return kept
    answer = ask()
    keep(digest, answer)
    return answer


def recalled(digest: str) -> str | None:
    """The answer kept under `digest` (a `key`): this process's, else the record's; None when there is none."""
    with _lock:
        if digest in _answers:
            return _answers[digest]
    kept = _read().get(digest)
    if kept is not None:
        with _lock:
            _answers[digest] = kept
    return kept


def keep(digest: str, answer: str) -> None:
    """Keep `answer` under `digest`, in this process and in the record."""
    with _lock:
        _answers[digest] = answer
    _write(digest, answer)


def output(binary: Path | str, *args: str) -> str:
    """`binary args`'s standard output (a version probe: `rustc -vV`, `nix --version`), remembered while the
    binary's stamp is unchanged. Raises OSError or SubprocessError when it does not run or fails."""
    return remembered(
        [*args, str(binary)],
        [binary],
        lambda: launcher.run([str(binary), *args], capture_output=True, text=True, timeout=60, check=True).stdout,
    )


def forget() -> None:
    """Drop this process's answers (the record stays): the next call reads the record or asks."""
    with _lock:
        _answers.clear()


def record_path() -> Path:
    return cache_home() / f"probes-{os.geteuid()}.json"


def _read() -> dict[str, str]:
    """The record's answers; none from a link or a record that is not this user's alone (another user who could
    write it would choose the sysroot whose toolchain sandboxes mount, the version that keys dependency builds, and
    whether a sandbox is probed before it is used)."""
    try:
        fd = os.open(record_path(), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO: no hang
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            logger.warning("ignoring %s: not this user's alone (owner uid %d, mode %o)", record_path(), info.st_uid,
                           info.st_mode & 0o777)  # fmt: skip
            return {}
        try:
            record = json.loads(handle.read(READ_LIMIT))
        except ValueError:
            return {}
    if not isinstance(record, dict):
        return {}
    return {k: v for k, v in record.items() if isinstance(k, str) and isinstance(v, str)}


def _write(digest: str, answer: str) -> None:
    record = _read()
    record.pop(digest, None)
    record[digest] = answer  # newest last: the oldest are dropped past KEPT
    try:
        atomic_write_text(record_path(), json.dumps(dict(list(record.items())[-KEPT:])), durable=False)
    except OSError as exc:
        logger.debug("could not record a toolchain probe in %s: %s", record_path(), exc)
