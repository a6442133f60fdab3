"""The table of commands: every command flakebot has, declared once, and what the doors are made from.

A command is a function in a module of this folder with a `Command` beside it. The function's parameters are the
command's request (each one `Annotated[TYPE, Param(...)]`: its help, its CLI spelling, the doors that offer it), its
docstring the command's help, its return value the result. The CLI (flakebot.cli.generated), the MCP tools
(flakebot.mcp.server) and the Python API (flakebot.api) are made from `commands()`; none wires a command by hand
(tests/commands/test_table.py). Adding a command is its module plus its line in MODULES:

    def hello(name: Annotated[str, Param("Who to greet.", positional=True)], settings: Settings | None = None) -> dict:
        \"\"\"Greet someone.\"\"\"
        return {"greeting": f"hello {name}"}

    COMMANDS = [Command("hello", hello, mcp="hello", hints=Hints("Greet", read_only=True))]

`settings`, `sink` (the run's event sink, for long work), `agent` (true over MCP), `progress` (a line of progress for
a person: stderr on the CLI), `sources` (where each setting came from, as the CLI loaded them) and `cwd` (the MCP
server's start directory) are given by the door, never asked of the caller.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flakebot.errors import UsageError

# The command modules, in the order `flakebot --help` and MCP's tools/list show their commands: the one table.
MODULES = (
    "craft",
    "improve",
    "evaluating",
    "runs",
    "setup",
    "catalog_tools",
    "wrap",
    "share",
    "service_verbs",
    "team_worker",
    "team_quota",
    "token_verbs",
)

DOORS = frozenset({"cli", "mcp", "api"})
# what a door passes itself (agent: the caller is a model, over MCP; progress: prints a line of progress, the CLI's;
# sources: where each setting came from, as the CLI loaded them; cwd: the directory the door works in)
GIVEN = ("settings", "sink", "agent", "progress", "sources", "cwd")
F = typing.TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Param:
    """How a command's parameter is offered: its help, and per door. `cli`: its option spelling(s) ("--from", "-n");
    `positional`: an argument on the command line; `mcp_help`: said differently to a model; `doors`: where it is
    offered (a parameter the MCP door does not offer keeps its default there); `mcp_required`: the MCP door asks for it
    although the function has a default (what the default stands for, such as `up --all`, is not offered there)."""

    help: str
    cli: tuple[str, ...] = ()
    positional: bool = False
    mcp_help: str | None = None
    doors: frozenset[str] = DOORS
    request: str | None = None  # a RunRequest: its fields for this verb are the parameters (pipeline/request.py)
    mcp_required: bool = False
    least: float | None = None  # the least number it takes: every door refuses less, naming it as that door does
    most: float | None = None  # the most it takes, likewise


@dataclass(frozen=True)
class Hints:
    """What a command may do, for hosts that decide approval by it (MCP ToolAnnotations)."""

    title: str
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False

    def annotations(self) -> dict[str, Any]:
        hints: dict[str, Any] = {"title": self.title, "readOnlyHint": self.read_only, "idempotentHint": self.idempotent}
        if not self.read_only:  # the spec gives destructiveHint a meaning only for a tool that writes
            hints["destructiveHint"] = self.destructive
        hints["openWorldHint"] = self.open_world
        return hints


def plain(result: Any) -> dict[str, Any]:
    """A result as plain data: its to_dict(), or the dict itself."""
    if hasattr(result, "to_dict"):
        return result.to_dict()  # type: ignore[no-any-return]
    if isinstance(result, dict):
        return result
    raise TypeError(f"a command returned {type(result).__name__}, not a dict or a result with to_dict()")


@dataclass(frozen=True)
class Command:
    """One command. `name`: its CLI verb ("config show": a verb of a group); `run`: what it does (the API function);
    `mcp`: its MCP tool's name (None: not offered to agents); `long`: minutes of work with progress (a job over MCP,
    live progress on the CLI); `changes_catalog`: the MCP door tells clients the tool list changed after it;
    `data`: its result as plain data (CLI --json, MCP); `agent`: that data as an agent gets it (compact);
    `text`: the CLI's lines for a person (None: a display of the CLI's own, or the data as key: value lines);
    `exit_code`: a non-zero exit for a result that reports a failure; `mcp_description`: said to a model instead
    of the docstring (or a function making it, for text another module holds); `working`: the CLI's live line
    while it works ({NAME} is an argument's value); `doors`: which of cli, mcp, api offer it; `check`: what a door
    runs before any job starts (taking the arguments `run` would)."""

    name: str
    run: Callable[..., Any]
    mcp: str | None = None
    hints: Hints | None = None
    long: bool = False
    changes_catalog: bool = False
    data: Callable[[Any], dict[str, Any]] = plain
    agent: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    text: Callable[[dict[str, Any]], str] | None = None
    exit_code: Callable[[dict[str, Any]], int] = lambda _: 0
    mcp_description: str | Callable[[], str] | None = None  # a callable: text made when first asked
    working: str | None = None
    doors: frozenset[str] = DOORS
    check: Callable[..., None] | None = None
    cli_extra: dict[str, Any] = field(default_factory=dict)  # typer command settings (run: extra args after --)

    @property
    def api(self) -> str:
        """Its name in flakebot.api: the function's own."""
        return self.run.__name__

    @property
    def help(self) -> str:
        return inspect.cleandoc(self.run.__doc__ or "")

    @property
    def summary(self) -> str:
        return " ".join(self.help.split("\n\n")[0].split())

    def params(self, door: str) -> list[Parameter]:
        """The parameters `door` offers, in the function's order."""
        return [p for p in parameters(self.run) if door in p.param.doors]

    def call(self, arguments: dict[str, Any], **given: Any) -> Any:
        """Run it with a door's arguments (by parameter name) and what the door gives (settings, sink): only what
        the function takes."""
        return _called(self.run, arguments, given)

    def call_check(self, arguments: dict[str, Any], **given: Any) -> None:
        """Its check (before a job starts) with the arguments and given values it takes."""
        if self.check is not None:
            _called(self.check, arguments, given)


def _called(function: Callable[..., Any], arguments: dict[str, Any], given: dict[str, Any]) -> Any:
    takes = inspect.signature(function).parameters
    return function(**{k: v for k, v in {**arguments, **given}.items() if k in takes})


@dataclass(frozen=True)
class Parameter:
    """One parameter of a command's function: its name, type (without Annotated), default and Param."""

    name: str
    kind: Any
    default: Any
    param: Param

    @property
    def required(self) -> bool:
        return self.default is inspect.Parameter.empty


@functools.cache
def parameters(run: Callable[..., Any]) -> tuple[Parameter, ...]:
    """A command function's parameters, each with its Param (a parameter without one is a TypeError: no door may
    guess how to offer it)."""
    hints = _parameter_hints(run)
    found = []
    for p in inspect.signature(run).parameters.values():
        if p.name in GIVEN:
            continue
        hint = hints[p.name]
        metadata = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Param)]
        if not metadata:
            raise TypeError(f"{run.__qualname__}: parameter {p.name!r} has no Param (Annotated[TYPE, Param(...)])")
        found.append(Parameter(p.name, typing.get_args(hint)[0], p.default, metadata[0]))
    return tuple(found)


