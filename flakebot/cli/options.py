"""The typer options of craft, improve and package, generated from the request fields that declare them
(flakebot.pipeline.request.option): a field's type, default and docstring become its option, so an option is
written once. A command's RunRequest parameter (commands/table.py Param(request=VERB)) is these options on the CLI
(cli/generated.py), and build_request makes the RunRequest from their values."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import Annotated, Any

import typer

from flakebot.pipeline.request import Improvement, RunRequest, options
from flakebot.toolschema import field_docs


def request_parameters(verb: str) -> list[tuple[inspect.Parameter, bool]]:
    """The typer parameters of `verb`'s request fields, each with whether it is positional."""
    return [*_parameters(Improvement, verb), *_parameters(RunRequest, verb)]


def build_request(verb: str, given: dict[str, Any]) -> RunRequest:
    """The RunRequest (with its Improvement for improve) the typer values of `verb` make; paths resolved as given."""
    values = {f.name: _value(given[f.name], meta) for f, meta in options(RunRequest, verb)}
    improvement = {f.name: given[f.name] for f, _ in options(Improvement, verb)}
    return RunRequest(**values, improve=Improvement(**improvement) if improvement else None)


def _value(value: Any, meta: dict[str, Any]) -> Any:
    return str(value) if meta["path"] and value is not None else value


def _parameters(cls: type, verb: str) -> list[tuple[inspect.Parameter, bool]]:
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    parameters = []
    for f, meta in options(cls, verb):
        kind = Path | None if meta["path"] else hints[f.name]
        if meta["positional"]:
            info: Any = typer.Argument(help=docs[f.name], metavar=f.name.upper())
            kind = str
            default: Any = inspect.Parameter.empty
        else:
            # no spelling: typer derives --NAME (and --NAME/--no-NAME for a flag) from the field's name
            info = typer.Option(*([meta["cli"]] if meta["cli"] else []), help=docs[f.name])
            default = f.default
        parameter = inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[kind, info], default=default
        )
        parameters.append((parameter, meta["positional"]))
    return parameters
