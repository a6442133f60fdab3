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
    sandboxed command: a warm target dir holds hundreds of entries); symbolic links never followed, `.git` left out."""
    changed, pending = 0, [top]
    while pending:
        try:
            listing = os.scandir(pending.pop())
        except OSError:
            continue  # gone, or not a directory any more (as os.walk skips it)
        with listing:
            for entry in listing:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed meanwhile (a removal on another thread)
                is_dir = stat.S_ISDIR(st.st_mode)
                if is_dir and entry.name in SKIP_NAMES:
                    continue
                if entry.path not in skipped:
                    changed += _adopt_one(entry.path, st, uid)
                if is_dir:
                    pending.append(entry.path)
    return changed


def _adopt_one(path: str, st: os.stat_result, uid: int) -> int:
    """The entry at `path`, whose lstat is `st`, handed to `uid`'s group (1), or left as it is (0)."""
    if stat.S_ISLNK(st.st_mode) or st.st_uid == uid:
        return 0
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and st.st_uid == 0:
        return 0  # a root file linked from elsewhere: never widen it
    mode = stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID) | stat.S_IRGRP | stat.S_IWGRP
    if stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_IXUSR:
        mode |= stat.S_IXGRP
    if st.st_gid == uid and stat.S_IMODE(st.st_mode) == mode:
        return 0
    # changed through a descriptor of the very entry looked at: a link or another file put at its name since (chmod
    # follows links) is left alone
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return 0  # gone, a link now, or a socket (nothing to open): not handed over
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return 0
        os.fchown(fd, -1, uid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return 1
