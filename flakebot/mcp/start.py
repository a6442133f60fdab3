"""The start of a `flakebot mcp` process, before the MCP SDK is imported: its first line of input, and `initialize`
answered at once when the SDK's answer to the same request is cached.

Importing the SDK's server and flakebot's takes 0.3-0.6 s on a loaded machine, and a host that gives a server about a
second to answer `initialize` (Codex) runs on without its tools when that is missed. So the process reads its first
line with plain Python, and when it is an `initialize` whose answer the cache holds, writes that answer before
importing anything else. The SDK stays the source of truth: it reads the same bytes (the first line included) as if
nothing had been read, answers the same `initialize` itself, and the server swallows that answer (server._serve),
checks it against what was sent (`settle`), and caches it, so the next start answers from the cache. A mismatch (a
stale cache) is logged and the cache refreshed. A tools/list that follows at once is answered the same way
(flakebot.mcp.earlylist).

The cache lives in the cache_dir setting (a trusted setting: never from a working directory's flakebot.toml), one
file keyed by flakebot's version, the SDK's version and the server's own source files (an edited checkout is a new
key), holding the answer to each protocol version a client asked for.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flakebot import __version__, config
from flakebot.errors import FlakebotError

logger = logging.getLogger(__name__)

CACHE_FILE = "mcp-initialize.json"
FIRST_LINE_LIMIT = 1 << 20  # bytes read looking for the first newline; a longer first line is the SDK's alone
SOURCES = ("mcp/server.py", "mcp/tasks.py")  # flakebot's files that decide the answer (instructions, capabilities)


@dataclass
class Opening:
    """What the process read before the SDK started: `head`, the bytes the SDK must read first (the first line
    included), the `initialize` request on that line (or None), and the result sent for it early (or None)."""

    head: bytes
    request: dict[str, Any] | None = None
    sent: dict[str, Any] | None = None
    cache: Path | None = None
    listed: dict[str, Any] | None = None  # the client's tools/list answered early (mcp/earlylist.py)
    listed_sent: str | None = None  # the result sent for it (its JSON text)


def open_session(fd: int = 0, out: int = 1) -> Opening:
    """Read the first line of `fd` and, when it is an `initialize` with a cached answer, write that answer to `out`."""
    head = _first_line(fd)
    request = _initialize_request(head)
    opening = Opening(head, request, cache=_cache_path() if request else None)
    if request is None or opening.cache is None:
        return opening
    result = _cached(opening.cache).get(request["params"]["protocolVersion"])
    if isinstance(result, dict):
        line = json.dumps(
            {"jsonrpc": "2.0", "id": request["id"], "result": result}, separators=(",", ":"), ensure_ascii=False
        )
        try:
            _write_all(out, (line + "\n").encode())
        except OSError as exc:  # the client is gone: the SDK meets the same closed pipe and ends
            logger.debug("could not write the early initialize answer: %s", exc)
            return opening
        opening.sent = result
        _answer_list(opening, fd, out)
    return opening


def _answer_list(opening: Opening, fd: int, out: int) -> None:
    """The client's tools/list after the early `initialize`, answered from flakebot.mcp.earlylist's cache when it
    holds the catalog as it is now; the lines read for it join `opening.head`."""
    from flakebot.mcp import earlylist

    opening.head, request = earlylist.read_until_list(fd, opening.head)
    version = (opening.sent or {}).get("protocolVersion")
    result = earlylist.answer(version) if request is not None and isinstance(version, str) else None
    if request is None or result is None:
        return
    line = '{"jsonrpc":"2.0","id":' + json.dumps(request["id"], ensure_ascii=False) + ',"result":' + result + "}"
    try:
        _write_all(out, (line + "\n").encode())
    except OSError as exc:
        logger.debug("could not write the early tools/list answer: %s", exc)
        return
    opening.listed, opening.listed_sent = request, result


def settle(opening: Opening, answer: dict[str, Any]) -> None:
    """The SDK's own answer (`answer`: its JSON-RPC response to the opening `initialize`): log it when it differs
    from what was sent early, and cache its result when the cache lacks it or holds another."""
    result = answer.get("result")
    if opening.sent is not None and opening.sent != result:
        logger.warning(
            "the cached initialize answer differed from the MCP SDK's (%s): the cache is refreshed", opening.cache
        )
    if opening.request is None or opening.cache is None or not isinstance(result, dict) or opening.sent == result:
        return
    answers = _cached(opening.cache)
    answers[opening.request["params"]["protocolVersion"]] = result
    try:
        from flakebot.fsutil import atomic_write_text

        atomic_write_text(opening.cache, json.dumps({"key": _cache_key(), "answers": answers}, indent=1) + "\n")
    except OSError as exc:
        logger.info("could not cache the initialize answer in %s: %s", opening.cache, exc)


def replayed_stdin(opening: Opening, fd: int = 0) -> io.TextIOWrapper:
    """Standard input as the SDK reads it: `opening.head`, then the rest of `fd`. The descriptor itself is moved out
    of the standard range and fd 0 pointed at the null device (as the SDK's stdio transport does), so no child
    reads the client's messages."""
    import fcntl

    private = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, fd)
    os.close(null)
    return io.TextIOWrapper(io.BufferedReader(_Replayed(opening.head, private)), encoding="utf-8", errors="replace")


