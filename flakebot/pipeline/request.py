"""A run's input: one RunRequest, built once by the CLI, the MCP server or the Python API (flakebot.api), stored in
state.json under "request" and read by the stages as `ctx.request`.

A craft fills the craft fields, an improve adds `improve`, a package the package fields; a field a pipeline does not
use stays at its default. Every field's docstring is what it means.

An option is declared once, here: a field made with `option(...)` names the verbs that take it and how each door
spells it. The CLI's typer options (flakebot.cli.options), the MCP tools' input schemas (flakebot.mcp.server) and the
Python API's keywords (flakebot.api) are generated from these fields, their types and their docstrings; a field
with `setting=True` overrides the setting of the same name for this run (`overrides()`).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Any

from flakebot.errors import UsageError

VERBS = ("craft", "improve", "package")


def option(
    default: Any = None,
    *,
    verbs: tuple[str, ...],
    mcp: tuple[str, ...] = (),
    cli: str = "",
    api: str = "",
    mcp_name: str = "",
    positional: bool = False,
    setting: bool = False,
    path: bool = False,
    least: float | None = None,
) -> Any:
    """A request field callers set: the `verbs` whose CLI and Python API take it, the verbs whose MCP tool offers it
    (`mcp`), its flag spelling when not --NAME (`cli`, e.g. "--offline/--online"), its keyword in the API (`api`) and
    its argument name over MCP (`mcp_name`) when the field's name cannot be used there, a positional CLI argument,
    a setting it overrides for the run, a path (resolved by the CLI), and the least number it takes."""
    meta = dict(verbs=verbs, mcp=mcp, cli=cli, api=api, mcp_name=mcp_name, positional=positional, setting=setting,
                path=path, least=least)  # fmt: skip
    return field(default=default, metadata={"option": meta})


def options(cls: type, verb: str, door: str = "cli") -> list[tuple[dataclasses.Field[Any], dict[str, Any]]]:
    """The fields of `cls` (RunRequest or Improvement) that `verb` takes through `door` (cli, api or mcp), in order."""
    chosen = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("option")
        if meta and verb in (meta["mcp"] if door == "mcp" else meta["verbs"]):
            chosen.append((f, meta))
    return chosen


def check_bounds(request: RunRequest) -> None:
    """Every number a caller gave is finite and at least its least value: a bad one fails before any work."""
    for f in dataclasses.fields(request):
        meta = f.metadata.get("option") or {}
        value = getattr(request, f.name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        flag = meta.get("cli") or f"--{f.name.replace('_', '-')}"
        if not math.isfinite(value) or (meta.get("least") is not None and value < meta["least"]):
            raise UsageError(
                f"{flag} must be a finite number of at least {meta.get('least', 0)}, got {value}",
                fix=f"pass {flag} with a number of at least {meta.get('least', 0)}",
            )


@dataclass(frozen=True)
class Improvement:
    """What `improve` adds to a craft: the catalogued tool it starts from and the change asked for."""

    tool: str = option("", verbs=("improve",), mcp=("improve",), positional=True)
    """The catalogued tool (NAME, or NAME@VERSION to start from that version)."""
    request: str = option("", verbs=("improve",), mcp=("improve",), positional=True)
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

    need: str = option("", verbs=("craft",), mcp=("craft",), positional=True)
    """What the tool should do, in plain words: "need a CSV deduper"."""
    model: str | None = option(verbs=VERBS[:2], mcp=VERBS[:2])
    """provider:model, e.g. groq:openai/gpt-oss-120b, openai:gpt-4.1-mini, ollama:NAME, scripted:FILE; default from flakebot's config."""
    registry: str | None = option(verbs=VERBS, mcp=("craft", "package"))
    """Where crates come from: auto, crates-io, local, or a cargo directory-source path."""
    crate: str | None = option(verbs=("craft",), mcp=("craft",))
    """Start from this crate (skips the search and the model's choice)."""
    mode: str | None = option(verbs=("craft",))
    """With crate: fork the crate, or make a new crate depending on it (fork|new)."""
    method: str | None = option(verbs=("craft",))
    """How to get the crate's source: auto, local (directory source), git (its repository at the version tag), archive (.crate) or fork."""
    from_location: str | None = option(
        verbs=("craft",), mcp=("craft",), cli="--from", api="from_source", mcp_name="from"
    )
    """A git repository URL (URL#ref for a tag or branch) or a local crate directory to start from: no search, no choice."""
    start: dict[str, Any] | None = None
    """from_location resolved: the crate to start at (a Crate as a dict), so no search and no choice."""
    service_flake: dict[str, Any] | None = None
    """A service's flake outputs beside its package (package-service): its declaration, NixOS module and image."""
    ref: str | None = option(verbs=("craft",))
    """With a repository to start from: the branch, tag or commit."""
    name: str | None = option(verbs=("craft", "package"), mcp=("craft", "package"))
    """The tool's name (craft: default the spec's, a name taken by another need gets a suffix; package with catalog: default the binary's)."""
    spec_file: str | None = option(verbs=VERBS[:2], cli="--spec", path=True)
    """A ToolSpec file (JSON or TOML: name, summary, usage, examples; for improve, 1-6 new examples) used instead of asking the model."""
    max_iterations: int | None = option(verbs=VERBS[:2], setting=True, least=1)
    """Edit-loop model calls before giving up."""
    max_cost: float | None = option(verbs=VERBS[:2], setting=True, least=0)
    """USD the run may spend on the model."""
    max_tokens: int | None = option(verbs=VERBS[:2], setting=True, least=1)
    """Tokens the run may use."""
    max_wall_seconds: float | None = option(verbs=VERBS[:2], setting=True, least=1)
    """Wall-clock seconds the edit loop may take."""
    offline: bool | None = option(verbs=VERBS, setting=True, cli="--offline/--online")
    """Use only the local registry and cargo --offline."""
    sandbox: str | None = option(verbs=VERBS[:2], setting=True)
    """required (default): bubblewrap or stop; auto: plain-process fallback; off: no isolation (unsafe)."""
    nixpkgs: str | None = option(verbs=("package",), setting=True)
    """pinned (real nixos-26.05) or host (offline stand-in); default: auto."""
    keep: bool = option(False, verbs=VERBS[:2])
    """Keep the workspace and target directory after the run."""
    service: bool = option(False, verbs=("craft",), mcp=("craft",))
    """Craft a long-running service (HTTP, port from $PORT, state in $STATE_DIRECTORY), checked over its whole lifecycle; `flakebot up NAME` starts it."""
    fresh: bool = option(False, verbs=("craft",), mcp=("craft",))
    """Craft again even if the catalog has a tool for this need."""
    fork: bool = option(False, verbs=("craft",))
    """Fork the crate's GitHub repository (needs GITHUB_TOKEN)."""
    push: bool = option(False, verbs=("craft",))
    """With fork: push the tool's branch to the fork."""
    delete_fork: bool = option(False, verbs=("craft",))
    """With fork: delete the fork when the run ends."""
    improve: Improvement | None = None
    """Set for `improve`: the craft starts from a catalogued tool and catalogs its next version."""
    target: str | None = option(verbs=("package",), mcp=("package",), positional=True)
    """A crate directory or a crate name."""
    bin: str | None = option(verbs=("package",), mcp=("package",), api="bin_name")
    """The binary to package, when the crate has several."""
    out: str | None = option(verbs=("package",), mcp=("package",), path=True)
    """Write the flake to this directory (new or empty; kept after the run and by 'flakebot clean')."""
    catalog: bool = option(False, verbs=("package",), mcp=("package",))
    """Also put the packaged binary in the catalog as a tool (named after the binary, or `name`): run, list and the MCP server offer it like a crafted one."""
    strict_smoke: bool = option(False, verbs=("craft", "package"), mcp=("package",))
    """Refuse a tool whose smoke run reached only the usage, runs or starts-only level (--help or --version must exit 0)."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The settings the caller's flags override (max_iterations, offline, sandbox, ...), by setting name."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def overrides(self) -> dict[str, Any]:
        """The settings this request overrides: its setting fields that were given, over `settings`."""
        given = {name: getattr(self, name) for name in setting_fields() if getattr(self, name) is not None}
        return {**self.settings, **given}

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


def setting_fields() -> list[str]:
    """The request fields that override a setting of the same name."""
    return [f.name for f in dataclasses.fields(RunRequest) if (f.metadata.get("option") or {}).get("setting")]


def api_names(verb: str) -> dict[str, tuple[type, str]]:
    """The Python API's keywords of `verb`: keyword -> (RunRequest or Improvement, field name)."""
    return {
        meta["api"] or f.name: (cls, f.name)
        for cls in (Improvement, RunRequest)
        for f, meta in options(cls, verb, "api")
    }


