"""Host file access inside a tree someone else could have written: the one choke point, no link ever followed.

A tree is untrusted when a sandbox, a cloned repository, a cache owner or a crafted tool could have written it (a
workspace, a target dir, a dependency-cache build, a shared catalog directory). The host reads, writes, creates,
renames, removes and locks there only through `Tree`, which resolves every path beneath a directory descriptor
opened once on the trusted root:

- each directory component with openat(O_DIRECTORY | O_NOFOLLOW), the last with O_NOFOLLOW: a symbolic link at
  any position is refused, never followed, so no write can land outside the tree;
- paths are relative and plain: an absolute path, `..`, `.` or an empty part is refused before any call;
- reads and locks refuse anything but a regular file (a FIFO would hang the host, a device would read forever),
  opening with O_NONBLOCK so the check itself cannot hang;
- writes create a fresh file (O_CREAT | O_EXCL) beside the target and rename it over the name within the same
  directory descriptor: a link or a hard link planted at the name is replaced, never written through, and a
  reader sees the old file or the new one;
- a lock file is opened without O_TRUNC and never written, so a hard link at its name changes nothing.

Every refusal is one `UnsafePath` (flakebot.errors) naming the path and the rule. What stays trusted is the root
directory given to `Tree` (flakebot chose it: the user's own cache directory, a run's directory, a temp dir it
made) and the kernel's openat/renameat semantics.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from flakebot.errors import UnsafePath

logger = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LINK_ERRNOS = (errno.ELOOP, errno.ENOTDIR)  # what O_NOFOLLOW / O_DIRECTORY answer on a link or a non-directory


def parts_of(rel: str | PurePosixPath) -> tuple[str, ...]:
    """The components of a relative path inside a tree; UnsafePath for an absolute path, '..', '.' or an empty one."""
    text = str(rel)
    if not text or "\0" in text:
        raise UnsafePath(f"{text!r} is not a path", fix="name a file inside the tree", path=text, rule="empty")
    if text.startswith("/"):
        raise UnsafePath(
            f"{text} is absolute: only paths inside the tree are opened",
            fix="give the path relative to the tree",
            path=text,
            rule="absolute",
        )
    parts = tuple(part for part in text.split("/") if part not in ("", "."))
    if ".." in parts or not parts:
        raise UnsafePath(
            f"{text} leaves the tree or names its root ('..')",
            fix="give a path inside the tree",
            path=text,
            rule="dotdot",
        )
    return parts


class Tree:
    """A directory someone else may have written, opened once. Every method takes a path relative to it."""

    def __init__(self, root: Path | str) -> None:
        # The root's own spelling is trusted (flakebot chose it); below it nothing is followed.
        self.root, self._fd = Path(root), -1
        self._fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def subtree(self, rel: str) -> Tree:
        """The directory `rel` below the root ('' is the root itself) as a Tree of its own, reached through real
        directories only (a link on the way or at the name: UnsafePath); the caller closes it."""
        fd = self._open_dir(parts_of(rel) if rel else ())
        tree = Tree.__new__(Tree)
        tree.root, tree._fd = self.root / rel, fd
        return tree

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    # ---------------------------------------------------------------- resolving

    def _refuse(self, rel: str, rule: str, why: str) -> UnsafePath:
        return UnsafePath(
            f"{self.root / rel}: {why}; refused (a tree someone else could have written is never followed)",
            fix=f"remove {self.root / rel} (it was planted there) and try again",
            path=str(self.root / rel),
            rule=rule,
        )

    def _open_dir(self, parts: tuple[str, ...], *, create: bool = False, mode: int = 0o755) -> int:
        """A descriptor of the directory `parts` below the root, each component opened without following a link
        (and made first when `create`: mkdirat never follows a link either)."""
        fd = os.dup(self._fd)
        try:
            for i, part in enumerate(parts):
                if create:
                    try:
                        os.mkdir(part, mode, dir_fd=fd)
                    except FileExistsError:
                        pass  # a directory already, or something the open below refuses
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in _LINK_ERRNOS:
                        raise self._not_a_directory(fd, part, "/".join(parts[: i + 1])) from None
                    raise
                os.close(fd)
                fd = child
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _not_a_directory(self, fd: int, part: str, rel: str) -> UnsafePath:
        try:
            mode = os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode
        except OSError:
            mode = 0
        if stat.S_ISLNK(mode):
            return self._refuse(rel, "link", "is a symbolic link")
        return self._refuse(rel, "not-a-directory", "is not a directory")

    @contextmanager
    def _parent(self, rel: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        parts = parts_of(rel)
        fd = self._open_dir(parts[:-1], create=create)
        try:
            yield fd, parts[-1]
        finally:
            os.close(fd)

    def _open_file(self, fd: int, name: str, rel: str, flags: int) -> int:
        try:
            handle = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._refuse(rel, "link", "is a symbolic link") from None
            if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened for writing with no reader
                raise self._refuse(rel, "not-a-file", "is not a regular file") from None
            raise
        mode = os.fstat(handle).st_mode
        if not stat.S_ISREG(mode):
            os.close(handle)
            raise self._refuse(rel, "not-a-file", "is not a regular file")
        os.set_blocking(handle, True)
        return handle

    # ---------------------------------------------------------------- reading

    def read_bytes(self, rel: str, *, limit: int | None = None, at_most: int | None = None) -> bytes:
        """The regular file at `rel` (FileNotFoundError when missing; UnsafePath for a link or a non-file, or one
        over `limit` bytes); `at_most`: only its first bytes, for a caller that judges the size itself."""
        with self._parent(rel) as (fd, name):
            handle = self._open_file(fd, name, rel, os.O_RDONLY)
        with os.fdopen(handle, "rb") as file:
            data = file.read(at_most if at_most is not None else -1 if limit is None else limit + 1)
        if limit is not None and len(data) > limit:
            raise self._refuse(rel, "too-large", f"holds more than {limit} bytes")
        return data

    @contextmanager
    def open_read(self, rel: str) -> Iterator[BinaryIO]:
        """The regular file at `rel` opened for reading, to stream (os.fstat of it describes what was opened);
        FileNotFoundError when missing, UnsafePath for a link or a non-file."""
        with self._parent(rel) as (fd, name):
            handle = self._open_file(fd, name, rel, os.O_RDONLY)
        with os.fdopen(handle, "rb") as file:
            yield file

    def read_text(self, rel: str, *, limit: int | None = None) -> str:
        return self.read_bytes(rel, limit=limit).decode()

    def lstat(self, rel: str) -> os.stat_result:
        """The entry at `rel` itself (a link is described, not followed)."""
        with self._parent(rel) as (fd, name):
            return os.stat(name, dir_fd=fd, follow_symlinks=False)

    def readlink(self, rel: str) -> str:
        """The target text of the symbolic link at `rel` (never followed)."""
        with self._parent(rel) as (fd, name):
            return os.readlink(name, dir_fd=fd)

    def exists(self, rel: str) -> bool:
        try:
            self.lstat(rel)
        except FileNotFoundError:
            return False
        return True

    def is_dir(self, rel: str) -> bool:
        try:
            return stat.S_ISDIR(self.lstat(rel).st_mode)
        except FileNotFoundError:
            return False

    def listdir(self, rel: str = "") -> list[str]:
        fd = self._open_dir(parts_of(rel) if rel else ())
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    def walk(self, rel: str = "") -> Iterator[tuple[str, os.stat_result]]:
        """Every entry below `rel` (itself first; '' is the root), as (path relative to the root, its own lstat);
        links are listed, never entered."""
        top = rel or ""
        yield top, self.lstat(top) if top else os.stat(self._fd)
        pending = [(top, iter(self.listdir(top)))]  # one level at a time, no recursion: a tree of any depth is walked
        while pending:
            parent, names = pending[-1]
            name = next(names, None)
            if name is None:
                pending.pop()
                continue
            child = f"{parent}/{name}" if parent else name
            info = self.lstat(child)
            yield child, info
            if stat.S_ISDIR(info.st_mode):
                pending.append((child, iter(self.listdir(child))))

    # ---------------------------------------------------------------- writing

    def mkdir(self, rel: str, *, mode: int = 0o755, parents: bool = True) -> None:
        """The directory `rel` and its parents (existing ones are fine; a link in their place is refused); new ones
        get `mode` less the umask. `parents` False: its parent must exist already (FileNotFoundError)."""
        parts = parts_of(rel)
        if not parents:
            with self._parent(rel) as (fd, name):
                try:
                    os.mkdir(name, mode, dir_fd=fd)
                except FileExistsError:
                    pass  # a directory already, or something the open below refuses
        os.close(self._open_dir(parts, create=parents, mode=mode))

    def write_bytes(self, rel: str, data: bytes, *, mode: int = 0o644, parents: bool = True, sync: bool = True) -> None:
        """Replace `rel` atomically: a fresh file made with O_EXCL beside it, renamed over the name (a link, a hard
        link or a file there is replaced, never written through). `sync` False: see write_from."""
        self.write_from(rel, io.BytesIO(data), mode=mode & 0o777, parents=parents, sync=sync)

    def write_from(
        self,
        rel: str,
        source: BinaryIO,
        *,
        mode: int,
        parents: bool = True,
        owner: tuple[int, int] | None = None,
        times_ns: tuple[int, int] | None = None,
        sync: bool = True,
        budget: Budget | None = None,
    ) -> None:
        """Replace `rel` atomically with what `source` streams (no whole file in memory), as write_bytes does: a fresh
        O_EXCL file beside it renamed over the name. `mode` without set-id bits; `owner` (uid, gid) and
        `times_ns` (atime, mtime) set on the new file before it takes the name; `sync` False for a scratch copy, or a
        file a crash's resume writes again (a run's workspace and flake/: the stage that wrote it runs again).
        `budget`: `source` is a file read sparse (only its data, holes left holes) and its data counted against it."""
        with self._parent(rel, create=parents) as (fd, name):
            tmp = f".{name}.{secrets.token_hex(6)}.tmp"
            handle = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
            try:
                with os.fdopen(handle, "wb") as file:
                    if budget is None:
                        shutil.copyfileobj(source, file, 1 << 20)
                    else:
                        _copy_sparse(source.fileno(), file.fileno(), budget)
                    file.flush()
                    if owner is not None:
                        os.fchown(file.fileno(), *owner)
                    os.fchmod(file.fileno(), mode & 0o1777)  # after chown, which clears set-id bits anyway
                    if times_ns is not None:
                        os.utime(file.fileno(), ns=times_ns)
                    if sync:
                        os.fsync(file.fileno())
                try:
                    os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
                except IsADirectoryError:
                    raise self._refuse(rel, "not-a-file", "is a directory") from None
                if sync:
                    os.fsync(fd)  # the new name survives a crash too
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=fd)
                except FileNotFoundError:
                    pass
                raise

    def write_text(self, rel: str, text: str, *, mode: int = 0o644, parents: bool = True, sync: bool = True) -> None:
        self.write_bytes(rel, text.encode(), mode=mode, parents=parents, sync=sync)

    def create_bytes(self, rel: str, data: bytes, *, mode: int = 0o644) -> None:
        """A new file at `rel` (FileExistsError when anything, a link included, is there)."""
        with self._parent(rel, create=True) as (fd, name):
            handle = os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode & 0o777, dir_fd=fd
            )
            with os.fdopen(handle, "wb") as file:
                file.write(data)

    def link(self, existing: str, rel: str) -> None:
        """A hard link at the new name `rel` to the file `existing` in this tree (neither followed if a link)."""
        with self._parent(existing) as (src_fd, src_name), self._parent(rel, create=True) as (fd, name):
            os.link(src_name, name, src_dir_fd=src_fd, dst_dir_fd=fd, follow_symlinks=False)

    def symlink(self, target: str, rel: str) -> None:
        """A symbolic link at `rel` (made, never followed by this module)."""
        with self._parent(rel, create=True) as (fd, name):
            os.symlink(target, name, dir_fd=fd)

    def rename(self, src: str, dst: str) -> None:
        """Move `src` to `dst` within the tree (renameat on descriptors: no link on either path is followed)."""
        with self._parent(src) as (src_fd, src_name), self._parent(dst, create=True) as (dst_fd, dst_name):
            os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)

    def unlink(self, rel: str) -> None:
        """Remove the file or link at `rel` itself (IsADirectoryError for a directory: never a whole tree)."""
        with self._parent(rel) as (fd, name):
            os.unlink(name, dir_fd=fd)

    def rmdir(self, rel: str) -> None:
        """Remove the empty directory at `rel` (OSError when it holds anything or is not a directory)."""
        with self._parent(rel) as (fd, name):
            os.rmdir(name, dir_fd=fd)

    def remove(self, rel: str, *, missing_ok: bool = True) -> bool:
        """Remove the file, link or whole directory at `rel` (a link is removed, never entered). True if removed."""
        try:
            with self._parent(rel) as (fd, name):
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISDIR(info.st_mode):
                    os.unlink(name, dir_fd=fd)
                    return True
            try:
                self._rmtree(rel)
            except PermissionError:  # a read-only directory the sandbox left: made writable (no link followed)
                for child, child_info in self.walk(rel):
                    if stat.S_ISDIR(child_info.st_mode):
                        self.chmod(child, stat.S_IMODE(child_info.st_mode) | stat.S_IRWXU)
                self._rmtree(rel)
        except FileNotFoundError:
            if not missing_ok:
                raise
            return False
        return True

    def _rmtree(self, rel: str) -> None:
        with self._parent(rel) as (fd, name):
            shutil.rmtree(name, dir_fd=fd)  # the descriptor-based rmtree: it never follows a link

    def chown(self, rel: str, uid: int, gid: int) -> None:
        """chown of the entry itself ('' is the root); a link is changed, never followed."""
        if not rel:
            os.fchown(self._fd, uid, gid)
            return
        with self._parent(rel) as (fd, name):
            os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)

    def chmod(self, rel: str, mode: int) -> None:
        """chmod of the entry itself ('' is the root): opened O_PATH|O_NOFOLLOW, so a link swapped in is refused,
        not followed."""
        if not rel:
            os.fchmod(self._fd, mode)
            return
        with self._parent(rel) as (fd, name):
            handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            try:
                if stat.S_ISLNK(os.fstat(handle).st_mode):
                    raise self._refuse(rel, "link", "is a symbolic link")
                os.chmod(f"/proc/self/fd/{handle}", mode)
            finally:
                os.close(handle)

    def copy_in(self, source: Path, rel: str) -> None:
        """Copy the trusted local directory `source` to the new directory `rel` (files, directories and links as
        links); nothing may exist at `rel` yet."""
        with self._parent(rel, create=True) as (fd, name):
            os.mkdir(name, 0o755, dir_fd=fd)
        for entry in sorted(source.iterdir()):
            child = f"{rel}/{entry.name}"
            if entry.is_symlink():
                self.symlink(os.readlink(entry), child)
            elif entry.is_dir():
                self.copy_in(entry, child)
            elif entry.is_file():
                self.create_bytes(child, entry.read_bytes(), mode=stat.S_IMODE(entry.stat().st_mode))

    @contextmanager
    def lock(self, rel: str) -> Iterator[None]:
        """Hold an exclusive flock on the regular file `rel` (created when missing, its directory not; never truncated
        or written)."""
        import fcntl

        with self._parent(rel) as (fd, name):
            handle = self._open_file(fd, name, rel, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        finally:
            os.close(handle)


class Budget:
    """How many bytes of file data a copy may still write; past it the copy ends (OSError EDQUOT)."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit, self.left, self.what = limit, limit, what

    def take(self, size: int) -> None:
        self.left -= size
        if self.left < 0:
            raise OSError(errno.EDQUOT, f"{self.what}: more than {self.limit >> 20} MiB of data, refused")


