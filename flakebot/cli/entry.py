"""The console-script entry. `flakebot mcp` and `flakebot run TOOL [OPTIONS] -- ARGS` start without typer, and
`flakebot --help` is printed from what typer printed for it before (cli/helpcache.py): building
the typer app (typer, its pydantic adapters, rich) costs more than a tool call itself, and an agent pays start-up on
every call. Any other command line, or one of theirs this reader does not take exactly as typer would (help, global
options, arguments before `--`), goes to the typer app (app.py) unchanged.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from flakebot import config
from flakebot.errors import FlakebotError, Interrupted, UsageError


def main() -> None:
    """Run the command line: a fast command when this reader takes it, else the typer app."""
    argv = sys.argv[1:]
    if argv[:1] == ["mcp"] and (roots := mcp_options(argv[1:])) is not None:
        _guarded(lambda: _mcp(roots), as_json=False)
    elif argv[:1] == ["run"] and (options := run_options(argv[1:])) is not None:
        _guarded(lambda: run_command(config.load({"workdir": None}), options), as_json=options["capture"])
    else:
        from flakebot.cli import helpcache

        if helpcache.serve(argv):  # the help typer printed last time for the same inputs
            sys.exit(0)
        from flakebot.cli.app import main as typer_main

        try:
            with helpcache.recording(argv):
                typer_main()
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                leave(exc.code or 0)
            raise


def leave(code: int) -> NoReturn:
    """Exit as the interpreter would, less its teardown: after a craft, freeing every module and object one by one
    took 0.8-1.0 s of the command's wall time (benchmarks/perf/craft.py's "exit" row). Threads still running are
    waited for and the exit handlers run (logging's flush, temporary directories, model clients), as at a normal
    exit; then the process ends."""
    import atexit
    import threading

    # what the interpreter does first at exit: threading's exit callbacks (idle executors told to stop) and a join
    # of every thread that is not a daemon
    getattr(threading, "_shutdown")()  # noqa: B009  # private, but the interpreter's own step (3.8 to 3.14)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away, a stream already closed
            code = code or 120  # what the interpreter exits with when it cannot flush stdout
    os._exit(code)


def run_options(argv: list[str]) -> dict[str, Any] | None:
    """`run`'s arguments by parameter name (the command table's declaration of run: its options, which are flags and
    which repeat), or None when typer should read them (help, a second positional, an option `run` does not have, a
    missing value)."""
    declared = _run().params("cli")
    options: dict[str, Any] = {p.name: [] if _repeated(p) else p.default for p in declared}
    spelled = {spelling: p for p in declared if not p.param.positional for spelling in p.param.cli}
    tool, rest = (p.name for p in declared if p.param.positional)  # NAME, then the tool's own arguments
    options[tool], index = None, 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if token == "--":
            options[rest] = argv[index:]
            break
        name, _, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        p = spelled.get(name)
        if p is not None and p.kind is bool and token == name:
            options[p.name] = True
        elif p is not None and p.kind is not bool:
            if not inline and token == name:
                if index >= len(argv) or argv[index] == "--":
                    return None
                inline, index = argv[index], index + 1
            options[p.name] = [*options[p.name], inline] if _repeated(p) else inline
        elif not token.startswith("-") and options[tool] is None:
            options[tool] = token
        else:
            return None
    return options if options[tool] is not None else None


def _run() -> Any:
    """The command table's `run`, from its own module only (the whole table imports every command module)."""
    from flakebot.commands.catalog_tools import COMMANDS

    return next(c for c in COMMANDS if c.name == "run")


def _repeated(p: Any) -> bool:
    """A list-typed option of run's: given once per value (--writable A --writable B)."""
    import typing

    return any(typing.get_origin(kind) is list for kind in (p.kind, *typing.get_args(p.kind)))


def mcp_options(argv: list[str]) -> list[str] | None:
    """`mcp`'s --grant-root directories, or None when typer should read the arguments (help, anything else)."""
    roots, index = [], 0
    while index < len(argv):
        name, _, inline = argv[index].partition("=")
        if name != "--grant-root" or (not inline and index + 1 >= len(argv)):
            return None
        roots.append(inline or argv[index + 1])
        index += 1 if inline else 2
    return roots


