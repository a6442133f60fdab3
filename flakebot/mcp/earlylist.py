"""The client's first tools/list answered before the MCP SDK is imported, as `initialize` is (mcp/start.py), from
the answer the SDK gave last time when the catalog still holds exactly the tools it listed.

A host asks for the tool list right after `initialize`, and importing the SDK is most of a start (0.3-0.4 s). So
after its early `initialize` answer the process waits a moment (LIST_WAIT_SECONDS) for the client's next lines; when
they are `notifications/initialized` and a plain `tools/list`, and the cache holds that protocol version's answer
made with today's code (flakebot's sources, the SDK's version) for every catalogued tool at its current entry digest
(catalog.db, read in one pass as the server does), that answer is written at once. The SDK still reads every line
(they are replayed to it) and answers the same tools/list; the server sends the client none of that second answer
(server._watch_answers) and logs a warning should it differ.

The cache is written by the server after a tools/list whose tools changed (`remember`, from mcp/listing.py): the
list's result as the JSON text it is sent as (read back without parsing it: 23 MB with 10,000 tools), under the
stamps of the catalogued tools it was made from (as deliver/definitions.py makes them; with flakebot's code, the
cache's key, they decide the answer). It lives in the cache_dir setting, one file per protocol version.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import select
import time
from pathlib import Path
from typing import Any

from flakebot import __version__, config
from flakebot.errors import FlakebotError

logger = logging.getLogger(__name__)

CACHE_FILE = "mcp-tools-list-{version}.json"
LIST_WAIT_SECONDS = 0.15  # after the early initialize answer: how long the client's tools/list is waited for
READ_LIMIT = 1 << 20  # bytes read past the first line looking for the tools/list


def read_until_list(fd: int, head: bytes) -> tuple[bytes, dict[str, Any] | None]:
    """The bytes read so far (`head`, then what came within LIST_WAIT_SECONDS), and the client's tools/list when its
    lines after the first are notifications and then a plain tools/list (else None: the SDK answers everything)."""
    deadline = time.monotonic() + LIST_WAIT_SECONDS
    while len(head) < READ_LIMIT:
        found, done = _scan(head)
        if done:
            return head, found
        left = deadline - time.monotonic()
        if left <= 0:
            return head, None
        try:
            ready, _, _ = select.select([fd], [], [], left)
            chunk = os.read(fd, 65536) if ready else b""
        except OSError as exc:
            logger.debug("could not read standard input: %s", exc)
            return head, None
        if ready and not chunk:  # the end of input: the SDK answers what came
            return head, None
        head += chunk
    return head, None


def _scan(head: bytes) -> tuple[dict[str, Any] | None, bool]:
    """(the tools/list request, True) when the complete lines after the first are notifications then a plain
    tools/list; (None, True) when another message comes first; (None, False) while more lines are needed."""
    lines = head.split(b"\n")[1:-1]  # the complete lines after the first
    for line in lines:
        try:
            message = json.loads(line)
        except ValueError:
            return None, True
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return None, True
        if "id" not in message and isinstance(message.get("method"), str):
            continue  # a notification (notifications/initialized): the SDK handles it in order
        plain = message.get("params") in (None, {}, {"cursor": None})
        id_ = message.get("id")
        if (
            message.get("method") == "tools/list"
            and plain
            and isinstance(id_, (int, str))
            and not isinstance(id_, bool)
        ):
            return message, True
        return None, True
    return None, False


def answer(version: str) -> str | None:
    """The cached tools/list result for `version`, as the JSON text it is sent as, when the catalog holds exactly
    the tools (each at the same stamp) it was made from."""
    path = cache_path(version)
    if path is None:
        return None
    try:
        with path.open("rb") as file:
            header, result = json.loads(file.readline()), file.readline().decode().rstrip("\n")
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict) or header.get("key") != cache_key() or not result:
        return None
    stamps = _stamps()
    return result if stamps is not None and header.get("stamps") == stamps else None


def remember(version: str, result: dict[str, Any], crafted: list[str], stamps: dict[str, str]) -> None:
    """Keep a list's result for `version` (the SDK's `result` with the `crafted` tools' JSON texts appended to its
    tools, as the list was sent) with the stamps of the catalogued tools it was made from, for the next server's
    early answer. Nothing is written when the cache holds it already: given flakebot's code (the key) and the
    version, the stamps decide the answer."""
    path = cache_path(version)
    if path is None:
        return
    try:
        with path.open("rb") as file:
            header = json.loads(file.readline())
        if isinstance(header, dict) and header.get("key") == cache_key() and header.get("stamps") == stamps:
            _remembered[version] = dict(stamps)
            return
    except (OSError, ValueError):
        pass
    # The SDK's part serialized with a marker after its tools, the crafted tools' texts joined in at the marker.
    marker, comma = "\x00crafted\x00", "," if result["tools"] else ""
    marked = _json({**result, "tools": [*result["tools"], marker]})
    text = marked.replace(comma + _json(marker), (comma + ",".join(crafted)) if crafted else "", 1)
    header_line = _json({"key": cache_key(), "stamps": stamps})
    try:
        from flakebot.fsutil import atomic_write_text

        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, header_line + "\n" + text + "\n")
    except OSError as exc:
        logger.info("could not cache the tool list in %s: %s", path, exc)
        return
    _remembered[version] = dict(stamps)


def remembered(version: str, stamps: dict[str, str]) -> bool:
    """Whether this process found or wrote `version`'s cache at these stamps already: a list of the same tools then
    has nothing to remember (the team front lists for many agents; each list read the settings and the cache's
    header on a thread of its own, 2 ms of CPU a list). The cache file is the next server's favour, not this one's
    state: one removed by hand is written again once the catalog changes, or by the next server."""
    return _remembered.get(version) == stamps


_remembered: dict[str, dict[str, str]] = {}  # protocol version -> the stamps its cache holds (found or written)


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def forget(version: str) -> None:
    """Drop `version`'s cache (an early answer the SDK disagreed with): the server's next list writes it again."""
    _remembered.pop(version, None)
    path = cache_path(version)
    try:
        if path is not None:
            path.unlink(missing_ok=True)
    except OSError as exc:
        logger.info("could not remove the tool list cache %s: %s", path, exc)


def _stamps() -> dict[str, str] | None:
    """Every catalogued tool's stamp (as deliver/definitions.py makes it); None when the index cannot be read as
    the server would read it (a catalog.json not yet moved into catalog.db, a bad config)."""
    from flakebot.deliver import catalogdb
    from flakebot.deliver.catalog import Catalog
    from flakebot.deliver.definitions import code_key
    from flakebot.errors import CatalogError

    digests: dict[str, str] = {}
    try:
        for layer in Catalog.open(config.load()).layers():  # a tenant's catalog over the organisation's, as listed
            if not layer.index.exists() and layer.index_path.exists():
                return None
            with layer.index.reading() as db:
                digests.update(catalogdb.digests(db))
    except (FlakebotError, CatalogError, OSError) as exc:
        logger.debug("no early tool list: %s", exc)
        return None
    return {name: f"{code_key()}:{digest}" for name, digest in digests.items()}


def cache_path(version: str) -> Path | None:
    """The cache of `version`'s answer: one file per protocol version (a write never reads another's)."""
    if not version.replace("-", "").isalnum():  # a version is a date; nothing else names a file
        return None
    try:
        return config.load().path("cache_dir") / CACHE_FILE.format(version=version)
    except FlakebotError as exc:
        logger.debug("no tool list cache: %s", exc)
        return None


@functools.cache
def cache_key() -> str:
    """flakebot's version, the SDK's, and every source of the package (its own tools are made from the table)."""
    from flakebot.mcp.start import sdk_name

    digest = hashlib.sha256(json.dumps([__version__, sdk_name()]).encode())
    package = Path(__file__).parent.parent
    for source in sorted(package.rglob("*.py")):
        stat = source.stat()
        digest.update(f"{source.relative_to(package)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()
