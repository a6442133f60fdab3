"""Shared catalogs: publish a tool's closure and entry, list what catalogs offer, install from them. The commands
install and publish are declared here for every door (table.py); `list --remote` is list's (catalog_tools.py)."""

from __future__ import annotations

from typing import Annotated, Any

from flakebot import config
from flakebot.commands.common import settings_or_default
from flakebot.commands.table import Command, Param


def install(
    tool: Annotated[str, Param("A published tool: NAME (its newest version) or NAME@VERSION.", positional=True)],
    *,
    from_url: Annotated[
        str | None,
        Param("The configured catalog (cache URL) to take it from; default: the first listing it.", cli=("--from",)),
    ] = None,
    settings: config.Settings | None = None,
) -> dict[str, Any]:
    """Install a tool another machine published: fetch its signed entry and closure (nix copy), no build.

    Only catalogs in the catalogs setting are read, and only their configured keys are trusted:
    [[catalogs]] url = "file:///srv/cache" keys = ["flakebot-host-1:BASE64"]
    """
    from flakebot.deliver.install import install as install_tool

    return install_tool(tool, settings_or_default(settings), from_url)


def list_remote(url: str | None = None, settings: config.Settings | None = None) -> list[dict[str, Any]]:
    """Every tool the configured shared catalogs (or the one `url` names) list, each version with its signer."""
    from flakebot.deliver.install import remote_tools

    return remote_tools(settings_or_default(settings), url)


def publish(
    tool: Annotated[str, Param("A catalogued tool's name.", positional=True)],
    *,
    to: Annotated[
        str,
        Param(
            "Binary cache or store URL: file:///DIR, https://..., s3://..., ssh-ng://HOST, /CHROOT-STORE.",
            cli=("--to",),
        ),
    ],
    settings: config.Settings | None = None,
) -> dict[str, Any]:
    """Copy a tool's closure to a binary cache or another Nix store (nix copy); caches are signed with flakebot's key."""
    from flakebot.deliver.publish import publish as publish_tool

    return publish_tool(tool, to, settings_or_default(settings))


COMMANDS = [Command("install", install), Command("publish", publish)]  # not offered to agents (no MCP name)
