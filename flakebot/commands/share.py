"""Shared catalogs: publish a tool's closure and entry, list what catalogs offer, install from them."""

from __future__ import annotations

from typing import Any

from flakebot import config
from flakebot.commands.common import settings_or_default


def install(tool: str, *, from_url: str | None = None, settings: config.Settings | None = None) -> dict[str, Any]:
    """Install a published tool (NAME or NAME@VERSION) from the configured shared catalogs (or the one `from_url`
    names): its signed entry and closure are fetched with `nix copy`, checked against the configured keys and
    catalogued here. Returns the catalog entry; nothing is built."""
    from flakebot.deliver.install import install as install_tool

    return install_tool(tool, settings_or_default(settings), from_url)


def list_remote(url: str | None = None, settings: config.Settings | None = None) -> list[dict[str, Any]]:
    """Every tool the configured shared catalogs (or the one `url` names) list, each version with its signer."""
    from flakebot.deliver.install import remote_tools

    return remote_tools(settings_or_default(settings), url)


def publish(tool: str, *, to: str, settings: config.Settings | None = None) -> dict[str, Any]:
    """Copy a catalogued tool's closure to a binary cache or Nix store (`nix copy`); returns what was copied and how to fetch it."""
    from flakebot.deliver.publish import publish as publish_tool

    return publish_tool(tool, to, settings_or_default(settings))