def _parameter_hints(run: Callable[..., Any]) -> dict[str, Any]:
    """The types of a function's parameters (Annotated kept); its return type is not evaluated: a result's type may
    be imported for type checkers only (a heavy module)."""
    annotations = {k: v for k, v in run.__annotations__.items() if k != "return"}
    shim = types.SimpleNamespace(__annotations__=annotations)
    return typing.get_type_hints(shim, globalns=getattr(run, "__globals__", {}), include_extras=True)


@functools.cache
def commands() -> tuple[Command, ...]:
    """Every command, in MODULES' order."""
    found: list[Command] = []
    for module in MODULES:
        found += importlib.import_module(f"flakebot.commands.{module}").COMMANDS
    names = [c.name for c in found]
    repeated = {n for n in names if names.count(n) > 1}
    if repeated:
        raise RuntimeError(f"commands declared twice: {', '.join(sorted(repeated))}")
    return tuple(found)


@functools.cache
def by_mcp_name() -> dict[str, Command]:
    return {c.mcp: c for c in commands() if c.mcp}


# The checks every door shares: types against the declared schema (`check_types`: the API's; MCP checks the schema
# it lists, flakebot.validation, and the CLI has typer parse them) and what types cannot say (`check_values`, the
# one function all three run), each before any work, run or job exists.