def copy_tree(source: Path, dest: Path, *, budget: Budget | None = None) -> None:
    """Copy the tree `source` (written by someone else, maybe still being written) to the new directory `dest`:
    every entry reached beneath a descriptor and never followed, links copied as links (never the file one names),
    regular files with their permission bits less set-id and sticky bits, sockets, FIFOs and devices left out. An
    entry swapped for a link while the copy runs ends it (UnsafePath) instead of being entered.
    `budget`: files are copied sparse (holes stay holes), hard links within `source` stay hard links (one copy of
    the data), and the data written is bounded by it."""
    dest.mkdir()
    directories: list[tuple[str, int]] = []
    copied: dict[tuple[int, int], str] = {}  # (device, inode) of a file with more than one name -> its copy
    with Tree(source) as tree, Tree(dest) as out:
        for rel, info in tree.walk():
            if not rel:
                continue
            if stat.S_ISDIR(info.st_mode):
                out.mkdir(rel, mode=0o700, parents=False)
                directories.append((rel, stat.S_IMODE(info.st_mode) & 0o777))
            elif stat.S_ISLNK(info.st_mode):
                out.symlink(tree.readlink(rel), rel)
            elif stat.S_ISREG(info.st_mode) and budget is not None and (info.st_dev, info.st_ino) in copied:
                out.link(copied[info.st_dev, info.st_ino], rel)
            elif stat.S_ISREG(info.st_mode):
                with tree.open_read(rel) as file:
                    opened = os.fstat(file.fileno())
                    mode = stat.S_IMODE(opened.st_mode) & 0o777
                    out.write_from(rel, file, mode=mode, parents=False, sync=False, budget=budget)
                if budget is not None and opened.st_nlink > 1:
                    copied[opened.st_dev, opened.st_ino] = rel
        for rel, mode in directories:  # their own modes last, so a read-only one did not stop the copy
            out.chmod(rel, mode)


