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
    assert params["key"].multiple is True  # clap 4 shows an Append option plainly: its help says it repeats
    schema = json_schema(list(params.values()))
    # OpenAI-strict: closed, every property required, the optional ones nullable (null = absent).
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["file", "key", "keep", "no_header", "stdin"]
    assert schema["properties"]["keep"]["type"] == ["string", "null"]
    assert schema["properties"]["keep"]["enum"] == ["first", "last", None]
    assert schema["properties"]["no_header"]["type"] == ["boolean", "null"]
    assert schema["properties"]["key"]["type"] == ["array", "null"]
    assert schema["properties"]["key"]["items"] == {"type": "string"}


def test_clap2_long_help_with_descriptions_on_next_lines() -> None:
    params = {p.name: p for p in parse_help(CLAP2_LONG)}
    assert set(params) == {"no_squeezing", "length", "file"}
    assert params["file"].required is True
    assert params["file"].description == "The file to display."
    assert params["length"].description == "Only read N bytes from the input."
    schema = json_schema(list(params.values()))
    assert schema["properties"]["file"]["type"] == "string"  # required: a value, not null
    assert schema["properties"]["length"]["type"] == ["string", "null"]


REPEATABLE = """Usage: tool [OPTIONS] [FILES]...

Arguments:
  [FILES]...  Files to read

Options:
  -v, --verbose...         More output
  -t, --tag <TAG>...       Tags to attach
  -i, --include <GLOB>     Include files matching GLOB. Can be given multiple times.
  -x, --exclude <GLOB>     Exclude files matching GLOB; may be repeated
      --repeat <N>         Repeat the output N times
      --color <WHEN>       When to colour [possible values: auto, always, never]
  -h, --help               Print help
"""


def test_repeatable_options_counted_flags_and_choices() -> None:
    params = {p.name: p for p in parse_help(REPEATABLE)}
    multiple = {name for name, p in params.items() if p.multiple}
    assert multiple == {"files", "verbose", "tag", "include", "exclude"}  # not --repeat: it takes one N
    assert params["verbose"].kind == "flag" and params["verbose"].description == "More output"
    schema = json_schema(list(params.values()))["properties"]
    assert schema["verbose"]["type"] == ["integer", "null"]
    assert schema["files"]["type"] == ["array", "null"] and schema["tag"]["items"] == {"type": "string"}
    assert schema["color"]["enum"] == ["auto", "always", "never", None]
    argv = to_argv(list(params.values()), {"verbose": 2, "tag": ["a", "b"], "files": ["x", "y"], "repeat": "3"})
    assert argv == ["--verbose", "--verbose", "--tag", "a", "--tag", "b", "--repeat", "3", "x", "y"]


def test_null_empty_and_false_are_absent() -> None:
    """What a strict model sends for the arguments it does not want: every property, filled with nothing."""
    params = parse_help(CLAP4)
    nothing = {"file": None, "key": None, "keep": None, "no_header": None, "stdin": None}
    assert to_argv(params, nothing) == []
    blank = {"file": "", "key": [], "keep": "", "no_header": False, "stdin": ""}
    assert to_argv(params, blank) == []
    assert to_argv(params, {**blank, "key": ["id", "", "name"]}) == ["--key", "id", "--key", "name"]
    with pytest.raises(ValueError, match="missing required argument"):
        to_argv(parse_help(CLAP2_LONG), {"file": None, "length": None, "no_squeezing": None})
    with pytest.raises(ValueError, match="missing required argument"):
        to_argv(parse_help(CLAP2_LONG), {"file": ""})


def test_to_argv_orders_options_before_positionals() -> None:
    params = parse_help(CLAP4)
    argv = to_argv(params, {"file": "in.csv", "key": "id", "no_header": True, "keep": "last", "stdin": "x"})
    assert argv == ["--key", "id", "--keep", "last", "--no-header", "in.csv"]
    with pytest.raises(ValueError, match="unknown argument"):
        to_argv(params, {"colour": "red"})
    with pytest.raises(ValueError, match="missing required"):
        to_argv(parse_help(CLAP2_LONG), {})


# What Debian's cargo-lock 8.0.2 prints for `cargo-lock --help` (exit 1): gumdrop's usage, value names bare.
GUMDROP_USAGE = """*** error: unrecognized option `--help`
USAGE:
The `cargo lock list` subcommand

Optional arguments:
  -f, --file FILE        input Cargo.lock file
  -p, --package PACKAGE  get information for a single package
  -d, --dependencies     show dependencies for each package
  -s, --sources          show package sources in listing
"""


def test_gumdrop_usage_of_a_packaged_crate() -> None:
    params = parse_help(GUMDROP_USAGE)
    assert [(p.flag, p.kind, p.value_name, p.description) for p in params] == [
        ("--file", "option", "FILE", "input Cargo.lock file"),
        ("--package", "option", "PACKAGE", "get information for a single package"),
        ("--dependencies", "flag", "", "show dependencies for each package"),
        ("--sources", "flag", "", "show package sources in listing"),
    ]
    assert to_argv(params, {"file": "Cargo.lock", "dependencies": True}) == ["--file", "Cargo.lock", "--dependencies"]
