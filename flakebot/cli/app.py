"""The `flakebot` command: parse, load settings, call the library, render. No logic lives here."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from flakebot import config
from flakebot.errors import FlakebotError, Interrupted, UsageError

app = typer.Typer(
    help="flakebot: a tool factory for agents. Describe a need; get back a tested Rust CLI built by Nix.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)
config_app = typer.Typer(help="Show or change settings (flakebot.toml).", no_args_is_help=True)
app.add_typer(config_app, name="config")


class Globals:
    """Options given before the command, shared by every command."""

    def __init__(self) -> None:
        self.overrides: dict[str, Any] = {}
        self.quiet = False
        self._settings: config.Settings | None = None
        self.sources: dict[str, str] = {}

    @property
    def settings(self) -> config.Settings:
        if self._settings is None:
            self._settings, self.sources = config.load_with_sources(self.overrides)
        return self._settings

    @property
    def workdir(self) -> Path:
        return self.settings.path("workdir")


G = Globals()

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (lines) for programs instead of tables.")]


def _print_version(given: bool) -> None:
    if given:
        from flakebot import __version__

        print(f"flakebot {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="More log output (-vv for debug).")] = 0,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Only errors and the result: no progress, no warnings.")
    ] = False,
    log_file: Annotated[Path | None, typer.Option(help="Also write the log to this file.")] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="Directory holding runs/ (default: $XDG_STATE_HOME/flakebot).")
    ] = None,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print flakebot's version and exit."),
    ] = False,
) -> None:
    _setup_logging(verbose, quiet, log_file)
    G.quiet = quiet
    G.overrides["workdir"] = str(workdir) if workdir else None


def _setup_logging(verbose: int, quiet: bool, log_file: Path | None) -> None:
    from flakebot.cli.entry import setup_logging

    setup_logging(verbose, quiet, log_file)


# ---------------------------------------------------------------- craft and the catalog


@app.command("list")
def list_cmd(
    remote: Annotated[
        bool, typer.Option("--remote", help="List the shared catalogs' tools (the catalogs setting) instead.")
    ] = False,
    from_url: Annotated[
        str | None, typer.Option("--from", help="With --remote: only this configured catalog (its URL).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the tools in the catalog, or with --remote those the shared catalogs offer."""
    from flakebot import api
    from flakebot.cli.display import print_remote_tools, print_tools

    if remote or from_url:
        print_remote_tools(api.list_remote(from_url, G.settings), as_json)
        return
    print_tools(api.list_tools(G.settings), as_json)


