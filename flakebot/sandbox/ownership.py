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
    skipped = {Path(p).resolve() for p in skip}
    changed = 0
    for tree in trees:
        tree = Path(tree).resolve()
        if not tree.is_dir():  # a single file (a tool's staged writable file) is handed over alone
            changed += _adopt_one(tree, uid, skipped) if tree.is_file() and tree not in skipped else 0
            continue
        changed += _adopt_one(tree, uid, skipped)
        for root, dirs, files in os.walk(tree):  # never follows symlinked directories
            dirs[:] = [d for d in dirs if d not in SKIP_NAMES]
            for name in [*dirs, *files]:
                path = Path(root, name)
                if path not in skipped:
                    changed += _adopt_one(path, uid, skipped)
    if changed:
        logger.debug("sandbox: %d entries made writable for uid %d", changed, uid)
    return changed


def _adopt_one(path: Path, uid: int, skipped: set[Path]) -> int:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or st.st_uid == uid:
        return 0
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and st.st_uid == 0:
        return 0  # a root file linked from elsewhere: never widen it
    mode = stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID) | stat.S_IRGRP | stat.S_IWGRP
    if stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_IXUSR:
        mode |= stat.S_IXGRP
    if st.st_gid == uid and stat.S_IMODE(st.st_mode) == mode:
        return 0
    os.chown(path, -1, uid, follow_symlinks=False)
    os.chmod(path, mode)
    return 1
