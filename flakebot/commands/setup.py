"""Search, models and settings: the commands that look things up or change configuration."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from flakebot import config
from flakebot.commands.common import settings_or_default
from flakebot.commands.table import Command, Hints, Param
from flakebot.crates import Candidate
from flakebot.errors import UsageError

QUERY_LIMIT = 500  # characters: a few keywords; crates.io refuses a URL past about 64 KB with a Python error


def models(settings: config.Settings | None = None) -> dict[str, Any]:
    """List model providers, the default model and whether each API key is set (keys are never shown).

    With a provider's key set (and the offline setting off), the provider is asked which models it serves now, and a default
    it no longer serves is a warning."""
    from flakebot.llm.providers import describe

    settings = settings_or_default(settings)
    return describe(settings, ask=not settings.offline)


def settings_report(settings: config.Settings | None = None, sources: dict[str, str] | None = None) -> dict[str, Any]:
    """Print every setting, its value, where the value came from and what it is for."""
    # "values" (key -> value), "settings" (key, value, where it came from ("source": `sources`' entry (the CLI's
    # loading gives it), else default), trust class and meaning of each), "files" (the configuration files read)
    settings = settings_or_default(settings)
    rows = [
        {
            "key": key,
            "value": settings.get(key),
            "source": (sources or {}).get(key, "default"),
            "trust": config.Settings.trust_class(key),
            "meaning": config.Settings.describe(key),
        }
        for key in config.Settings.keys()
    ]
    files = [str(p) for p in config.config_files() if p.is_file()]
    return {"values": settings.as_dict(), "settings": rows, "files": files}


def set_setting(
    key: Annotated[str, Param("Setting name (see 'flakebot config show').", positional=True)],
    value: Annotated[str, Param("New value.", positional=True)],
    *,
    local: Annotated[
        bool,
        Param("Write ./flakebot.toml instead of the user file (it may only lower limits).", cli=("--local",)),
    ] = False,
) -> dict[str, Any]:
    """Write one setting to ~/.config/flakebot/flakebot.toml (comments are kept).

    With FLAKEBOT_TENANT=T (team mode): a tenant's setting (catalogs, publish_to) into T's own file."""
    # (./flakebot.toml when `local`: a limit only); the setting as read back and the file written
    path = config.set_value(key, value, local=local)
    settings = config.load()
    if settings.tenant:  # the tenant's own file (config.TENANT_SETTINGS), as that tenant's calls read it
        return {"key": key, "value": settings.tenant_setting(key), "file": str(path), "tenant": settings.tenant}
    return {"key": key, "value": settings.get(key), "file": str(path)}


def search(
    query: Annotated[
        str,
        Param(
            "What the tool should do or work on, e.g. 'csv dedupe'.",
            positional=True,
            mcp_help="What the tool should do or work on.",
        ),
    ],
    *,
    registry: Annotated[
        str | None,
        Param(
            "crates-io, local, or a cargo directory source PATH (default: crates.io, else local).",
            mcp_help="auto, crates-io or local.",
        ),
    ] = None,
    limit: Annotated[int, Param("How many crates to show.", mcp_help="How many (1 or more).", least=1)] = 10,
    offline: Annotated[
        bool | None,
        Param(
            "Never contact crates.io; search the local registry.", cli=("--offline",), doors=frozenset({"cli", "api"})
        ),
    ] = None,
    settings: config.Settings | None = None,
) -> list[Candidate]:
    """Find crates a tool could start from, ranked for tool-making."""
    # best first; registry: crates-io, local, a path, or auto
    from flakebot.crates.registries import search as search_crates

    if len(query) > QUERY_LIMIT:  # said in one short line, never echoed back whole
        raise UsageError(
            f"the search query is {len(query):,} characters, more than {QUERY_LIMIT}",
            fix="search for a few keywords, e.g. 'csv dedupe'",
        )
    settings = settings_or_default(settings)
    if offline is not None:
        settings = dataclasses.replace(settings, offline=offline)
    return search_crates(query, settings, registry, limit)[1]


COMMANDS = [
    Command(
        "search",
        search,
        mcp="search",
        hints=Hints("Search crates", read_only=True, idempotent=True, open_world=True),
        data=lambda found: {"candidates": [candidate.to_dict() for candidate in found]},
        mcp_description="Search Rust crates a tool could start from, ranked for tool-making.",
    ),
    Command("config show", settings_report),
    Command("config set", set_setting),
    Command("models", models),
]
