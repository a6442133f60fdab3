"""A run's input: one RunRequest, built once by the CLI, the MCP server or the Python API (flakebot.api), stored in
state.json under "request" and read by the stages as `ctx.request`.

A craft fills the craft fields, an improve adds `improve`, a package the package fields; a field a pipeline does not
use stays at its default. Every field's docstring is what it means; the MCP server's craft, improve and package
input schemas are drawn from these fields and their docstrings (flakebot.toolschema.field_docs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Improvement:
    """What `improve` adds to a craft: the catalogued tool it starts from and the change asked for."""

    tool: str
    """The catalogued tool (NAME, or NAME@VERSION to start from that version)."""
    request: str
    """The change in plain words, e.g. 'also support a --delimiter option'."""
    from_version: str = ""
    """The version the improvement starts from (its source and its examples)."""
    version: str = ""
    """The version the improved tool gets in the catalog (0.1.0 -> 0.2.0)."""
    need: str = ""
    """The tool's need as first crafted: the improved tool keeps it."""
    kept_spec: dict[str, Any] = field(default_factory=dict)
    """The starting version's spec (a ToolSpec as a dict): its examples are kept as they are."""


@dataclass(frozen=True)
class RunRequest:
    """Everything a caller asked of one run (craft, improve or package); the settings it overrides included."""

    need: str = ""
    """What the tool should do, in plain words."""
    model: str | None = None
    """provider:model, e.g. groq:openai/gpt-oss-120b; default from flakebot's config."""
    registry: str | None = None
    """auto, crates-io, local, or a cargo directory-source path."""
    crate: str | None = None
    """Start from this crate (skips the search)."""
    mode: str | None = None
    """With crate: fork the crate, or make a new crate depending on it (fork|new)."""
    method: str | None = None
    """How to get the crate's source: auto, local, git, archive or fork."""
    from_location: str | None = None
    """A git repository URL (URL#ref for a tag or branch) or a local crate directory to start from."""
    start: dict[str, Any] | None = None
    """from_location resolved: the crate to start at (a Crate as a dict), so no search and no choice."""
    ref: str | None = None
    """With from_location: the branch, tag or commit to start from."""
    name: str | None = None
    """The tool's name, when the one the spec picks is taken."""
    spec_file: str | None = None
    """A ToolSpec file (JSON or TOML) used instead of asking the model; an absolute path."""
    keep: bool = False
    """Keep the workspace and target directory after the run."""
    fresh: bool = False
    """Craft again even if the catalog has a tool for this need."""
    fork: bool = False
    """Fork the crate's GitHub repository (needs GITHUB_TOKEN)."""
    push: bool = False
    """With fork: push the tool's branch to the fork."""
    delete_fork: bool = False
    """With fork: delete the fork when the run ends."""
    improve: Improvement | None = None
    """Set for `improve`: the craft starts from a catalogued tool and catalogs its next version."""
    target: str | None = None
    """A crate directory or a crate name."""
    bin: str | None = None
    """The binary, when the crate has several."""
    out: str | None = None
    """Write the flake to this directory (kept after the run)."""
    catalog: bool = False
    """Put the packaged crate in the catalog as a tool (its binary's name, or `name`), runnable like a crafted one."""
    strict_smoke: bool = False
    """Refuse a tool whose smoke run reached only the usage or starts-only level (--help or --version must exit 0)."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The settings the caller's flags override (max_iterations, offline, sandbox, ...), by setting name."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRequest:
        """A stored request; keys an older or newer flakebot wrote that this one does not know are left out."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if values.get("improve"):
            values["improve"] = Improvement(**_known(Improvement, values["improve"]))
        return cls(**values)

    @classmethod
    def from_options(cls, need: str, options: dict[str, Any]) -> RunRequest:
        """The request of a run stored before requests were typed (state.json format 2: a dict of options)."""
        renamed = {"from": "start"}
        values = {renamed.get(k, k): v for k, v in options.items()}
        return cls.from_dict({**values, "need": need})


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    known = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in known}
