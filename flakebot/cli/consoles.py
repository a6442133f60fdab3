"""The CLI's two rich consoles, each made on first use: `console()` (stderr: progress, errors) and `out()` (stdout:
reports for people). A command that prints only JSON (an agent's) never imports rich, 20 ms of its start-up."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


@functools.cache
def console() -> Console:
    from rich.console import Console

    return Console(stderr=True)


@functools.cache
def out() -> Console:
    from rich.console import Console

    return Console()
