"""flakebot as an MCP server (stdio): agents call craft, search, list and run as tools."""

from __future__ import annotations

import logging
import subprocess
from typing import Any

from flakebot import api, config
from flakebot.errors import FlakebotError

logger = logging.getLogger(__name__)

INSTRUCTIONS = (
    "flakebot crafts tested command-line tools from a need in plain words. Call `list` to see tools "
    "already crafted, `craft` to make a new one (minutes: it edits, tests and builds a Rust crate), "
    "then `run` it with arguments. Each crafted tool's manifest gives its exact parameters."
)


def _server_class() -> Any:
    try:  # mcp >= 2
        from mcp.server.mcpserver import MCPServer

        return MCPServer
    except ImportError:  # mcp 1.x
        from mcp.server.fastmcp import FastMCP  # type: ignore[attr-defined]

        return FastMCP


def _errors_as_results(call: Any) -> dict[str, Any]:
    """Run `call`; a FlakebotError becomes a result the agent can read instead of a protocol error."""
    try:
        return {"ok": True, **call()}
    except FlakebotError as exc:
        return {"ok": False, "error": exc.one_line(), "exit_code": exc.exit_code}


def build_server(settings: config.Settings | None = None) -> Any:
    """The MCP server with flakebot's tools registered."""
    server = _server_class()("flakebot", instructions=INSTRUCTIONS)

    def settings_now() -> config.Settings:
        return settings or config.load()

    @server.tool(description="Craft a tested, Nix-built command-line tool from a need in plain words; returns its usage manifest.")
    def craft(need: str, model: str | None = None, crate: str | None = None, registry: str | None = None, fresh: bool = False) -> dict[str, Any]:
        return _errors_as_results(lambda: api.craft(need, model=model, crate=crate, registry=registry, fresh=fresh, settings=settings_now()).to_dict())

    @server.tool(description="Search Rust crates a tool could start from, ranked for tool-making.")
    def search(query: str, registry: str | None = None, limit: int = 10) -> dict[str, Any]:
        return _errors_as_results(lambda: {"candidates": [c.to_dict() for c in api.search(query, registry=registry, limit=limit, settings=settings_now())]})

    @server.tool(name="list", description="List the crafted tools in flakebot's catalog with their summaries.")
    def list_tools() -> dict[str, Any]:
        return _errors_as_results(lambda: {"tools": [{k: e.get(k) for k in ("name", "summary", "need", "run_id")} for e in api.list_tools(settings_now())]})

    @server.tool(description="Run a crafted tool with command-line arguments (and optional stdin); returns exit code, stdout and stderr.")
    def run(tool: str, args: list[str] | None = None, stdin: str = "", timeout: float = 120.0) -> dict[str, Any]:
        def call() -> dict[str, Any]:
            argv = api.tool_command(tool, list(args or []), settings_now())
            done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
            return {"exit_code": done.returncode, "stdout": done.stdout, "stderr": done.stderr[-4000:]}

        return _errors_as_results(call)

    return server


def serve() -> None:
    """Serve over stdio until the client disconnects."""
    build_server().run()
