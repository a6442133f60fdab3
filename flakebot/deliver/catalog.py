"""The catalog of crafted tools (default ~/.local/share/flakebot/).

    catalog.json          {"format": 1, "tools": {name: entry}}: rewritten atomically under .lock
    tools/<name>/flake/   the tool's flake (sources, flake.nix, flake.lock)
    tools/<name>/manifest.json, USAGE.md
    tools/<name>/gcroot   a Nix GC root holding the tool's store path

Concurrent crafts serialize on an exclusive flock of .lock; a tool directory is assembled beside
its final place and renamed in, so a reader never sees half of one.
"""

from __future__ import annotations

import fcntl
import json
import logging
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.errors import CatalogError
from flakebot.fsutil import atomic_write_json, remove_tree

logger = logging.getLogger(__name__)

CATALOG_FORMAT = 1
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


class Catalog:
    """Crafted tools on this machine."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.index_path = root / "catalog.json"

    @classmethod
    def open(cls, settings: Settings) -> Catalog:
        return cls(settings.path("catalog_dir"))

    def tool_dir(self, name: str) -> Path:
        return self.root / "tools" / name

    @contextmanager
    def locked(self) -> Iterator[dict[str, Any]]:
        """Hold the catalog lock and yield the index; it is written back atomically on success."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            handle = open(self.root / ".lock", "w")
        except OSError as exc:
            raise CatalogError(
                f"catalog {self.root} is not writable ({exc.strerror})", fix="set catalog_dir to a writable directory"
            ) from None
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            index = self._read()
            before = json.dumps(index, sort_keys=True)
            yield index
            if json.dumps(index, sort_keys=True) != before:
                atomic_write_json(self.index_path, index)

    def _read(self) -> dict[str, Any]:
        if not self.index_path.exists():
            return {"format": CATALOG_FORMAT, "tools": {}}
        try:
            index = json.loads(self.index_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CatalogError(
                f"{self.index_path} is corrupt ({exc})", fix=f"restore or remove {self.index_path}"
            ) from None
        if not isinstance(index, dict) or not isinstance(index.get("tools"), dict):
            raise CatalogError(f"{self.index_path} has no tools table", fix=f"restore or remove {self.index_path}")
        return index

    def tools(self) -> dict[str, dict[str, Any]]:
        return dict(self._read()["tools"])

    def get(self, name: str) -> dict[str, Any]:
        tools = self.tools()
        if name not in tools:
            known = ", ".join(sorted(tools)) or "none yet"
            raise CatalogError(
                f"no tool '{name}' in the catalog", fix=f"list tools with 'flakebot list' (known: {known})"
            )
        return tools[name]

    def find_need(self, need: str) -> dict[str, Any] | None:
        """A catalogued tool crafted for the same (normalized) need whose store path still exists."""
        key = normalize_need(need)
        for entry in self.tools().values():
            if entry.get("need_key") == key and Path(entry.get("store_path", "/nonexistent")).exists():
                return entry
        return None

    def name_holder(self, name: str, need: str) -> dict[str, Any] | None:
        """The entry holding `name` for a different need (None when the name is free or holds the same need)."""
        entry = self.tools().get(name)
        return entry if entry is not None and entry.get("need_key") != normalize_need(need) else None

    def free_name(self, name: str, need: str) -> str:
        """`name`, or when a different need holds it, the first free `name-2`, `name-3`, ..."""
        taken = self.tools()
        for candidate in (name, *(f"{name}-{n}" for n in range(2, 1000))):
            entry = taken.get(candidate)
            if entry is None or entry.get("need_key") == normalize_need(need):
                return candidate
        raise CatalogError(f"every name like {name} is taken", fix="pass --name with a name of your own")

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
    ) -> dict[str, Any]:
        """Copy a built tool into the catalog (replacing an older one of the same name and need) and hold its store path.

        A tool of the same name crafted for a different need is never replaced silently: that is an error."""
        staging = Path(tempfile.mkdtemp(dir=self._staging_root(), prefix=f"{name}."))
        try:
            shutil.copytree(
                flake_dir, staging / "flake", symlinks=True, ignore=shutil.ignore_patterns("result", "result-*")
            )
            atomic_write_json(staging / "manifest.json", manifest)
            (staging / "USAGE.md").write_text(usage_md)
            with self.locked() as index:
                _refuse_other_need(index["tools"].get(name), need)
                final = self.tool_dir(name)
                old = final.with_name(f".{name}.old")
                remove_tree(old)
                if final.exists():
                    final.rename(old)
                staging.rename(final)
                remove_tree(old)
                entry = {
                    "name": name,
                    "need": need,
                    "need_key": normalize_need(need),
                    "summary": manifest.get("summary", ""),
                    "run_id": run_id,
                    "origin": origin,
                    "store_path": store_path,
                    "dir": str(final),
                    "added": time.time(),
                }
                entry["gc_root"] = str(add_gc_root(final / "gcroot", store_path))
                index["tools"][name] = entry
                return entry
        finally:
            remove_tree(staging)

    def update(self, name: str, **fields: Any) -> dict[str, Any]:
        """Change fields of a tool's entry under the lock. A dict value is merged into the entry's dict of that
        name, so concurrent updates of different keys (say, two publications) both land."""
        with self.locked() as index:
            entry = index["tools"].get(name)
            if entry is None:
                raise CatalogError(f"no tool '{name}' in the catalog", fix="list tools with 'flakebot list'")
            for key, value in fields.items():
                entry[key] = (
                    {**entry[key], **value} if isinstance(value, dict) and isinstance(entry.get(key), dict) else value
                )
            return dict(entry)

    def remove(self, name: str) -> dict[str, Any]:
        """Drop a tool: its entry, its directory and so its GC root."""
        with self.locked() as index:
            entry = index["tools"].pop(name, None)
            if entry is None:
                raise CatalogError(f"no tool '{name}' in the catalog", fix="list tools with 'flakebot list'")
            remove_tree(self.tool_dir(name))
        return dict(entry)

    def _staging_root(self) -> Path:
        staging = self.root / "tools" / ".staging"
        staging.mkdir(parents=True, exist_ok=True)
        return staging


