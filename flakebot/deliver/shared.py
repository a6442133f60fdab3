"""A shared catalog: catalog entries published into a binary cache beside the tools' closures.

    <cache>/flakebot/index.json                  {"format": 1, "tools": {name: {need, need_key, version, versions}}}
    <cache>/flakebot/tools/<name>/<version>/      entry.json, manifest.json, USAGE.md, schemas.json, flake/

The index and the files are for finding and reading. What another machine trusts is the entry as a store path
(`entry_path`, the same files, made with `nix store add-path` and copied into the cache signed like the tool):
flakebot.deliver.install fetches it and checks its signature before it reads a byte of it.
Writing entries and the index is for file:// caches (flock + write-temp-then-rename, so two publishers keep
both); reading works for file:// and http(s):// caches.
"""

from __future__ import annotations

import fcntl
import json
import logging
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from flakebot.config import Settings
from flakebot.deliver.catalog import normalize_need
from flakebot.deliver.versions import newest
from flakebot.errors import CatalogError, NixError
from flakebot.fsutil import atomic_write_json, remove_tree
from flakebot.nix import command

logger = logging.getLogger(__name__)

PREFIX = "flakebot"
INDEX_FORMAT = 1
ENTRY_FORMAT = 1
READABLE_SCHEMES = ("file", "http", "https")
# What the index keeps of a publication (not the URL given to publish: it may name a local secret-key file).
INDEX_FIELDS = (
    "store_path",
    "entry_path",
    "nar_hash",
    "paths",
    "closure_size",
    "signed_by",
    "public_key",
    "published_at",
)


def entry_files(entry: dict[str, Any], store_path: str) -> dict[str, Any]:
    """entry.json: what a consumer needs to find, trust and catalogue the tool (no time: the same tool, the same path)."""
    manifest = _manifest(entry)
    return {
        "format": ENTRY_FORMAT,
        "name": entry["name"],
        "version": entry["version"],
        "need": entry.get("need", ""),
        "need_key": normalize_need(entry.get("need", "")),
        "summary": entry.get("summary") or manifest.get("summary", ""),
        "store_path": store_path,
        "main_program": manifest.get("main_program") or entry["name"],
        "catalog_dir": entry["dir"],
    }


def entry_store_path(entry: dict[str, Any], store_path: str, settings: Settings) -> str:
    """The tool's catalog entry as a store path of its own: entry.json, manifest, usage, schemas, flake source."""
    with tempfile.TemporaryDirectory(prefix="flakebot-entry-") as tmp:
        root = Path(tmp) / f"flakebot-entry-{entry['name']}-{entry['version']}"
        write_entry_dir(root, entry, store_path)
        argv = command.nix_argv(["store", "add-path"], ["--name", root.name, str(root)], "pinned", None)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=settings.nix_copy_timeout)
    if done.returncode != 0 or not done.stdout.strip():
        raise NixError(
            f"nix store add-path of {entry['name']}'s catalog entry failed: {done.stderr.strip()[-300:]}",
            fix="check that 'nix store add-path --help' works",
        )
    return done.stdout.strip()


def write_entry_dir(root: Path, entry: dict[str, Any], store_path: str) -> None:
    directory = Path(entry["dir"])
    manifest = _manifest(entry)
    root.mkdir(parents=True)
    atomic_write_json(root / "entry.json", entry_files(entry, store_path))
    atomic_write_json(root / "manifest.json", manifest)
    schemas = {k: manifest.get(k) for k in ("openai_tool", "mcp_tool", "parameters")}
    atomic_write_json(root / "schemas.json", schemas)
    usage = directory / "USAGE.md"
    (root / "USAGE.md").write_text(usage.read_text() if usage.is_file() else f"# {entry['name']}\n")
    if (directory / "flake").is_dir():
        shutil.copytree(
            directory / "flake", root / "flake", symlinks=True, ignore=shutil.ignore_patterns("result", "result-*")
        )


