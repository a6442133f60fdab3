"""A tool's writable paths as a layer: the tool writes a copy, flakebot copies back what is data.

The sandbox never mounts a caller's path writable. Each writable file or directory is copied into flakebot's own
scratch tree (regular files, directories and links as links; sockets, FIFOs and devices never), that copy is bound
at every spelling of the path, and after the run flakebot writes back what changed: regular files and
directories only, nothing under a name some host program reads as configuration (trust.STEERING_NAMES, at any
depth), and a file the tool creates lands without exec bits (a rewritten one keeps the mode it had). Both sides are trees someone else could have written (the caller's by any host program while the tool
runs, the copy by the tool), so every read and write of either goes through flakebot.safefs.Tree, rooted at the
directory holding the path: no link is followed anywhere below it, files are made with O_EXCL and renamed into
place. What is left out is said on one line. Copy-in and copy-back are each bounded (`limit` bytes).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from flakebot.errors import UnsafePath, UsageError
from flakebot.safefs import Tree
from flakebot.trust import git_dir_layout, steering_name

logger = logging.getLogger(__name__)

IN_THE_WAY = "the host has a link or another kind of file in its way"


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
    """One writable host path (`host`, resolved) and its staged copy (`stage`); the host side is opened at `base` (the
    grant root's parent: no link below it is followed, so a directory swapped for a link between the grant check and
    the copy is refused), by default the host path's own directory."""

    host: Path
    stage: Path
    before: dict[str, Stamp] = field(default_factory=dict)  # relative path ("." for the root) -> stamp
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (relative path, why)
    base: Path | None = None

    @property
    def opened_at(self) -> Path:
        return self.base or self.host.parent

    def on_host(self, rel: str) -> str:
        """`rel` of the layer as a path in the tree opened at `opened_at`."""
        top = self.host.relative_to(self.opened_at).as_posix()
        return top if rel == "." else f"{top}/{rel}"

    def in_stage(self, rel: str) -> str:
        """`rel` of the layer as a path in the tree of the staged copy's directory."""
        return self.stage.name if rel == "." else f"{self.stage.name}/{rel}"


def stage(host: Path, root: Path, index: int, limit: int, base: Path | None = None) -> Layer:
    """Copy the writable path `host` into `root/<index>/`; the layer's `stage` is the copy (a file or a directory).
    `base`: a directory above `host` to open the host side at (Layer.base)."""
    with Tree(root) as scratch:
        scratch.mkdir(str(index), parents=False)
    layer = Layer(host, root / str(index) / (host.name or "root"), base=base)
    budget = [limit]
    try:
        with Tree(layer.opened_at) as hosts, Tree(layer.stage.parent) as staged:
            if stat.S_ISDIR(hosts.lstat(layer.on_host(".")).st_mode):
                staged.mkdir(layer.in_stage("."), mode=0o777, parents=False)
                layer.before["."] = Stamp("dir")
                for rel, kind in _walk(hosts, layer.on_host("."), []):
                    _copy_in(layer, hosts, staged, rel, kind, budget)
            else:
                _copy_in(layer, hosts, staged, ".", "file", budget)
    except OSError as exc:  # unreadable, or a link or FIFO put in place while copying (safefs refuses it)
        raise UsageError(
            f"cannot copy {host} for the tool to write ({exc.strerror or exc})",
            fix="let the tool write a directory whose files you can read, e.g. --writable ./out",
        ) from None
    return layer


def _walk(tree: Tree, top: str, unreadable: list[str]) -> Iterator[tuple[str, str]]:
    """(path relative to `top`, kind) of every entry below `top` in `tree`, parents first, links never followed; a
    directory that cannot be listed is named in `unreadable` and not entered."""
    pending = [""]
    while pending:
        here = pending.pop()
        try:
            names = tree.listdir(f"{top}/{here}" if here else top)
        except PermissionError:
            unreadable.append(here or ".")
            continue
        subdirs = []
        for name in names:
            rel = f"{here}/{name}" if here else name
            kind = _kind(tree.lstat(f"{top}/{rel}").st_mode)
            yield rel, kind
            if kind == "dir":
                subdirs.append(rel)
        pending.extend(reversed(subdirs))


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