class _Replayed(io.RawIOBase):
    """`head`'s bytes, then the descriptor's."""

    def __init__(self, head: bytes, fd: int) -> None:
        super().__init__()
        self.head, self.fd = head, fd

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.head:
            count = min(len(buffer), len(self.head))
            buffer[:count], self.head = self.head[:count], self.head[count:]
            return count
        return os.readv(self.fd, [buffer])


def _first_line(fd: int) -> bytes:
    """The bytes read until the first newline (and what came with it), the end of input, or FIRST_LINE_LIMIT."""
    data = b""
    while b"\n" not in data and len(data) < FIRST_LINE_LIMIT:
        try:
            chunk = os.read(fd, 65536)
        except OSError as exc:
            logger.debug("could not read standard input: %s", exc)
            break
        if not chunk:
            break
        data += chunk
    return data


def _initialize_request(head: bytes) -> dict[str, Any] | None:
    """The first line's `initialize` request, when it is one the SDK would accept as such (else None)."""
    line, newline, _ = head.partition(b"\n")
    try:
        request = json.loads(line) if newline else None
    except ValueError:
        return None
    if not isinstance(request, dict) or request.get("jsonrpc") != "2.0" or request.get("method") != "initialize":
        return None
    params, id_ = request.get("params"), request.get("id")
    if isinstance(id_, bool) or not isinstance(id_, (int, str)) or not isinstance(params, dict):
        return None
    client = params.get("clientInfo")
    if not (isinstance(params.get("protocolVersion"), str) and isinstance(params.get("capabilities"), dict)):
        return None
    if not (
        isinstance(client, dict) and isinstance(client.get("name"), str) and isinstance(client.get("version"), str)
    ):
        return None
    return request


def _cache_path() -> Path | None:
    try:
        return config.load().path("cache_dir") / CACHE_FILE
    except FlakebotError as exc:  # a bad config file: the SDK answers, and every call reports it
        logger.debug("no initialize cache: %s", exc)
        return None


def _cached(path: Path) -> dict[str, Any]:
    """The cached answers by requested protocol version, when the file is this server's (its key); else none."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict) or record.get("key") != _cache_key() or not isinstance(record.get("answers"), dict):
        return {}
    return dict(record["answers"])


@functools.cache
def _cache_key() -> str:
    """flakebot's version, the SDK's (its installed distribution's name), and flakebot's deciding sources' sizes and
    modification times."""
    here = Path(__file__).parent.parent  # the package root: SOURCES name files under it
    sources = [(name, (s := (here / name).stat()).st_size, s.st_mtime_ns) for name in SOURCES]
    return json.dumps([__version__, sdk_name(), sources])


@functools.cache
def sdk_name() -> str:
    """The installed MCP SDK's distribution (its dist-info's name, version included), found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("mcp")  # a top-level package: found, not imported
    sdk = "none"
    if spec is not None and spec.origin is not None:
        found = sorted(p.name for p in Path(spec.origin).parent.parent.glob("mcp-*.dist-info"))
        sdk = found[0] if found else spec.origin
    return sdk


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]
