"""The catalog of crafted tools (default ~/.local/share/flakebot/).

    catalog.db                      the index: one row per tool, one transaction per write (deliver/catalogdb.py)
    tools/<name>/<version>/flake/   that version's flake (sources, flake.nix, flake.lock)
    tools/<name>/<version>/manifest.json, USAGE.md
    tools/<name>/<version>/gcroot   a Nix GC root holding that version's store path

An entry carries its current (newest) version's fields at the top, as format 1 did, plus `version` and
`versions` (every version's record). Format 1 kept one version flat in tools/<name>/; such an entry reads as
version 0.1.0 whose files stay where they are, so its manifest's `nix run` keeps working. The catalog.json of
formats 1 and 2 moves into catalog.db on first open.

Concurrent writers (crafts, installs, `rm`) queue on the index's write transaction; a version directory is
assembled beside its final place and renamed in inside it, so a reader never sees half of one.

Team mode (the `tenant` setting, set per call by `flakebot serve` and per job by a worker): catalog_dir is the
organisation's catalog and each tenant's is a catalog of the same shape beneath it,

    tenants/<tenant>/               catalog.db, tools/... : that tenant's tools

A tenant's Catalog reads its own tools over the organisation's (its entry of a name shadows the organisation's) and
writes its own only: removing, improving or updating a tool only the organisation's catalog holds is refused.
Another tenant's tools are not there at all, so they are "no tool" as an unknown name is.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flakebot.config import Settings, tenant_dir
from flakebot.deliver import catalogdb
from flakebot.deliver.versions import FIRST_VERSION, ToolRef, newest, next_version, parse_ref, version_key
from flakebot.errors import CatalogError, NixError
from flakebot.fsutil import atomic_write_json, remove_tree

logger = logging.getLogger(__name__)

CATALOG_FORMAT = catalogdb.FORMAT
# What each version keeps of its own; the entry shows the current version's at its top.
VERSION_FIELDS = (
    "summary", "change", "run_id", "origin", "store_path", "dir", "gc_root", "dependencies_gc_root", "added",
    "installed_from",
)  # fmt: skip
VERSION_FILES = ("flake", "manifest.json", "USAGE.md", "gcroot", "deps-gcroot")
STOPWORDS = {
    "a",
    "an",
    "the",
    "i",
    "we",
    "need",
    "needs",
    "want",
    "wants",
    "tool",
    "to",
    "that",
    "which",
    "for",
    "please",
    "me",
    "some",
    "cli",
    "command",
    "line",
    "program",
}


def normalize_need(need: str) -> str:
    """The key two needs share when they ask for the same thing: lower-case words, stopwords and order dropped."""
    words = {w.rstrip("s") if len(w) > 3 else w for w in re.findall(r"[a-z0-9]+", need.lower())}
    return " ".join(sorted(words - STOPWORDS))


def tenant_root(settings: Settings, tenant: str) -> Path:
    """Where `tenant`'s own catalog lives: beneath catalog_dir, under a name that is one plain name (ConfigError
    otherwise: a tenant never names a path)."""
    return tenant_dir(settings, tenant)


class Catalog:
    """Crafted tools on this machine: those in `root`, read over the organisation's (`shared`, a tenant's catalog
    only), which this catalog never writes."""

    def __init__(self, root: Path, shared: Catalog | None = None) -> None:
        self.root = root
        self.shared = shared
        self.index = catalogdb.Index(root)
        self.index_path = self.index.legacy  # catalog.json: read once into catalog.db (index.path)

    @classmethod
    def open(cls, settings: Settings) -> Catalog:
        """The catalog of `settings`: catalog_dir's, or with a `tenant`, that tenant's over catalog_dir's."""
        organisation = settings.path("catalog_dir")
        if not settings.tenant:
            return cls(organisation)
        return cls(tenant_root(settings, settings.tenant), shared=cls(organisation))

    def layers(self) -> list[Catalog]:
        """The catalogs read, the shadowed first: the organisation's, then this one."""
        return [*(self.shared.layers() if self.shared is not None else []), Catalog(self.root)]

    def writable(self, name: str) -> None:
        """Refuse to change `name` when only the organisation's catalog holds it (a tenant reads it, never changes
        it); a name no catalog holds is left to the caller's own "no tool" answer."""
        if self.shared is None:
            return
        with self.index.reading() as db:
            own = catalogdb.entry(db, name)
        if own is None and self.shared.entry(name) is not None:
            raise CatalogError(
                f"'{name}' is in the organisation's catalog, which this token reads but cannot change",
                fix=f"ask an admin to change it ('flakebot rm {name}' or 'flakebot improve' on the server), or craft "
                "a tool of your own under another name",
                reason="organisation",
            )

    def tool_dir(self, name: str) -> Path:
        """Where every version of a tool lives."""
        return self.root / "tools" / name

    def version_dir(self, name: str, version: str) -> Path:
        return self.tool_dir(name) / version

    @contextmanager
    def locked(self) -> Iterator[dict[str, Any]]:
        """The whole index ({"format", "tools"}) in one write transaction; the entries changed are written back
        when the block ends. add, update and remove touch one row each: prefer them."""
        with self.index.writing() as db:
            tools = catalogdb.entries(db)
            before = {name: json.dumps(entry, sort_keys=True) for name, entry in tools.items()}
            by_name = {k: _with_versions(v) for k, v in tools.items()}
            yield {"format": CATALOG_FORMAT, "tools": by_name}
            for name in before.keys() - by_name.keys():
                catalogdb.delete(db, name)
            for name, entry in by_name.items():
                if json.dumps(entry, sort_keys=True) != before.get(name):
                    catalogdb.put(db, name, entry)

    def tools(self) -> dict[str, dict[str, Any]]:
        """Every tool's entry by name, read in one pass (the organisation's too, shadowed by this catalog's)."""
        shared = self.shared.tools() if self.shared is not None else {}
        with self.index.reading() as db:
            return {**shared, **{name: _with_versions(entry) for name, entry in catalogdb.entries(db).items()}}

    def entry(self, name: str) -> dict[str, Any] | None:
        """A tool's entry (every version), None when the catalog (nor the organisation's beneath) has no such tool."""
        found = self._own(name)
        if found is None and self.shared is not None:
            return self.shared.entry(name)
        return found

    def own_entry(self, name: str) -> dict[str, Any] | None:
        """A tool's entry in this catalog itself (a tenant's own), never the organisation's beneath it."""
        return self._own(name)

    def _own(self, name: str) -> dict[str, Any] | None:
        with self.index.reading() as db:
            found = catalogdb.entry(db, name)
        return None if found is None else _with_versions(found)

    def names(self) -> list[str]:
        """Every tool's name, sorted (the organisation's too)."""
        with self.index.reading() as db:
            own = catalogdb.names(db)
        return sorted({*own, *(self.shared.names() if self.shared is not None else [])})

    def get(self, name: str) -> dict[str, Any]:
        """A tool's entry by `NAME` (its current version) or `NAME@VERSION` (that version's fields at the top)."""
        ref = parse_ref(name)
        found = self.entry(ref.name)
        if found is None:
            names = self.names()
            known = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "") or "none yet"
            raise CatalogError(
                f"no tool '{ref.name}' in the catalog",
                fix=f"list tools with 'flakebot list' (known: {known})",
                reason="unknown",
            )
        return _at_version(found, ref)

    def find_need(self, need: str) -> dict[str, Any] | None:
        """A catalogued tool crafted for the same (normalized) need whose store path still exists."""
        with self.index.reading() as db:
            found = catalogdb.entries(db, "WHERE need_key = ?", (normalize_need(need),))
        for entry in found.values():
            if Path(entry.get("store_path", "/nonexistent")).exists():
                return _with_versions(entry)
        return self.shared.find_need(need) if self.shared is not None else None

    def name_holder(self, name: str, need: str) -> dict[str, Any] | None:
        """The entry holding `name` for a different need (None when the name is free or holds the same need)."""
        entry = self.entry(name)
        return entry if entry is not None and entry.get("need_key") != normalize_need(need) else None

    def free_name(self, name: str, need: str) -> str:
        """`name`, or when a different need holds it, the first free `name-2`, `name-3`, ..."""
        taken: dict[str, dict[str, Any]] = {}
        for layer in self.layers():  # this catalog's names over the organisation's: a free name is free in both
            with layer.index.reading() as db:
                rows = [] if db is None else db.execute("SELECT name, need_key FROM tools").fetchall()
            taken.update({name: {"need_key": key} for name, key in rows})
        for candidate in (name, *(f"{name}-{n}" for n in range(2, 1000))):
            entry = taken.get(candidate)
            if entry is None or entry.get("need_key") == normalize_need(need):
                return candidate
        raise CatalogError(f"every name like {name} is taken", fix="pass --name with a name of your own")

    def version_for(self, name: str, *, improving: bool = False) -> str:
        """The version a new build of `name` becomes. An improvement gets the next version. A plain craft of a
        need the catalog holds replaces that craft (its current version) unless the current version is an
        improvement, which a plain re-craft must not silently drop: then it too gets the next version (this catalog's
        own versions: an organisation's tool of the name is not this catalog's to continue)."""
        entry = self._own(name)
        if entry is None:
            return FIRST_VERSION
        current = entry["version"]
        if improving or entry["versions"][current].get("change"):
            return next_version(current)
        return str(current)

    def add(
        self,
        name: str,
        *,
        need: str,
        flake_dir: Path,
        manifest: dict[str, Any],
        usage_md: str,
        store_path: str,
        run_id: str,
        origin: dict[str, Any],
        version: str | None = None,
        change: str = "",
        installed_from: dict[str, Any] | None = None,
        dependencies_path: str = "",
    ) -> dict[str, Any]:
        """Copy a built tool into the catalog as `version` of `name` (default: what `version_for` says) and hold
        its store path, and the output of the dependency derivation it was built on (`dependencies_path`, so the next
        tool on the same dependencies still finds it after a garbage collection). The newest version becomes the
        current one.

        A tool of the same name crafted for a different need is never replaced silently: that is an error.
        `change` (an improvement's request) marks a new version: one another run already made is not replaced.
        `installed_from` (a shared catalog's URL, the signer) marks a version fetched rather than built here."""
        self.index.refuse_read_only()  # before the staging copy, which would fail half-way on a read-only mount
        version = version or self.version_for(name, improving=bool(change))
        staging = Path(tempfile.mkdtemp(dir=self._staging_root(), prefix=f"{name}."))
        try:
            shutil.copytree(
                flake_dir, staging / "flake", symlinks=True, ignore=shutil.ignore_patterns("result", "result-*")
            )
            atomic_write_json(staging / "manifest.json", manifest)
            (staging / "USAGE.md").write_text(usage_md)
            with self.index.writing() as db:
                entry = catalogdb.entry(db, name)
                entry = None if entry is None else _with_versions(entry)
                _refuse_other_need(entry, need)
                earlier = (entry or {}).get("versions", {}).get(version)
                if earlier is not None and change and earlier.get("run_id") != run_id:
                    raise CatalogError(
                        f"{name} {version} was made by another run ({earlier.get('run_id')}) while this one worked",
                        fix=f"improve {name} again: it starts from {name}@{version}",
                        name=name,
                    )
                final = self.version_dir(name, version)
                final.parent.mkdir(parents=True, exist_ok=True)
                old = final.with_name(f".{version}.old")
                remove_tree(old)
                if final.exists():
                    final.rename(old)
                staging.rename(final)
                remove_tree(old)
                if earlier is not None and Path(earlier["dir"]) != final:  # a format-1 copy, flat in the tool's dir
                    _remove_version_files(Path(earlier["dir"]), self.tool_dir(name))
                record = {
                    "version": version,
                    "summary": manifest.get("summary", ""),
                    "change": change,
                    "run_id": run_id,
                    "origin": origin,
                    "store_path": store_path,
                    "dir": str(final),
                    "added": time.time(),
                }
                if installed_from:
                    record["installed_from"] = installed_from
                roots = {"gc_root": (final / "gcroot", store_path)}
                if dependencies_path:
                    roots["dependencies_gc_root"] = (final / "deps-gcroot", dependencies_path)
                record.update((key, str(link)) for key, link in add_gc_roots(roots).items())
                if entry is None:
                    entry = {"name": name, "need": need, "need_key": normalize_need(need), "versions": {}}
                entry["versions"][version] = record
                current = _current(entry)
                catalogdb.put(db, name, current)
                return _at_version(current, ToolRef(name, version))
        finally:
            remove_tree(staging)

    def update(self, name: str, **fields: Any) -> dict[str, Any]:
        """Change fields of a tool's entry under the lock. A dict value is merged into the entry's dict of that
        name, so concurrent updates of different keys (say, two publications) both land."""
        self.writable(name)
        with self.index.writing() as db:
            entry = catalogdb.entry(db, name)
            if entry is None:
                raise CatalogError(f"no tool '{name}' in the catalog", fix="list tools with 'flakebot list'")
            entry = _with_versions(entry)
            for key, value in fields.items():
                entry[key] = (
                    {**entry[key], **value} if isinstance(value, dict) and isinstance(entry.get(key), dict) else value
                )
            catalogdb.put(db, name, entry)
            return dict(entry)

    def remove(self, name: str) -> dict[str, Any]:
        """Drop a tool (`NAME`: every version, its directory and so its GC roots) or one version (`NAME@VERSION`;
        the newest left becomes current, and removing the only one removes the tool)."""
        ref = parse_ref(name)
        self.writable(ref.name)
        with self.index.writing() as db:
            entry = catalogdb.entry(db, ref.name)
            if entry is None:
                raise CatalogError(f"no tool '{ref.name}' in the catalog", fix="list tools with 'flakebot list'")
            entry = _with_versions(entry)
            removed = _at_version(entry, ref)
            # the files first: a crash before the commit leaves the entry, and `rm` again finishes the job
            if ref.version is None or len(entry["versions"]) == 1:
                remove_tree(self.tool_dir(ref.name))
                catalogdb.delete(db, ref.name)
                return removed
            record = entry["versions"].pop(ref.version)
            _remove_version_files(Path(record["dir"]), self.tool_dir(ref.name))
            catalogdb.put(db, ref.name, _current(entry))
        return removed

    def _staging_root(self) -> Path:
        staging = self.root / "tools" / ".staging"
        staging.mkdir(parents=True, exist_ok=True)
        return staging