def _copy_in(layer: Layer, hosts: Tree, staged: Tree, rel: str, kind: str, budget: list[int]) -> None:
    source, target = layer.on_host(rel), layer.in_stage(rel)
    if kind == "dir":
        staged.mkdir(target, mode=0o777, parents=False)
        layer.before[rel] = Stamp("dir")
    elif kind == "link":
        link = hosts.readlink(source)
        staged.symlink(link, target)
        layer.before[rel] = Stamp("link", target=link)
    elif kind == "file":
        with hosts.open_read(source) as src:
            host = os.fstat(src.fileno())
            budget[0] -= host.st_size
            if budget[0] < 0:
                raise UsageError(
                    f"writable path {layer.host} holds more than the sandbox_disk_mb limit: the tool writes a copy",
                    fix="name the directory the tool writes its output to (e.g. --writable ./out), not a large tree",
                )
            mode = stat.S_IMODE(host.st_mode) & 0o755 | 0o600
            times = (host.st_atime_ns, host.st_mtime_ns)
            staged.write_from(target, src, mode=mode, parents=False, times_ns=times, sync=False)
        copy = staged.lstat(target)
        layer.before[rel] = Stamp("file", copy.st_size, copy.st_mtime_ns, host.st_size, host.st_mtime_ns)
    # sockets, FIFOs and devices are never copied: the tool does not see them


def copy_back(layer: Layer, limit: int) -> list[tuple[str, str]]:
    """Write what the tool changed in the layer's copy back to the host path; returns what was left out, as
    (relative path, why)."""
    budget = [limit]
    try:
        hosts = Tree(layer.opened_at)
    except OSError as exc:
        layer.left_out.append((".", f"on the host: {exc.strerror}"))
        return layer.left_out
    with hosts, Tree(layer.stage.parent) as staged:
        if layer.before["."].kind == "file":
            if _changed(staged, layer.in_stage("."), "file", layer.before["."]):
                try:
                    _file_back(layer, hosts, staged, ".", budget)
                except OSError as exc:
                    layer.left_out.append((layer.host.name, f"on the host: {_why(exc)}"))
            return layer.left_out
        try:
            replaced = not stat.S_ISDIR(hosts.lstat(layer.on_host(".")).st_mode)
        except OSError:
            replaced = True
        if replaced:  # by a link or a file while the tool ran: nothing is written through it
            layer.left_out.append((".", IN_THE_WAY))
            return layer.left_out
        seen, unreadable = _tree_back(layer, hosts, staged, budget)
        _deletions(layer, hosts, seen, unreadable)
    return layer.left_out


def _why(exc: OSError) -> str:
    if isinstance(exc, UnsafePath) or exc.errno in (errno.ENOTDIR, errno.ELOOP, errno.EISDIR):
        return IN_THE_WAY
    return str(exc.strerror or exc)


def _tree_back(layer: Layer, hosts: Tree, staged: Tree, budget: list[int]) -> tuple[set[str], list[str]]:
    seen = {"."}
    skipped: list[str] = []  # directories not copied back: a steering name, or the host has a link there
    unreadable: list[str] = []
    layouts: dict[str, str] = {}  # staged directory -> the program that reads it as a repository ('' for none)
    for rel, kind in _walk(staged, layer.in_stage("."), unreadable):
        if any(rel.startswith(f"{top}/") for top in skipped):
            continue
        seen.add(rel)
        if not _changed(staged, layer.in_stage(rel), kind, layer.before.get(rel)):
            continue
        reader = steering_name(rel) or _repository(staged, layer, rel, layouts)
        if reader:
            layer.left_out.append((rel, f"read as configuration by {reader}"))
            skipped.append(rel)
        elif kind in ("dir", "file"):
            try:
                if kind == "dir":
                    hosts.mkdir(layer.on_host(rel), mode=0o777, parents=False)
                else:
                    _file_back(layer, hosts, staged, rel, budget)
            except OSError as exc:  # safefs follows no link: one on the way is refused here
                layer.left_out.append((rel, _why(exc)))
                skipped.append(rel)
        else:
            layer.left_out.append((rel, f"a {'symbolic link' if kind == 'link' else kind}, not data"))
    for rel in unreadable:
        layer.left_out.append((rel, "the tool made it unreadable"))
    return seen, unreadable


