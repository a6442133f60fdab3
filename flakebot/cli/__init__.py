"""The `flakebot` command: parse, load settings, call the library (flakebot.api), render.

    app.py      the typer commands; thin, no logic
    display.py  tables and summaries for people (rich), JSON for programs
    live.py     the live per-stage display of a craft

May import anything in flakebot; nothing imports it.
"""

from flakebot.cli.app import main

__all__ = ["main"]
