"""One check of a call's arguments against the JSON schema its door declared, before any work: types as declared,
never coerced (5 is not "5", a list is not a string); no property the schema does not name; required ones present.
The first problem becomes one UsageError naming the argument and the fix.

Strict schemas (deliver/schema.py) list every property as required and mark the optional ones nullable: here an
optional property may also be absent, as clients that know no strict mode send it.
"""

from __future__ import annotations

from typing import Any

from flakebot.errors import UsageError

JSON_TYPES = {"string": "a string", "integer": "a whole number", "number": "a number", "boolean": "true or false",
              "array": "a list", "object": "an object", "null": "null"}  # fmt: skip


def check_arguments(tool: str, arguments: Any, schema: dict[str, Any]) -> None:
    """Refuse `arguments` (one UsageError) unless they match `schema`, the tool's declared input schema."""
    from jsonschema.exceptions import best_match

    if not isinstance(arguments, dict):
        raise UsageError(f"{tool}'s arguments must be an object, got {kind_of(arguments)}", fix="pass an object")
    error = best_match(_validator(schema).iter_errors(arguments))
    if error is not None:
        raise _refusal(tool, error, schema)


def _validator(schema: dict[str, Any]) -> Any:
    """The validator of `schema`, made once per schema object: flakebot's own tools check the same declared schemas
    (module constants) on every call, several times per team-front call, and making a validator (its meta-schema
    lookups) was most of the check. Kept by identity with the schema itself (an id is never reused while kept), at
    most VALIDATORS_KEPT of them (crafted tools' schemas are new objects per call)."""
    from jsonschema import Draft202012Validator

    kept = _validators.get(id(schema))
    if kept is not None and kept[0] is schema:
        return kept[1]
    validator = Draft202012Validator(_absent_may_be_null(schema))
    if len(_validators) >= VALIDATORS_KEPT:
        _validators.clear()
    _validators[id(schema)] = (schema, validator)
    return validator


VALIDATORS_KEPT = 256
_validators: dict[int, tuple[dict[str, Any], Any]] = {}


def kind_of(value: Any) -> str:
    """A JSON value's kind in words ("a string", "a whole number", ...); a Python value JSON has no word for (bytes,
    a tuple, an object) by its type's name, never "null"."""
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    kind = "null" if value is None else names.get(type(value))
    return JSON_TYPES[kind] if kind else type(value).__name__


def _absent_may_be_null(schema: dict[str, Any]) -> dict[str, Any]:
    properties = schema.get("properties", {})
    required = [name for name in schema.get("required", []) if "null" not in _types(properties.get(name, {}))]
    return {**schema, "required": required}


def _types(schema: dict[str, Any]) -> list[str]:
    kind = schema.get("type", [])
    return [kind] if isinstance(kind, str) else list(kind)


def _refusal(tool: str, error: Any, schema: dict[str, Any]) -> UsageError:
    where = "'" + ".".join(str(part) for part in error.absolute_path) + "'" if error.absolute_path else tool
    if error.validator == "type":
        wanted = " or ".join(JSON_TYPES.get(t, t) for t in _types(error.schema))
        return UsageError(f"{where} must be {wanted}, got {kind_of(error.instance)}", fix=f"pass {where} as {wanted}")
    if error.validator == "additionalProperties":
        unknown = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        known = ", ".join(schema.get("properties", {})) or "no arguments"
        return UsageError(f"{tool} takes no argument {', '.join(unknown)}", fix=f"use: {known}")
    if error.validator == "required":
        return UsageError(f"{tool}: {error.message}", fix="see the tool's input schema (tools/list)")
    return UsageError(f"{where}: {error.message[:200]}", fix="see the tool's input schema (tools/list)")
