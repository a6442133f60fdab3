"""An option is declared once, as a request field (flakebot.pipeline.request.option): the CLI's typer options, the MCP
tools' input schemas and the Python API's keywords are generated from it. Checked here through each door as a caller
meets it: `--help`, tools/list's schema, inspect.signature."""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing

import pytest

from flakebot import api
from flakebot.cli.reference import cli_reference
from flakebot.errors import UsageError
from flakebot.mcp.server import OWN_TOOLS
from flakebot.pipeline.request import VERBS, Improvement, RunRequest, check_bounds, from_keywords, options
from flakebot.toolschema import field_docs

NUMBERS = (int, float)


def _declared(verb: str, door: str) -> list[tuple[dataclasses.Field[typing.Any], dict[str, typing.Any]]]:
    return [*options(Improvement, verb, door), *options(RunRequest, verb, door)]


@pytest.mark.parametrize("verb", VERBS)
def test_every_option_has_a_docstring_and_numbers_have_a_least_value(verb: str) -> None:
    for cls in (Improvement, RunRequest):
        docs = field_docs(cls)
        hints = typing.get_type_hints(cls)
        for f, meta in options(cls, verb):
            assert docs.get(f.name, "").strip(), f"{cls.__name__}.{f.name} has no docstring"
            kinds = typing.get_args(hints[f.name]) or (hints[f.name],)
            if any(k in NUMBERS for k in kinds) and bool not in kinds:
                assert meta["least"] is not None, f"{f.name} is a number without a least value"


@pytest.mark.parametrize("verb", VERBS)
def test_the_cli_offers_each_declared_option_with_its_docstring(verb: str) -> None:
    page = cli_reference()
    block = page.split(f"## `flakebot {verb}`", 1)[1].split("\n## ", 1)[0]
    docs = {**field_docs(Improvement), **field_docs(RunRequest)}
    for f, meta in _declared(verb, "cli"):
        spelling = (
            f.name.upper() if meta["positional"] else (meta["cli"] or f"--{f.name.replace('_', '-')}").split("/")[0]
        )
        assert f"`{spelling}`" in block, f"flakebot {verb} lacks {spelling}"
        assert " ".join(docs[f.name].split()).replace("|", "\\|") in block


@pytest.mark.parametrize("verb", VERBS)
def test_the_mcp_schema_is_the_declared_fields(verb: str) -> None:
    _, schema = OWN_TOOLS[verb]
    declared = {meta["mcp_name"] or f.name for f, meta in _declared(verb, "mcp")}
    assert set(schema["properties"]) - {"wait", "detach"} == declared  # the server's own: how to answer
    docs = {**field_docs(Improvement), **field_docs(RunRequest)}
    for f, meta in _declared(verb, "mcp"):
        assert schema["properties"][meta["mcp_name"] or f.name]["description"].startswith(docs[f.name])


@pytest.mark.parametrize(
    ("verb", "function"), [("craft", api.craft), ("improve", api.improve), ("package", api.package)]
)
def test_the_api_keywords_are_the_declared_fields(verb: str, function: typing.Any) -> None:
    parameters = inspect.signature(function).parameters
    for f, meta in _declared(verb, "api"):
        assert (meta["api"] or f.name) in parameters, f"{verb}() lacks {meta['api'] or f.name}"


def test_an_unknown_api_keyword_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(UsageError, match="unknown option.*max_cots") as caught:
        from_keywords("craft", {"need": "x", "max_cots": 1})
    assert "max_cost" in (caught.value.fix or "")


@pytest.mark.parametrize(("field", "value"), [("max_cost", math.nan), ("max_cost", -1.0), ("max_iterations", 0)])
def test_numbers_out_of_bounds_fail_before_any_work(field: str, value: float) -> None:
    with pytest.raises(UsageError, match="must be a finite number"):
        check_bounds(RunRequest(need="x", **{field: value}))
