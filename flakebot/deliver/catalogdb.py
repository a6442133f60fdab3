"""The local catalog's index: catalog.db, an SQLite database (stdlib sqlite3) in the catalog's directory.

    tools(name, need_key, digest, entry)  one row per tool; `entry` is its JSON (shape: catalog.py's docstring),
                                          `digest` that JSON's sha256, so a reader knows what changed unread
    definitions(name, stamp, definition)  a tool's MCP definition, cached against `stamp` (deliver/definitions.py)
    PRAGMA user_version                the index's format (3); a newer one is refused, not misread

Every write is one transaction (BEGIN IMMEDIATE: writers queue on SQLite's lock, waiting up to BUSY_SECONDS), so
a crash loses nothing committed and leaves nothing half-written; WAL lets readers go on while a writer works.
A read touches the rows it needs, never the whole index. The catalog.json of formats 1 and 2 is read once into
the database on first open and kept as catalog.json.migrated.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flakebot.errors import CatalogError

logger = logging.getLogger(__name__)

FORMAT = 3  # catalog.json was formats 1 and 2
BUSY_SECONDS = 600.0  # a writer waits this long for another (a craft's add holds the lock while nix-store runs)
SCHEMA = """
CREATE TABLE IF NOT EXISTS tools (name TEXT PRIMARY KEY, need_key TEXT NOT NULL, digest TEXT NOT NULL, entry TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS tools_need_key ON tools (need_key);
CREATE TABLE IF NOT EXISTS definitions (name TEXT PRIMARY KEY, stamp TEXT NOT NULL, definition TEXT NOT NULL);
"""


class Index:
    """catalog.db in `root`. Each thread keeps its connection open (closing the last one would checkpoint the WAL
    every time); a fork, or a catalog.db replaced underneath, gets a new one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / "catalog.db"
        self.legacy = root / "catalog.json"

    def exists(self) -> bool:
        return self.path.exists() or self.legacy.exists()

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection | None]:
        """A connection that reads one consistent snapshot; None when there is no catalog yet (nothing is created).
        Inside this thread's write transaction, that transaction's view."""
        if not self.exists():
            yield None
            return
        db = self._connection()
        if db.in_transaction:
            yield db
            return
        db.execute("BEGIN")
        try:
            yield db
        finally:
            db.execute("COMMIT")

    @contextmanager
    def writing(self, busy: float = BUSY_SECONDS, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """A write transaction, after waiting up to `busy` seconds for another writer's: committed when the block
        ends (synced to disk unless not `durable`: a cache), rolled back when it raises. A catalog this process
        cannot write is refused before anything is touched."""
        self.refuse_read_only()
        db = self._connection()
        db.execute(f"PRAGMA busy_timeout = {int(busy * 1000)}")
        db.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
        _begin_immediate(db, self.path)
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        else:
            db.execute("COMMIT")
        finally:
            db.execute(f"PRAGMA busy_timeout = {int(BUSY_SECONDS * 1000)}")

    def refuse_read_only(self) -> None:
        """A CatalogError when this process cannot write the catalog: what changes it (an add's staging copy, a
        publication's key and copy) calls this before its first step, not only at the index's transaction."""
        if self.exists() and self._unwritable():
            raise CatalogError(
                f"catalog {self.root} is read-only here: it can be read, not changed",
                fix="set catalog_dir to a writable directory (--catalog-dir DIR or FLAKEBOT_CATALOG_DIR), or make "
                f"{self.root} writable",
            )

    def _unwritable(self) -> bool:
        """This process cannot write the catalog's directory (a read-only mount, another user's): SQLite's lock files
        and every change go there."""
        return not os.access(self.root, os.W_OK)

    def _connection(self) -> sqlite3.Connection:
        read_only = self.path.exists() and self._unwritable()
        try:
            db = _connections.get(self.path) or (self._connect_read_only() if read_only else self._connect())
            if db.execute("PRAGMA user_version").fetchone()[0] != FORMAT:
                if read_only:
                    raise CatalogError(
                        f"catalog {self.root} is read-only here and its index is not in the format this flakebot reads",
                        fix="open it once where it is writable with this flakebot version, or upgrade flakebot",
                    )
                self._prepare(db)
        except sqlite3.DatabaseError as exc:
            if read_only:  # never "remove it": the file is fine, this process just cannot write beside it
                raise CatalogError(
                    f"catalog {self.root} cannot be read here: it is read-only to this user, and SQLite needs to "
                    f"write its lock files beside catalog.db to read it ({exc})",
                    fix="make the directory writable to this user, or use a catalog_dir of your own and "
                    "'flakebot install' from a shared cache",
                ) from None
            raise CatalogError(
                f"{self.path} is unusable ({exc})", fix=f"restore {self.path} from a backup, or remove it"
            ) from None
        return db

    def _connect(self) -> sqlite3.Connection:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=BUSY_SECONDS, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise CatalogError(
                f"catalog {self.root} is not writable ({exc})", fix="set catalog_dir to a writable directory"
            ) from None
        _connections.keep(self.path, db)
        return db

    def _connect_read_only(self) -> sqlite3.Connection:
        """catalog.db where this process cannot write (a read-only mount, another user's directory): opened to read
        only, through the lock files its writers leave (SQLite reads a WAL database's newest commits from them).
        On a read-only file system without them nobody writes it at all: it is opened immutable. A -wal with
        commits in it but no -shm cannot be read there, and immutable would read catalog.db without them (an older
        catalog, or none): refused."""
        uri = self.path.resolve().as_uri() + "?mode=ro"
        try:
            db = sqlite3.connect(uri, uri=True, timeout=BUSY_SECONDS, isolation_level=None)
            db.execute("PRAGMA user_version").fetchone()
        except sqlite3.OperationalError:
            if not os.statvfs(self.root).f_flag & os.ST_RDONLY:
                raise
            wal = self.path.with_name(self.path.name + "-wal")
            if wal.exists() and wal.stat().st_size > 0:
                raise CatalogError(
                    f"catalog {self.root} is read-only here and its {wal.name} holds changes that are not in "
                    f"{self.path.name} yet, which SQLite cannot read there (its -shm file is missing)",
                    fix=f"open the catalog once where it is writable ('flakebot list' folds {wal.name} into "
                    f"{self.path.name}), then share it read-only again",
                ) from None
            db = sqlite3.connect(uri + "&immutable=1", uri=True, timeout=BUSY_SECONDS, isolation_level=None)
        _connections.keep(self.path, db)
        return db

    def _prepare(self, db: sqlite3.Connection) -> None:
        """Make the tables (in WAL mode) and bring in catalog.json, once; whoever gets the lock first does it."""
        db.execute("PRAGMA journal_mode=WAL")
        _begin_immediate(db, self.path)
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > FORMAT:
                raise CatalogError(
                    f"{self.path} is format {version}, newer than this flakebot reads ({FORMAT})",
                    fix="upgrade flakebot, or point catalog_dir at another directory",
                )
            if version < FORMAT:
                for statement in SCHEMA.strip().split(";\n"):
                    db.execute(statement)
                migrated = self._migrate(db)
                db.execute(f"PRAGMA user_version = {FORMAT}")
            else:
                migrated = 0
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        if migrated and self.legacy.exists():  # after the commit: a crash before it leaves catalog.json to read again
            self.legacy.rename(self.legacy.with_name("catalog.json.migrated"))
            logger.info("catalog: %d tool(s) moved from %s into %s", migrated, self.legacy, self.path)

    def _migrate(self, db: sqlite3.Connection) -> int:
        """catalog.json's entries as they are (a format-1 entry is read as format 2, as catalog.json's was)."""
        if not self.legacy.exists():
            return 0
        try:
            index = json.loads(self.legacy.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CatalogError(f"{self.legacy} is corrupt ({exc})", fix=f"restore or remove {self.legacy}") from None
        if not isinstance(index, dict) or not isinstance(index.get("tools"), dict):
            raise CatalogError(f"{self.legacy} has no tools table", fix=f"restore or remove {self.legacy}")
        for name, entry in index["tools"].items():
            put(db, name, entry)
        return len(index["tools"])


class _Connections(threading.local):
    """This thread's open connections by database path, each with the file it opened (device, inode)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.open: dict[Path, tuple[sqlite3.Connection, tuple[int, int]]] = {}

    def get(self, path: Path) -> sqlite3.Connection | None:
        if self.pid != os.getpid():  # a connection must not cross a fork
            self.pid, self.open = os.getpid(), {}
        kept = self.open.get(path)
        if kept is None:
            return None
        try:
            found = os.stat(path)
        except OSError:
            found = None
        if found is not None and (found.st_dev, found.st_ino) == kept[1]:
            return kept[0]
        del self.open[path]
        kept[0].close()
        return None

    def keep(self, path: Path, db: sqlite3.Connection) -> None:
        found = os.stat(path)
        self.open[path] = (db, (found.st_dev, found.st_ino))


_connections = _Connections()


def _begin_immediate(db: sqlite3.Connection, path: Path) -> None:
    try:
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:  # busy past BUSY_SECONDS, or a read-only file
        raise CatalogError(
            f"cannot write the catalog {path} ({exc})",
            fix="wait for the other flakebot writing it to finish, or check the directory is writable",
        ) from None


def put(db: sqlite3.Connection, name: str, entry: dict[str, Any]) -> None:
    text = json.dumps(entry, sort_keys=True)
    db.execute(
        "INSERT OR REPLACE INTO tools (name, need_key, digest, entry) VALUES (?, ?, ?, ?)",
        (name, entry.get("need_key", ""), hashlib.sha256(text.encode()).hexdigest()[:32], text),
    )


def delete(db: sqlite3.Connection, name: str) -> None:
    db.execute("DELETE FROM tools WHERE name = ?", (name,))
    db.execute("DELETE FROM definitions WHERE name = ?", (name,))


def entry(db: sqlite3.Connection | None, name: str) -> dict[str, Any] | None:
    if db is None:
        return None
    row = db.execute("SELECT entry FROM tools WHERE name = ?", (name,)).fetchone()
    return None if row is None else _loads(row[0])


def entries(db: sqlite3.Connection | None, where: str = "", args: tuple[Any, ...] = ()) -> dict[str, dict[str, Any]]:
    """Tools by name (all, or those `where` selects), in one pass."""
    if db is None:
        return {}
    rows = db.execute(f"SELECT name, entry FROM tools {where} ORDER BY name", args)
    return {name: _loads(text) for name, text in rows}


def digests(db: sqlite3.Connection | None) -> dict[str, str]:
    """Every tool's entry digest by name: what changed since a reader last looked, without reading entries."""
    return {} if db is None else dict(db.execute("SELECT name, digest FROM tools ORDER BY name").fetchall())


def names(db: sqlite3.Connection | None) -> list[str]:
    return [] if db is None else [name for (name,) in db.execute("SELECT name FROM tools ORDER BY name")]


def _loads(text: str) -> dict[str, Any]:
    loaded = json.loads(text)
    return loaded if isinstance(loaded, dict) else {}


def definitions(db: sqlite3.Connection | None, names: list[str]) -> dict[str, tuple[str, str]]:
    """Cached MCP definitions of the tools `names`, by name: (stamp, definition JSON)."""
    if db is None:
        return {}
    found = {}
    for start in range(0, len(names), 500):  # SQLite's limit on bound parameters
        chunk = names[start : start + 500]
        query = f"SELECT name, stamp, definition FROM definitions WHERE name IN ({', '.join('?' * len(chunk))})"
        found.update({name: (stamp, text) for name, stamp, text in db.execute(query, chunk)})
    return found


def store_definitions(db: sqlite3.Connection, made: dict[str, tuple[str, str]]) -> None:
    db.executemany(
        "INSERT OR REPLACE INTO definitions (name, stamp, definition) SELECT ?, ?, ? "
        "WHERE EXISTS (SELECT 1 FROM tools WHERE name = ?)",  # not for a tool removed meanwhile
        [(name, stamp, text, name) for name, (stamp, text) in made.items()],
    )
