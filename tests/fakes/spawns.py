"""Count the processes flakebot starts, through Python's `subprocess.Popen` audit event (nothing of the code under
test is replaced): `with spawns() as started:` gives the argv of every process started in the block."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_recording: list[list[list[str]]] = []


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event == "subprocess.Popen" and _recording:
        argv = args[1]
        _recording[-1].append([str(a) for a in argv] if isinstance(argv, list | tuple) else [str(argv)])


sys.addaudithook(_hook)  # once per interpreter (a hook cannot be removed): it records only inside spawns()


@contextmanager
def spawns() -> Iterator[list[list[str]]]:
    started: list[list[str]] = []
    _recording.append(started)
    try:
        yield started
    finally:
        _recording.remove(started)


def cargo_subcommands(started: list[list[str]]) -> list[str]:
    """The cargo subcommand of each cargo process started (its first word after cargo's --config options)."""
    found = []
    for argv in started:
        if argv and argv[0].rsplit("/", 1)[-1] == "cargo":
            rest = argv[1:]
            while rest and rest[0].startswith("-"):
                rest = rest[2:] if rest[0] == "--config" else rest[1:]
            found.append(rest[0] if rest else "?")
    return found
