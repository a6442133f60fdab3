"""The catalog's tools: list them, read their manifests and MCP definitions, run them sandboxed, remove them."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from flakebot import config
from flakebot.commands.common import settings_or_default
from flakebot.errors import CatalogError, UsageError

if TYPE_CHECKING:
    from pathlib import Path

    from flakebot.deliver.toolcall import ToolCall

logger = logging.getLogger(__name__)


def list_tools(settings: config.Settings | None = None) -> list[dict[str, Any]]:
    """Every catalogued tool's entry (its current version), sorted by name."""
    from flakebot.deliver.catalog import Catalog

    return sorted(Catalog.open(settings_or_default(settings)).tools().values(), key=lambda e: e["name"])


def tool_manifest(name: str, settings: config.Settings | None = None) -> dict[str, Any]:
    """A catalogued tool's manifest (its schemas, how to run it)."""
    from flakebot.deliver.catalog import show_tool

    manifest: dict[str, Any] = show_tool(name, settings_or_default(settings))["manifest"]
    if not manifest.get("nix_run_argv"):
        raise CatalogError(
            f"tool '{name}' has no manifest",
            fix=f"craft it again with 'flakebot craft --fresh' or remove it with 'flakebot rm {name}'",
        )
    return manifest


def _runnable_manifest(name: str, settings: config.Settings) -> dict[str, Any]:
    """A catalogued tool's manifest for a run; a service is refused at once, naming the door that starts it (run in
    the foreground it would listen and never answer)."""
    manifest = tool_manifest(name, settings)
    if manifest.get("kind") == "service":
        service = manifest.get("name", name)
        raise UsageError(
            f"{service} is a service, not a tool: it is started, not run",
            fix=f"start it with 'flakebot up {service}' (MCP: service_up), then send it requests",
        )
    return manifest


def tool_definitions(settings: config.Settings | None = None) -> list[dict[str, Any]]:
    """Every catalogued tool as an MCP tool definition (name, description, inputSchema), cached per version
    (deliver/definitions.py); services and tools without a manifest are left out."""
    from flakebot.deliver.catalog import Catalog
    from flakebot.deliver.definitions import catalog_definitions

    return catalog_definitions(Catalog.open(settings_or_default(settings)))


def tool_arguments(name: str, arguments: Any, settings: config.Settings | None = None) -> tuple[list[str], str | None]:
    """(argv, stdin or None) for a catalogued tool called with its schema's JSON arguments."""
    from flakebot.deliver.toolcall import arguments_to_argv

    return arguments_to_argv(tool_manifest(name, settings), arguments)


def call_tool(name: str, arguments: Any, settings: config.Settings | None = None, cwd: Path | None = None) -> ToolCall:
    """Run a catalogued tool (sandboxed) with JSON arguments, at `cwd` (default: the current directory; also the
    start of relative grant roots); its output and exit code come back as data."""
    from flakebot.deliver.toolcall import call

    settings = settings_or_default(settings)
    return call(_runnable_manifest(name, settings), arguments, settings=settings, cwd=cwd)


def call_tool_argv(
    name: str,
    args: list[str],
    settings: config.Settings | None = None,
    stdin: str | None = None,
    writable: list[str] | None = None,
    cwd: Path | None = None,
) -> ToolCall:
    """Run a catalogued tool (sandboxed) with command-line `args` and `stdin` (None: the caller's own), capturing
    its output; `writable`: the existing paths it may write (beneath a grant root); `cwd` as call_tool's."""
    from flakebot.deliver.toolcall import run_captured

    settings = settings_or_default(settings)
    return run_captured(_runnable_manifest(name, settings), args, stdin, settings=settings, writable=writable, cwd=cwd)


def run_tool(
    name: str,
    args: list[str],
    settings: config.Settings | None = None,
    stdin: str | None = None,
    writable: list[str] | None = None,
) -> int:
    """Run a catalogued tool (NAME or NAME@VERSION) in the sandbox with the caller's stdin (or `stdin`), stdout and
    stderr; returns its exit code. It runs in an empty directory: paths its arguments name are readable, only
    `writable` ones writable (deliver.toolrun)."""
    from flakebot.deliver.toolrun import run_attached

    settings = settings_or_default(settings)
    return run_attached(_runnable_manifest(name, settings), args, settings=settings, stdin=stdin, writable=writable)


def remove_tool(name: str, settings: config.Settings | None = None) -> dict[str, Any]:
    """Remove a tool from the catalog: NAME (every version, its GC roots with it) or NAME@VERSION; the entry removed."""
    from flakebot.deliver.catalog import Catalog

    return Catalog.open(settings_or_default(settings)).remove(name)
