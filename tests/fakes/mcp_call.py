"""One call of flakebot's MCP server through the mcp Python SDK's client over stdio: for tests that need a single
answer, not a session (tests/mcp/test_server.py holds the sessions)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any


def mcp_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Start `flakebot mcp`, call one tool, and return its JSON answer (a result or flakebot's error object)."""
    return asyncio.run(_call(name, arguments))


async def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "flakebot", "mcp"], env=dict(os.environ))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool(name, arguments)
        return dict(json.loads(result.content[0].text))
