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
SDK's answer without the crafted tools (its envelope and flakebot's own tools, shaped for the version) and each
crafted tool's wire form with its stamp. It lives in the cache_dir setting, one file per protocol version; a tool
left out of a list (a service, a name of flakebot's own) is recorded as None.
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
        if message.get("method") == "tools/list" and plain and isinstance(id_, (int, str)) and id_ is not True:
            return message, True
        return None, True
    return None, False


def answer(version: str) -> dict[str, Any] | None:
    """The cached tools/list result for `version` when the catalog holds exactly the tools it was made from."""
    path = cache_path(version)
    if path is None:
        return None
    try:
        with path.open("rb") as file:
            header, made = json.loads(file.readline()), json.loads(file.readline())
    except (OSError, ValueError):
        return None
    stamps = _stamps()
    if not isinstance(header, dict) or header.get("key") != cache_key() or not isinstance(made, dict):
        return None
    if stamps is None or made["crafted"].keys() != stamps.keys():
        return None
    crafted = made["crafted"]
    if any(crafted[name][0] != stamp for name, stamp in stamps.items()):
        return None
    tools = [*made["own"], *(crafted[name][1] for name in stamps if crafted[name][1] is not None)]
    return {**made["envelope"], "tools": tools}


def remember(version: str, envelope: dict[str, Any], own: list[Any], crafted: dict[str, list[Any]]) -> None:
    """Keep a list's answer for `version` (its `envelope` without tools, flakebot's own tools' wire forms, and each
    crafted tool's [stamp, wire form or None]) for the next server's early answer; nothing is written when the cache
    holds it already (the file's first line names the answer by a digest of what it was made from)."""
    path = cache_path(version)
    if path is None:
        return
    stamps = {name: stamp for name, (stamp, _) in crafted.items()}
    signature = hashlib.sha256(json.dumps([cache_key(), envelope, own, stamps]).encode()).hexdigest()
    try:
        with path.open("rb") as file:
            if json.loads(file.readline()).get("signature") == signature:
                return
    except (OSError, ValueError, AttributeError):
        pass
    header = {"key": cache_key(), "signature": signature}
    made = {"envelope": envelope, "own": own, "crafted": crafted}
    try:
        from flakebot.fsutil import atomic_write_text

        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in (header, made)))
    except OSError as exc:
        logger.info("could not cache the tool list in %s: %s", path, exc)


def forget(version: str) -> None:
    """Drop `version`'s cache (an early answer the SDK disagreed with): the server's next list writes it again."""
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

    try:
        catalog = Catalog.open(config.load())
        if not catalog.index.exists() and catalog.index_path.exists():
            return None
        with catalog.index.reading() as db:
            digests = catalogdb.digests(db)
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
