"""The MCP service tools through the real `flakebot mcp`, from the Python SDK's client and the TypeScript SDK's:
kv-service (tests/fixtures) packaged into the test's home, started, asked through the request tool, its log read,
stopped; the request tool kept to that service's port."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import json_result, require, run_cli
from tests.mcp.test_server import TS_CLIENT, mcp_client, require_typescript_sdk
from tests.services.test_supervisor import KV_SERVICE, pasta_pids, port_free

pytestmark = pytest.mark.slow
SERVICE_TOOLS = {"service_up", "service_down", "service_rollback", "services", "service_logs", "service_request"}


@pytest.fixture
def packaged(flakebot_home: Path) -> str:
    require("nix", "cargo", "bwrap", "pasta")
    done = run_cli("package-service", str(KV_SERVICE), "--offline", "--stop-grace", "2", "--json")
    assert done.returncode == 0, done.stderr
    catalogued = json_result(done)  # a service: started with up (service_up), not called as a tool
    assert catalogued["kind"] == "service" and catalogued["start"]["cli"] == "flakebot up kv-service"
    assert catalogued["reach"]["mcp_tool"] == "service_request" and "call" not in catalogued
    return "kv-service"


def listener() -> socket.socket:
    """Another program's port on 127.0.0.1: nothing of a request may reach it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    return sock


def reached(sock: socket.socket) -> bool:
    try:
        sock.accept()[0].close()
    except BlockingIOError:
        return False
    return True


def test_an_agent_starts_asks_and_stops_a_service_over_mcp_from_the_python_sdk(packaged: str) -> None:
    other = listener()

    async def session() -> dict[str, Any]:
        async with mcp_client() as client:
            seen: dict[str, Any] = {"tools": {t.name: t for t in (await client.session.list_tools()).tools}}
            seen["up"] = await client.call("service_up", {"service": packaged})
            args = {"service": packaged, "method": "PUT", "path": "/kv/agent", "body": "from python"}
            seen["put"] = await client.call("service_request", args)
            seen["get"] = await client.call("service_request", {**args, "method": "GET", "body": None})
            seen["userinfo"] = await client.call(
                "service_request", {**args, "method": "GET", "path": f"@127.0.0.1:{other.getsockname()[1]}/"}
            )
            seen["connect"] = await client.call("service_request", {**args, "method": "CONNECT", "path": "/"})
            seen["listed"] = await client.call("services", {})
            seen["logs"] = await client.call("service_logs", {"service": packaged, "lines": 10})
            seen["down"] = await client.call("service_down", {"service": packaged})
            seen["after"] = await client.call("service_request", {**args, "method": "GET", "body": None})
            seen["bad network"] = await client.call("service_up", {"service": packaged, "network": "yes"})
            seen["networked"] = await client.call("service_up", {"service": packaged, "network": True})
            seen["routes"] = await client.call("service_request", {**args, "method": "GET", "path": "/net"})
            seen["listed networked"] = await client.call("services", {})
            await client.call("service_down", {"service": packaged})
            return seen

    seen = asyncio.run(session())
    tools = seen["tools"]
    assert SERVICE_TOOLS <= set(tools)
    assert tools["services"].annotations.read_only_hint is True
    assert tools["service_logs"].annotations.read_only_hint is True
    assert (
        tools["service_down"].annotations.destructive_hint is True and tools["service_down"].annotations.idempotent_hint
    )
    assert tools["service_request"].annotations.read_only_hint is False
    assert tools["service_request"].annotations.open_world_hint is False
    assert tools["service_up"].annotations.open_world_hint is True  # its `network` gives a service the outside
    up, up_error = seen["up"]
    assert not up_error and up["state"] == "running" and up["health"] == "healthy", up
    assert "service_pid" not in up and "state_dir" not in up  # what an agent needs, not host details
    assert seen["put"] == ({**seen["put"][0], "ok": True, "status": 200, "body": "stored\n"}, False)
    assert seen["get"][0]["body"] == "from python" and seen["get"][0]["truncated"] is False
    for attack in ("userinfo", "connect"):
        answer, error = seen[attack]
        assert error and answer["type"] == "UsageError" and answer["exit_code"] == 2, answer
    assert not reached(other)
    other.close()
    [listed] = seen["listed"][0]["services"]
    assert listed["name"] == packaged and listed["port"] == up["port"] and listed["version"] == "0.1.0"
    assert up["network"] is False and listed["network"] is False  # no network unless asked
    assert any("kv-service: listening" in line for line in seen["logs"][0]["lines"])
    assert seen["down"][0]["state"] == "stopped" and port_free(up["port"]) and not pasta_pids(up["port"])
    after, error = seen["after"]
    assert error and "not running" in after["error"]
    bad, error = seen["bad network"]
    assert error and bad["type"] == "UsageError" and "true or false" in bad["error"], bad
    networked, error = seen["networked"]
    assert not error and networked["network"] is True and seen["listed networked"][0]["services"][0]["network"]
    routes = seen["routes"][0]["body"].splitlines()  # the service's /proc/net/route: an interface now
    assert len(routes) > 1 and routes[1].split()[0] != "lo", routes


def test_an_agent_runs_a_service_as_an_mcp_task_from_the_typescript_sdk(packaged: str) -> None:
    require_typescript_sdk()
    other = listener()
    done = subprocess.run(
        ["node", str(TS_CLIENT / "services.mjs"), sys.executable, packaged, str(other.getsockname()[1])],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert set(seen["tools"]) == SERVICE_TOOLS
    assert seen["tools"]["service_up"]["execution"] == {"taskSupport": "optional"}
    assert seen["tools"]["service_request"]["annotations"]["destructiveHint"] is True
    kinds = [message["type"] for message in seen["up"]]
    assert kinds[0] == "taskCreated" and kinds[-1] == "result", seen["up"]
    started = json.loads(seen["up"][-1]["result"]["content"][0]["text"])
    assert started["ok"] and started["state"] == "running" and started["health"] == "healthy", started
    assert seen["put"] == {"result": {**seen["put"]["result"], "status": 200}, "isError": False}
    assert seen["get"]["result"]["body"] == "typescript"
    assert seen["elsewhere"]["isError"] and seen["elsewhere"]["result"]["type"] == "UsageError"
    assert not reached(other)
    other.close()
    assert any("kv-service: listening" in line for line in seen["logs"]["result"]["lines"])
    assert seen["listed"]["result"]["services"][0]["state"] == "running"
    assert seen["down"]["result"]["state"] == "stopped" and port_free(started["port"])
    assert seen["afterDown"]["isError"]
