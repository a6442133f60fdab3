"""A shared catalog: catalog entries published into a binary cache beside the tools' closures.

    <cache>/flakebot/index.json                  the signed index (flakebot.deliver.index: format, checks)
    <cache>/flakebot/tools/<name>/<version>/      entry.json, manifest.json, USAGE.md, schemas.json, flake/

The index is how other machines find a tool: a snapshot signed with the publisher's Nix key, with a sequence
number and an expiry. Each publication signs a new snapshot: the tools of the one before (only when that one
verifies against this publisher's own key or the keys configured for the cache) plus the new version, under the
next sequence. What another machine trusts of a tool is the entry as a store path (`entry_path`, the same files,
made with `nix store add-path` and copied into the cache signed like the tool): flakebot.deliver.install fetches
it and checks its signature before it reads a byte of it. The files under tools/ are for people browsing.
Writing entries and the index is for file:// caches (flock + write-temp-then-rename, so two publishers keep
both); reading works for file:// and http(s):// caches.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from flakebot import launcher
from flakebot.config import Settings
from flakebot.deliver import index as signed
from flakebot.deliver.catalog import normalize_need
from flakebot.deliver.signatures import signed_index
from flakebot.deliver.versions import newest
from flakebot.errors import CatalogError, CatalogTrustError, NixError, UnsafePath
from flakebot.fsutil import atomic_write_json
from flakebot.nix import command
from flakebot.safefs import Tree

logger = logging.getLogger(__name__)

PREFIX = "flakebot"
ENTRY_FORMAT = 1
READABLE_SCHEMES = ("file", "http", "https")
# What the index keeps of a publication (not the URL given to publish: it may name a local secret-key file; not
# who signed it: the index's own signature says that).
INDEX_FIELDS = ("store_path", "entry_path", "nar_hash", "paths", "closure_size", "published_at")


@dataclass(frozen=True)
class IndexKey:
    """How a publisher signs a cache's index: its secret key (Nix's NAME:BASE64), the keys whose earlier snapshots
    it carries forward (its own public key and those configured for the cache), how long a snapshot stays valid."""

    secret: str
    trusted: list[str]
    lifetime: float


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
        done = launcher.run(argv, capture_output=True, text=True, timeout=settings.nix_copy_timeout)
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


def add_entry(url: str, entry: dict[str, Any], record: dict[str, Any], key: IndexKey) -> str:
    """Write the entry's files into a file:// cache and sign a new index snapshot holding it, under the cache's
    lock. Returns the entry's directory there.

    The cache's owner may have planted links, hard links or FIFOs in it: below the directory the URL names, every
    file is reached through flakebot.safefs (no link followed, files replaced by rename, the lock never written)."""
    root = cache_dir(url)
    assert root is not None
    cache = Tree(root)
    rel = f"tools/{entry['name']}/{entry['version']}"
    cache.mkdir(f"{PREFIX}/tools")
    with cache.lock(f"{PREFIX}/.lock"):  # two publishers at once: one index holding both
        tools, sequence = _carried_forward(url, root / PREFIX / "index.json", key)
        tool = tools.get(entry["name"])
        if tool is not None and tool["need_key"] != normalize_need(entry.get("need", "")):
            raise CatalogError(
                f"{url} holds a tool named {entry['name']} for another need ({tool['need']!r})",
                fix=f"craft it under another name (--name {entry['name']}-2) and publish that",
            )
        _replace_dir(cache, f"{PREFIX}/{rel}", lambda staging: write_entry_dir(staging, entry, record["store_path"]))
        versions = dict((tool or {}).get("versions") or {})
        kept = {k: record.get(k) for k in INDEX_FIELDS}
        versions[entry["version"]] = {**kept, "summary": entry.get("summary", "")}
        tools[entry["name"]] = {"name": entry["name"], "need": entry.get("need", ""), "versions": versions}
        listed = {  # readers compute need_key themselves
            name: {
                "name": name,
                "need": tool["need"],
                "version": newest(list(tool["versions"])),
                "versions": tool["versions"],
            }
            for name, tool in tools.items()
        }
        # Milliseconds since 1970 when that is higher: a sequence that still grows if the index is lost or reset.
        snapshot = signed.new_snapshot(listed, max(sequence + 1, time.time_ns() // 1_000_000), key.lifetime)
        from flakebot.redact import redact

        cache.write_text(f"{PREFIX}/index.json", json.dumps(signed_index(redact(snapshot), key.secret)) + "\n")
    return str(root / PREFIX / rel)


def _carried_forward(url: str, path: Path, key: IndexKey) -> tuple[dict[str, Any], int]:
    """The tools and sequence of the cache's current index, when it verifies against `key.trusted` (expired or
    not); otherwise none: the publisher signs only what it can vouch for."""
    raw = _read_capped(path)
    if raw is None:
        return {}, 0
    try:
        snapshot = signed.verify(raw, url, key.trusted)
    except CatalogTrustError as exc:
        logger.warning(
            "the index in %s does not verify against your keys (%s): its tools are left out of the new one; "
            "publish them again to list them",
            url,
            exc.one_line(),
        )
        return {}, 0
    return dict(snapshot.tools), snapshot.sequence


def _replace_dir(cache: Tree, final: str, fill: Any) -> None:
    """Assemble a directory in a private temp dir, copy it in beside `final` and rename it in: a reader never sees
    half of one, and nothing is ever assembled through a path the cache's owner could swap."""
    parent, name = final.rsplit("/", 1)
    staging, old = f"{parent}/.{name}.{uuid.uuid4().hex[:12]}", f"{parent}/.{name}.old"
    with tempfile.TemporaryDirectory(prefix="flakebot-share-") as tmp:
        fill(Path(tmp) / name)
        cache.copy_in(Path(tmp) / name, staging)
    try:
        cache.remove(old)
        if cache.exists(final):
            cache.rename(final, old)
        cache.rename(staging, final)
        cache.remove(old)
    finally:
        cache.remove(staging)


