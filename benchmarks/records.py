"""Typed records to and from JSON: a benchmark's rows are dataclasses in code and plain objects in its JSON file.

load(Row, data) checks the keys when a row is made (a missing or unknown key fails there, not when a report is
rendered) and builds nested records; dump(record) gives the JSON-ready object back.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


class RecordError(ValueError):
    """A JSON object that does not fit its record type."""


def load(cls: type[T], data: Any) -> T:
    """`data` (a JSON object) as a `cls` record; fields with a default may be missing, unknown keys are refused."""
    if not isinstance(data, dict):
        raise RecordError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise RecordError(f"{cls.__name__}: unknown key(s) {', '.join(unknown)}")
    hints = typing.get_type_hints(cls)
    missing = [name for name, f in fields.items() if name not in data and _required(f)]
    if missing:
        raise RecordError(f"{cls.__name__}: missing key(s) {', '.join(missing)}")
    return cls(**{name: _value(hints[name], value) for name, value in data.items()})


def load_all(cls: type[T], rows: list[Any]) -> list[T]:
    return [load(cls, row) for row in rows]


def dump(record: Any) -> Any:
    """A record (or a list of them) as JSON-ready objects, fields in declaration order."""
    if isinstance(record, list):
        return [dump(item) for item in record]
    return dataclasses.asdict(record)


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _value(hint: Any, value: Any) -> Any:
    """Nested records (X, X | None, list[X], dict[str, X]) are loaded; everything else is kept as the JSON gave it."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _value(options[0], value) if len(options) == 1 else value
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return [_value(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(hint) or (str, Any)
        return {k: _value(item, v) for k, v in value.items()}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return load(hint, value)
    return value