def _with_versions(entry: dict[str, Any]) -> dict[str, Any]:
    """A format-1 entry (one flat version) in format 2's shape: version 0.1.0, its files where they are."""
    if "versions" not in entry:
        entry["version"] = FIRST_VERSION
        entry["versions"] = {
            FIRST_VERSION: {"version": FIRST_VERSION, **{k: entry[k] for k in VERSION_FIELDS if k in entry}}
        }
    return entry


def _current(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry with its newest version's fields at the top."""
    version = newest(list(entry["versions"]))
    return {**_shared_fields(entry), **entry["versions"][version], "version": version}


def _shared_fields(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry without the version fields its top shows (another version's must not linger there)."""
    return {k: v for k, v in entry.items() if k not in VERSION_FIELDS}


def _at_version(entry: dict[str, Any], ref: ToolRef) -> dict[str, Any]:
    if ref.version is None:
        return dict(entry)
    record = entry["versions"].get(ref.version)
    if record is None:
        known = ", ".join(sorted(entry["versions"], key=version_key))
        raise CatalogError(
            f"{ref.name} has no version {ref.version} (it has {known})",
            fix=f"use one of {', '.join(f'{ref.name}@{v}' for v in sorted(entry['versions'], key=version_key))}",
        )
    return {**_shared_fields(entry), **record, "version": ref.version}


def _remove_version_files(directory: Path, tool_dir: Path) -> None:
    """Remove one version's files: its own directory, or those of a format-1 version, flat in the tool's
    directory beside the other versions' directories."""
    if directory != tool_dir:
        remove_tree(directory)
        return
    for name in VERSION_FILES:
        target = directory / name
        if target.is_symlink() or target.is_file():
            target.unlink()
        else:
            remove_tree(target)


def _refuse_other_need(entry: dict[str, Any] | None, need: str) -> None:
    if entry is not None and entry.get("need_key") != normalize_need(need):
        raise CatalogError(
            f"the catalog already has a tool named {entry['name']} for another need ({entry.get('need', '')!r})",
            fix=f"pass --name {entry['name']}-2 (or another free name), or remove the old one with "
            f"'flakebot rm {entry['name']}'",  # a craft's or a package's: the words fit both
            name=entry["name"],
        )


def add_gc_root(link: Path, store_path: str) -> Path:
    """Register `link` as an indirect Nix GC root for `store_path` (nix.build.make_gc_root), or keep a plain symlink
    when nix-store is absent or refuses."""
    return add_gc_roots({"": (link, store_path)})[""]


def add_gc_roots(roots: dict[str, tuple[Path, str]]) -> dict[str, Path]:
    """add_gc_root of each (link, store path) of `roots`, their nix-store processes all running at once (each is
    mostly nix's own start); the links under the same keys."""
    from flakebot.nix.build import start_gc_root

    started: dict[str, Callable[[], Path] | None] = {}
    for key, (link, store_path) in roots.items():
        try:
            started[key] = start_gc_root(store_path, link)
        except (NixError, OSError, subprocess.SubprocessError) as exc:
            logger.warning("no GC root for %s (%s); keeping a plain link", store_path, exc)
            started[key] = None
    return {key: _rooted(finish, *roots[key]) for key, finish in started.items()}


def _rooted(finish: Callable[[], Path] | None, link: Path, store_path: str) -> Path:
    """The root `finish` waits for, or a plain symlink at `link` when it was refused (or never started: None)."""
    try:
        if finish is not None:
            return finish()
    except (NixError, OSError, subprocess.SubprocessError) as exc:
        logger.warning("no GC root for %s (%s); keeping a plain link", store_path, exc)
    link.unlink(missing_ok=True)
    link.symlink_to(store_path)
    return link


def read_manifest(directory: Path, ref: str) -> dict[str, Any]:
    """A catalogued version's manifest.json ({} when it has none); a damaged one is one clear error, not a traceback."""
    path = directory / "manifest.json"
    if not path.exists():
        return {}
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CatalogError(
            f"the manifest of {ref} ({path}) is damaged: {exc}",
            fix=f"craft it again with 'flakebot craft --fresh', or remove it with 'flakebot rm {ref}'",
            reason="damaged",
        ) from None
    if not isinstance(manifest, dict):
        raise CatalogError(
            f"the manifest of {ref} ({path}) is not a JSON object",
            fix=f"craft it again with 'flakebot craft --fresh', or remove it with 'flakebot rm {ref}'",
            reason="damaged",
        )
    return manifest


def show_tool(name: str, settings: Settings) -> dict[str, Any]:
    """A catalogued tool's entry and manifest (`NAME@VERSION`: that version's), with every version listed."""
    entry = Catalog.open(settings).get(name)
    directory = Path(entry["dir"])
    manifest = read_manifest(directory, f"{entry['name']}@{entry['version']}")
    usage = (directory / "USAGE.md").read_text() if (directory / "USAGE.md").exists() else ""
    versions = [
        {k: record.get(k) for k in ("version", "change", "summary", "run_id", "store_path", "added", "installed_from")}
        for _, record in sorted(entry["versions"].items(), key=lambda item: version_key(item[0]))
    ]
    shown = {k: v for k, v in entry.items() if k != "versions"}
    current = newest(list(entry["versions"]))
    return {
        "kind": "tool",
        **shown,
        "current_version": current,
        "versions": versions,
        "manifest": manifest,
        "usage_markdown": usage,
    }
