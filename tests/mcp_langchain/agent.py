"""LangChain's own agent loop (langchain.agents.create_agent) on ChatOpenAI, with flakebot's MCP tools from
langchain-mcp-adapters' load_mcp_tools on its defaults (a server per call), every tool bound strictly. Run by its
own venv (.venv/langchain): the adapters need mcp<2, flakebot's server mcp>=2. Prints one JSON line: the agent's
final answer and each message of the run (the model's tool calls, the tool results' status).

usage: agent.py PYTHON MODEL_URL NEED   (PYTHON runs `-m flakebot mcp`; MODEL_URL is a chat-completions base URL)

create_agent takes its tools once, when it is built; a tool crafted during the run is offered and called through
LangChain's runtime tool registration (a middleware's wrap_model_call offers the tools flakebot lists now, its
wrap_tool_call runs the ones the agent was not built with). The same middleware binds the tools with strict=True:
create_agent passes a request's model_settings to the model's bind_tools. Everything else is left at its default,
LangGraph's recursion limit too (a craft followed by polls every few seconds fits in it).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool
from langchain_mcp_adapters.tools import load_mcp_tools
from langchain_openai import ChatOpenAI
from langgraph.prebuilt.tool_node import ToolCallRequest


class FlakebotTools(AgentMiddleware):
    """Offers the model the tools flakebot lists at each turn, strictly, and runs the ones crafted since the agent
    was built."""

    def __init__(self, connection: dict[str, Any]) -> None:
        super().__init__()
        self.connection = connection
        self.listed: dict[str, BaseTool] = {}

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
    ) -> ModelResponse:
        tools = await load_mcp_tools(None, connection=self.connection)
        self.listed = {tool.name: tool for tool in tools}
        return await handler(
            request.override(tools=list(tools), model_settings={**request.model_settings, "strict": True})
        )

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[Any]]
    ) -> Any:
        if request.tool is None and request.tool_call["name"] in self.listed:
            return await handler(request.override(tool=self.listed[request.tool_call["name"]]))
        return await handler(request)


async def main(python: str, model_url: str, need: str) -> dict[str, Any]:
    connection = {"transport": "stdio", "command": python, "args": ["-m", "flakebot", "mcp"], "env": dict(os.environ)}
    model = ChatOpenAI(model="following", base_url=model_url, api_key="stub")
    tools = await load_mcp_tools(None, connection=connection)
    agent = create_agent(model, tools, middleware=[FlakebotTools(connection)])
    state = await agent.ainvoke({"messages": [{"role": "user", "content": need}]})
    return {"answer": state["messages"][-1].text, "messages": [summary(message) for message in state["messages"]]}


def summary(message: Any) -> dict[str, Any]:
    if isinstance(message, AIMessage):
        return {"role": "ai", "calls": [[call["name"], call["args"]] for call in message.tool_calls]}
    if isinstance(message, ToolMessage):
        return {"role": "tool", "name": message.name, "status": message.status}
    return {"role": message.type}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:4]))))
