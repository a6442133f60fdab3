"""A tool declared once: the schema a model sees and the check of its arguments come from one function."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from flakebot.deliver.schema import really_required, strict_schema
from flakebot.toolschema import BadArguments, declare, field_docs

LIMIT = 7


@dataclass
class Point:
    """A point the model names."""

    x: int
    """across"""
    y: int = field(default=0, metadata={"required": True})
    label: str = ""


def _place(where: Point, tags: list[str], note: str | None = None, count: int = 1) -> None:
    """Put a marker at a point; at most {LIMIT} markers.

    where: The point.
    tags: Labels for the marker,
        one word each.
    note: Free text.
    """


def test_the_schema_comes_from_the_signature_and_the_docstring() -> None:
    declared = declare(_place, writes=True)
    function = declared.schema()["function"]
    assert (function["name"], function["description"]) == ("place", "Put a marker at a point; at most 7 markers.")
    parameters = function["parameters"]
    assert parameters["required"] == ["where", "tags"] and parameters["additionalProperties"] is False
    assert parameters["properties"]["tags"] == {
        "type": "array",
        "items": {"type": "string"},
        "description": "Labels for the marker, one word each.",
    }
    assert parameters["properties"]["note"] == {"type": "string", "description": "Free text."}
    assert parameters["properties"]["count"] == {"type": "integer"}
    where = parameters["properties"]["where"]
    assert where["description"] == "The point." and where["required"] == ["x", "y"]
    assert where["properties"]["x"] == {"type": "integer", "description": "across"}
    assert declared.extra == {"writes": True} and field_docs(Point) == {"x": "across"}


if LIMIT:

    @dataclass
    class Guarded:
        """A class under an if."""

        size: int
        """how big"""


def test_field_docs_find_a_class_inside_another_inside_a_function_and_under_an_if() -> None:
    @dataclass
    class Outer:
        @dataclass
        class Inner:
            depth: int
            """how deep"""

        name: str
        """what it is called"""

    assert field_docs(Outer) == {"name": "what it is called"}
    assert field_docs(Outer.Inner) == {"depth": "how deep"}
    assert field_docs(Guarded) == {"size": "how big"}


def test_an_open_declaration_and_extra_keywords() -> None:
    parameters = declare(_place, closed=False, params={"tags": {"minItems": 1}}).parameters()
    assert "additionalProperties" not in parameters and parameters["properties"]["tags"]["minItems"] == 1


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ([1], "arguments must be a JSON object, got list"),
        ({"tags": []}, "missing required argument 'where'"),
        ({"where": {"x": 1}, "tags": ["a"], "colour": "red"}, "unexpected argument 'colour' (accepted: where, tags"),
        ({"where": {"x": 1}, "tags": "a"}, "'tags' must be an array of strings, got str 'a'"),
        ({"where": {"x": 1}, "tags": [], "count": True}, "'count' must be a integer, got bool"),
        ({"where": [1], "tags": []}, "'where' must be a object, got list"),
    ],
)
def test_wrong_arguments_are_refused_with_the_reason(arguments: object, problem: str) -> None:
    with pytest.raises(BadArguments) as info:
        declare(_place).check(arguments)
    assert str(info.value).startswith(problem)


def test_good_arguments_pass_with_nulls_dropped_and_integer_strings_taken() -> None:
    args = declare(_place).check({"where": {"x": 1}, "tags": ["a"], "note": None, "count": "3"})
    assert args == {"where": {"x": 1}, "tags": ["a"], "count": 3}


def test_a_docstring_naming_an_undefined_constant_fails_at_declaration() -> None:
    def broken() -> None:
        """Uses {NOT_DEFINED_ANYWHERE}."""

    with pytest.raises(NameError, match="NOT_DEFINED_ANYWHERE"):
        declare(broken)


def test_the_strict_form_makes_optional_parameters_nullable() -> None:
    schema = strict_schema(declare(_place))
    assert schema["required"] == ["where", "tags", "note", "count"] and schema["additionalProperties"] is False
    assert schema["properties"]["note"]["type"] == ["string", "null"]
    assert really_required(schema) == ["where", "tags"]
