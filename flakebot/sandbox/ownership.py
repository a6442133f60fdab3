"""Giving the sandbox's unprivileged uid its writable trees, so commands run with no capabilities at all.

As root, a sandboxed command runs as an unused uid (bubblewrap.SANDBOX_UID_BASE + pid) with no capabilities, so
it can no longer write flakebot's root-owned workspace and target dir by CAP_DAC_OVERRIDE. Before each command
`adopt` hands those trees to the sandbox: their group becomes the sandbox's gid and group-writable. Owners stay
as they are (host git only trusts a work tree its own uid owns), `.git` and frozen files are left alone, and
symbolic links are never followed.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

SKIP_NAMES = {".git"}  # read-only in the sandbox; host git objects stay root's


def adopt(trees: Iterable[Path], uid: int, skip: Iterable[Path] = ()) -> int:
    """Make every file and directory under `trees` writable by `uid` (whose gid is the same number); returns how
    many entries changed. Entries `uid` already owns, or already group `uid` with group write, are untouched."""
    skipped = {str(Path(p).resolve()) for p in skip}
    changed = 0
    for tree in trees:
        tree = Path(tree).resolve()
        if not tree.is_dir():  # a single file (a tool's staged writable file) is handed over alone
            if tree.is_file() and str(tree) not in skipped:
                changed += _adopt_one(str(tree), os.lstat(tree), uid)
            continue
        changed += _adopt_one(str(tree), os.lstat(tree), uid)
        changed += _adopt_under(str(tree), uid, skipped)
    if changed:
        logger.debug("sandbox: %d entries made writable for uid %d", changed, uid)
    return changed


def _adopt_under(top: str, uid: int, skipped: set[str]) -> int:
    """adopt's walk below `top`: one lstat per entry, read from the directory as it is listed (this runs before every
    sandboxed command: a warm target dir holds hundreds of entries); symbolic links never followed, `.git` left out.
    Every directory is listed and changed through a descriptor opened from its parent's (O_NOFOLLOW), never by its
    path: adopt runs while other sandboxed commands run (the examples beside cargo test), and one of them that swaps
    a directory already looked at for a link must not lead the walk outside the tree."""
    try:
        fd = os.open(top, _DIR_FLAGS)
    except OSError:
        return 0
    changed, stack = 0, [(fd, top, os.scandir(fd))]
    try:
        while stack:
            fd, path, listing = stack[-1]
            entry = next(listing, None)
            if entry is None:
                listing.close()
                os.close(fd)
                stack.pop()
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed meanwhile (a removal on another thread)
            full = os.path.join(path, entry.name)
            if not stat.S_ISDIR(st.st_mode):
                if full not in skipped:
                    changed += _adopt_one(entry.name, st, uid, dir_fd=fd)
                continue
            if entry.name in SKIP_NAMES:
                continue
            try:
                child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # gone, a link now, or too deep for our descriptors: not handed over
            if not _same(os.fstat(child), st):
                os.close(child)
                continue
            if full not in skipped:
                changed += _adopt_fd(child, st, uid)
            try:
                stack.append((child, full, os.scandir(child)))
            except OSError:
                os.close(child)
    finally:
        for fd, _path, listing in stack:
            listing.close()
            os.close(fd)
    return changed


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _adopt_one(path: str, st: os.stat_result, uid: int, dir_fd: int | None = None) -> int:
    """The entry at `path` (relative to `dir_fd`, when given), whose lstat is `st`, handed to `uid`'s group (1), or
    left as it is (0)."""
    if _wanted(st, uid) is None:
        return 0
    # changed through a descriptor of the very entry looked at: a link or another file put at its name since (chmod
    # follows links) is left alone
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return 0  # gone, a link now, or a socket (nothing to open): not handed over
    try:
        return _adopt_fd(fd, st, uid) if _same(os.fstat(fd), st) else 0
    finally:
        os.close(fd)


def _adopt_fd(fd: int, st: os.stat_result, uid: int) -> int:
    """The entry open at `fd`, whose lstat is `st`, handed to `uid`'s group (1), or left as it is (0)."""
    mode = _wanted(st, uid)
    if mode is None:
        return 0
    os.fchown(fd, -1, uid)
    os.fchmod(fd, mode)
    return 1


def _wanted(st: os.stat_result, uid: int) -> int | None:
    """The mode an entry whose lstat is `st` gets, or None when it is left as it is."""
    if stat.S_ISLNK(st.st_mode) or st.st_uid == uid:
        return None
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and st.st_uid == 0:
        return None  # a root file linked from elsewhere: never widen it
    mode = stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID) | stat.S_IRGRP | stat.S_IWGRP
    if stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_IXUSR:
        mode |= stat.S_IXGRP
    if st.st_gid == uid and stat.S_IMODE(st.st_mode) == mode:
        return None
    return mode
