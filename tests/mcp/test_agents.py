"""Agent frameworks on their defaults against `flakebot mcp`: the OpenAI Agents SDK's MCPServerStdio, its strict
schema conversion (no fallback to non-strict for any tool), LangChain's load_mcp_tools (langchain-mcp-adapters, in
a venv of its own: tests/mcp_langchain), and calls shaped as a strict model sends them."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import mcp_types
import pytest
from agents import Agent, OpenAIChatCompletionsModel, RunContextWrapper, Runner
from agents.mcp import MCPServerStdio, MCPUtil
from agents.strict_schema import ensure_strict_json_schema
from openai import AsyncOpenAI

from benchmarks.scenarios.shout import shout_script
from flakebot.deliver import schema
from flakebot.deliver.toolcall import mcp_definition
from tests.conftest import REPO, json_result, require, run_cli
from tests.deliver.test_helpparse import CLAP4, REPEATABLE
from tests.fakes.agent_model import FollowingModel

SESSION = REPO / "flakebot/data/sessions/csv-dedup.json"
LANGCHAIN_PYTHON = REPO / ".venv/langchain/bin/python"
CSV = "id,name\n1,ann\n2,bob\n1,ann\n3,cy\n2,bob\n"


def flakebot_server() -> MCPServerStdio:
    """The server as an Agents SDK user configures it (client_session_timeout_seconds left at its default)."""
    params = {"command": sys.executable, "args": ["-m", "flakebot", "mcp"], "env": dict(os.environ), "cwd": os.getcwd()}
    return MCPServerStdio(params=params, name="flakebot")


def advertised_schemas() -> dict[str, Any]:
    """Each tool's input schema as `flakebot mcp` lists it now (through the Agents SDK's MCPServerStdio)."""

    async def listed() -> dict[str, Any]:
        async with flakebot_server() as server:
            return {tool.name: tool.input_schema for tool in await server.list_tools()}

    return asyncio.run(listed())


def langchain_client(calls: list[tuple[str, dict[str, Any]]], timeout: float = 300) -> dict[str, Any]:
    """What tests/mcp_langchain/client.py saw: the tools' schemas, their strict conversion, each call's result."""
    if not LANGCHAIN_PYTHON.exists():
        pytest.skip("langchain-mcp-adapters is not installed: scripts/setup.sh installs it in .venv/langchain")
    done = subprocess.run(
        [str(LANGCHAIN_PYTHON), str(REPO / "tests/mcp_langchain/client.py"), sys.executable, json.dumps(calls)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


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
    assert schemas["run"]["required"] == ["tool", "args", "stdin", "writable"]
    assert schemas["run"]["properties"]["args"]["items"] == {"type": "string"}


def test_langchain_loads_every_tool_and_its_strict_conversion_keeps_the_schema() -> None:
    seen = langchain_client([("runs", {}), ("status", {"run_id": 42}), ("run", {"tool": "nope", "args": None})])
    assert {"craft", "status", "run", "list", "runs"} <= set(seen["schemas"])
    for name, advertised in seen["schemas"].items():
        assert advertised["additionalProperties"] is False and advertised["required"] == list(advertised["properties"])
        assert seen["strict"][name] == advertised, name
    ran, wrong_type, no_tool = seen["calls"]
    assert ran == {"status": "success", "result": {"ok": True, "runs": []}}
    assert wrong_type["status"] == "error" and "'run_id' must be a string" in wrong_type["result"]["error"]
    assert no_tool["status"] == "error" and "no tool 'nope'" in no_tool["result"]["error"]


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
    strictly and called through MCPServerStdio, and through LangChain, with every property filled, as a strict
    model fills them."""
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
            blank = {
                "file": "",
                "key": "",
                "no_header": False,
                "stdin": CSV,
                "writable": None,
            }  # what the issue saw fail
            seen["blank"] = await MCPUtil.invoke_mcp_tool(server, tools["csv-dedup"], context, json.dumps(blank))
            keyed = {"file": None, "key": ["name"], "no_header": None, "stdin": "id,name\n1,a\n2,a\n", "writable": None}
            seen["keyed"] = await server.call_tool("csv-dedup", keyed)
            failing = {"tool": "csv-dedup", "args": "--key zip", "stdin": "id,name\n1,a\n", "writable": None}
            seen["failing"] = await server.call_tool("run", failing)
        return seen

    seen = asyncio.run(session())
    # LangChain in the same catalog: the strict model's call, and a repeated option as a list.
    blank = {"file": "", "key": "", "no_header": False, "stdin": CSV, "writable": None}
    keys = {
        "file": None,
        "key": ["id", "name"],
        "no_header": None,
        "stdin": "id,name\n1,a\n1,a\n2,a\n",
        "writable": None,
    }
    langchain = langchain_client([("csv-dedup", blank), ("csv-dedup", keys)])
    assert langchain["strict"]["csv-dedup"] == langchain["schemas"]["csv-dedup"] == seen["schema"]
    assert langchain["calls"][0]["result"]["stdout"] == "id,name\n1,ann\n2,bob\n3,cy\n"
    assert langchain["calls"][1]["result"]["argv"] == ["--key", "id", "--key", "name"]
    assert langchain["calls"][1]["result"]["stdout"] == "id,name\n1,a\n2,a\n"

    assert seen["schema"]["properties"]["key"]["type"] == ["array", "null"]
    blank = json.loads(seen["blank"]["text"] if isinstance(seen["blank"], dict) else seen["blank"])
    assert blank["argv"] == [] and blank["exit_code"] == 0 and blank["stdout"] == "id,name\n1,ann\n2,bob\n3,cy\n"
    keyed = json.loads(seen["keyed"].content[0].text)
    assert keyed["argv"] == ["--key", "name"] and keyed["stdout"] == "id,name\n1,a\n" and not seen["keyed"].is_error
    failing = json.loads(seen["failing"].content[0].text)
    assert seen["failing"].is_error and failing["exit_code"] == 1 and "no column named 'zip'" in failing["stderr"]


