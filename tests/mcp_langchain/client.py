"""langchain-mcp-adapters' load_mcp_tools over stdio on `flakebot mcp`, run by its own venv (.venv/langchain):
the adapters need mcp<2, flakebot's server mcp>=2. Prints one JSON line: each tool's args schema, its parameters
after LangChain's OpenAI strict conversion (what bind_tools(strict=True) sends), then each call's result.

usage: client.py PYTHON CALLS_JSON   (CALLS_JSON: [[tool, arguments], ...]; PYTHON runs `-m flakebot mcp`)

As LangChain's defaults have it, every call starts a server of its own (a new stdio session). agent.py beside it
runs LangChain's own agent loop instead of these calls.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_mcp_adapters.tools import load_mcp_tools


async def main(python: str, calls: list[list[Any]]) -> dict[str, Any]:
    connection = {"transport": "stdio", "command": python, "args": ["-m", "flakebot", "mcp"], "env": dict(os.environ)}
    tools = {tool.name: tool for tool in await load_mcp_tools(None, connection=connection)}
    seen: dict[str, Any] = {
        "schemas": {name: tool.args_schema for name, tool in tools.items()},
        "strict": {
            name: convert_to_openai_tool(tool, strict=True)["function"]["parameters"] for name, tool in tools.items()
        },
        "calls": [],
    }
    for number, (name, arguments) in enumerate(calls):
        status, result = await invoke(tools[name], arguments, f"call-{number}")
        seen["calls"].append({"status": status, "result": result})
    return seen


async def invoke(tool: Any, arguments: dict[str, Any], call_id: str) -> tuple[str, Any]:
    """One call as an agent's tool node makes it: the ToolMessage's status ("error" for isError) and its JSON."""
    message = await tool.ainvoke({"name": tool.name, "args": arguments, "id": call_id, "type": "tool_call"})
    content = message.content if isinstance(message.content, str) else message.content[0]["text"]
    return message.status, json.loads(content)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))))
