"""MCP tool annotations (spec `ToolAnnotations`): what each tool may do, for hosts that decide approval by them:
flakebot's own tools say what their command's Hints say (flakebot.commands.table), a crafted tool what CRAFTED says.

Codex, for one, runs a tool without asking only when it says `readOnlyHint: true`; under `approval_policy = "never"`
every other call is refused. The hints are honest rather than convenient: `run` and every crafted tool may write
where the caller's `writable` names, so they are not read-only, and a host asks (or is told, docs/agents.md).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CRAFTED", "tool_annotations"]


def _hints(title: str, read_only: bool, destructive: bool, idempotent: bool, open_world: bool) -> dict[str, Any]:
    hints: dict[str, Any] = {"title": title, "readOnlyHint": read_only, "idempotentHint": idempotent}
    if not read_only:  # the spec gives destructiveHint a meaning only for a tool that writes
        hints["destructiveHint"] = destructive
    hints["openWorldHint"] = open_world
    return hints


# A crafted tool: sandboxed, no network, reads what its arguments name, writes (and may overwrite) only the paths a
# call names in `writable`.
CRAFTED = _hints("", False, True, False, False)


def tool_annotations(name: str) -> dict[str, Any]:
    """A tool's annotations as tools/list sends them (camelCase keys): flakebot's own (a command's hints), or a
    crafted tool's."""
    from flakebot.commands.table import by_mcp_name

    command = by_mcp_name().get(name)
    if command is not None and command.hints is not None:
        return command.hints.annotations()
    return {**CRAFTED, "title": name}