def _read_capped(path: Path) -> bytes | None:
    """A cache's flakebot/index.json (`path`), at most one byte more than the index may hold (None when there is
    none), read through flakebot.safefs: a link below the cache's directory, a FIFO or a device is refused."""
    try:
        with Tree(path.parent.parent) as cache:
            return cache.read_bytes(f"{path.parent.name}/{path.name}", at_most=signed.MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except UnsafePath as exc:  # a link, FIFO or device: an unusable catalog, as an unreadable index is
        raise CatalogError(f"cannot read {path}: {exc.message}", fix=exc.fix) from None
    except OSError as exc:
        raise CatalogError(f"cannot read {path}: {exc.strerror}", fix=f"check the permissions of {path}") from None


# ---------------------------------------------------------------- reading


def read_index(url: str, timeout: float = 30.0) -> bytes | None:
    """A cache's index as its bytes, unverified (flakebot.deliver.index.verify checks them); None when the cache
    holds none. At most one byte more than an index may hold is read."""
    scheme = urlparse(url).scheme
    if scheme not in READABLE_SCHEMES:
        raise CatalogError(
            f"cannot read a shared catalog at {url}: only file:// and http(s):// caches are read for now",
            fix="serve the cache over file:// or http(s)://, or remove it from the catalogs setting",
        )
    if scheme == "file":
        root = cache_dir(url)
        assert root is not None
        if not root.is_dir():  # no cache at all, not a cache that lists no tools yet
            raise CatalogError(
                f"the shared catalog {url} does not exist ({root} is not a directory)",
                fix="check the url in the catalogs setting ('flakebot config show'), or publish to it first",
            )
        return _read_capped(root / PREFIX / "index.json")
    import httpx

    where = f"{url}/{PREFIX}/index.json"
    late = CatalogError(
        f"cannot read {where}: its server did not send the index whole within {timeout:g} s",
        fix=f"check that {url} is reachable and serves its index (a slow or hostile server is given up on)",
    )
    # `timeout` bounds the whole request, not only each read: a server that sends a byte a second (of its headers or
    # its body) never lets one read time out. At the deadline every socket the request opened is shut down.
    with _deadline(timeout) as (trace, expired):
        try:
            with (
                httpx.Client(timeout=timeout, follow_redirects=True) as client,
                client.stream("GET", where, extensions={"trace": trace}) as response,
            ):
                if response.status_code == 404:
                    return None
                if response.status_code != 200:
                    raise CatalogError(
                        f"cannot read {where}: HTTP {response.status_code}", fix=f"check that {url} is reachable"
                    )
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > signed.MAX_BYTES:
                        break
                if expired.is_set():
                    raise late
                return bytes(body)
        except httpx.HTTPError as exc:
            if expired.is_set():
                raise late from None
            raise CatalogError(f"cannot read {where}: {exc}", fix=f"check that {url} is reachable") from None


@contextmanager
def _deadline(seconds: float) -> Iterator[tuple[Callable[[str, dict[str, Any]], None], threading.Event]]:
    """An httpx `trace` extension that notes each socket a request connects, and an event set when `seconds` have
    passed: then each of those sockets is shut down, so a read blocked on it returns (a read timeout alone never
    fires while a byte arrives now and then)."""
    sockets: list[socket.socket] = []
    expired = threading.Event()

    def trace(name: str, info: dict[str, Any]) -> None:
        if name.endswith("connect_tcp.complete") and info.get("return_value") is not None:
            sock = info["return_value"].get_extra_info("socket")
            if sock is not None:
                sockets.append(sock)

    def cut() -> None:
        expired.set()
        for sock in sockets:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(seconds, cut)
    timer.daemon = True
    timer.start()
    try:
        yield trace, expired
    finally:
        timer.cancel()
