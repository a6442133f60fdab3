"""A suite of needs for `flakebot eval`: each need, how it is crafted offline, and its held-out checks.

A suite is a directory holding suite.json (format 1):

    {"format": 1, "name": "default", "description": "...",
     "needs": [{"id": "csv-dedup", "need": "need a CSV deduper", "session": "sessions/csv-dedup.json",
                "expect": "crafted" | "rejected", "registry": "local", "method": null, "fixture": null,
                "covers": ["new crate on a library", ...], "mistakes": ["wrong output", ...],
                "heldout": [{"description": "...", "bin": "", "args": [], "stdin": "", "files": {},
                             "stdout": "...", "exit_code": 0}]}]}

`session` is a hand-written model script (docs/scripts.md) replayed when no real model is given.
Held-out checks are never shown to the model: they are run on the built tool after the craft.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from flakebot.errors import UsageError

logger = logging.getLogger(__name__)

FORMAT = 1
EXPECTS = ("crafted", "rejected")


@dataclass
class Check:
    """One held-out case: run `bin` (default: the tool's main program) like this, expect this."""

    args: list[str]
    stdout: str
    exit_code: int = 0
    stdin: str = ""
    files: dict[str, str] = field(default_factory=dict)
    description: str = ""
    bin: str = ""


@dataclass
class Need:
    """One need of the suite and everything needed to craft and judge it."""

    id: str
    need: str
    session: Path
    expect: str = "crafted"
    registry: str = "local"
    method: str | None = None
    fixture: str | None = None
    covers: list[str] = field(default_factory=list)
    mistakes: list[str] = field(default_factory=list)
    heldout: list[Check] = field(default_factory=list)


@dataclass
class Suite:
    name: str
    description: str
    directory: Path
    needs: list[Need]

    def select(self, ids: list[str]) -> Suite:
        """The suite reduced to `ids` (all when empty)."""
        unknown = sorted(set(ids) - {n.id for n in self.needs})
        if unknown:
            raise UsageError(
                f"no need {', '.join(unknown)} in suite '{self.name}'",
                fix=f"choose from: {', '.join(n.id for n in self.needs)}",
            )
        return Suite(self.name, self.description, self.directory, [n for n in self.needs if not ids or n.id in ids])


def shipped_suites() -> Path:
    """The directory of the suites that ship with flakebot."""
    return Path(str(resources.files("flakebot") / "data" / "suites"))


def load_suite(name_or_path: str = "default") -> Suite:
    """A shipped suite by name, or a suite directory (or its suite.json) by path."""
    from flakebot.preflight import check_path_name

    check_path_name(name_or_path, "the suite")
    path = Path(name_or_path)
    directory = path.parent if path.name == "suite.json" else path if path.is_dir() else shipped_suites() / name_or_path
    file = directory / "suite.json"
    if not file.is_file():
        shipped = ", ".join(sorted(p.name for p in shipped_suites().iterdir() if (p / "suite.json").is_file()))
        raise UsageError(
            f"no suite '{name_or_path}'", fix=f"name a shipped suite ({shipped}) or a directory holding suite.json"
        )
    try:
        data = json.loads(file.read_text())
        return _suite(data, directory.resolve())
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise UsageError(
            f"suite file {file} is malformed: {exc}", fix="follow the format in flakebot/evaluate/suite.py"
        ) from None


def _suite(data: dict[str, Any], directory: Path) -> Suite:
    if data.get("format", FORMAT) > FORMAT:
        raise UsageError(
            f"suite format {data['format']} is newer than this flakebot reads ({FORMAT})", fix="upgrade flakebot"
        )
    needs = [_need(entry, directory) for entry in data["needs"]]
    ids = [n.id for n in needs]
    if len(set(ids)) != len(ids):
        raise UsageError(f"suite {directory} repeats a need id", fix="give every need its own id")
    return Suite(str(data.get("name", directory.name)), str(data.get("description", "")), directory, needs)


def _need(entry: dict[str, Any], directory: Path) -> Need:
    checks = [Check(**check) for check in entry.get("heldout", [])]
    need = Need(**{**entry, "session": (directory / entry["session"]).resolve(), "heldout": checks})
    if need.expect not in EXPECTS:
        raise UsageError(f"need {need.id}: expect must be one of {', '.join(EXPECTS)}", fix="correct suite.json")
    if need.expect == "crafted" and not checks:
        raise UsageError(
            f"need {need.id} has no held-out checks", fix="add at least one held-out check the model never sees"
        )
    return need