def required_text(name: str, value: Any) -> None:
    """The one check of a required text argument: given and not blank (an agent's empty string or null is absent)."""
    if value is None or value is False or (isinstance(value, str) and not value.strip()):
        raise UsageError(f"'{name}' is required", fix=f"pass {name} as a non-empty string")


def spelled(p: Parameter, door: str) -> str:
    """How `door` names a parameter in an error: the CLI's option or argument (--limit, QUERY), else its name."""
    if door != "cli":
        return p.name
    if p.param.positional:
        return p.name.upper()
    return p.param.cli[0] if p.param.cli else "--" + p.name.replace("_", "-")


def check_values(command: Command, arguments: dict[str, Any], door: str) -> None:
    """What every door checks of a call's arguments (by parameter name) beyond their types, the same for the CLI,
    MCP and the API: a required string is not blank, a whole number is not 8080.0 (JSON Schema counts it an
    integer; a socket does not), a number is finite and at least its declared least; a request's required fields
    (its positional ones) are not blank. Each problem names the argument as `door` spells it."""
    import math

    for p in command.params(door):
        if p.name not in arguments:
            continue
        value, name = arguments[p.name], spelled(p, door)
        if p.param.request:
            if door != "cli":  # the CLI's are arguments typer requires, their words checked by the command (an example)
                _check_request_values(value, p.param.request, door)
        elif isinstance(value, str) and (p.required or (door == "mcp" and p.param.mcp_required)):
            required_text(name, value)
        elif isinstance(value, float) and _json_type(p.kind) == "integer":
            raise UsageError(f"'{name}' must be a whole number, got a number", fix=f"pass {name} as a whole number")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            least = p.param.least
            if isinstance(value, float) and not math.isfinite(value):  # (10**400 is no float: no overflow)
                raise UsageError(f"'{name}' must be a finite number, got {value}", fix=f"pass {name} as a number")
            most = p.param.most
            if (least is not None and value < least) or (most is not None and value > most):
                within = _within(least, most)
                raise UsageError(f"'{name}' must be {within}, got {value}", fix=f"pass {name} {within}")


def _within(least: float | None, most: float | None) -> str:
    """A declared range in words: "from 1024 to 65535", "at least 1", "at most 60"."""
    if least is not None and most is not None:
        return f"from {least:g} to {most:g}"
    return f"at least {least:g}" if least is not None else f"at most {most:g}"


def _check_request_values(request: Any, verb: str, door: str) -> None:
    from flakebot.pipeline.request import Improvement, request_fields

    for cls, field_name, name, positional in request_fields(verb, door):
        if positional:
            part = (request.improve or Improvement()) if cls is Improvement else request
            required_text(name, getattr(part, field_name))


def check_types(command: Command, arguments: dict[str, Any]) -> None:
    """The API's arguments (by parameter name) against the command's declared schema (`schema`): types as
    annotated, never coerced; a RunRequest's fields as its verb declares them. One UsageError for the first
    problem (flakebot.validation)."""
    from flakebot.pipeline.request import RunRequest, as_fields
    from flakebot.validation import check_arguments

    plain = dict(arguments)
    for p in command.params("api"):
        value = plain.get(p.name)
        if p.param.request and p.name in plain:
            if not isinstance(value, RunRequest):
                raise UsageError(
                    f"'{p.name}' must be a RunRequest, got {type(value).__name__}",
                    fix=f"pass RunRequest(...), or call flakebot.api.{p.param.request}() with keywords",
                )
            plain[p.name] = as_fields(value, p.param.request)
        elif _is_path(p.kind) and isinstance(value, os.PathLike):
            plain[p.name] = os.fspath(value)
    check_arguments(command.api, plain, schema(command))


def schema(command: Command) -> dict[str, Any]:
    """The JSON schema of the arguments the API takes by name: each parameter's type as annotated (null only where
    it allows None, a path as a string), required when it has no default; a RunRequest as its verb's fields."""
    from flakebot.pipeline.request import request_schema

    properties: dict[str, Any] = {}
    for p in command.params("api"):
        properties[p.name] = request_schema(p.param.request) if p.param.request else value_schema(p.kind)
    required = [p.name for p in command.params("api") if p.required]
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def value_schema(kind: Any) -> dict[str, Any]:
    """A Python type's JSON schema for a value passed by name: null too when it allows None; a path is a string."""
    from flakebot.toolschema import json_schema

    nullable = type(None) in typing.get_args(kind)
    made = {"type": "string"} if _is_path(kind) else json_schema(kind)
    return {**made, "type": [made["type"], "null"]} if nullable else made


