"""flakebot: a tool factory for agents.

    import flakebot

    result = flakebot.craft("need a CSV deduper")  # a CraftResult: the tool's name, manifest, usage
    flakebot.call_tool(result.name, {"args": ["--help"]})
    flakebot.up("kv-store")  # a catalogued service, started and healthy: its port, state, version

The names below are flakebot.api's, Settings (flakebot.config), RunRequest (a run's input, flakebot.pipeline.request)
and the root of the exception tree (flakebot.errors).
They are imported on first use, so `import flakebot` stays cheap (no SDK, no pipeline); type checkers see them
through the imports under TYPE_CHECKING. tests/test_public_api.py keeps the list true.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from flakebot.api import (
        CraftResult,
        call_tool,
        craft,
        improve,
        package,
        resume,
    )
    from flakebot.commands.catalog_tools import list_tools
    from flakebot.commands.runs import status
    from flakebot.commands.service_verbs import down, list_services, up
    from flakebot.commands.setup import search
    from flakebot.config import Settings
    from flakebot.errors import FlakebotError
    from flakebot.pipeline.request import RunRequest

# name -> the module it lives in, imported on first use
_LAZY = {
    "craft": "flakebot.api",
    "improve": "flakebot.api",
    "search": "flakebot.api",
    "package": "flakebot.api",
    "status": "flakebot.api",
    "resume": "flakebot.api",
    "call_tool": "flakebot.api",
    "list_tools": "flakebot.api",
    "CraftResult": "flakebot.api",
    "up": "flakebot.api",
    "down": "flakebot.api",
    "list_services": "flakebot.api",
    "Settings": "flakebot.config",
    "FlakebotError": "flakebot.errors",
    "RunRequest": "flakebot.pipeline.request",
}

__all__ = [
    "CraftResult",
    "FlakebotError",
    "RunRequest",
    "Settings",
    "__version__",
    "call_tool",
    "craft",
    "down",
    "improve",
    "list_services",
    "list_tools",
    "package",
    "resume",
    "search",
    "status",
    "up",
]

if not TYPE_CHECKING:  # for type checkers the imports above are the whole module: no name is silently Any

    def __getattr__(name: str) -> Any:
        if name not in _LAZY:
            raise AttributeError(f"module 'flakebot' has no attribute {name!r}")
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups are plain attribute reads
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_LAZY})
