"""Search, models and settings: the commands that look things up or change configuration."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from flakebot import config
from flakebot.commands.common import settings_or_default
from flakebot.crates import Candidate


def models(settings: config.Settings | None = None) -> dict[str, Any]:
    """Model providers, the default model and whether each API key is set (never the key). Unless offline, a
    provider whose key is set is asked which models it serves now."""
    from flakebot.llm.providers import describe

    settings = settings_or_default(settings)
    return describe(settings, ask=not settings.offline)


def settings_report(settings: config.Settings | None = None, sources: dict[str, str] | None = None) -> dict[str, Any]:
    """Every setting: "values" (key -> value), "settings" (key, value, where it came from ("source": `sources`'
    entry, else default), trust class and meaning of each), "files" (the configuration files read)."""
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


def set_setting(key: str, value: str, *, local: bool = False) -> Path:
    """Write one setting to the user's flakebot.toml (./flakebot.toml when `local`: a limit only), comments kept;
    the file written."""
    return config.set_value(key, value, local=local)


def search(
    query: str,
    *,
    registry: str | None = None,
    limit: int = 10,
    offline: bool | None = None,
    settings: config.Settings | None = None,
) -> list[Candidate]:
    """Crates for `query`, best first; registry: crates-io, local, a path, or auto."""
    from flakebot.crates.registries import search as search_crates

    settings = settings_or_default(settings)
    if offline is not None:
        settings = dataclasses.replace(settings, offline=offline)
    return search_crates(query, settings, registry, limit)[1]
