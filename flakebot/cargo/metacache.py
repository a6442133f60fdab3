"""One `cargo metadata` per workspace state: a successful answer is kept, in this process, under a digest of
everything it depends on, and given again while that digest holds.

The digest covers the call (argv and environment: the crate source's replacement, the toolchain, CARGO_HOME), the
names of every entry in the run's tree (cargo discovers targets from file names), the bytes of every Cargo.toml,
Cargo.lock and .cargo/config* in it, the cargo config files outside it (CARGO_HOME's, those above the call's
directory), and the directory registry's mtime. The tree was written by the model, so it is read through safefs
(no link followed) and nothing in it is trusted: a file that changes is a new key. A tree holding a symbolic link
(cargo follows it, the walk does not) or a package inside its .git (whose names are otherwise not walked) is not
kept: cargo is asked. Only a call on a crate inside the run's tree (`Cargo.tree`) is kept, and only an answer whose
manifests all lie inside it (a member or workspace root in the run's target dir, which the sandbox writes, is read
by cargo but not by the digest). The digest is taken after the call, so a Cargo.lock that `cargo metadata` writes
is part of the state the answer is kept for.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import subprocess
from collections import OrderedDict
from pathlib import Path
from typing import Any

from flakebot.errors import UnsafePath
from flakebot.safefs import Tree

logger = logging.getLogger(__name__)

KEPT = 16  # answers kept per process (a long-lived server crafts many crates)
# a tree with more entries is not walked (cargo is asked): past this, the walk would cost more than the call it saves
MAX_ENTRIES = 400  # about 45 us an entry: a walk of 400 costs about what one `cargo metadata` does
READ_LIMIT = 4 * 1024 * 1024  # a bigger file of a READ name (cargo's are KBs) is not read: the tree is not kept
READ = ("Cargo.toml", "Cargo.lock", "config", "config.toml")  # their bytes count, not only their names
_answers: OrderedDict[str, subprocess.CompletedProcess[str]] = OrderedDict()
hits = 0  # answers given from the cache in this process (read by tests and the benchmark's trace)


def digest(
    argv: list[str], env: dict[str, str], tree: Path, skip: Path, registry: Path | None, configs: list[Path]
) -> str | None:
    """The key of a `cargo metadata` call's answer; None when the tree cannot be read whole (then cargo is asked).
    `configs`: the cargo config files the call may read outside the tree (CARGO_HOME's, those above its directory)."""
    h = hashlib.sha256()
    _put(h, *(os.fsencode(part) for part in argv))  # fsencode: a path or name need not be UTF-8
    _put(h, b"env", *(os.fsencode(f"{k}={v}") for k, v in sorted(env.items())))
    for config in configs:
        _put(h, os.fsencode(config), _config_bytes(config))
    try:
        info = registry.lstat() if registry is not None else None
    except OSError:
        info = None
    _put(h, os.fsencode(f"{registry}:{info.st_mtime_ns if info else '-'}:{info.st_size if info else '-'}"))
    try:
        with Tree(tree) as t:
            _walk(t, "", h, _inside(tree, skip), [MAX_ENTRIES])
    except _TooBig:
        logger.debug("cargo metadata not cached: the tree %s has over %d entries", tree, MAX_ENTRIES)
        return None
    except _Unseen as exc:
        logger.debug("cargo metadata not cached: %s", exc)
        return None
    except (OSError, UnsafePath) as exc:
        logger.debug("cargo metadata not cached: the tree %s cannot be read (%s)", tree, exc)
        return None
    return h.hexdigest()


def _put(h: Any, *parts: bytes) -> None:
    """Each part with its length before it: a file's bytes cannot spell the record of the entries after it."""
    h.update(len(parts).to_bytes(8, "big"))
    for part in parts:
        h.update(len(part).to_bytes(8, "big") + part)


def _config_bytes(path: Path) -> bytes:
    """A config file's bytes as cargo would read them (through a link); its kind and time when not a regular file."""
    try:
        info = path.stat()
        if stat.S_ISREG(info.st_mode):
            return b"file:" + path.read_bytes()
        return f"other:{stat.S_IFMT(info.st_mode)}:{info.st_mtime_ns}".encode()
    except OSError as exc:
        return f"none:{exc.errno}".encode()


def _inside(tree: Path, skip: Path) -> str | None:
    """`skip` (the target dir) relative to `tree` when it lies inside it: not walked (cargo writes it, reads no
    manifest there)."""
    try:
        return skip.resolve().relative_to(tree.resolve()).as_posix()
    except ValueError:
        return None


class _TooBig(Exception):
    pass


class _Unseen(Exception):
    """The tree holds something cargo reads that the digest would not see."""


def _walk(t: Tree, rel: str, h: Any, skip: str | None, left: list[int]) -> None:
    names = t.listdir(rel)
    left[0] -= len(names)
    if left[0] < 0:
        raise _TooBig
    for name in names:
        child = f"{rel}/{name}" if rel else name
        if child == skip:
            continue
        info = t.lstat(child)
        if stat.S_ISLNK(info.st_mode):
            # cargo follows a link; the walk does not, so what cargo reads through it (a Cargo.toml linked to a file of
            # another name, a directory of targets) would be outside the digest
            raise _Unseen(f"{child} is a symbolic link")
        # in the tree's own .git only the manifests count: its objects change with every commit, its file names list
        # no target, unless a package lives in it (cargo discovers its targets from names there): then ask cargo
        in_git = child == ".git" or child.startswith(".git/")
        if in_git and name == "Cargo.toml":
            raise _Unseen(f"{child} is a package inside .git")
        if not in_git or name in READ:
            _put(h, os.fsencode(child), str(stat.S_IFMT(info.st_mode)).encode())
        if stat.S_ISREG(info.st_mode) and name in READ:
            _put(h, t.read_bytes(child, limit=READ_LIMIT))  # over it: UnsafePath, not kept
        elif stat.S_ISDIR(info.st_mode):
            _walk(t, child, h, skip, left)


def confined(answer: str, tree: Path) -> bool:
    """Every manifest the answer names (the workspace root's, each path package's) lies inside `tree`: a member or
    workspace root elsewhere (the run's target dir, which the sandbox writes) is read by cargo but not by the digest."""
    try:
        meta = json.loads(answer)
        inside = tree.resolve()
        manifests = [Path(meta["workspace_root"]) / "Cargo.toml"]
        manifests += [Path(p["manifest_path"]) for p in meta["packages"] if p.get("source") is None]
        return all(m.resolve().is_relative_to(inside) for m in manifests)
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        return False


def get(key: str) -> subprocess.CompletedProcess[str] | None:
    global hits
    found = _answers.get(key)
    if found is not None:
        _answers.move_to_end(key)
        hits += 1
        logger.debug("cargo metadata: the workspace is unchanged, its answer reused")
    return found


def put(key: str, answer: subprocess.CompletedProcess[str]) -> None:
    _answers[key] = answer
    _answers.move_to_end(key)
    while len(_answers) > KEPT:
        _answers.popitem(last=False)
