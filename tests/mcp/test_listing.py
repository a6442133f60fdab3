"""tools/list's crafted tools sent as wire forms made once (flakebot/mcp/listing.py): the answer is the one the MCP
SDK makes of the whole list itself, on every protocol version a client can agree on, through the SDK's own server
runner over its in-memory transport."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.server.lowlevel.server import NotificationOptions
from mcp.shared.memory import create_client_server_memory_streams
from mcp.shared.message import SessionMessage
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from benchmarks.scenarios.many_tools import Tools, store_path
from flakebot.mcp import listing
from flakebot.mcp.server import OWN_TOOLS, FlakebotMCP


async def _listed(server: Any, version: str) -> dict[str, Any]:
    """One connection to `server` agreeing on `version`: the raw result of its tools/list."""
    options = server.create_initialization_options(NotificationOptions(tools_changed=True))
    async with create_client_server_memory_streams() as (client, served), anyio.create_task_group() as group:
        group.start_soon(server.run, served[0], served[1], options)
        read, write = client

        async def ask(id_: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
            await write.send(SessionMessage(types.JSONRPCRequest(jsonrpc="2.0", id=id_, method=method, params=params)))
            while True:
                message = (await read.receive()).message
                if isinstance(message, types.JSONRPCError):
                    raise AssertionError(f"{method}: {message.error}")
                if isinstance(message, types.JSONRPCResponse) and message.id == id_:
                    return message.result

        info = {"name": "test", "version": "1"}
        await ask(1, "initialize", {"protocolVersion": version, "capabilities": {}, "clientInfo": info})
        await write.send(SessionMessage(types.JSONRPCNotification(jsonrpc="2.0", method="notifications/initialized")))
        result = await ask(2, "tools/list", {})
        group.cancel_scope.cancel()
    return result


def test_crafted_tools_are_listed_as_the_sdk_lists_them_on_every_protocol_version(
    flakebot_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same server's tools/list with the crafted tools' wire forms added by `listing.add_crafted` and without it
    (the handler then returns every tool to the SDK, which validates and shapes them all): equal answers, on each
    protocol version, twice (the second from the wire forms kept)."""
    monkeypatch.setenv("PATH", "/nonexistent")  # no nix-store: each GC root is the plain link kept without Nix
    tools = Tools(flakebot_home, store_path(tmp_path, nix=False))
    tools.grow(3)
    state = FlakebotMCP()
    fast = state.server()
    assert listing.add_crafted in fast.middleware
    whole = FlakebotMCP().server()
    whole.middleware.remove(listing.add_crafted)

    async def answers() -> list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]]:
        return [(v, await _listed(fast, v), await _listed(fast, v), await _listed(whole, v)) for v in VERSIONS]

    for version, first, kept, sdk in anyio.run(answers):
        names = [t["name"] for t in first["tools"]]
        assert names == [*OWN_TOOLS, "t00001", "t00002", "t00003"], version
        assert first == kept == sdk, version
    crafted = next(t for t in first["tools"] if t["name"] == "t00002")
    assert {"delimiter", "key", "files"} <= set(crafted["inputSchema"]["properties"])
    assert crafted["annotations"]["readOnlyHint"] is False


VERSIONS = list(HANDSHAKE_PROTOCOL_VERSIONS)


def test_lists_that_change_in_a_burst_write_the_cache_once_more_with_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """The early list's cache is 23 MB with 10,000 tools: a burst of lists after changes makes the first write at
    once and then one write of the latest list, not one each; the thread ends when nothing is left to write."""
    monkeypatch.setattr(listing.CacheWriter, "GAP_SECONDS", 0.3)
    written: list[int] = []
    writer = listing.CacheWriter(lambda n: written.append(n))
    for n in range(6):
        writer.submit((n,))
    thread = writer._thread
    assert thread is not None and thread.name == "flakebot-list-cache" and not thread.daemon
    thread.join(5)
    assert written == [0, 5] or written == [5], written  # the first at once (or all six came before it started)
    writer.submit((6,))  # after the burst: a thread of its own again
    again = writer._thread
    if again is not None:  # None only when it already wrote and ended
        again.join(5)
    assert written[-1] == 6 and writer._thread is None
