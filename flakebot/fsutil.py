"""Small file-system helpers shared by run state, the catalog and caches."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any


def atomic_write_text(
    path: Path, text: str, *, durable: bool = True, synced: bool = True, parents: bool = True
) -> None:
    """Write `text` to `path` so readers see the old or the new file, never half of one. The file's bytes are on disk
    before the rename (without, a machine's crash may leave the new name on an empty file: XFS, ext4 without
    auto_da_alloc). `durable`: the rename too (fsync of the directory), so a crash keeps the new version; without,
    a crash of the machine (not of the process) may bring back the previous version, whole. Not `synced`: nothing
    is synced (a cache's entry, whose reader takes an empty or old file after a machine's crash for a miss).
    `parents`: the directory made first when missing (else FileNotFoundError)."""
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temporary_beside(path)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            if synced:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable and synced:
        _fsync_dir(path.parent)


def _temporary_beside(path: Path) -> tuple[int, Path]:
    """A new file (mode 0600) next to `path`, named `.NAME.RANDOM.tmp`: what tempfile.mkstemp does, without importing
    tempfile (and random, shutil's archivers) into every process that writes a record, such as a service's
    supervisor (benchmarks S5: its memory)."""
    while True:
        tmp = path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp"
        try:
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), tmp
        except FileExistsError:
            continue


def atomic_write_json(path: Path, data: Any, *, durable: bool = True) -> None:
    """Write a JSON record (state.json, manifest.json, edit.json, ...) atomically, secrets redacted."""
    atomic_write_text(path, json_record_text(data), durable=durable)


def json_record_text(data: Any) -> str:
    """A JSON record's text as atomic_write_json writes it: sorted, indented, secrets redacted."""
    from flakebot.redact import json_may_hold_secrets, redact

    text = json.dumps(data, indent=2, sort_keys=True, default=str)
    if json_may_hold_secrets(text):
        text = json.dumps(redact(json.loads(text)), indent=2, sort_keys=True)
    return text + "\n"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_tree(path: Path) -> bool:
    """Remove a file or directory tree, making read-only entries writable first. True if removed."""
    if not path.exists() and not path.is_symlink():
        return False
    if path.is_dir() and not path.is_symlink():
        for root, dirs, _files in os.walk(path):
            for name in dirs:
                if not os.path.islink(os.path.join(root, name)):  # chmod would follow it out of the tree
                    os.chmod(os.path.join(root, name), 0o755)
        shutil.rmtree(path)
    else:
        path.unlink()
    return True


def tree_bytes(path: Path) -> int:
    """Bytes held under `path` on disk (links not followed): a file's size or its blocks, the larger, and each
    directory's blocks; one lstat per entry, read as its directory is listed (the edit loop's guard totals its trees
    after every tool call and verdict)."""
    total, pending = 0, [os.fspath(path)]
    while pending:
        try:
            listing = os.scandir(pending.pop())
        except OSError:
            continue  # gone, or not a directory
        with listing:
            for entry in listing:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed meanwhile
                if stat.S_ISDIR(st.st_mode):  # its blocks: a million empty directories hold gigabytes
                    pending.append(entry.path)
                    total += st.st_blocks * 512
                else:  # the blocks too: a file can hold disk past its size (fallocate --keep-size)
                    total += max(st.st_size, st.st_blocks * 512)
    return total


def sha256_hex(data: bytes) -> str:
    """SHA-256 from Python's own module (the one hashlib falls back to): hashlib maps OpenSSL's libcrypto (3 MB) into
    a process, and the supervisor beside every service (benchmarks S5: its memory) names its cgroup and finds its
    sandbox's probe record with this."""
    try:
        from _sha256 import sha256  # 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # type: ignore[import-not-found,no-redef,unused-ignore]  # 3.12 on
        except ImportError:  # a build without them: the same digest through OpenSSL
            from hashlib import sha256
    return str(sha256(data).hexdigest())
