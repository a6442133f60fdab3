"""flakebot: a tool factory for agents.

from flakebot import craft, improve, search, package, status, resume, call_tool
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
PUBLIC = ("craft", "improve", "search", "package", "status", "resume", "call_tool", "list_tools")
__all__ = [*PUBLIC, "__version__"]


def __getattr__(name: str) -> Any:
    # The API imports SDKs lazily; keep `import flakebot` cheap.
    if name in PUBLIC:
        from flakebot import api

        return getattr(api, name)
    raise AttributeError(name)
