"""What a catalogued thing is and the door to use it by, as a result tells its caller: a tool is called (its own MCP
tool, `flakebot run`); a service is started (MCP `service_up`, `flakebot up`) and then reached with
`service_request`, never called as a tool."""

from __future__ import annotations

from typing import Any

SERVICE = "service"  # a manifest's kind for a service (services/catalogued.py); anything else is a tool


def how_to_use(name: str, kind: str | None, nix_run: str = "") -> dict[str, Any]:
    """`kind` ("tool" or "service") and how to use `name`: a tool's `call`, a service's `start` and `reach`;
    `nix_run`, when given, is the way without flakebot."""
    without = {"nix_run": nix_run} if nix_run else {}
    if kind == SERVICE:
        return {
            "kind": SERVICE,
            "start": {"mcp_tool": "service_up", "arguments": {"service": name}, "cli": f"flakebot up {name}"} | without,
            "reach": {"mcp_tool": "service_request", "arguments": {"service": name}},
        }
    return {"kind": "tool", "call": {"mcp_tool": name, "cli": f"flakebot run {name} -- ARGS"} | without}
