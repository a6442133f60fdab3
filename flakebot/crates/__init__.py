"""Crate discovery: where a tool starts from.

    cratesio.py  crates.io API + sparse index + .crate downloads (httpx, rate-limited, cached)
    local.py     a cargo directory source (Debian's /usr/share/cargo/registry, a `cargo vendor` dir)
    rank.py      one ranking for both backends, every result with a short `why`
    registries.py open_registry(): a registry by name (crates-io, local, a directory source, auto)
    mirror.py    a local crates.io made of real crates (sparse index, API, .crate files) on 127.0.0.1

May import flakebot.config, errors, fsutil; nothing from llm/, agent/, nix/.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol


@dataclass
class CrateInfo:
    """What flakebot knows of one crate version, from either backend."""

    name: str
    version: str
    description: str = ""
    keywords: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    license: str = ""
    repository: str = ""
    homepage: str = ""
    has_lib: bool | None = None
    bin_names: list[str] = field(default_factory=list)
    dependencies: list[str] = field(default_factory=list)
    downloads: int | None = None
    recent_downloads: int | None = None
    yanked: bool = False
    checksum: str = ""
    source: str = ""  # "local" or "crates-io"
    path: str = ""  # directory of the crate in a local directory source
    proc_macro: bool = False  # a compiler plugin: rarely where a tool starts

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CrateInfo:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class Candidate:
    """A ranked search result."""

    crate: CrateInfo
    score: float
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {**self.crate.to_dict(), "score": round(self.score, 4), "why": self.why}


class Registry(Protocol):
    """A place crates can be found in."""

    name: str

    def search(self, query: str, limit: int = 10) -> list[Candidate]: ...

    def get(self, name: str, version: str | None = None) -> CrateInfo: ...
