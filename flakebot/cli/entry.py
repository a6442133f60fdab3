"""The console-script entry. `flakebot mcp` and `flakebot run TOOL [OPTIONS] -- ARGS` start without typer: building
the typer app (typer, its pydantic adapters, rich) costs more than a tool call itself, and an agent pays start-up on
every call. Any other command line, or one of theirs this reader does not take exactly as typer would (help, global
options, arguments before `--`), goes to the typer app (app.py) unchanged.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from flakebot import config
from flakebot.errors import FlakebotError, Interrupted, UsageError

# `flakebot run`'s own options; the ones in VALUED take a value (--name VALUE or --name=VALUE).
RUN_FLAGS = {"--json"}
RUN_VALUED = {"--writable", "--grant-root", "--sandbox", "--args-json"}
REPEATED = {"writable", "grant_roots"}  # options given once per path


def main() -> None:
    """Run the command line: a fast command when this reader takes it, else the typer app."""
    argv = sys.argv[1:]
    if argv[:1] == ["mcp"] and (roots := mcp_options(argv[1:])) is not None:
        _guarded(lambda: _mcp(roots), as_json=False)
    elif argv[:1] == ["run"] and (options := run_options(argv[1:])) is not None:
        _guarded(lambda: run_command(config.load({"workdir": None}), **options), as_json=options["as_json"])
    else:
        from flakebot.cli.app import main as typer_main

        typer_main()


def run_options(argv: list[str]) -> dict[str, Any] | None:
    """`run`'s arguments as run_command takes them, or None when typer should read them (help, a second positional,
    an option `run` does not have, a missing value)."""
    options: dict[str, Any] = {
        "tool": None,
        "args": [],
        "args_json": None,
        "as_json": False,
        "writable": [],
        "grant_roots": [],
        "sandbox": None,
    }
    names = {
        "--writable": "writable",
        "--grant-root": "grant_roots",
        "--sandbox": "sandbox",
        "--args-json": "args_json",
    }
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if token == "--":
            options["args"] = argv[index:]
            break
        name, _, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        if token in RUN_FLAGS:
            options["as_json"] = True
        elif name in RUN_VALUED:
            if not inline and token == name:
                if index >= len(argv) or argv[index] == "--":
                    return None
                inline, index = argv[index], index + 1
            key = names[name]
            options[key] = [*options[key], inline] if key in REPEATED else inline
        elif not token.startswith("-") and options["tool"] is None:
            options["tool"] = token
        else:
            return None
    return options if options["tool"] is not None else None


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


def run_command(
    settings: config.Settings,
    *,
    tool: str,
    args: list[str],
    args_json: str | None,
    as_json: bool,
    writable: list[str],
    sandbox: str | None,
    grant_roots: list[str] | None = None,
) -> int:
    """`flakebot run`: the tool's exit code (with --json, after printing {exit_code, stdout, stderr} as the result)."""
    import dataclasses

    from flakebot import api
    from flakebot.deliver.grants import widened

    settings = widened(settings, grant_roots or [])
    if sandbox is not None:
        settings = dataclasses.replace(settings, sandbox=config.coerce("sandbox", sandbox, "--sandbox"))
    arguments = _json_arguments(args_json) if args_json is not None else None
    if arguments is not None and args:
        raise UsageError(
            "give the tool's arguments either after -- or as --args-json, not both",
            fix="move them all into the --args-json object",
        )
    allowed = list(writable)
    if arguments is not None:  # the JSON call's own `writable` (toolcall is imported only for JSON calls)
        from flakebot.deliver.toolcall import writable_argument

        allowed += writable_argument(arguments)
    if as_json:
        from flakebot.cli.jsonout import json_result

        # Without --args-json the tool reads the caller's standard input, as it does without --json.
        call = (
            api.call_tool(
                tool, {**arguments, "writable": allowed} if isinstance(arguments, dict) else arguments, settings
            )
            if arguments is not None
            else api.call_tool_argv(tool, list(args), settings, writable=allowed)
        )
        json_result(call.to_dict())
        return call.exit_code
    argv, stdin = api.tool_arguments(tool, arguments, settings) if arguments is not None else (list(args), None)
    return api.run_tool(tool, argv, settings, stdin=stdin, writable=allowed)


def _json_arguments(text: str) -> Any:
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--args-json is not JSON: {exc}", fix='pass one object, e.g. --args-json \'{"stdin": "a\\nb\\n"}\''
        ) from None


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