def request_fields(verb: str, door: str) -> list[tuple[type, str, str, bool]]:
    """The request fields `door` (cli, mcp or api) offers for `verb`: (RunRequest or Improvement, field name, how
    the door spells it, positional), in order."""
    found: list[tuple[type, str, str, bool]] = []
    for cls in (Improvement, RunRequest):
        for f, meta in options(cls, verb, door):
            flag = meta["cli"].split("/")[0] or "--" + f.name.replace("_", "-")
            cli = f.name.upper() if meta["positional"] else flag
            spelled = {"cli": cli, "mcp": meta["mcp_name"] or f.name, "api": meta["api"] or f.name}[door]
            found.append((cls, f.name, spelled, bool(meta["positional"])))
    return found


def field_schema(cls: type, name: str) -> dict[str, Any]:
    """A request field's JSON schema as declared by its type (null too when it allows None)."""
    from flakebot.toolschema import json_schema

    kind = typing.get_type_hints(cls)[name]
    made = json_schema(kind)
    return {**made, "type": [made["type"], "null"]} if type(None) in typing.get_args(kind) else made


def request_schema(verb: str) -> dict[str, Any]:
    """A `verb` request's caller fields as a JSON object (`as_fields`), by field name: the API checks a RunRequest
    it is given against this."""
    fields = {f.name: field_schema(RunRequest, f.name) for f, _ in options(RunRequest, verb, "api")}
    improved = {f.name: field_schema(Improvement, f.name) for f, _ in options(Improvement, verb, "api")}
    if improved:
        fields["improve"] = {"type": "object", "properties": improved, "additionalProperties": True}
    return {"type": "object", "properties": fields, "additionalProperties": True}


