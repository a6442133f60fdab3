"""clap help text -> parameters -> schema -> argv, on clap 4 and clap 2 layouts."""

from __future__ import annotations

import pytest

from flakebot.deliver.helpparse import json_schema, parse_help, to_argv

CLAP4 = """Deduplicate CSV rows

Usage: csv-dedup [OPTIONS] [FILE]

Arguments:
  [FILE]  Input CSV file (reads stdin when absent)

Options:
  -k, --key <COLUMN>    Column to compare rows on; repeat for several
      --keep <WHICH>    Which duplicate to keep [default: first] [possible values: first, last]
  -H, --no-header       Treat the first row as data
  -h, --help            Print help
  -V, --version         Print version
"""

CLAP2_LONG = """hexyl 0.10.0

USAGE:
    hexyl [FLAGS] [OPTIONS] <FILE>

FLAGS:
    -v, --no-squeezing
            Displays all input data.

    -h, --help
            Prints help information

OPTIONS:
    -n, --length <N>
            Only read N bytes from the input.

ARGS:
    <FILE>
            The file to display.
"""


def test_clap4_help() -> None:
    params = {p.name: p for p in parse_help(CLAP4)}
    assert set(params) == {"file", "key", "keep", "no_header"}
    assert (params["file"].kind, params["file"].required) == ("positional", False)
    assert (params["key"].kind, params["key"].flag, params["key"].value_name) == ("option", "--key", "COLUMN")
    assert params["keep"].choices == ["first", "last"] and params["keep"].default == "first"
    assert params["no_header"].kind == "flag"
    schema = json_schema(list(params.values()))
    assert schema["properties"]["keep"]["enum"] == ["first", "last"]
    assert schema["properties"]["no_header"]["type"] == "boolean"
    assert schema["required"] == []


def test_clap2_long_help_with_descriptions_on_next_lines() -> None:
    params = {p.name: p for p in parse_help(CLAP2_LONG)}
    assert set(params) == {"no_squeezing", "length", "file"}
    assert params["file"].required is True
    assert params["file"].description == "The file to display."
    assert params["length"].description == "Only read N bytes from the input."


def test_to_argv_orders_options_before_positionals() -> None:
    params = parse_help(CLAP4)
    argv = to_argv(params, {"file": "in.csv", "key": "id", "no_header": True, "keep": "last", "stdin": "x"})
    assert argv == ["--key", "id", "--keep", "last", "--no-header", "in.csv"]
    with pytest.raises(ValueError, match="unknown argument"):
        to_argv(params, {"colour": "red"})
    with pytest.raises(ValueError, match="missing required"):
        to_argv(parse_help(CLAP2_LONG), {})