@app.command("install")
def install_cmd(
    tool: Annotated[str, typer.Argument(help="A published tool: NAME (its newest version) or NAME@VERSION.")],
    from_url: Annotated[
        str | None,
        typer.Option(
            "--from", help="The configured catalog (cache URL) to take it from; default: the first listing it."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Install a tool another machine published: fetch its signed entry and closure (nix copy), no build.

    Only catalogs in the catalogs setting are read, and only their configured keys are trusted:
    [[catalogs]] url = "file:///srv/cache" keys = ["flakebot-host-1:BASE64"]
    """
    from flakebot import api
    from flakebot.cli.live import json_result, out
    from flakebot.modeltext import markup as escape  # a cache's text: no markup, no terminal escapes

    entry = api.install(tool, from_url=from_url, settings=G.settings)
    if as_json:
        json_result(entry)
        return
    source = entry.get("installed_from") or {}
    out.print(
        f"[green]installed[/green] {escape(entry['name'])} {escape(entry['version'])} from {escape(source.get('catalog', ''))}, "
        f"signed by {escape(source.get('signed_by') or '')}: {escape(entry['store_path'])}",
        soft_wrap=True,
    )
    out.print(f"run it: flakebot run {escape(entry['name'])} -- ARGS", soft_wrap=True)


@app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run_cmd(
    tool: Annotated[str, typer.Argument(help="A catalogued tool: NAME (its current version) or NAME@VERSION.")],
    args: Annotated[list[str] | None, typer.Argument(help="Arguments for the tool (put them after --).")] = None,
    args_json: Annotated[
        str | None,
        typer.Option(
            "--args-json",
            help='The tool\'s schema arguments as JSON, as a function-calling agent passes them: \'{"key": "id", "stdin": "..."}\'.',
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Capture the tool's output: print {exit_code, stdout, stderr} as one JSON object."),
    ] = False,
    writable: Annotated[
        list[str] | None,
        typer.Option(
            "--writable",
            help="An existing file or directory the tool may write (repeatable); pass --writable . to let it write here.",
        ),
    ] = None,
    grant_root: Annotated[
        list[str] | None,
        typer.Option(
            "--grant-root",
            help="A directory of yours --writable paths may lie beneath, beside the grant_roots setting (default: here); never a configuration directory (repeatable).",
        ),
    ] = None,
    sandbox: Annotated[
        str | None,
        typer.Option(
            help="required (default): bubblewrap or stop; auto: plain-process fallback; off: the tool runs here with your rights, sees this whole machine (unsafe)."
        ),
    ] = None,
) -> None:
    """Run a catalogued tool: flakebot run csv-dedup -- --key id data.csv, or flakebot run csv-dedup --args-json '{"key": "id"}'

    The tool runs sandboxed in an empty directory at this directory's path.
    The files and directories its arguments name are there, read-only (relative paths work); nothing else is.
    It writes only where you allow it: --writable out.csv (create the file first), or --writable . for output
    it writes into this directory; a writable path must lie beneath a grant root (this directory, the grant_roots
    setting, --grant-root DIR). /, your home and the directories above this one are refused as arguments.
    No network, none of your environment variables.
    """
    from flakebot.cli.entry import run_command

    code = run_command(
        G.settings, tool=tool, args=list(args or []), args_json=args_json, as_json=as_json,
        writable=list(writable or []), sandbox=sandbox, grant_roots=list(grant_root or []),
    )  # fmt: skip
    raise typer.Exit(code)


@app.command("rm")
def rm_cmd(
    tool: Annotated[str, typer.Argument(help="A catalogued tool: NAME (every version) or NAME@VERSION (that one).")],
    as_json: JsonOpt = False,
) -> None:
    """Remove a tool from the catalog (its flakes, manifests and GC roots), or one version of it."""
    from flakebot import api
    from flakebot.cli.live import json_result, out

    entry = api.remove_tool(tool, G.settings)
    if as_json:
        json_result({"removed": {key: entry.get(key) for key in ("name", "version", "store_path")}})
        return
    which = entry["name"] if "@" not in tool else f"{entry['name']} {entry['version']}"
    out.print(f"removed {which} (store path {entry.get('store_path', '?')} is no longer held)")


@app.command("mcp")
def mcp_cmd(
    grant_root: Annotated[
        list[str] | None,
        typer.Option(
            "--grant-root",
            help="A directory of yours a call's writable paths may lie beneath, beside the grant_roots setting (default: the directory the server starts in); no call can add one (repeatable).",
        ),
    ] = None,
) -> None:
    """Serve flakebot as an MCP server over stdio: its own tools (craft, status, resume, ...) and every crafted tool."""
    from flakebot.mcp.server import load_sdk, serve

    load_sdk()
    serve(grant_roots=list(grant_root or []))


# ---------------------------------------------------------------- publish


@app.command("publish")
def publish_cmd(
    tool: Annotated[str, typer.Argument(help="A catalogued tool's name.")],
    to: Annotated[
        str,
        typer.Option(
            "--to", help="Binary cache or store URL: file:///DIR, https://..., s3://..., ssh-ng://HOST, /CHROOT-STORE."
        ),
    ],
    as_json: JsonOpt = False,
) -> None:
    """Copy a tool's closure to a binary cache or another Nix store (nix copy); caches are signed with flakebot's key."""
    from rich.markup import escape

    from flakebot import api
    from flakebot.cli.live import json_result, out

    result = api.publish(tool, to=to, settings=G.settings)
    if as_json:
        json_result(result)
        return
    size = f"{result['paths']} path{'s' if result['paths'] != 1 else ''}, {result['closure_size']:,} bytes"
    out.print(
        f"[green]published[/green] {escape(result['store_path'])} ({size}) to {escape(result['to'])}", soft_wrap=True
    )
    if result["public_key"]:
        out.print(f"signed by: {escape(result['public_key'])}", soft_wrap=True)
    out.print(f"fetch it: {escape(result['substitute_command']['shell'])}", soft_wrap=True)
    out.print(f"then run: {escape(result['run_command']['shell'])}", soft_wrap=True)


# ---------------------------------------------------------------- bench


# ---------------------------------------------------------------- the command table's commands (cli/generated.py)

from flakebot.cli.generated import register as _register_table  # noqa: E402

_register_table(app, {"config": config_app}, G)


# ---------------------------------------------------------------- entry point


def main() -> None:
    """Console-script entry: run the app, turning FlakebotErrors into one red line and an exit code.

    Typer runs without its standalone mode, so a usage error (exit 2) is the same `error: ... Fix: ...` line as any
    other failure, and with --json the same error object on stdout."""
    try:
        # not standalone: a usage error reaches the except below and is the same one line as every other error
        code = app(prog_name="flakebot", standalone_mode=False)
    except _click_exception() as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `flakebot` or `flakebot config` alone: the help is the answer
            exc.show()  # type: ignore[attr-defined]  # click's UsageError, vendored by typer
            sys.exit(getattr(exc, "exit_code", 2))
        _print_error(
            UsageError(
                getattr(exc, "format_message", exc.__str__)(), fix="see 'flakebot --help' and 'flakebot COMMAND --help'"
            )
        )
        sys.exit(getattr(exc, "exit_code", 2))
    except FlakebotError as exc:
        if os.environ.get("FLAKEBOT_RAISE_ERRORS") == "1":
            raise
        _print_error(exc)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _print_error(Interrupted("interrupted", fix="continue an interrupted craft with 'flakebot resume RUN'"))
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _print_error(exc: FlakebotError) -> None:
    """The human line on stderr; with --json also the error object, last on stdout, for programs."""
    from flakebot.cli.entry import print_error

    print_error(exc, as_json=_wants_json(sys.argv[1:]))


def _click_exception() -> type[Exception]:
    """Click's usage-error base class: typer >= 0.2x carries its own copy of click."""
    import importlib

    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            return importlib.import_module(module).ClickException  # type: ignore[no-any-return]
        except ImportError:
            continue
    return Exception


def _wants_json(argv: list[str]) -> bool:
    """--json among flakebot's own arguments (those after `--` belong to a tool)."""
    return "--json" in (argv[: argv.index("--")] if "--" in argv else argv)


if __name__ == "__main__":
    main()
