"""The `flakebot` command: parse, load settings, call the library, render. No logic lives here."""

from __future__ import annotations

import os
import re
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
token_app = typer.Typer(help="Make, list and revoke the tokens agents use with `flakebot serve`.", no_args_is_help=True)
app.add_typer(token_app, name="token")


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


# ---------------------------------------------------------------- the command table's commands (cli/generated.py)

from flakebot.cli.generated import register as _register_table  # noqa: E402

_register_table(app, {"config": config_app, "token": token_app}, G)


# ---------------------------------------------------------------- the MCP doors' starts (doors, not commands: the
# library, commands/ included, never imports the MCP server they start)


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


@app.command("serve")
def serve_cmd(
    host: Annotated[
        str, typer.Option(help="Address to listen on; beyond loopback only with --tls-cert, --tls-key and a token.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: a free one, printed).")] = 8765,
    tls_cert: Annotated[Path | None, typer.Option(help="PEM certificate (chain) for HTTPS.")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="PEM private key of --tls-cert.")] = None,
    url: Annotated[
        str | None,
        typer.Option(help="The URL agents use, when not http(s)://HOST:PORT/mcp (a proxy's, a DNS name's)."),
    ] = None,
    grant_root: Annotated[
        list[str] | None,
        typer.Option(
            "--grant-root",
            help="A directory a call's writable paths may lie beneath, beside the grant_roots setting (repeatable).",
        ),
    ] = None,
    database: Annotated[
        str | None,
        typer.Option(
            help="The team's PostgreSQL URL, without a password (refused: `ps` shows it): crafts go to its queue for "
            "'flakebot worker'. Default: FLAKEBOT_DATABASE_URL when set (no queue otherwise); postgresql:// alone: "
            "libpq's PGHOST, PGUSER... and ~/.pgpass.",
        ),
    ] = None,
    jwt_issuer: Annotated[
        str | None,
        typer.Option(
            help="Also let in JWTs of this identity provider (its `iss`); with --jwt-audience. Its keys: --jwt-key, "
            "--jwt-jwks, or else fetched from the jwks_uri of its /.well-known/openid-configuration."
        ),
    ] = None,
    jwt_audience: Annotated[str | None, typer.Option(help="The `aud` the provider's JWTs must carry.")] = None,
    jwt_key: Annotated[
        Path | None, typer.Option(help="The provider's public key: a PEM file or its JWKS saved as JSON (read once).")
    ] = None,
    jwt_jwks: Annotated[
        str | None,
        typer.Option(
            help="The provider's JWKS URL (https, or http to loopback): fetched, cached, refetched on rotation."
        ),
    ] = None,
    jwt_jwks_ttl: Annotated[
        float, typer.Option(help="Seconds the fetched keys are kept before they are fetched again.")
    ] = 300.0,
    jwt_tenant_claim: Annotated[
        str, typer.Option(help="The JWT claim naming the caller's tenant (a token without it is refused).")
    ] = "flakebot_tenant",
    jwt_limits_claim: Annotated[
        str,
        typer.Option(
            help='The JWT claim holding the caller\'s limits, an object such as {"calls_per_minute": 30, '
            '"concurrent_crafts": 1}, each held to the --jwt-max-* caps (a claim that cannot be read: refused).'
        ),
    ] = "flakebot_limits",
    jwt_max_calls_per_minute: Annotated[
        int | None,
        typer.Option(help="The most tool calls a minute a JWT's limits claim may give (default: 120, as token add)."),
    ] = None,
    jwt_max_concurrent_crafts: Annotated[
        int | None,
        typer.Option(help="The most concurrent crafts a JWT's limits claim may give (default: 2, as token add)."),
    ] = None,
    lease: Annotated[
        float,
        typer.Option(
            help="With --database: seconds this front stays live without renewing its lease (every third of it), 3 to "
            "86400; once it ran out, another front ends the followings of this front's waited crafts."
        ),
    ] = 30.0,
) -> None:
    """Serve flakebot's MCP server over Streamable HTTP for a team: bearer tokens, limits per token, an audit (docs/team.md).

    Runs until Ctrl-C or SIGTERM. Make tokens with `flakebot token add NAME`."""
    from flakebot.cli.entry import share_logging
    from flakebot.mcp.front import FrontOptions, serve
    from flakebot.team import dburl

    database = dburl.chosen(database)  # before anything: a password in argv is one line, nothing started
    share_logging("uvicorn", "mcp", "starlette", "sse_starlette")
    from flakebot.team.idtokens import jwt_options

    jwt = jwt_options(
        jwt_issuer,
        jwt_audience,
        jwt_key,
        jwt_tenant_claim,
        jwt_jwks,
        jwt_jwks_ttl,
        limits_claim=jwt_limits_claim,
        max_calls_per_minute=jwt_max_calls_per_minute,
        max_concurrent_crafts=jwt_max_concurrent_crafts,
    )
    options = FrontOptions(
        host, port, tls_cert, tls_key, url, grant_roots=list(grant_root or []), database=database, jwt=jwt, lease=lease
    )

    def ready(address: str, tokens: int) -> None:
        print(f"flakebot serve: {address} ({tokens} active token(s))", flush=True)

    serve(options, G.settings, ready)


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
        fix = "see 'flakebot --help' and 'flakebot COMMAND --help'"
        if re.fullmatch(r"-\d[\d.]*", str(getattr(exc, "option_name", ""))):  # a negative number read as an option
            fix = f"a value starting with '-' goes after '--' (flakebot ... -- {exc.option_name}), or {fix}"  # type: ignore[attr-defined]
        _print_error(UsageError(getattr(exc, "format_message", exc.__str__)(), fix=fix))
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