def _manifest(entry: dict[str, Any]) -> dict[str, Any]:
    path = Path(entry["dir"]) / "manifest.json"
    return dict(json.loads(path.read_text())) if path.is_file() else {}


# ---------------------------------------------------------------- writing (file:// caches)


def cache_dir(url: str) -> Path | None:
    """The directory of a file:// cache URL (its ?query dropped), None for other stores."""
    parsed = urlparse(url)
    return Path(unquote(parsed.path)) if parsed.scheme == "file" else None


def add_entry(url: str, entry: dict[str, Any], record: dict[str, Any]) -> str:
    """Write the entry's files into a file:// cache and add it to the index, under the cache's lock. Returns the
    entry's directory there."""
    root = cache_dir(url)
    assert root is not None
    shared = root / PREFIX
    rel = f"tools/{entry['name']}/{entry['version']}"
    (shared / "tools").mkdir(parents=True, exist_ok=True)
    with open(shared / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two publishers at once: one index holding both
        index = read_index_file(shared / "index.json")
        tool = index["tools"].get(entry["name"])
        if tool is not None and tool.get("need_key") != normalize_need(entry.get("need", "")):
            raise CatalogError(
                f"{url} holds a tool named {entry['name']} for another need ({tool.get('need', '')!r})",
                fix=f"craft it under another name (--name {entry['name']}-2) and publish that",
            )
        _replace_dir(shared / rel, lambda staging: write_entry_dir(staging, entry, record["store_path"]))
        tool = tool or {"name": entry["name"], "need": entry.get("need", ""), "versions": {}}
        tool["need_key"] = normalize_need(entry.get("need", ""))
        kept = {k: record.get(k) for k in INDEX_FIELDS}
        tool["versions"][entry["version"]] = {**kept, "summary": entry.get("summary", ""), "dir": rel}
        tool["version"] = newest(list(tool["versions"]))
        index["tools"][entry["name"]] = tool
        atomic_write_json(shared / "index.json", index)
    return str(shared / rel)


def _replace_dir(final: Path, fill: Any) -> None:
    """Assemble a directory beside `final` and rename it in: a reader never sees half of one."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    try:
        remove_tree(staging)
        fill(staging)
        old = final.with_name(f".{final.name}.old")
        remove_tree(old)
        if final.exists():
            final.rename(old)
        staging.rename(final)
        remove_tree(old)
    finally:
        remove_tree(staging)


def read_index_file(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"format": INDEX_FORMAT, "tools": {}}
    return _checked_index(path.read_text(), str(path))


def _checked_index(text: str, where: str) -> dict[str, Any]:
    try:
        index = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CatalogError(f"the shared catalog index {where} is corrupt ({exc})", fix=f"restore {where}") from None
    if not isinstance(index, dict) or not isinstance(index.get("tools"), dict):
        raise CatalogError(f"the shared catalog index {where} has no tools table", fix=f"restore {where}")
    return index


# ---------------------------------------------------------------- reading


def read_index(url: str, timeout: float = 30.0) -> dict[str, Any]:
    """A cache's index of published tools (empty when nothing was published there)."""
    scheme = urlparse(url).scheme
    if scheme not in READABLE_SCHEMES:
        raise CatalogError(
            f"cannot read a shared catalog at {url}: only file:// and http(s):// caches are read for now",
            fix="serve the cache over file:// or http(s)://, or remove it from the catalogs setting",
        )
    if scheme == "file":
        root = cache_dir(url)
        assert root is not None
        return read_index_file(root / PREFIX / "index.json")
    import httpx

    where = f"{url}/{PREFIX}/index.json"
    try:
        response = httpx.get(where, timeout=timeout, follow_redirects=True)
    except httpx.HTTPError as exc:
        raise CatalogError(f"cannot read {where}: {exc}", fix=f"check that {url} is reachable") from None
    if response.status_code == 404:
        return {"format": INDEX_FORMAT, "tools": {}}
    if response.status_code != 200:
        raise CatalogError(f"cannot read {where}: HTTP {response.status_code}", fix=f"check that {url} is reachable")
    return _checked_index(response.text, where)
