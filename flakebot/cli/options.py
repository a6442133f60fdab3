"""The typer options of craft, improve and package, generated from the request fields that declare them
(flakebot.pipeline.request.option): a field's type, default and docstring become its option, so an option is
written once. `request_command(app, verb, ...)` turns a handler taking the built RunRequest into a typer command."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from flakebot.pipeline.request import Improvement, RunRequest, options
from flakebot.toolschema import field_docs


def request_command(
    verb: str, extra: dict[str, tuple[Any, Any]]
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give `handler(request, **extra)` the signature typer reads: the verb's request fields (positional ones first)
    and then `extra` (name -> (Annotated type, default)), which are the invocation's own (--json, --stop-after)."""

    def decorate(handler: Callable[..., None]) -> Callable[..., None]:
        fields = [*_parameters(Improvement, verb), *_parameters(RunRequest, verb)]
        fields.sort(key=lambda pair: not pair[1])  # positional arguments first, in declaration order
        own = [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=a, default=d) for n, (a, d) in extra.items()
        ]

        @functools.wraps(handler)
        def command(**given: Any) -> None:
            handler(build_request(verb, given), **{name: given[name] for name in extra})

        command.__signature__ = inspect.Signature([p for p, _ in fields] + own)  # type: ignore[attr-defined]
        del command.__wrapped__  # typer must read the generated signature, not the handler's
        return command

    return decorate


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
