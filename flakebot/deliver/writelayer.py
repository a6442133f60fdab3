"""A tool's writable paths as a layer: the tool writes a copy, flakebot copies back what is data.

The sandbox never mounts a caller's path writable. Each writable file or directory is copied into flakebot's own
scratch tree (regular files, directories and links as links; sockets, FIFOs and devices never), that copy is bound
at every spelling of the path, and after the run flakebot writes back what changed: regular files and
directories only, nothing under a name some host program reads as configuration (trust.STEERING_NAMES, at any
depth), and each host path opened beneath the caller's directory one component at a time with O_NOFOLLOW, files
created with O_EXCL and renamed into place within that directory. What is left out is said on one line.
Copy-in and copy-back are each bounded (`limit` bytes).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from flakebot.errors import UsageError
from flakebot.trust import steering_name

logger = logging.getLogger(__name__)

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 20


@dataclass(frozen=True)
class Stamp:
    """What an entry was when staged: its kind, and for files size and modification time (of the staged copy and of
    the host file), for links the target."""

    kind: str  # "dir", "file" or "link"
    size: int = 0
    mtime_ns: int = 0
    host_size: int = 0
    host_mtime_ns: int = 0
    target: str = ""


@dataclass
class Layer:
    """One writable host path (`host`, resolved) and its staged copy (`stage`)."""

    host: Path
    stage: Path
    before: dict[str, Stamp] = field(default_factory=dict)  # relative path ("." for the root) -> stamp
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (relative path, why)


def stage(host: Path, root: Path, index: int, limit: int) -> Layer:
    """Copy the writable path `host` into `root/<index>/`; the layer's `stage` is the copy (a file or a directory)."""
    holder = root / str(index)
    holder.mkdir(parents=True)
    layer = Layer(host, holder / (host.name or "root"))
    budget = [limit]
    if host.is_dir():
        layer.stage.mkdir()
        layer.before["."] = Stamp("dir")
        for rel, kind in _walk(host):
            _copy_in(layer, rel, kind, budget)
    else:
        _copy_in(layer, ".", "file", budget)
    return layer


def _walk(top: Path) -> Iterator[tuple[str, str]]:
    """(relative path, kind) of every entry under `top`, parents first, links never followed."""
    for here, dirs, files in os.walk(top):
        for name in [*dirs, *files]:
            path = Path(here, name)
            yield str(path.relative_to(top)), kind_of(path)


def kind_of(path: Path) -> str:
    """dir, file, link, socket, FIFO or device: what `path` itself is (a link is not followed)."""
    return _kind(os.lstat(path).st_mode)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "link"
    return {stat.S_IFSOCK: "socket", stat.S_IFIFO: "FIFO"}.get(stat.S_IFMT(mode), "device")


def _copy_in(layer: Layer, rel: str, kind: str, budget: list[int]) -> None:
    source, target = layer.host / rel, layer.stage / rel
    if kind == "dir":
        target.mkdir()
        layer.before[rel] = Stamp("dir")
    elif kind == "link":
        link = os.readlink(source)
        target.symlink_to(link)
        layer.before[rel] = Stamp("link", target=link)
    elif kind == "file":
        try:
            fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise UsageError(
                f"cannot copy {source} for the tool to write ({exc.strerror})",
                fix="let the tool write a directory whose files you can read, e.g. --writable ./out",
            ) from None
        with os.fdopen(fd, "rb") as src:
            host = os.fstat(src.fileno())
            budget[0] -= host.st_size
            if budget[0] < 0:
                raise UsageError(
                    f"writable path {layer.host} holds more than the sandbox_disk_mb limit: the tool writes a copy",
                    fix="name the directory the tool writes its output to (e.g. --writable ./out), not a large tree",
                )
            with open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, CHUNK)
        os.chmod(target, stat.S_IMODE(host.st_mode) & 0o755 | 0o600)
        os.utime(target, ns=(host.st_atime_ns, host.st_mtime_ns))
        staged = os.lstat(target)
        layer.before[rel] = Stamp("file", staged.st_size, staged.st_mtime_ns, host.st_size, host.st_mtime_ns)
    # sockets, FIFOs and devices are never copied: the tool does not see them


def copy_back(layer: Layer, limit: int) -> list[tuple[str, str]]:
    """Write what the tool changed in the layer's copy back to the host path; returns what was left out, as
    (relative path, why)."""
    budget = [limit]
    if layer.before["."].kind == "file":
        if _changed(layer.stage, "file", layer.before["."]):
            try:
                parent = _open_dir(layer.host.parent, [])
                try:
                    _file_back(layer, ".", parent, layer.host.name, budget)
                finally:
                    os.close(parent)
            except OSError as exc:
                layer.left_out.append((layer.host.name, f"on the host: {exc.strerror}"))
        return layer.left_out
    try:
        root = _open_dir(layer.host, [])
    except OSError:  # replaced by a link or a file while the tool ran: nothing is written through it
        layer.left_out.append((".", "the host has a link or another kind of file in its way"))
        return layer.left_out
    try:
        seen = _tree_back(layer, root, budget)
        _deletions(layer, root, seen)
    finally:
        os.close(root)
    return layer.left_out