@pytest.mark.slow
def test_the_agents_sdk_on_its_5s_timeout_crafts_by_following_a_run_handle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Agents SDK sends no progress token and gives up on a request after 5 s (client_session_timeout_seconds):
    craft answers with a run handle at once, `status` follows it to the end, then the crafted tool is called."""
    require("bwrap", "cargo", "nix")
    monkeypatch.setenv("FLAKEBOT_OFFLINE", "1")
    arguments = {"need": "upper-case my input", "model": f"scripted:{shout_script(tmp_path)}", "crate": "csv",
                 "registry": "local", "name": None, "from": None, "fresh": None, "wait": None, "detach": None,
             "service": None}  # fmt: skip

    async def session() -> dict[str, Any]:
        seen: dict[str, Any] = {"polls": []}
        async with flakebot_server() as server:
            assert server.client_session_timeout_seconds == 5  # the SDK's default, unchanged here
            started = time.monotonic()
            seen["handle"] = await server.call_tool("craft", arguments)
            seen["answered_in"] = time.monotonic() - started
            run_id = json.loads(seen["handle"].content[0].text)["run_id"]
            for _ in range(900):
                status = json.loads((await server.call_tool("status", {"run_id": run_id})).content[0].text)
                seen["polls"].append(status["status"])
                if status["status"] not in ("created", "running"):
                    break
                await asyncio.sleep(1)
            seen["status"] = status
            seen["shout"] = await server.call_tool("shout", {"stdin": "follow me\n"})
        return seen

    seen = asyncio.run(session())
    handle = json.loads(seen["handle"].content[0].text)
    assert not seen["handle"].is_error and handle["status"] == "running" and "status" in handle["follow"], handle
    assert seen["answered_in"] < 5
    assert seen["polls"] and set(seen["polls"]) <= {"running", "succeeded"}, seen["polls"]
    assert seen["status"]["status"] == "succeeded", seen["status"]
    assert seen["status"]["result"]["name"] == "shout"
    shout = json.loads(seen["shout"].content[0].text)
    assert not seen["shout"].is_error and shout["stdout"] == "FOLLOW ME\n"


@pytest.mark.slow
def test_a_langchain_agent_crafts_and_calls_the_crafted_tool_with_strict_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LangChain's own loop (create_agent on ChatOpenAI, tests/mcp_langchain/agent.py) with the tools of
    load_mcp_tools on its defaults, bound strictly, against a model on 127.0.0.1 that crafts, follows the run handle
    with `status`, calls the crafted tool and answers with what it printed."""
    require("bwrap", "cargo", "nix")
    if not LANGCHAIN_PYTHON.exists():
        pytest.skip("langchain is not installed: scripts/setup.sh installs it in .venv/langchain")
    monkeypatch.setenv("FLAKEBOT_OFFLINE", "1")
    craft = {"need": "upper-case my input", "model": f"scripted:{shout_script(tmp_path)}", "crate": "csv",
             "registry": "local", "name": None, "from": None, "fresh": None, "wait": None, "detach": None,
             "service": None}  # fmt: skip

    before = advertised_schemas()
    with FollowingModel(craft, "shout", {"stdin": "follow me\n", "writable": None}) as model:
        done = subprocess.run(
            [str(LANGCHAIN_PYTHON), str(REPO / "tests/mcp_langchain/agent.py"), sys.executable, model.openai_url,
             "Make me a tool that upper-cases its input, then upper-case 'follow me' with it."],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert model.failures == [], model.failures
    assert seen["answer"] == "shout printed:\nFOLLOW ME\n", seen
    offered = [{tool["function"]["name"]: tool for tool in request["body"]["tools"]} for request in model.requests]
    assert set(offered[0]) == set(before) and "shout" not in offered[0]
    for name, tool in offered[0].items():
        assert tool["type"] == "function" and tool["function"].get("strict") is True, tool
        assert tool["function"]["parameters"] == before[name], name
    # The crafted tool is offered once the run succeeded (in the request the model answered by calling it), strictly,
    # with the schema flakebot now advertises.
    assert "shout" in offered[-2], sorted(offered[-2])
    shout = offered[-2]["shout"]["function"]
    assert shout == {**shout, "strict": True, "parameters": advertised_schemas()["shout"]}
    # followed to its end: a fast craft (its builds in the store) may end within the first status call's wait
    assert model.polls[-1] == "succeeded" and set(model.polls) <= {"running", "succeeded"}, model.polls
    calls = [call[0] for message in seen["messages"] if message["role"] == "ai" for call in message["calls"]]
    assert calls == ["craft", *["status"] * len(model.polls), "shout"], calls
    assert all(message["status"] == "success" for message in seen["messages"] if message["role"] == "tool"), seen


@pytest.mark.slow
def test_an_agents_sdk_agent_with_strict_tools_crafts_follows_the_run_and_calls_the_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Agents SDK's own loop (Runner.run) with strict schemas on and its MCP defaults (5 s requests, no progress
    token), the model on 127.0.0.1 deciding each turn: it sees every tool as a strict function, crafts (a run handle),
    follows it with `status`, calls the crafted tool (listed to it once crafted) and answers with its output."""
    require("bwrap", "cargo", "nix")
    monkeypatch.setenv("FLAKEBOT_OFFLINE", "1")
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")  # traces would go to OpenAI's API
    craft = {"need": "upper-case my input", "model": f"scripted:{shout_script(tmp_path)}", "crate": "csv",
             "registry": "local", "name": None, "from": None, "fresh": None, "wait": None, "detach": None,
             "service": None}  # fmt: skip

    async def session(model: FollowingModel) -> Any:
        client = AsyncOpenAI(base_url=model.openai_url, api_key="stub")
        async with flakebot_server() as server:
            agent = Agent(
                name="toolsmith",
                instructions="Craft the tools you lack, then use them.",
                model=OpenAIChatCompletionsModel(model="following", openai_client=client),
                mcp_servers=[server],
                mcp_config={"convert_schemas_to_strict": True},
            )
            # Runner's default max_turns (10) cannot hold a craft's polls: a user raises it (the README says so).
            return await Runner.run(agent, "I need my input upper-cased: 'follow me'.", max_turns=200)

    with FollowingModel(craft, "shout", {"stdin": "follow me\n", "writable": None}, poll_seconds=2) as model:
        result = asyncio.run(session(model))
    assert model.failures == []
    assert result.final_output == "shout printed:\nFOLLOW ME\n"
    # followed to its end: a fast craft (its builds in the store) may end within the first status call's wait
    assert model.polls[-1] == "succeeded" and set(model.polls) <= {"running", "succeeded"}, model.polls
    advertised = advertised_schemas()
    first, last = (_offered(request["body"]) for request in (model.requests[0], model.requests[-1]))
    assert "shout" not in first and set(first) == set(advertised) - {"shout"}
    assert set(last) == set(advertised) and "shout" in last  # tools/list again after the craft
    for name, function in last.items():
        assert function["strict"] is True and function["parameters"] == advertised[name], name


def _offered(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The functions a chat-completions request offered the model, by name."""
    return {tool["function"]["name"]: tool["function"] for tool in body.get("tools") or []}
