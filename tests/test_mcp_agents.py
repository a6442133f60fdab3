"""Agent frameworks on their defaults against `flakebot mcp`: the OpenAI Agents SDK's MCPServerStdio, its strict
schema conversion (no fallback to non-strict for any tool), and calls shaped as a strict model sends them."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import mcp_types
import pytest
from agents import RunContextWrapper
from agents.mcp import MCPServerStdio, MCPUtil
from agents.strict_schema import ensure_strict_json_schema

from flakebot.deliver import schema
from flakebot.deliver.toolcall import mcp_definition
from tests.conftest import json_result, require, run_cli
from tests.deliver.test_helpparse import CLAP4, REPEATABLE

SESSION = Path(__file__).resolve().parent.parent / "flakebot/data/sessions/csv-dedup.json"
CSV = "id,name\n1,ann\n2,bob\n1,ann\n3,cy\n2,bob\n"


def flakebot_server() -> MCPServerStdio:
    """The server as an Agents SDK user configures it (client_session_timeout_seconds left at its default)."""
    params = {"command": sys.executable, "args": ["-m", "flakebot", "mcp"], "env": dict(os.environ), "cwd": os.getcwd()}
    return MCPServerStdio(params=params, name="flakebot")


def assert_strict_as_is(tool: Any, server: Any, caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    """The SDK's strict conversion keeps the tool strict, logs no fallback, and changes nothing in the schema."""
    caplog.clear()
    function_tool = MCPUtil.to_function_tool(tool, server, convert_schemas_to_strict=True)
    assert function_tool.strict_json_schema is True, (tool.name, caplog.text)
    assert "strict mode" not in caplog.text, caplog.text
    given = tool.input_schema
    assert ensure_strict_json_schema(copy.deepcopy(given)) == given, tool.name  # nothing left for it to force
    # Strict mode makes every property required: the ones a call may leave out must accept null.
    required_by_us = schema.really_required(given)
    assert set(given["required"]) - set(required_by_us) == {
        name for name, prop in given["properties"].items() if "null" in prop["type"]
    }
    return dict(function_tool.params_json_schema)


def test_every_flakebot_tool_converts_to_strict_without_fallback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="openai.agents")

    async def session() -> dict[str, dict[str, Any]]:
        async with flakebot_server() as server:
            tools = await server.list_tools()
            return {tool.name: assert_strict_as_is(tool, server, caplog) for tool in tools}

    schemas = asyncio.run(session())
    assert {"craft", "improve", "status", "resume", "search", "list", "show", "package", "runs", "run", "rm"} <= set(
        schemas
    )
    assert schemas["list"] == {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
    assert schemas["run"]["required"] == ["tool", "args", "stdin"]
    assert schemas["run"]["properties"]["args"]["items"] == {"type": "string"}


@pytest.mark.parametrize("help_text", [CLAP4, REPEATABLE], ids=["clap4", "repeatable"])
def test_a_crafted_tools_schema_converts_to_strict_without_fallback(
    help_text: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="openai.agents")
    definition = mcp_definition({"name": "tool", "summary": "A tool", "help_text": help_text})
    tool = mcp_types.Tool(name="tool", description=definition["description"], input_schema=definition["inputSchema"])
    assert_strict_as_is(tool, flakebot_server(), caplog)


@pytest.mark.slow
def test_the_agents_sdk_calls_a_crafted_tool_as_a_strict_model_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case end to end: csv-dedup crafted (scripted model, real cargo and nix), then listed, converted
    strictly and called through MCPServerStdio with every property filled, as a strict model fills them."""
    require("bwrap", "cargo", "nix")
    monkeypatch.setenv("FLAKEBOT_OFFLINE", "1")
    caplog.set_level(logging.DEBUG, logger="openai.agents")
    crafted = run_cli("craft", "need a CSV deduper", "--model", f"scripted:{SESSION}", "--registry", "local", "--json")
    assert json_result(crafted)["name"] == "csv-dedup"

    async def session() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with flakebot_server() as server:
            tools = {tool.name: tool for tool in await server.list_tools()}
            seen["schema"] = assert_strict_as_is(tools["csv-dedup"], server, caplog)
            context = RunContextWrapper(context=None)
            blank = {"file": "", "key": "", "no_header": False, "stdin": CSV}  # what the issue saw fail
            seen["blank"] = await MCPUtil.invoke_mcp_tool(server, tools["csv-dedup"], context, json.dumps(blank))
            keyed = {"file": None, "key": ["name"], "no_header": None, "stdin": "id,name\n1,a\n2,a\n"}
            seen["keyed"] = await server.call_tool("csv-dedup", keyed)
            failing = {"tool": "csv-dedup", "args": "--key zip", "stdin": "id,name\n1,a\n"}
            seen["failing"] = await server.call_tool("run", failing)
        return seen

    seen = asyncio.run(session())
    assert seen["schema"]["properties"]["key"]["type"] == ["array", "null"]
    blank = json.loads(seen["blank"]["text"] if isinstance(seen["blank"], dict) else seen["blank"])
    assert blank["argv"] == [] and blank["exit_code"] == 0 and blank["stdout"] == "id,name\n1,ann\n2,bob\n3,cy\n"
    keyed = json.loads(seen["keyed"].content[0].text)
    assert keyed["argv"] == ["--key", "name"] and keyed["stdout"] == "id,name\n1,a\n" and not seen["keyed"].is_error
    failing = json.loads(seen["failing"].content[0].text)
    assert seen["failing"].is_error and failing["exit_code"] == 1 and "no column named 'zip'" in failing["stderr"]