def _repository(staged: Tree, layer: Layer, rel: str, layouts: dict[str, str]) -> str:
    """Who would read the directory holding `rel` as a repository once the copy lands (trust.git_dir_layout, judged
    on the staged copy: the host's entries and the tool's together); '' when nobody would. Nothing the tool changed
    in such a directory is copied back, so it never becomes one, nor has its config rewritten."""
    parent = rel.rpartition("/")[0] or "."
    if parent not in layouts:
        try:
            layouts[parent] = git_dir_layout(staged.listdir(layer.in_stage(parent)))
        except OSError:
            layouts[parent] = ""
    return layouts[parent]


def _changed(staged: Tree, path: str, kind: str, old: Stamp | None) -> bool:
    if old is None or old.kind != kind:
        return True
    if kind == "file":
        now = staged.lstat(path)
        return (now.st_size, now.st_mtime_ns) != (old.size, old.mtime_ns)
    return kind == "link" and staged.readlink(path) != old.target


def _file_back(layer: Layer, hosts: Tree, staged: Tree, rel: str, budget: list[int]) -> None:
    """The staged file `rel` written over (or as) its host path: safefs makes a new file with O_EXCL beside it and
    renames it into place (a link or a hard link the host has there is replaced, not followed)."""
    target, old = layer.on_host(rel), layer.before.get(rel)
    try:
        host: os.stat_result | None = hosts.lstat(target)
    except FileNotFoundError:
        host = None
    if old is not None and (host is None or (host.st_size, host.st_mtime_ns) != (old.host_size, old.host_mtime_ns)):
        layer.left_out.append((rel, "changed on the host while the tool ran"))
        return
    if old is None and host is not None:
        layer.left_out.append((rel, "made on the host while the tool ran"))
        return
    with staged.open_read(layer.in_stage(rel)) as src:
        copy = os.fstat(src.fileno())
        budget[0] -= copy.st_size
        if budget[0] < 0:
            layer.left_out.append((rel, "past the sandbox_disk_mb limit"))
            return
        mode, owner = _settled(host)
        hosts.write_from(target, src, mode=mode, owner=owner, parents=False)


def _settled(host: os.stat_result | None) -> tuple[int, tuple[int, int] | None]:
    """(mode, owner) of the file written back: a replaced file keeps its mode and owner; a new one is data, 0666 less
    the caller's umask: never executable whatever the tool set (a hook it wrote must not be runnable as it lands),
    never set-id bits."""
    if host is not None:
        owner = (host.st_uid, host.st_gid) if os.geteuid() == 0 else None
        return stat.S_IMODE(host.st_mode) & 0o1777, owner
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask, None


def _deletions(layer: Layer, hosts: Tree, seen: set[str], unreadable: list[str]) -> None:
    """What the tool removed from its copy is removed on the host: files still as they were staged, then empty
    directories (deepest first); never anything under a steering name or a directory the tool made unreadable."""
    gone = sorted((rel for rel in layer.before if rel not in seen), key=lambda r: -len(Path(r).parts))
    for rel in gone:
        old = layer.before[rel]
        hidden = any(top == "." or rel.startswith(f"{top}/") for top in unreadable)
        if steering_name(rel) or old.kind == "link" or hidden:
            continue
        try:
            host = hosts.lstat(layer.on_host(rel))
            if old.kind == "file" and (host.st_size, host.st_mtime_ns) == (old.host_size, old.host_mtime_ns):
                hosts.unlink(layer.on_host(rel))
            elif old.kind == "dir" and stat.S_ISDIR(host.st_mode):
                hosts.rmdir(layer.on_host(rel))
        except OSError:  # gone already, a link on the way, or a directory that still holds something: left as it is
            pass
