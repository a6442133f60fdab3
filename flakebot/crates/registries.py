"""Choosing a registry by name, and the pipeline's search stage.

open_registry(settings, "crates-io" | "local" | PATH | "auto" | None) -> a Registry
search_stage(ctx) -> {"registry", "query", "candidates"}   (top 10, as dicts)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from flakebot.config import Settings
from flakebot.crates import Candidate, CrateInfo, Registry
from flakebot.errors import SearchError

if TYPE_CHECKING:
    from flakebot.crates.local import LocalRegistry

logger = logging.getLogger(__name__)

T = TypeVar("T")


def local_registry(settings: Settings, path: str | Path | None = None) -> LocalRegistry:
    """The directory source at `path` (default: settings.local_registry), its index cached in the cache dir."""
    from flakebot.crates.local import LocalRegistry

    return LocalRegistry(Path(path or settings.local_registry), settings.path("cache_dir"))


def open_registry(settings: Settings, registry: str | None = None) -> Registry:
    """The registry called `registry`: crates-io, local, a directory-source path, or auto (None = settings.registry)."""
    choice = registry or settings.registry or "auto"
    if choice == "local":
        return local_registry(settings)
    if choice in ("crates-io", "crates.io"):
        if settings.offline:
            raise SearchError(
                "--registry crates-io cannot be searched offline",
                fix="drop --offline (or the offline setting), or use '--registry local'",
            )
        from flakebot.crates.cratesio import CratesIo

        return CratesIo(settings)
    if choice == "auto":
        return local_registry(settings) if settings.offline else AutoRegistry(settings)
    if not _exists(choice):
        shown = choice if len(choice) <= 64 else choice[:64] + "..."
        raise SearchError(
            f"unknown registry '{shown}'", fix="use crates-io, local, auto or the path of a cargo directory source"
        )
    return local_registry(settings, choice)


def _exists(path: str) -> bool:
    """Whether `path` names anything (a file is said to be no directory source by the registry itself)."""
    try:
        return Path(path).expanduser().exists()
    except OSError:  # a name too long for a file name: nothing is there
        return False


def is_directory(path: str) -> bool:
    """Whether `path` names a directory (a registry given as a path); a name no file can have (too long) is none."""
    try:
        return Path(path).expanduser().is_dir()
    except OSError:
        return False


class AutoRegistry:
    """crates.io while it can be reached; the local registry (with a one-line notice) once it cannot."""

    def __init__(self, settings: Settings) -> None:
        from flakebot.crates.cratesio import CratesIo

        self.settings = settings
        self.active: Registry = CratesIo(settings)
        self.name = self.active.name  # the registry that answers: "crates-io", then "local" after a fallback

    def search(self, query: str, limit: int = 10) -> list[Candidate]:
        return self._call(lambda registry: registry.search(query, limit))

    def get(self, name: str, version: str | None = None) -> CrateInfo:
        return self._call(lambda registry: registry.get(name, version))

    def _call(self, call: Callable[[Registry], T]) -> T:
        from flakebot.crates.cratesio import Unreachable

        try:
            return call(self.active)
        except Unreachable as exc:
            if self.active.name != "crates-io":
                raise
            fallback = local_registry(self.settings)
            logger.warning("%s; searching the local registry %s instead", exc.message, fallback.path)
            self.active, self.name = fallback, fallback.name
            return call(fallback)


def search(query: str, settings: Settings, registry: str | None = None, limit: int = 10) -> tuple[str, list[Candidate]]:
    """Ranked candidates for `query` and the name of the registry that answered."""
    if limit < 1:
        raise SearchError(f"the limit must be at least 1, got {limit}", fix="ask for 1 or more crates")
    chosen = open_registry(settings, registry)
    found = chosen.search(query, limit)
    return chosen.name, found