def as_fields(request: RunRequest, verb: str) -> dict[str, Any]:
    """A request's caller fields for `verb` as plain data (`request_schema`)."""
    made = {f.name: getattr(request, f.name) for f, _ in options(RunRequest, verb, "api")}
    if options(Improvement, verb, "api"):
        made["improve"] = {f.name: getattr(request.improve, f.name) for f, _ in options(Improvement, verb, "api")}
        if request.improve is None:
            made["improve"] = {}
    return made


def from_keywords(verb: str, given: dict[str, Any]) -> RunRequest:
    """The RunRequest the API keywords of `verb` make, each checked against its field's declared type (never
    coerced: flakebot.validation); an unknown keyword is one clear error."""
    from flakebot.validation import check_arguments

    names = api_names(verb)
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise UsageError(f"{verb}() got unknown option(s): {', '.join(unknown)}", fix=f"use: {', '.join(names)}")
    paths = {k: str(v) if v is not None and _is_path(*names[k]) and isinstance(v, os.PathLike) else v
             for k, v in given.items()}  # fmt: skip
    keywords = {keyword: field_schema(*names[keyword]) for keyword in names}
    check_arguments(f"{verb}()", paths, {"type": "object", "properties": keywords})
    values: dict[type, dict[str, Any]] = {RunRequest: {}, Improvement: {}}
    for keyword, value in given.items():
        cls, name = names[keyword]
        values[cls][name] = str(value) if value is not None and _is_path(cls, name) else value
    improvement = Improvement(**values[Improvement]) if values[Improvement] else None
    return RunRequest(**values[RunRequest], improve=improvement)


def _is_path(cls: type, name: str) -> bool:
    meta = next(f.metadata.get("option") or {} for f in dataclasses.fields(cls) if f.name == name)
    return bool(meta.get("path"))


def keyword_signature(verb: str, function: Any) -> inspect.Signature:
    """`function`'s signature with its **options spelled out as the keywords of `verb` (for help() and editors)."""
    fixed = [p for p in inspect.signature(function).parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
    taken = {p.name for p in fixed}
    classes: tuple[type, ...] = (Improvement, RunRequest)
    hints: dict[type, dict[str, Any]] = {cls: typing.get_type_hints(cls) for cls in classes}
    defaults: dict[type, dict[str, Any]] = {
        cls: {f.name: f.default for f in dataclasses.fields(cls)} for cls in classes
    }
    keywords = [
        inspect.Parameter(
            keyword, inspect.Parameter.KEYWORD_ONLY, default=defaults[cls][name], annotation=hints[cls][name]
        )
        for keyword, (cls, name) in api_names(verb).items()
        if keyword not in taken
    ]
    return inspect.Signature([*fixed, *keywords], return_annotation=inspect.signature(function).return_annotation)