def _tree_back(layer: Layer, root: int, budget: list[int]) -> set[str]:
    seen = {"."}
    for here, dirs, files in os.walk(layer.stage):
        for name in sorted([*dirs, *files]):
            path = Path(here, name)
            rel = str(path.relative_to(layer.stage))
            seen.add(rel)
            kind, old = kind_of(path), layer.before.get(rel)
            if not _changed(path, kind, old):
                continue
            reader = steering_name(rel)
            if reader:
                layer.left_out.append((rel, f"read as configuration by {reader}"))
                if kind == "dir":
                    dirs.remove(name)
            elif kind in ("dir", "file"):
                try:
                    _write_back(layer, root, rel, budget)
                except OSError as exc:  # opened with O_NOFOLLOW: a link on the way fails here, never followed
                    blocked = exc.errno in (errno.ENOTDIR, errno.ELOOP, errno.EISDIR)
                    why = "the host has a link or another kind of file in its way" if blocked else str(exc.strerror)
                    layer.left_out.append((rel, why))
                    if kind == "dir":
                        dirs.remove(name)
            else:
                layer.left_out.append((rel, f"a {'symbolic link' if kind == 'link' else kind}, not data"))
    return seen


def _changed(path: Path, kind: str, old: Stamp | None) -> bool:
    if old is None or old.kind != kind:
        return True
    if kind == "file":
        now = os.lstat(path)
        return (now.st_size, now.st_mtime_ns) != (old.size, old.mtime_ns)
    return kind == "link" and os.readlink(path) != old.target


def _write_back(layer: Layer, root: int, rel: str, budget: list[int]) -> None:
    """The staged directory or file `rel` made on the host, beneath `root` (its parents exist: made first)."""
    parent = _open_dir(None, Path(rel).parent.parts, root)
    try:
        if (layer.stage / rel).is_dir():
            try:
                os.mkdir(Path(rel).name, 0o777, dir_fd=parent)
            except FileExistsError:
                os.close(os.open(Path(rel).name, DIR_FLAGS, dir_fd=parent))  # a directory, not a link to one
        else:
            _file_back(layer, rel, parent, Path(rel).name, budget)
    finally:
        os.close(parent)


def _file_back(layer: Layer, rel: str, parent: int, name: str, budget: list[int]) -> None:
    """The staged file `rel` written over (or as) `name` in the host directory `parent`: a new file made with
    O_EXCL beside it, then renamed into place (a link or a hard link the host has there is replaced, not followed)."""
    staged, old = layer.stage / rel, layer.before.get(rel)
    try:
        host = os.lstat(name, dir_fd=parent)
    except FileNotFoundError:
        host = None
    if old is not None and (host is None or (host.st_size, host.st_mtime_ns) != (old.host_size, old.host_mtime_ns)):
        layer.left_out.append((rel, "changed on the host while the tool ran"))
        return
    if old is None and host is not None:
        layer.left_out.append((rel, "made on the host while the tool ran"))
        return
    size = os.lstat(staged).st_size
    budget[0] -= size
    if budget[0] < 0:
        layer.left_out.append((rel, "past the sandbox_disk_mb limit"))
        return
    temp = f".{name}.flakebot-{os.getpid()}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
    try:
        with os.fdopen(os.open(staged, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as src:
            with os.fdopen(fd, "wb", closefd=False) as dst:
                shutil.copyfileobj(src, dst, CHUNK)
        _settle(fd, host, os.lstat(staged).st_mode)
        os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        os.unlink(temp, dir_fd=parent)
        raise
    finally:
        os.close(fd)


def _settle(fd: int, host: os.stat_result | None, staged_mode: int) -> None:
    """A replaced file keeps its mode and owner; a new one gets the caller's umask (executable if the tool made it
    so), never set-id bits."""
    if host is not None:
        os.fchmod(fd, stat.S_IMODE(host.st_mode) & 0o1777)
        if os.geteuid() == 0:
            os.fchown(fd, host.st_uid, host.st_gid)
        return
    mask = os.umask(0)
    os.umask(mask)
    os.fchmod(fd, (0o777 if staged_mode & stat.S_IXUSR else 0o666) & ~mask)


def _deletions(layer: Layer, root: int, seen: set[str]) -> None:
    """What the tool removed from its copy is removed on the host: files still as they were staged, then empty
    directories (deepest first); never anything under a steering name."""
    gone = sorted((rel for rel in layer.before if rel not in seen), key=lambda r: -len(Path(r).parts))
    for rel in gone:
        old = layer.before[rel]
        if steering_name(rel) or old.kind == "link":
            continue
        parent = _open_dir(None, Path(rel).parent.parts, root, missing_ok=True)
        if parent < 0:
            continue
        try:
            name = Path(rel).name
            host = os.lstat(name, dir_fd=parent)
            if old.kind == "file" and (host.st_size, host.st_mtime_ns) == (old.host_size, old.host_mtime_ns):
                os.unlink(name, dir_fd=parent)
            elif old.kind == "dir" and stat.S_ISDIR(host.st_mode):
                os.rmdir(name, dir_fd=parent)
        except OSError:  # gone already, or a directory that still holds something: left as it is
            pass
        finally:
            os.close(parent)


def _open_dir(path: Path | None, parts: tuple[str, ...] | list[str], root: int = -1, missing_ok: bool = False) -> int:
    """A descriptor of `path`, or of `parts` beneath the descriptor `root`, each component opened with O_NOFOLLOW:
    a link anywhere on the way fails instead of leading out of the tree (-1 for a missing one when `missing_ok`)."""
    fd = os.open(path, DIR_FLAGS) if path is not None else os.dup(root)
    for part in parts:
        if part in ("", "."):
            continue
        try:
            inner = os.open(part, DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            os.close(fd)
            if missing_ok:
                return -1
            raise
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        fd = inner
    return fd
