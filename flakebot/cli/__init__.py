"""The `flakebot` command: parse, load settings, call the library (flakebot.api), render.

    entry.py    the console-script entry: `mcp` and `run TOOL -- ARGS` start without typer, the rest goes to app.py
    app.py      the typer commands; thin, no logic
    jsonout.py  JSON lines on stdout for programs
    display.py  tables and summaries for people (rich), JSON for programs
    live.py     the live per-stage display of a craft

May import anything in flakebot; nothing imports it.
"""

from flakebot.cli.entry import main

__all__ = ["main"]