def _copy_sparse(source: int, dest: int, budget: Budget) -> None:
    """Copy the data regions of `source` (SEEK_DATA/SEEK_HOLE) to the same offsets in `dest`, holes left holes, and
    give `dest` the source's size; each region's bytes taken from `budget` before they are written."""
    size, offset = os.fstat(source).st_size, 0
    while offset < size:
        try:
            start = os.lseek(source, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but a hole to the end
                break
            raise
        end = min(os.lseek(source, start, os.SEEK_HOLE), size)
        budget.take(end - start)
        while start < end:
            chunk = os.pread(source, min(1 << 20, end - start), start)
            if not chunk:
                break
            os.pwrite(dest, chunk, start)
            start += len(chunk)
        offset = end
    os.ftruncate(dest, size)


def file_below(root: Path, path: Path) -> Path:
    """The absolute `path` as a regular file below the trusted directory `root`, reached through real directories
    only, spelled beneath `root` resolved (so a sandbox bind of its parent shows that directory and nothing else):
    a path elsewhere, a link at the name or on the way, or anything but a regular file is UnsafePath, never
    resolved. For a path someone else named (cargo's JSON, a build's bin/)."""
    real = root.resolve()
    inside = [r for r in (root, real) if path.is_absolute() and path.is_relative_to(r)]
    rel = str(path.relative_to(inside[0])) if inside else ""
    if not inside or rel == ".":
        raise UnsafePath(f"{path} is not below {real}", fix=f"name a file below {real}", path=str(path), rule="outside")
    with Tree(real) as tree:
        info = tree.lstat(rel)
        if not stat.S_ISREG(info.st_mode):
            what = "is a symbolic link" if stat.S_ISLNK(info.st_mode) else "is not a regular file"
            raise tree._refuse(rel, "link" if stat.S_ISLNK(info.st_mode) else "not-a-file", what)
    return real / rel


def read_file(path: Path, *, limit: int | None = None) -> bytes:
    """The regular file `path` whose directory is trusted but whose name someone else could have planted (a
    manifest in the workspace): a link or FIFO at the name is refused (UnsafePath), never followed or waited on."""
    with Tree(path.parent) as tree:
        return tree.read_bytes(path.name, limit=limit)


def read_file_text(path: Path, *, limit: int | None = None) -> str:
    return read_file(path, limit=limit).decode()


def link_leaves(root: Path, rel: str) -> str:
    """Where the symbolic link `root/rel` points when that is outside `root` (judged both by its text and by what
    it resolves to now), or '' when it stays inside."""
    target = os.readlink(root / rel)
    lexical = os.path.normpath(os.path.join(os.path.dirname(rel), target))
    real = Path(os.path.realpath(root / rel))
    outside = os.path.isabs(target) or lexical == ".." or lexical.startswith("../")
    if outside or not real.is_relative_to(Path(os.path.realpath(root))):
        return target
    return ""


def links_leaving(root: Path) -> list[tuple[str, str]]:
    """Every symbolic link below `root` that points outside it: (path relative to root, its target)."""
    found = []
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(directory, name)
            if path.is_symlink():
                rel = str(path.relative_to(root))
                target = link_leaves(root, rel)
                if target:
                    found.append((rel, target))
    return sorted(found)
