"""The CLI's commands, made from the command table (flakebot.commands.table): each command's parameters become its
typer arguments and options, its docstring its help; `--json` prints its result as data, otherwise the display
named for it (cli/display.py SHOWN), its text, or its data as `key: value` lines. Long work shows live progress."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from flakebot.commands.table import Command, Parameter, check_values, commands

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (lines) for programs instead of tables.")]


ONLY: str | None = None  # the one command this process runs (entry.py sets it: only_command), else every command


def register(app: typer.Typer, groups: dict[str, typer.Typer], door: Any) -> None:
    """Add every command the CLI offers to `app` (a "group verb" name to that group's typer), or only ONLY when set;
    `door` gives the loaded settings and the global options (cli/app.py's Globals)."""
    for command in commands():
        if "cli" not in command.doors or (ONLY is not None and command.name != ONLY):
            continue
        group, _, verb = command.name.rpartition(" ")
        target = groups[group] if group else app
        target.command(verb, help=command.help, context_settings=command.cli_extra or None)(_handler(command, door))


def _handler(command: Command, door: Any) -> Callable[..., None]:
    fields = [*_fields(command)]
    # a parameter spelled --json (or named as_json) is the command's own --json: it is what --json means there
    named = [p.name for p in command.params("cli") if "--json" in p.param.cli] or ["as_json"]
    own = named[0] not in {p.name for p in fields}

    def handler(**given: Any) -> None:
        as_json = bool(given.pop("as_json", False)) if own else bool(given.get(named[0]))
        arguments = _arguments(command, given)
        check_values(command, arguments, "cli")  # beyond typer's types: the check every door runs
        with _progress(command, as_json, arguments, door) as extra:
            result = command.call(arguments, settings=door.settings, sources=door.sources, **extra)
        code = _show(command, result, as_json, {**arguments, "settings": door.settings, "arguments": arguments})
        if code:
            raise typer.Exit(code)

    extra = [inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, annotation=JsonOpt, default=False)]
    handler.__signature__ = inspect.Signature(fields + (extra if own else []))  # type: ignore[attr-defined]
    handler.__name__ = command.api
    return handler


def _fields(command: Command) -> Iterator[inspect.Parameter]:
    """The typer parameters of a command: positional arguments first, in declaration order."""
    from flakebot.cli.options import request_parameters

    made: list[tuple[inspect.Parameter, bool]] = []
    for p in command.params("cli"):
        if p.param.request:
            made += request_parameters(p.param.request)
            continue
        made.append((_typer_parameter(p), p.param.positional))
    made.sort(key=lambda pair: not pair[1])
    for parameter, _ in made:
        yield parameter


def _typer_parameter(p: Parameter) -> inspect.Parameter:
    if p.param.positional:
        info: Any = typer.Argument(help=p.param.help)
    else:
        info = typer.Option(*p.param.cli, help=p.param.help)
    default = p.default
    return inspect.Parameter(
        p.name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[p.kind, info], default=default
    )


def _arguments(command: Command, given: dict[str, Any]) -> dict[str, Any]:
    """The function's arguments from typer's values (a RunRequest built from its fields)."""
    from flakebot.cli.options import build_request

    arguments: dict[str, Any] = {}
    for p in command.params("cli"):
        if p.param.request:
            arguments[p.name] = build_request(p.param.request, given)
        else:
            value = given[p.name]
            arguments[p.name] = str(value) if isinstance(value, Path) else value
    return arguments


@contextmanager
def _progress(command: Command, as_json: bool, arguments: dict[str, Any], door: Any) -> Iterator[dict[str, Any]]:
    """Live progress while the command works: its run's events when it takes a sink, its lines when it takes a
    progress printer, else a live line naming what it does; Ctrl-C on a service command says where it left the
    service."""
    takes_sink = "sink" in inspect.signature(command.run).parameters
    title = _title(command, arguments)
    if takes_sink:
        from flakebot.cli.live import event_sink

        with event_sink(as_json, title, quiet=door.quiet) as sink:
            yield {"sink": sink}
        return
    if "progress" in inspect.signature(command.run).parameters:  # its lines, on stderr as they come
        from flakebot.cli.consoles import console

        yield {"progress": lambda line: console().print(line, markup=False)}
        return
    if not command.working:
        yield {}
        return
    from flakebot.cli.consoles import console

    try:
        if as_json or not console().is_terminal:
            yield {}
        else:
            with console().status(title):
                yield {}
    except KeyboardInterrupt:
        from flakebot.cli.entry import interrupted_service

        interrupted_service(arguments, door.settings)


def _title(command: Command, arguments: dict[str, Any]) -> str:
    """The command's live title: its `working` text with {NAME} filled from the arguments."""
    values = {k: _titled(v) for k, v in arguments.items()}
    return re.sub(r"\{(\w+)\}", lambda m: str(values.get(m.group(1), "")), command.working or command.name)


def _titled(value: Any) -> str:
    """A RunRequest's words for a title (its need, its target, the tool and request of an improvement)."""
    if hasattr(value, "need"):
        improve = getattr(value, "improve", None)
        return value.need or value.target or (f"{improve.tool}: {improve.request}" if improve else "")
    return "" if value is None else str(value)


def _show(command: Command, result: Any, as_json: bool, given: dict[str, Any]) -> int:
    """Print the result for a person or a program; the exit code its result calls for. A display may also take the
    command's arguments and the settings (`given`) by name, or all its arguments as `arguments`."""
    from flakebot.cli.display import SHOWN

    data = command.data(result)
    shown = SHOWN.get(command.name)
    if shown is not None:
        takes = inspect.signature(shown).parameters
        code = shown(result, as_json, **{k: v for k, v in given.items() if k in takes})
        return code if code is not None else command.exit_code(data)
    if as_json:
        from flakebot.cli.jsonout import json_result

        json_result(data)
    elif command.text is not None:
        typer.echo(command.text(data))
    else:
        for key, value in data.items():
            typer.echo(f"{key}: {value}")
    return command.exit_code(data)
