"""Tool versions in the catalog: `NAME@VERSION` references, their order, and the version an improvement gets.

A tool's first craft is 0.1.0; `flakebot improve` makes the next minor version (0.2.0, 0.3.0, ...). These are
the catalog's versions of the tool, independent of the version in its Cargo.toml (a fork of hexyl 0.8.0
crafted into a tool is that tool's 0.1.0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flakebot.errors import UsageError

FIRST_VERSION = "0.1.0"
VERSION_RE = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")


@dataclass(frozen=True)
class ToolRef:
    """A catalogued tool by name, and one of its versions when given (`csv-dedup@0.1.0`); None means the current one."""

    name: str
    version: str | None = None

    def __str__(self) -> str:
        return f"{self.name}@{self.version}" if self.version else self.name


def parse_ref(text: str) -> ToolRef:
    """`NAME` or `NAME@VERSION`; a malformed version is a usage error naming the form it needs."""
    name, at, version = text.partition("@")
    if at and not VERSION_RE.match(version):
        raise UsageError(
            f"'{text}' names no version: after @ comes a version like 0.2.0",
            fix=f"write {name}@0.1.0 (flakebot show {name} lists its versions), or leave @... out for the current one",
        )
    return ToolRef(name, version or None)


def version_key(version: str) -> tuple[int, ...]:
    """Sort key: 0.10.0 after 0.9.0. An unparsable version sorts first."""
    match = VERSION_RE.match(version)
    return tuple(int(part) for part in match.groups()) if match else (-1,)


def next_version(version: str) -> str:
    """The version an improvement of `version` gets: the next minor version (0.1.0 -> 0.2.0)."""
    match = VERSION_RE.match(version)
    if not match:
        return FIRST_VERSION
    major, minor, _ = (int(part) for part in match.groups())
    return f"{major}.{minor + 1}.0"


def newest(versions: list[str]) -> str:
    return max(versions, key=version_key)