def _json_type(kind: Any) -> str:
    kinds = value_schema(kind)["type"]
    return str(kinds if isinstance(kinds, str) else kinds[0])


def _is_path(kind: Any) -> bool:
    import pathlib

    return kind is pathlib.Path or pathlib.Path in typing.get_args(kind)


def checked(command: Command) -> Callable[..., Any]:
    """The command's function as the API offers it: a call's arguments checked (`check_types`, `check_values`)
    before it runs; what the door gives (settings, sink, ...) is passed on as the caller gave it."""

    def check(arguments: dict[str, Any]) -> None:
        check_types(command, arguments)
        check_values(command, arguments, "api")

    known = ", ".join(p.name for p in command.params("api")) or "no arguments"
    return _checking(command.run, command.api, known, check)


def typed(function: Callable[..., Any]) -> Callable[..., Any]:
    """A library function the API offers beside the table's commands, its arguments checked against its annotations
    as a command's are (never coerced); what a door gives, and a parameter whose type has no JSON schema (Any), pass
    as the caller gave them."""
    from flakebot.validation import check_arguments

    name = function.__name__
    taken = [p for p in inspect.signature(function).parameters.values() if p.name not in GIVEN]
    shim = types.SimpleNamespace(__annotations__={p.name: function.__annotations__[p.name] for p in taken})
    hints = typing.get_type_hints(shim, globalns=getattr(function, "__globals__", {}))
    properties = {}
    for p in taken:
        try:
            properties[p.name] = value_schema(hints[p.name])
        except TypeError:  # Any: whatever the function itself accepts
            properties[p.name] = {}
    required = [p.name for p in taken if p.default is inspect.Parameter.empty]
    schema = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return _checking(function, name, ", ".join(properties), lambda arguments: check_arguments(name, arguments, schema))


def bound(function: F) -> F:
    """A library function that checks its own keywords (craft, improve, package: pipeline.request.from_keywords),
    its call bound to its signature as a command's is: a missing or extra argument, or what a door gives of the
    wrong kind, is one UsageError, not a TypeError from inside."""
    known = ", ".join(p for p in inspect.signature(function).parameters if p not in GIVEN)
    return typing.cast(F, _checking(function, function.__name__, known, lambda arguments: None))


def check_given(name: str, value: Any) -> None:
    """What a door gives (settings, sink, agent, progress, sources, cwd), when an API caller gives it instead: of the
    kind the door would give, or one UsageError (a string for `settings` is a mistake, not an AttributeError deep
    inside the command)."""
    from flakebot.config import Settings

    kinds: dict[str, tuple[bool, str]] = {
        "settings": (value is None or isinstance(value, Settings), "a flakebot.config.Settings or None"),
        "sink": (callable(value), "a function taking an event"),
        "progress": (callable(value), "a function taking a line of text"),
        "agent": (isinstance(value, bool), "true or false"),
        "sources": (value is None or isinstance(value, dict), "a dict or None"),
        "cwd": (value is None or isinstance(value, (str, os.PathLike)), "a path or None"),
    }
    fits, wanted = kinds.get(name, (True, ""))
    if not fits:
        raise UsageError(f"'{name}' must be {wanted}, got {type(value).__name__}", fix=f"pass {name} as {wanted}")


def _checking(
    run: Callable[..., Any], name: str, known: str, check: Callable[[dict[str, Any]], None]
) -> Callable[..., Any]:
    """`run` with its call bound to its signature (an unknown or missing argument is one UsageError), what a door
    gives checked for its kind (`check_given`) and the rest `check`ed (by name) before it runs."""
    signature = inspect.signature(run)

    @functools.wraps(run)
    def call(*args: Any, **kwargs: Any) -> Any:
        unknown = sorted(set(kwargs) - set(signature.parameters))
        if unknown:
            raise UsageError(f"{name}() takes no argument {', '.join(unknown)}", fix=f"use: {known or 'no arguments'}")
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise UsageError(f"{name}(): {exc}", fix=f"see help(flakebot.api.{name})") from None
        for given in GIVEN:
            if given in bound.arguments:
                check_given(given, bound.arguments[given])
        check({k: v for k, v in bound.arguments.items() if k not in GIVEN})
        return run(*bound.args, **bound.kwargs)

    return call
