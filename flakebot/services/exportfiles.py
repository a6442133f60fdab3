"""Where `flakebot export` writes: a directory the user names, never followed through a link, nothing overwritten
without --force, each file (or a whole image layout) in place in one rename or not at all.

The output directory is reached as a name inside its parent (safefs.Tree on the parent): a symbolic link at that
name is refused, not followed, as is a link at any file name below it; files are made fresh (O_EXCL) and renamed
over their names. A layout directory is written under a temporary name and renamed into place; with --force the
old one is moved aside first and removed after.
"""

from __future__ import annotations

import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flakebot.errors import HostError, UnsafePath, UsageError
from flakebot.safefs import Tree


class ExportDir:
    """The directory `out_dir` (made when missing, its parents too) as export writes into it. Made and proven
    writable when opened, before any build; `discard` removes what opening made, for an export that then fails."""

    def __init__(self, out_dir: Path, *, force: bool = False) -> None:
        path = Path(out_dir).expanduser().absolute()
        if not path.name:
            raise UsageError(f"{path} cannot be an export directory", fix="pass --out a directory below /")
        self.path, self.force, self._name = path, force, path.name
        self.made = [p for p in (path, *path.parents) if not p.exists()]  # the user's own spelling, trusted
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._tree = Tree(path.parent)
            if self._tree.exists(self._name) and not self._tree.is_dir(self._name):
                kind = "a symbolic link" if stat.S_ISLNK(self._tree.lstat(self._name).st_mode) else "not a directory"
                raise UsageError(
                    f"{path} is {kind}: export writes only into a real directory, never through a link",
                    fix="pass --out a new or existing directory that is not a link",
                )
            self._tree.mkdir(self._name, parents=False)
            self._prove_writable()
        except UsageError:  # UnsafePath too, though it is an OSError as well
            self.discard()
            raise
        except OSError as exc:  # read-only, /proc, no permission: the machine's trouble (exit 5), as package --out's
            self.discard()
            raise HostError(
                f"cannot write into {path}: {exc.strerror or exc}", fix="pass --out a directory you can write"
            ) from exc

    def _prove_writable(self) -> None:
        """Create and remove one file, so an unwritable --out is refused before a build rather than after it."""
        probe = self._rel(f".flakebot-probe-{secrets.token_hex(6)}")
        self._tree.create_bytes(probe, b"")
        self._tree.unlink(probe)

    def discard(self) -> None:
        """Remove the directories opening made, deepest first, each only while empty (nothing of the user's)."""
        for made in self.made:
            try:
                made.rmdir()
            except OSError:
                break

    def _rel(self, name: str) -> str:
        return f"{self._name}/{name}"

    def refuse_existing(self, names: list[str]) -> None:
        """A UsageError when one of `names` is there already and --force was not given (checked before any work)."""
        for name in names:
            if self._tree.exists(self._rel(name)) and not self.force:
                raise UsageError(
                    f"{self.path / name} exists", fix="pass --force to replace it, or choose another --out"
                )

    def write_text(self, files: dict[str, str]) -> list[Path]:
        """Each file of `files` (name -> text) written whole; all names checked first."""
        self.refuse_existing(list(files))
        for name, text in files.items():
            if self._tree.is_dir(self._rel(name)):
                raise UnsafePath(f"{self.path / name} is a directory", fix=f"remove {self.path / name}", rule="export")
            self._tree.write_text(self._rel(name), text, parents=False)
        return [self.path / name for name in files]

    def write_tree(self, name: str, files: dict[str, bytes]) -> Path:
        """The directory `name` holding `files` (relative path -> bytes), renamed into place whole."""
        self.refuse_existing([name])
        token = secrets.token_hex(6)
        staging, old = self._rel(f".{name}.tmp-{token}"), self._rel(f".{name}.old-{token}")
        try:
            self._tree.mkdir(staging, parents=False)
            for rel, data in files.items():
                self._tree.write_bytes(f"{staging}/{rel}", data)
            if self._tree.exists(self._rel(name)):  # --force (refuse_existing let it through)
                self._tree.rename(self._rel(name), old)
            self._tree.rename(staging, self._rel(name))
        finally:
            self._tree.remove(staging)
            self._tree.remove(old)
        return self.path / name


@contextmanager
def export_dir(out_dir: Path, *, force: bool = False) -> Iterator[ExportDir]:
    """The ExportDir for `out_dir`; what opening it made is removed again when the export fails."""
    target = ExportDir(out_dir, force=force)
    try:
        yield target
    except BaseException:
        target.discard()
        raise