def _refuse_other_need(entry: dict[str, Any] | None, need: str) -> None:
    if entry is not None and entry.get("need_key") != normalize_need(need):
        raise CatalogError(
            f"the catalog already has a tool named {entry['name']} for another need ({entry.get('need', '')!r})",
            fix=f"craft again with --name {entry['name']}-2 (or another free name), or remove the old one with 'flakebot rm {entry['name']}'",
            name=entry["name"],
        )


def add_gc_root(link: Path, store_path: str) -> Path:
    """Register `link` as an indirect Nix GC root for `store_path` (plain symlink when nix-store is absent)."""
    if shutil.which("nix-store"):
        result = subprocess.run(
            ["nix-store", "--add-root", str(link), "--indirect", "--realise", store_path],
            capture_output=True,
            text=True,
        )
        if result.returncode == 0:
            return link
        logger.warning("nix-store --add-root failed (%s); keeping a plain link", result.stderr.strip()[-200:])
    link.unlink(missing_ok=True)
    link.symlink_to(store_path)
    return link


def show_tool(name: str, settings: Settings) -> dict[str, Any]:
    """A catalogued tool's entry and manifest."""
    catalog = Catalog.open(settings)
    entry = catalog.get(name)
    directory = catalog.tool_dir(name)
    manifest = json.loads((directory / "manifest.json").read_text()) if (directory / "manifest.json").exists() else {}
    usage = (directory / "USAGE.md").read_text() if (directory / "USAGE.md").exists() else ""
    return {"kind": "tool", **entry, "manifest": manifest, "usage_markdown": usage}
