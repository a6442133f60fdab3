"""A tool for a model, declared once: its JSON schema comes from a function's signature and docstring, a structured
argument's from a dataclass's fields and their docstrings, and a call's arguments are checked against the same
declaration (the model gets a one-line reason for a wrong type).

    def read_file(path: str, start_line: int = 1) -> ...:
        \"\"\"Read a text file with line numbers.

        path: File path relative to the workspace root.
        start_line: First line to show (1-based); default 1.
        \"\"\"

    declare(read_file).schema()  # {"type": "function", "function": {"name": "read_file", "parameters": {...}}}

The docstring's lines `NAME: text` (after its description) describe the parameters, and {CONSTANT} in it is the
value of that module constant; a dataclass field's docstring is the string under it. Python types map to JSON types: str, int, bool, list[...] (array), dict[str, str] and a
dataclass (object); a parameter with a default is optional (`X | None` too). `schema.py` in flakebot.deliver
turns the same declarations into strict MCP input schemas.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


class BadArguments(Exception):
    """A call's arguments do not fit the tool's declaration; the message says what is wrong, for the model."""


@dataclass(frozen=True)
class Param:
    """One parameter of a declared tool."""

    name: str
    schema: dict[str, Any]  # its JSON schema, description included
    required: bool


@dataclass(frozen=True)
class Declared:
    """A tool as the model sees it: name, description, parameters."""

    name: str
    description: str
    params: tuple[Param, ...]
    # an open object lets a provider that checks calls against the schema pass keys it does not name (the caller
    # reads only the keys it knows): the spec, choose and ruling tools, as they always were
    closed: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  # marks for the caller (e.g. writes: refused when read-only)

    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments: an object, closed unless declared open."""
        schema = {
            "type": "object",
            "properties": {p.name: p.schema for p in self.params},
            "required": [p.name for p in self.params if p.required],
        }
        return {**schema, "additionalProperties": False} if self.closed else schema

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-tool definition."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters()}
        return {"type": "function", "function": function}

    def check(self, arguments: Any) -> dict[str, Any]:
        """The arguments with their types checked (nulls dropped, integer strings accepted); BadArguments otherwise."""
        if not isinstance(arguments, dict):
            raise BadArguments(f"arguments must be a JSON object, got {type(arguments).__name__}")
        params = {p.name: p for p in self.params}
        unknown = sorted(set(arguments) - set(params))
        if unknown:
            accepted = ", ".join(params) or "none"
            raise BadArguments(f"unexpected argument {', '.join(map(repr, unknown))} (accepted: {accepted})")
        args = {k: v for k, v in arguments.items() if v is not None}
        missing = [p.name for p in self.params if p.required and p.name not in args]
        if missing:
            raise BadArguments(f"missing required argument {', '.join(map(repr, missing))}")
        return {k: _typed(k, params[k].schema, v) for k, v in args.items()}


def declare(
    func: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    params: dict[str, dict[str, Any]] | None = None,
    closed: bool = True,
    **extra: Any,
) -> Declared:
    """The declaration of `func` (a function or method): named as it is without a leading underscore, described by
    its docstring (`list_` is the tool `list`). `params` adds JSON-schema keywords to a parameter's schema (minItems, enum, ...)."""
    text, docs = _split_docstring(_filled(func.__doc__ or "", func.__globals__))
    hints = typing.get_type_hints(func)
    declared = []
    for parameter in _parameters(func):
        schema = json_schema(hints[parameter.name], docs.get(parameter.name, ""))
        schema.update((params or {}).get(parameter.name, {}))
        declared.append(Param(parameter.name, schema, parameter.default is parameter.empty))
    return Declared(name or func.__name__.strip("_"), description or text, tuple(declared), closed, extra)


