"""The `flakebot` command: parse, load settings, call the library (flakebot.api), render.

    entry.py    the console-script entry: `mcp` and `run TOOL -- ARGS` start without typer, the rest goes to app.py
    app.py      the typer app: global options, `flakebot mcp` (the MCP door's start), errors as one line
    generated.py every command of the command table (flakebot.commands.table) as a typer command
    jsonout.py  JSON lines on stdout for programs
    display.py  tables and summaries for people (rich), JSON for programs; @shows: a command's display
    live.py     the live per-stage display of a craft

May import anything in flakebot; nothing imports it.
"""

from flakebot.cli.entry import main

__all__ = ["main"]
