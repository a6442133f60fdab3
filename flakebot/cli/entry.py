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
import typing
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
    elif argv[:1] in ([name] for name in AS_JSON) and (arguments := json_options(argv[0], argv[1:])) is not None:
        _guarded(lambda: json_command(config.load({"workdir": None}), argv[0], arguments), as_json=True)
    else:
        from flakebot.cli import helpcache

        if helpcache.serve(argv):  # the help typer printed last time for the same inputs
            sys.exit(0)
        from flakebot.longlived import imports_kept

        with imports_kept():  # typer, its pydantic adapters, the command table: the process's from now on
            from flakebot.cli import generated

            generated.ONLY = only_command(argv)
            from flakebot.cli.app import main as typer_main

        try:
            with helpcache.recording(argv):
                typer_main()
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                leave(exc.code or 0)
            raise


def only_command(argv: list[str]) -> str | None:
    """The command of the table `argv` runs when its first word names one outside a group (`craft ...`): typer is then
    given that command alone, not all 31 (each made into typer's and click's parameters: ~20 ms of every start). None
    (every command) for anything else: a global option first, a group, a typo (click suggests the names it knows)."""
    from flakebot.commands.table import commands

    first = argv[0] if argv else ""
    named = any(c.name == first and "cli" in c.doors for c in commands()) and " " not in first
    return first if named else None


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


AS_JSON = ("up",)  # commands a program calls with --json, read here: their --json output is their data, shown by none
# of cli/display.py's displays (tests/cli/test_entry.py holds them to both)


def json_options(name: str, argv: list[str]) -> dict[str, Any] | None:
    """The arguments of `name` (one of AS_JSON) called with --json, by parameter name, or None when typer should read
    them: no --json, help, an option it does not have or given twice, a value typer would convert (a number that is
    not one), a second positional. Defaults as declared, so the command sees what typer would give it."""
    if "--json" not in argv:
        return None
    from flakebot.commands.table import spelled as spelled_as

    declared = [p for p in _table_command(name).params("cli") if not p.param.request]
    arguments: dict[str, Any] = {p.name: p.default for p in declared}
    # typer's spelling: the declared one, else --NAME (a flag without one is typer's --NAME/--no-NAME: typer reads it)
    spelled = {spelling: p for p in declared if not p.param.positional
               for spelling in p.param.cli or ([] if p.kind is bool else [spelled_as(p, "cli")])}  # fmt: skip
    positional = [p for p in declared if p.param.positional]
    seen: set[str] = set()
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if token == "--json":
            continue
        name_, _, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        p = spelled.get(name_)
        if p is not None and p.kind is bool and token == name_ and p.name not in seen:
            arguments[p.name] = True
        elif p is not None and p.kind is not bool and (_repeated(p) or p.name not in seen):
            if not inline and token == name_:
                if index >= len(argv) or argv[index].startswith("-"):
                    return None
                inline, index = argv[index], index + 1
            value = _value(p, inline)
            if value is None:
                return None
            arguments[p.name] = [*(arguments[p.name] or []), value] if _repeated(p) else value
        elif not token.startswith("-") and positional:
            arguments[positional.pop(0).name] = token
            continue
        else:
            return None
        seen.add(p.name)
    return arguments


def _value(p: Any, text: str) -> Any:
    """An option's value as typer would give it (a str, or an int for a whole number), else None (typer says why)."""
    kinds = set(typing.get_args(p.kind) if typing.get_origin(p.kind) is not list else ()) or {p.kind}
    kinds -= {type(None)}
    if kinds <= {str} or (_repeated(p) and kinds <= {list[str]}):
        return text
    if kinds == {int} and text.lstrip("-").isdigit():
        return int(text)
    return None


def json_command(settings: config.Settings, name: str, arguments: dict[str, Any]) -> int:
    """A command of AS_JSON read by json_options, as the typer app runs it with --json: the check every door runs,
    the call, its result as the one JSON result line, its exit code."""
    from flakebot.cli.jsonout import json_result
    from flakebot.commands.table import check_values

    command = _table_command(name)
    check_values(command, arguments, "cli")
    try:
        result = command.call(arguments, settings=settings)
    except KeyboardInterrupt:
        interrupted_service(arguments, settings)
        raise
    data = command.data(result)
    json_result(data)
    return int(command.exit_code(data))


def interrupted_service(arguments: dict[str, Any], settings: config.Settings) -> None:
    """Ctrl-C during a service command: an Interrupted saying where it left the service (none for up --all)."""
    from flakebot.services.control import statuses

    name = str(arguments.get("service") or "").partition("@")[0]
    if not name:  # up --all: no one service to say where it is
        raise Interrupted("interrupted", fix="see where each service is with 'flakebot services'") from None
    state = next((s["state"] for s in statuses(settings) if s["name"] == name), "not started")
    raise Interrupted(
        f"interrupted: {name} is {state}", fix=f"see 'flakebot services'; 'flakebot down {name}' stops it"
    ) from None


def _table_command(name: str) -> Any:
    """A service command of the command table, from its own module only (the whole table imports every command
    module, the typer app typer and pydantic: 0.2-0.3 s before `up` starts anything)."""
    from flakebot.commands.service_verbs import COMMANDS

    return next(c for c in COMMANDS if c.name == name)


def _run() -> Any:
    """The command table's `run`, from its own module only (the whole table imports every command module)."""
    from flakebot.commands.catalog_tools import COMMANDS

    return next(c for c in COMMANDS if c.name == "run")


def _repeated(p: Any) -> bool:
    """A list-typed option: given once per value (--writable A --writable B)."""
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

    if grant_roots:  # a root no call could use is refused before the host is answered
        from pathlib import Path

        from flakebot import config
        from flakebot.deliver.grants import check_flag_roots

        check_flag_roots(grant_roots, config.load(), Path.cwd())

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
    from flakebot.cli.consoles import console
    from flakebot.cli.jsonout import json_line
    from flakebot.modeltext import markup

    # Escaped: "[edit] ..." and "[[bin]]" in a message are text, not rich markup; it may quote model text.
    console().print(f"[bold red]error:[/bold red] {markup(exc.one_line())}", highlight=False, soft_wrap=True)
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

            from flakebot.cli.consoles import console

            self.rich = RichHandler(console=console(), show_path=False, show_time=self.show_time)
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
