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
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
    "token_verbs",
)

DOORS = frozenset({"cli", "mcp", "api"})
# what a door passes itself (agent: the caller is a model, over MCP; progress: prints a line of progress, the CLI's;
# sources: where each setting came from, as the CLI loaded them; cwd: the directory the door works in)
GIVEN = ("settings", "sink", "agent", "progress", "sources", "cwd")


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
