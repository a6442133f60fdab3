"""Tool input schemas in the shape OpenAI's strict function calling takes as it is, for every client.

Strict mode (the OpenAI Agents SDK's MCP conversion, `strict: true` tools) accepts only closed objects
(`additionalProperties: false`) whose properties are all required. So an optional property is required
and nullable here: a strict model passes null for what it does not want, and flakebot reads null (and an
empty string, and a `false` flag) as "absent". Non-strict clients may still leave such properties out.
One builder serves flakebot's own MCP tools and every crafted tool (deliver/helpparse.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flakebot.toolschema import Declared

ABSENT_HINT = "null when not wanted"


@dataclass(frozen=True)
class Field:
    """One property of a tool's input: its JSON type, what it means, and whether a call must give it."""

    kind: str  # "string" | "boolean" | "integer" | "array"
    description: str
    required: bool = False
    enum: tuple[str, ...] = ()  # the values a string (or an array's items) may take
    items: str = "string"  # an array's item type


def field_schema(spec: Field) -> dict[str, Any]:
    """The property's schema: nullable unless required, arrays with their items, enums with null too."""
    base: dict[str, Any] = {"type": spec.kind}
    if spec.kind == "array":
        base["items"] = {"type": spec.items, **({"enum": list(spec.enum)} if spec.enum else {})}
    elif spec.enum:
        base["enum"] = list(spec.enum)
    if not spec.required:
        base["type"] = [spec.kind, "null"]
        if "enum" in base:
            base["enum"] = [*base["enum"], None]
    base["description"] = spec.description if spec.required else _optional(spec.description)
    return base


def closed_object(fields: dict[str, Field]) -> dict[str, Any]:
    """A tool's input schema: a closed object listing every property as required (optional ones nullable)."""
    return {
        "type": "object",
        "properties": {name: field_schema(spec) for name, spec in fields.items()},
        "required": list(fields),
        "additionalProperties": False,
    }


def strict_schema(declared: Declared) -> dict[str, Any]:
    """A declared tool's (flakebot.toolschema) input schema in this shape: the parameters it declares optional, nullable."""
    fields = {
        p.name: Field(p.schema["type"], p.schema.get("description", ""), p.required, items=_items(p.schema))
        for p in declared.params
    }
    return closed_object(fields)


def _items(schema: dict[str, Any]) -> str:
    return str(schema.get("items", {}).get("type", "string"))


def really_required(schema: dict[str, Any]) -> list[str]:
    """The properties a call must give a value: required and not nullable."""
    properties = schema.get("properties", {})
    return [name for name in schema.get("required", []) if not _nullable(properties.get(name, {}))]


def is_absent(value: Any) -> bool:
    """What a caller passes for an optional argument it does not want: null, "", false or an empty list."""
    return value is None or value is False or value == "" or value == []


def _nullable(prop: dict[str, Any]) -> bool:
    kind = prop.get("type")
    return kind == "null" or (isinstance(kind, list) and "null" in kind)


def _optional(description: str) -> str:
    text = description.rstrip()
    if text and text[-1] not in ".)?!":
        text += "."
    return f"{text} Optional: {ABSENT_HINT}.".strip()