def json_schema(kind: Any, description: str = "") -> dict[str, Any]:
    """The JSON schema of a Python type (described when `description` is given)."""
    kind = _without_none(kind)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    simple = {str: "string", int: "integer", bool: "boolean", float: "number"}
    if kind in simple:
        schema: dict[str, Any] = {"type": simple[kind]}
    elif origin is list:
        schema = {"type": "array", "items": json_schema(args[0])}
    elif origin is dict:
        schema = {"type": "object", "additionalProperties": json_schema(args[1])}
    elif dataclasses.is_dataclass(kind):
        schema = object_schema(kind)  # type: ignore[arg-type]
    else:
        raise TypeError(f"no JSON schema for {kind!r}")
    return {**schema, "description": description} if description else schema


def object_schema(cls: type) -> dict[str, Any]:
    """A dataclass as a JSON object: its fields (described by their docstrings), required when they have no default
    or their metadata says `required`."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    required = [f.name for f in fields if f.metadata.get("required", _no_default(f))]
    properties = {f.name: json_schema(hints[f.name], docs.get(f.name, "")) for f in fields}
    return {"type": "object", "properties": properties, "required": required}


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal under it in the class body), by field name."""
    return _module_field_docs(sys.modules[cls.__module__].__file__ or "")[cls.__qualname__]


@functools.cache
def _module_field_docs(path: str) -> dict[str, dict[str, str]]:
    """field_docs of every class of the module at `path`, by qualified name: its source parsed once for them all (for
    each class, inspect.getsource parsed the whole module and then tokenized the class, 2-5 ms a class, four of them
    before a craft's first model call). The first class of a name wins, as for inspect."""
    import ast

    found: dict[str, dict[str, str]] = {}

    def visit(nodes: Iterable[ast.AST], prefix: str) -> None:
        for node in nodes:
            if isinstance(node, ast.ClassDef):
                found.setdefault(prefix + node.name, _docs_under_fields(node.body))
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(node.body, f"{prefix}{node.name}.<locals>.")
            else:  # classes under an if, a try, a with
                blocks = ast.stmt | ast.excepthandler | ast.match_case
                visit((child for child in ast.iter_child_nodes(node) if isinstance(child, blocks)), prefix)

    with open(path, "rb") as source:
        visit(ast.parse(source.read(), path).body, "")
    return found


def _docs_under_fields(body: list[Any]) -> dict[str, str]:
    import ast

    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def _filled(doc: str, constants: dict[str, Any]) -> str:
    """`doc` with each {NAME} of an upper-case module constant replaced by its value (a limit the model is told)."""

    def value(match: re.Match[str]) -> str:
        if match.group(1) not in constants:
            raise NameError(f"a tool's docstring names {match.group(0)}, which its module does not define")
        return str(constants[match.group(1)])

    return re.sub(r"\{([A-Z][A-Z0-9_]*)\}", value, doc)


def _parameters(func: Callable[..., Any]) -> list[Any]:
    import inspect

    return [p for p in inspect.signature(func).parameters.values() if p.name not in ("self", "cls")]


def _split_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """A docstring's description, and its `NAME: text` lines (a line indented under one continues it)."""
    import inspect

    lines = inspect.cleandoc(doc).splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(r"^\w+: ", line)), len(lines))
    docs: dict[str, str] = {}
    last = ""
    for line in lines[start:]:
        found = re.match(r"^(\w+): (.*)$", line)
        if found:
            last = found.group(1)
            docs[last] = found.group(2).strip()
        elif line.strip() and last:
            docs[last] += " " + line.strip()
    return " ".join(" ".join(lines[:start]).split()), docs


def _without_none(kind: Any) -> Any:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(kind) if a is not type(None)]
        return rest[0] if len(rest) == 1 else kind
    return kind


def _no_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _typed(name: str, schema: dict[str, Any], value: Any) -> Any:
    kind = schema.get("type")
    if kind == "integer" and isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    ok = {
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "array": isinstance(value, list) and all(isinstance(v, str) for v in value),
        "object": isinstance(value, dict),
    }.get(str(kind), True)
    if kind == "array" and schema.get("items", {}).get("type") != "string":
        ok = isinstance(value, list)
    if not ok:
        expected = "an array of strings" if kind == "array" else f"a {kind}"
        raise BadArguments(f"'{name}' must be {expected}, got {type(value).__name__} {str(value)[:60]!r}")
    return value
