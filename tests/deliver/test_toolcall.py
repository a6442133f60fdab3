"""JSON arguments -> argv for a catalogued tool: the schema and the mapping both come from its recorded --help."""

from __future__ import annotations

import pytest

from flakebot.deliver.helpparse import CliParam
from flakebot.deliver.toolcall import arguments_to_argv, mcp_definition
from flakebot.errors import UsageError
from tests.deliver.test_helpparse import CLAP4

# A manifest as an older flakebot wrote it: `key` parsed as a single string, a non-strict schema stored.
OLD_MANIFEST = {
    "name": "csv-dedup",
    "summary": "Remove duplicate rows",
    "usage": "csv-dedup [--key COLUMN]... [FILE]",
    "help_text": CLAP4,
    "parameters": [CliParam("key", "option", "--key", "COLUMN").to_dict()],
    "mcp_tool": {"inputSchema": {"type": "object", "properties": {"key": {"type": "string"}}, "required": []}},
}


def test_an_old_entry_gets_todays_strict_schema_from_its_help_text() -> None:
    schema = mcp_definition(OLD_MANIFEST)["inputSchema"]
    assert schema["additionalProperties"] is False and set(schema["required"]) == set(schema["properties"])
    assert schema["properties"]["key"]["type"] == ["array", "null"]


def test_a_strict_models_call_with_every_property_filled() -> None:
    """What csv-dedup got from a strict model before: every optional property filled, a blank file and key."""
    filled = {"file": "", "key": "", "keep": None, "no_header": False, "stdin": "a,b\n"}
    assert arguments_to_argv(OLD_MANIFEST, filled) == ([], "a,b\n")
    assert arguments_to_argv(OLD_MANIFEST, {**filled, "key": ["a", "b"]}) == (["--key", "a", "--key", "b"], "a,b\n")
    assert arguments_to_argv(OLD_MANIFEST, {"key": "a"}) == (["--key", "a"], None)  # non-strict: one string


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"keep": ["first", "last"]}, "keep takes one string"),
        ({"key": [{"a": 1}]}, "key takes a list of strings"),
        ({"no_header": "yes"}, "no_header is a flag"),
        ({"key": 5}, "key takes a list of strings"),  # never coerced to "--key 5"
        ({"keep": 1.5}, "keep takes one string"),
        ({"stdin": ["id", "1", "1"]}, "stdin takes one string"),  # never Python's text of a list
        ({"stdin": 5}, "stdin takes one string"),
    ],
)
def test_wrong_types_are_named(arguments: dict[str, object], says: str) -> None:
    with pytest.raises(UsageError, match=says):
        arguments_to_argv(OLD_MANIFEST, arguments)


COUNTED = {  # a tool with `-v...` (clap's ArgAction::Count), as its manifest records it
    "name": "csv-dedup",
    "parameters": [CliParam("verbose", "flag", "--verbose", multiple=True).to_dict()],
}


@pytest.mark.parametrize("count", [10**30, 10**9, 101, -1, 2.0])
def test_a_counted_flag_takes_a_bounded_count(count: object) -> None:
    """`{"verbose": 10**30}` was an OverflowError traceback, `10**9` a list of a billion flags (the server's memory):
    a count is a whole number from 0 to 100, or one UsageError."""
    with pytest.raises(UsageError, match="verbose is a counted flag: pass how many times"):
        arguments_to_argv(COUNTED, {"verbose": count})
    assert arguments_to_argv(COUNTED, {"verbose": 3}) == (["--verbose"] * 3, None)
    assert arguments_to_argv(COUNTED, {"verbose": True}) == (["--verbose"], None)
