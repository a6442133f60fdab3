"""tools/list with many crafted tools: each tool's wire form (what the MCP SDK sends for it) made once per definition
and protocol version, by the SDK's own models and per-version shape, and sent as it is on the lists after.

On every tools/list the SDK validates and dumps the whole answer twice (mcp.server.runner._serialize: the result
model dumped, then validated and dumped again against the protocol version's shape). With 1,000 crafted tools that
was most of a list's time, all of it spent again on definitions that had not changed. So the list handler gives the
SDK flakebot's own tools as before (the answer's envelope, its resultType, _meta and cache hints, stay the SDK's) and
puts the crafted tools' wire forms aside; `add_crafted`, a server middleware, appends them to the SDK's answer. A
crafted tool is still validated by the SDK, once: when its wire form is made.
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from flakebot.mcp.hints import tool_annotations

logger = logging.getLogger(__name__)


@dataclass
class _Aside:
    """What the tools/list handler puts aside for `add_crafted`: the crafted tools' wire forms in list order, and
    every catalogued tool's stamp, which the early list of the next server checks (mcp/earlylist.py)."""

    forms: list[dict[str, Any]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # the forms' JSON texts
    stamps: dict[str, str] | None = None


_aside: contextvars.ContextVar[_Aside | None] = contextvars.ContextVar("flakebot_aside", default=None)


class WireForms:
    """Each crafted tool's wire form by protocol version, and its JSON text, kept while its definition is the same
    object (an unchanged definition is: deliver/definitions.py keeps it), so a list after a change validates only
    what changed, and the early list's cache (mcp/earlylist.py) joins texts instead of serializing the whole list."""

    def __init__(self) -> None:
        self._made: dict[str, tuple[dict[str, Any], dict[str, tuple[dict[str, Any], str]]]] = {}

    def forms(self, definitions: list[dict[str, Any]], version: str) -> list[tuple[dict[str, Any], str]]:
        """The definitions' wire forms for `version` with their JSON texts, in their order; tools no longer listed are
        forgotten."""
        for gone in self._made.keys() - {d["name"] for d in definitions}:
            del self._made[gone]
        return [self._form(d, version) for d in definitions]

    def _form(self, definition: dict[str, Any], version: str) -> tuple[dict[str, Any], str]:
        made = self._made.get(definition["name"])
        if made is None or made[0] is not definition:
            made = self._made[definition["name"]] = (definition, {})
        form = made[1].get(version)
        if form is None:
            shaped = wire_form(definition, version)
            form = made[1][version] = (shaped, json.dumps(shaped, separators=(",", ":"), ensure_ascii=False))
        return form


def wire_form(definition: dict[str, Any], version: str) -> dict[str, Any]:
    """A crafted tool's entry in tools/list as the SDK sends it on `version`: validated by its Tool model, dumped, and
    shaped by that version's tools/list result (fields the version lacks are dropped)."""
    from mcp_types import methods

    dumped = tool(definition).model_dump(by_alias=True, mode="json", exclude_none=True)
    # the envelope a version requires (2026-07-28: resultType, ttlMs, cacheScope) around the one tool; only it is kept
    envelope = {"tools": [dumped], "resultType": "complete", "ttlMs": 0, "cacheScope": "private"}
    shaped: dict[str, Any] = methods.serialize_server_result("tools/list", version, envelope)["tools"][0]
    return shaped


def tool(definition: dict[str, Any]) -> Any:
    """A crafted tool's entry in tools/list, as the SDK's Tool model."""
    import mcp_types as types

    return types.Tool(
        name=definition["name"],
        description=definition["description"],
        input_schema=definition["inputSchema"],
        annotations=types.ToolAnnotations.model_validate(tool_annotations(definition["name"])),
    )


def put_aside(forms: list[tuple[dict[str, Any], str]], stamps: dict[str, str]) -> bool:
    """Hand the crafted tools' wire forms (with their JSON texts) and every catalogued tool's stamp to
    `add_crafted`; False when no `add_crafted` runs around this handler (the handler then returns them in its
    result)."""
    aside = _aside.get()
    if aside is None:
        return False
    aside.forms.extend(form for form, _ in forms)
    aside.texts.extend(text for _, text in forms)
    aside.stamps = stamps
    return True


async def add_crafted(ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """Server middleware: tools/list's answer, the SDK's (flakebot's own tools), with the crafted tools' wire forms the
    handler put aside appended, in the order the handler listed them. The answer and the stamps go to the early
    list's cache (mcp/earlylist.py) on a thread of their own: the answer waits for no file (the process's exit
    does, when the list changed since the cache was written)."""
    if ctx.method != "tools/list":
        return await call_next(ctx)
    aside = _Aside()
    token = _aside.set(aside)
    try:
        result = await call_next(ctx)
    finally:
        _aside.reset(token)
    if aside.stamps is None:
        return result
    if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
        raise RuntimeError("tools/list answered without a tools list: its crafted tools cannot be added to it")
    from flakebot.mcp import earlylist

    if not earlylist.remembered(ctx.protocol_version, aside.stamps):  # the cache holds this list already
        _cache_writer.submit((ctx.protocol_version, result, aside.texts, aside.stamps))
    return {**result, "tools": [*result["tools"], *aside.forms]}


class CacheWriter:
    """Writes the early list's cache on a thread of its own, the latest list only: lists that change in a burst
    (an agent adding tools, each add followed by a list) make one write of the last, not one each; with 10,000
    tools a write is 23 MB of text, and writes one after another took the lists' time. The first write after a
    quiet GAP_SECONDS starts at once. Not a daemon: a server whose client closes right after a list still leaves
    the cache whole."""

    GAP_SECONDS = 1.0

    def __init__(self, write: Callable[..., None]) -> None:
        self._write = write
        self._lock = threading.Lock()
        self._pending: tuple[Any, ...] | None = None
        self._thread: threading.Thread | None = None
        self._last = float("-inf")

    def submit(self, args: tuple[Any, ...]) -> None:
        with self._lock:
            self._pending = args
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="flakebot-list-cache")
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(max(0.0, self._last + self.GAP_SECONDS - time.monotonic()))
            with self._lock:
                args, self._pending = self._pending, None
                if args is None:
                    self._thread = None
                    return
            self._last = time.monotonic()
            self._write(*args)


def _remember(*args: Any) -> None:
    from flakebot.mcp import earlylist

    try:
        earlylist.remember(*args)
    except Exception:  # a favour to the next server: never a failure of this one
        logger.exception("could not cache the tool list")


_cache_writer = CacheWriter(_remember)
