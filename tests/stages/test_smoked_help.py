"""The instruct stage reads the tool's help from the package stage's smoke run (instruct.smoked_help) only when
state.json holds it as the smoke run kept it: the `--help` try of this binary, exit 0, its stdout a text."""

from __future__ import annotations

from pathlib import Path

import pytest

from flakebot.stages.instruct import smoked_help

BINARY = Path("/nix/store/0123456789abcdfghijklmnpqrsvwxyz-hi-0.1.0/bin/hi")


def test_the_smoke_runs_help_stdout_is_read() -> None:
    smoke = {"argv": [str(BINARY), "--help"], "exit_code": 0, "stdout": "hi: says hi\n"}
    assert smoked_help(smoke, BINARY) == "hi: says hi\n"
    assert smoked_help({**smoke, "stdout": ""}, BINARY) == ""  # its help on stderr: as observe's stdout was


@pytest.mark.parametrize("stdout", [None, ["hi: says hi"], {"text": "hi"}, 7])
def test_a_smoke_stdout_that_is_no_text_is_not_the_help(stdout: object) -> None:
    """A state.json edited or damaged (null, a list): the help is read again (None), not its repr ("None") taken as
    the tool's help text and parsed into its parameters."""
    smoke = {"argv": [str(BINARY), "--help"], "exit_code": 0, "stdout": stdout}
    assert smoked_help(smoke, BINARY) is None


def test_another_try_or_binary_or_an_older_state_is_not_the_help() -> None:
    smoke = {"argv": [str(BINARY), "--help"], "exit_code": 0, "stdout": "hi: says hi\n"}
    assert smoked_help({**smoke, "argv": [str(BINARY), "--version"]}, BINARY) is None
    assert smoked_help(smoke, BINARY.with_name("other")) is None
    assert smoked_help({**smoke, "exit_code": 2}, BINARY) is None
    assert smoked_help({k: v for k, v in smoke.items() if k != "stdout"}, BINARY) is None
