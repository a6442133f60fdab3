"""The ToolSpec, what a tool must do: its name, summary, usage and acceptance examples, the checks that make a spec
usable, and a spec read from `--spec FILE` (JSON or TOML). The data type only: the spec stage that asks the model for
one is flakebot/stages/spec.py, and agent/acceptance.py renders a spec's examples as the frozen acceptance test.

An improved tool's spec (`flakebot improve TOOL "also support X"`) keeps every acceptance example of the
version it starts from (users rely on them) and adds new ones; a new example with a kept one's input but
another expected output would change what the tool already promised, and is refused.
"""

from __future__ import annotations

import json
import logging
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flakebot.errors import SpecError, UsageError

logger = logging.getLogger(__name__)

NAME_MAX = 100  # characters: a tool's name is a directory of the catalog and a key of a shared index
# kebab-case, bounded; \Z, not $: "csv\n" is no name
NAME_RE = re.compile(rf"^(?=[a-z0-9-]{{1,{NAME_MAX}}}\Z)[a-z][a-z0-9]*(-[a-z0-9]+)*\Z")


@dataclass
class Example:
    """One acceptance example: run the tool with these inputs, expect this output.

    It is also the shape the spec model writes examples in (flakebot.toolschema): a field's docstring is what the
    model is told about it, and exit_code is asked for even though it has a default."""

    args: list[str]  # the tool's command-line arguments
    stdout: str
    """exact expected standard output"""
    exit_code: int = field(default=0, metadata={"required": True})
    stdin: str = ""
    files: dict[str, str] = field(default_factory=dict)
    """files created in the working directory"""
    description: str = ""  # what the example shows


@dataclass
class ToolSpec:
    """What the tool is: its binary name, what it does, how it is called, and how to check it."""

    name: str
    summary: str
    usage: str
    examples: list[Example]
    search_query: str = ""
    # An improved tool's spec: examples[:inherited_examples] are its earlier version's, kept as they were.
    inherited_examples: int = 0
    # A service (craft --service): {"protocol", "declaration", "examples"} as flakebot.services.crafting makes it;
    # its acceptance test is its lifecycle, so `examples` (command lines) stays empty.
    service: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "spec") -> ToolSpec:
        try:
            examples = [
                Example(**{k: v for k, v in e.items() if k in Example.__dataclass_fields__}) for e in data["examples"]
            ]
            spec = cls(
                name=str(data["name"]),
                summary=str(data["summary"]),
                usage=str(data.get("usage", "")),
                examples=examples,
                search_query=str(data.get("search_query", "")),
                inherited_examples=int(data.get("inherited_examples") or 0),
                service=dict(data.get("service") or {}),
            )
        except (KeyError, TypeError) as exc:
            raise SpecError(
                f"{source}: missing or malformed field {exc}",
                fix="give name, summary, usage and 3-6 examples (args, stdout, exit_code)",
            ) from None
        problems = spec.problems()
        if problems:
            raise SpecError(f"{source}: {'; '.join(problems)}", fix="correct the spec")
        return spec

    def problems(self) -> list[str]:
        """What makes this spec unusable, if anything."""
        found = []
        if not NAME_RE.match(self.name):
            found.append(f"name '{self.name}' is not kebab-case (like csv-dedup)")
        added = len(self.examples) - self.inherited_examples
        if self.service:
            return found + ([f"a service has no command-line examples ({added} given)"] if self.examples else [])
        if not self.inherited_examples and not 3 <= added <= 6:
            found.append(f"{added} examples given; 3 to 6 are needed")
        if self.inherited_examples and not 1 <= added <= 6:
            found.append(f"{added} new examples given beside the {self.inherited_examples} kept; 1 to 6 are needed")
        for i, example in enumerate(self.examples, 1):
            if not isinstance(example.args, list) or not all(isinstance(a, str) for a in example.args):
                found.append(f"example {i}: args must be a list of strings")
            if any(Path(name).is_absolute() or ".." in Path(name).parts for name in example.files):
                found.append(f"example {i}: file names must be relative")
        return found


def load_spec_file(path: Path) -> ToolSpec:
    """A spec supplied by a person or agent (JSON or TOML)."""
    return ToolSpec.from_dict(read_spec_file(path), source=str(path))


def read_spec_file(path: Path) -> Any:
    """A spec file's data, parsed (JSON or TOML) but not yet checked."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(
            f"cannot read spec file {path}: {exc.strerror}", fix="pass --spec with a readable JSON or TOML file"
        ) from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"spec file {path} does not parse ({exc})", fix="fix the JSON/TOML syntax") from None
    except RecursionError:  # the decoders recurse per level
        raise UsageError(f"spec file {path} is nested too deeply to read", fix="write the spec flatter") from None
    return data


# ------------------------------------------------------------------ the next version


def improved_spec(kept: ToolSpec, answer: dict[str, Any], source: str = "improvement") -> ToolSpec:
    """The next version's spec: `kept`'s examples first (unchanged), then the answer's new ones."""
    try:
        added = [
            Example(**{k: v for k, v in e.items() if k in Example.__dataclass_fields__}) for e in answer["examples"]
        ]
    except (KeyError, TypeError) as exc:
        raise SpecError(
            f"{source}: missing or malformed field {exc}", fix="give summary, usage and 1-6 new examples"
        ) from None
    spec = ToolSpec.from_dict(
        {
            "name": kept.name,
            "summary": str(answer.get("summary") or kept.summary),
            "usage": str(answer.get("usage") or kept.usage),
            "search_query": kept.search_query,
            "examples": [vars(e) for e in [*kept.examples, *added]],
            "inherited_examples": len(kept.examples),
        },
        source,
    )
    contradiction = _contradiction(kept.examples, added)
    if contradiction:
        raise SpecError(
            f"{source}: {contradiction}", fix="keep the current examples as they are; add only new behaviour"
        )
    return spec


def _contradiction(kept: list[Example], added: list[Example]) -> str:
    """A new example with a kept example's exact input but another expected result, if any."""
    for n, example in enumerate(added, 1):
        for m, old in enumerate(kept, 1):
            same_input = (old.args, old.stdin, old.files) == (example.args, example.stdin, example.files)
            if same_input and (old.stdout, old.exit_code) != (example.stdout, example.exit_code):
                return (
                    f"new example {n} has the input of kept example {m} but expects another result; the current "
                    "version's examples cannot change"
                )
    return ""


def improvement_from_file(kept: ToolSpec, path: Path) -> ToolSpec:
    """`improve --spec FILE`: JSON or TOML with summary, usage and the new examples (a name, if given, must be the tool's)."""
    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except OSError as exc:
        raise UsageError(
            f"cannot read spec file {path}: {exc.strerror}", fix="pass --spec with a readable file"
        ) from None
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"spec file {path} does not parse ({exc})", fix="fix the JSON/TOML syntax") from None
    if data.get("name", kept.name) != kept.name:
        raise UsageError(
            f"spec file {path} names the tool {data['name']}, but this improves {kept.name}",
            fix="leave the name out of an improvement's spec (the tool keeps its name)",
        )
    return improved_spec(kept, data, source=str(path))