def run_command(settings: config.Settings, arguments: dict[str, Any]) -> int:
    """`flakebot run` read by run_options: the tool's exit code (captured, with --json, after printing {exit_code,
    stdout, stderr} as the result), as the typer app's run (cli/generated.py, the command table's run) does."""
    command = _run()
    data = command.data(command.call(arguments, settings=settings))
    if arguments["capture"]:
        from flakebot.cli.jsonout import json_result

        json_result(data)
    return int(command.exit_code(data))


def _mcp(grant_roots: list[str]) -> int:
    import gc

    from flakebot.mcp.start import open_session

    # The first line, and `initialize` answered from the cache, before the SDK's imports (0.3-0.6 s): hosts give a
    # server about a second to answer it (flakebot.mcp.start).
    opening = open_session()
    from flakebot.mcp.server import load_sdk, serve

    load_sdk()
    # What the imports made lives as long as the process: keep it out of every collection, the one at exit too
    # (collecting the SDK's pydantic graphs there added 0.1 s before the process ended and a client saw it close).
    gc.freeze()
    serve(grant_roots=grant_roots, opening=opening)
    return 0


def _guarded(command: Any, *, as_json: bool) -> None:
    """Run a fast command as app.main runs a typer one: a FlakebotError is one red line (and with --json the error
    object on stdout) and its exit code, Ctrl-C is exit 130."""
    setup_logging(0, False, None)
    try:
        code = command()
    except FlakebotError as exc:
        if os.environ.get("FLAKEBOT_RAISE_ERRORS") == "1":
            raise
        print_error(exc, as_json=as_json)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print_error(
            Interrupted("interrupted", fix="continue an interrupted craft with 'flakebot resume RUN'"), as_json=as_json
        )
        sys.exit(130)
    sys.exit(code)


def print_error(exc: FlakebotError, *, as_json: bool) -> None:
    """The human line on stderr; with --json also the error object, last on stdout, for programs."""
    from flakebot.cli.jsonout import json_line
    from flakebot.cli.live import console
    from flakebot.modeltext import markup

    # Escaped: "[edit] ..." and "[[bin]]" in a message are text, not rich markup; it may quote model text.
    console.print(f"[bold red]error:[/bold red] {markup(exc.one_line())}", highlight=False, soft_wrap=True)
    if as_json:
        json_line(exc.result())


class _RichOnFirstRecord(logging.Handler):
    """The CLI's log handler: rich on stderr, built when the first record reaches it (importing rich costs more than
    a tool call, and most calls log nothing)."""

    def __init__(self, level: int, show_time: bool) -> None:
        super().__init__(level)
        self.show_time = show_time
        self.rich: logging.Handler | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.rich is None:
            from rich.logging import RichHandler

            from flakebot.cli.live import console

            self.rich = RichHandler(console=console, show_path=False, show_time=self.show_time)
        self.rich.emit(record)


def setup_logging(verbose: int, quiet: bool, log_file: Path | None) -> None:
    """flakebot's log to stderr at the level -v/-q ask for (warnings by default), and to log_file if given."""
    from flakebot.redact import RedactFilter

    level = logging.ERROR if quiet else [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    handler = _RichOnFirstRecord(level, show_time=verbose > 1)
    handler.addFilter(RedactFilter())
    root = logging.getLogger("flakebot")
    root.addHandler(handler)
    root.setLevel(min(level, logging.DEBUG if log_file else level))
    if log_file:
        try:
            file_handler = logging.FileHandler(log_file)
        except OSError as exc:
            raise UsageError(
                f"cannot write the log file {log_file}: {exc.strerror}",
                fix="pass --log-file a path in an existing, writable directory",
            ) from None
        file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        file_handler.addFilter(RedactFilter())
        root.addHandler(file_handler)


def share_logging(*names: str) -> None:
    """Give other libraries' loggers (`serve`: uvicorn's, the MCP SDK's) flakebot's handlers, redaction included, at
    flakebot's level, so whatever they say reaches the same terminal and log file with secrets removed."""
    ours = logging.getLogger("flakebot")
    for name in names:
        theirs = logging.getLogger(name)
        theirs.setLevel(ours.level)
        theirs.propagate = False
        for handler in ours.handlers:
            theirs.addHandler(handler)
