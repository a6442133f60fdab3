"""The MCP server, driven by the official MCP SDK's own client over stdio."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters, stdio_client


async def _session_calls(calls: list[tuple[str, dict[str, Any]]]) -> tuple[list[str], list[Any]]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "flakebot", "mcp"], env=dict(os.environ))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        names = [tool.name for tool in (await session.list_tools()).tools]
        results = []
        for name, arguments in calls:
            result = await session.call_tool(name, arguments)
            results.append(json.loads(result.content[0].text))
        return names, results


def test_mcp_client_lists_and_calls_tools(flakebot_home: Path) -> None:
    names, (listing, unknown) = asyncio.run(_session_calls([("list", {}), ("run", {"tool": "nope", "args": []})]))
    assert {"craft", "search", "list", "run"} <= set(names)
    assert listing == {"ok": True, "tools": []}
    assert unknown["ok"] is False and "no tool 'nope'" in unknown["error"]
