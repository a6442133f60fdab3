"""flakebot: a tool factory for agents.

from flakebot import craft, search, package
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["craft", "search", "package", "__version__"]


def __getattr__(name: str) -> Any:
    # The API imports SDKs lazily; keep `import flakebot` cheap.
    if name in ("craft", "search", "package"):
        from flakebot import api

        return getattr(api, name)
    raise AttributeError(name)
