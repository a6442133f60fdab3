"""flakebot's own MCP tools, made from the command table (flakebot.commands.table): a command with an MCP name is a
tool whose input schema is its parameters (strict-compatible, deliver/schema.py), whose description is its
docstring (or what it says to a model instead), whose annotations are its hints; a call's arguments become the
function's, absent ones (null, "", false: schema.py) left to its defaults."""

from __future__ import annotations

import inspect
import typing
from typing import Any

from flakebot.commands.table import Command, Parameter, by_mcp_name, check_values, required_text
from flakebot.deliver.schema import Field, closed_object, is_absent
from flakebot.pipeline.request import Improvement, RunRequest
from flakebot.pipeline.request import options as request_options
from flakebot.toolschema import field_docs, json_schema

WAIT = (
    "true: answer when the work is done (with progress notifications). Null, false or absent: as the request asks "
    "(done when it carries a progress token, else at once with a run handle)."
)
DETACH = (
    "true: answer at once with a run handle {run_id, status: running, follow}, then follow it with status. Null, "
    "false or absent: as the request asks."
)


def table_tools() -> dict[str, Command]:
    """The commands offered as MCP tools, by tool name."""
    return by_mcp_name()


def description(command: Command) -> str:
    text = command.mcp_description
    return (text() if callable(text) else text) or " ".join(command.help.split())


def input_schema(command: Command) -> dict[str, Any]:
    """The tool's strict-compatible input schema: its parameters (a request's MCP fields), `wait` and `detach` for
    long work that is a run."""
    fields: dict[str, Field] = {}
    for p in command.params("mcp"):
        if p.param.request:
            fields |= {name: _request_field(path, required) for name, (path, required) in request_args(p).items()}
        else:
            fields[p.name] = _field(p)
    if command.long and _makes_a_run(command):
        fields |= {"wait": Field("boolean", WAIT), "detach": Field("boolean", DETACH)}
    return closed_object(fields)


def _makes_a_run(command: Command) -> bool:
    return "sink" in inspect.signature(command.run).parameters


def _field(p: Parameter) -> Field:
    schema = json_schema(p.kind)
    items = str(schema.get("items", {}).get("type", "string"))
    return Field(schema["type"], p.param.mcp_help or p.param.help, _asked(p), items=items)


def _asked(p: Parameter) -> bool:
    """Whether a call must give it over MCP."""
    return p.required or p.param.mcp_required


def request_args(p: Parameter) -> dict[str, tuple[str, bool]]:
    """A RunRequest parameter's MCP arguments: argument name -> (request field path, required)."""
    verb = p.param.request or ""
    found = {}
    for cls, prefix in ((Improvement, "improve."), (RunRequest, "")):
        for f, meta in request_options(cls, verb, "mcp"):
            found[meta["mcp_name"] or f.name] = (f"{prefix}{f.name}", bool(meta["positional"]))
    return found


def _request_field(path: str, required: bool) -> Field:
    cls, name = (Improvement, path.removeprefix("improve.")) if path.startswith("improve.") else (RunRequest, path)
    kind = json_schema(typing.get_type_hints(cls)[name])["type"]
    return Field(kind, field_docs(cls)[name], required)


def arguments(command: Command, args: dict[str, Any]) -> dict[str, Any]:
    """The function's arguments from a call's (checked against the schema already, validation.py): absent ones are
    left to the function's defaults; a RunRequest is built from its fields. Then what every door checks beyond
    types (table.check_values), each argument named as MCP names it."""
    made: dict[str, Any] = {}
    for p in command.params("mcp"):
        if p.param.request:
            made[p.name] = _request(args, request_args(p))
        elif not is_absent(args.get(p.name)) or (args.get(p.name) is False and p.default is True):
            made[p.name] = args[p.name]  # false is absent, but not for a flag whose default is true
        elif _asked(p):
            required_text(p.name, None)
    check_values(command, made, "mcp")
    return made


def _request(args: dict[str, Any], names: dict[str, tuple[str, bool]]) -> RunRequest:
    values: dict[str, Any] = {}
    for name, (path, _) in names.items():
        given = args.get(name)  # a required one blank or absent: check_values refuses it
        kind = _request_field(path, False).kind
        values[path] = bool(given) if kind == "boolean" else (str(given) if given else None)
    improvement = {k.removeprefix("improve."): v for k, v in values.items() if k.startswith("improve.")}
    plain = {k: v for k, v in values.items() if not k.startswith("improve.") and v is not None}
    return RunRequest(**plain, improve=Improvement(**improvement) if improvement else None)
