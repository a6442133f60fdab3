"""The `flakebot` command: parse, load settings, call the library, render. No logic lives here."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from flakebot import config
from flakebot.cli.options import request_command
from flakebot.errors import FlakebotError, Interrupted, UsageError
from flakebot.pipeline.request import RunRequest

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
# The invocation's own options (craft, improve and package take the rest from their request fields).
StopAfterOpt = Annotated[
    str | None, typer.Option(help="Stop after this stage (spec, search, choose, acquire, edit, package, instruct).")
]


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


# ---------------------------------------------------------------- runs


@app.command("runs")
def runs_cmd(as_json: JsonOpt = False) -> None:
    """List runs, newest first, with status, age and need."""
    from flakebot import api
    from flakebot.cli.live import json_result, out

    runs = api.list_runs(G.settings)
    if as_json:
        json_result({"runs": runs})
        return
    if not runs:
        out.print(f"No runs in {G.workdir / 'runs'}.")
        return
    from flakebot.cli.display import print_runs

    print_runs(runs)


@app.command("show")
def show_cmd(
    name: Annotated[
        str, typer.Argument(help="A run id (or unique prefix), or a catalogued tool: NAME or NAME@VERSION.")
    ],
    as_json: JsonOpt = False,
) -> None:
    """Show a run's stage timeline and outcome, or a catalogued tool's usage."""
    from flakebot import api

    report = api.show(name, G.settings)
    if as_json:
        from flakebot.cli.live import json_result

        json_result(report)
        return
    from flakebot.cli.display import print_report

    print_report(report)


@app.command("resume")
def resume_cmd(
    run_id: Annotated[str, typer.Argument(help="The run to continue (id or unique prefix).")],
    as_json: JsonOpt = False,
) -> None:
    """Continue a run from its first unfinished stage (after a crash, Ctrl-C or failure)."""
    from flakebot import api
    from flakebot.cli.live import event_sink, json_line, out

    with event_sink(as_json, f"resume {run_id}", quiet=G.quiet) as sink:
        report = api.resume_report(run_id, sink=sink, settings=G.settings)
    if as_json:
        json_line({"result": {key: report[key] for key in ("run_id", "status", "outputs")}})
    elif report["craft"]:
        from flakebot.cli.display import print_craft_result

        print_craft_result(report["craft"], as_json=False)
    else:
        out.print(f"[green]run {report['run_id']} {report['status']}[/green]")


@app.command("clean")
def clean_cmd(
    run_id: Annotated[str | None, typer.Argument(help="The run whose directory to remove.")] = None,
    all_runs: Annotated[bool, typer.Option("--all", help="Remove every run directory.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Remove run directories and everything the runs created."""
    from flakebot import api
    from flakebot.cli.live import json_result, out
    from flakebot.errors import UsageError

    if bool(run_id) == all_runs:
        raise UsageError("give either a RUN id or --all", fix="run 'flakebot clean RUN' or 'flakebot clean --all'")
    removed = api.remove_runs(None if all_runs else run_id, G.settings)
    if as_json:
        json_result({"removed": [str(path) for path in removed]})
        return
    out.print(f"removed {len(removed)} run(s)")


# ---------------------------------------------------------------- search


@app.command("search")
def search_cmd(
    query: Annotated[str, typer.Argument(help="What the tool should do or work on, e.g. 'csv dedupe'.")],
    registry: Annotated[
        str | None,
        typer.Option(help="crates-io, local, or a cargo directory source PATH (default: crates.io, else local)."),
    ] = None,
    limit: Annotated[int, typer.Option(help="How many crates to show.")] = 10,
    offline: Annotated[
        bool, typer.Option("--offline", help="Never contact crates.io; search the local registry.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Find crates a tool could start from, ranked for tool-making."""
    from flakebot import api
    from flakebot.cli.live import json_result, out

    found = api.search(query, registry=registry, limit=limit, offline=offline or None, settings=G.settings)
    if as_json:
        json_result({"candidates": [candidate.to_dict() for candidate in found]})
        return
    if not found:
        out.print(f"No crate matches '{query}'.")
        return
    from flakebot.cli.display import print_candidates

    print_candidates(query, found)


# ---------------------------------------------------------------- config


@config_app.command("show")
def config_show(as_json: JsonOpt = False) -> None:
    """Print every setting, its value, where the value came from and what it is for."""
    from flakebot import api
    from flakebot.cli.live import json_result

    report = api.settings_report(G.settings, G.sources)
    if as_json:
        json_result(report["values"])
        return
    from flakebot.cli.display import print_settings

    print_settings(report)


@config_app.command("set")
def config_set(
    key: Annotated[str, typer.Argument(help="Setting name (see 'flakebot config show').")],
    value: Annotated[str, typer.Argument(help="New value.")],
    local: Annotated[
        bool, typer.Option("--local", help="Write ./flakebot.toml instead of the user file (it may only lower limits).")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Write one setting to ~/.config/flakebot/flakebot.toml (comments are kept)."""
    from flakebot import api
    from flakebot.cli.live import json_result, out

    path = api.set_setting(key, value, local=local)
    if as_json:
        json_result({"key": key, "value": config.load().get(key), "file": str(path)})
        return
    out.print(f"{key} = {value!r} written to {path}")


# ---------------------------------------------------------------- craft and the catalog


@app.command("craft")
@request_command("craft", {"stop_after": (StopAfterOpt, None), "as_json": (JsonOpt, False)})
def craft_cmd(request: RunRequest, stop_after: str | None, as_json: bool) -> None:
    """Craft a tested, Nix-built command-line tool from a need (or return the catalogued one).

    Stages: spec -> search -> choose -> acquire -> edit -> package -> instruct -> clean.
    Resume an interrupted craft with 'flakebot resume RUN'.
    """
    from flakebot import api
    from flakebot.cli.live import event_sink

    with event_sink(as_json, f"craft: {request.need}", quiet=G.quiet) as sink:
        result = api.craft_request(request, stop_after=stop_after, sink=sink, settings=G.settings)
    from flakebot.cli.display import print_craft_result

    print_craft_result(result.to_dict(), as_json)


@app.command("improve")
@request_command("improve", {"stop_after": (StopAfterOpt, None), "as_json": (JsonOpt, False)})
def improve_cmd(request: RunRequest, stop_after: str | None, as_json: bool) -> None:
    """Craft a catalogued tool's next version: flakebot improve csv-dedup "also support --delimiter".

    The new version starts from the tool's own source (fork mode), keeps every acceptance example it has and
    adds new ones for the change; it is catalogued as the next version (0.1.0 -> 0.2.0), the current one from
    then on. Earlier versions stay runnable: flakebot run csv-dedup@0.1.0. 'flakebot show TOOL' lists them.
    """
    from flakebot import api
    from flakebot.cli.live import event_sink

    asked = request.improve or api.Improvement(tool="", request="")
    with event_sink(as_json, f"improve {asked.tool}: {asked.request}", quiet=G.quiet) as sink:
        result = api.improve_request(request, stop_after=stop_after, sink=sink, settings=G.settings)
    from flakebot.cli.display import print_craft_result

    print_craft_result(result.to_dict(), as_json)


@app.command("eval")
def eval_cmd(
    suite: Annotated[str, typer.Argument(help="A shipped suite's name or a directory holding suite.json.")] = "default",
    model: Annotated[
        str | None,
        typer.Option(
            help="Give every need to this model (provider:model); default: replay each need's hand-written session."
        ),
    ] = None,
    only: Annotated[list[str] | None, typer.Option(help="Evaluate only this need (repeatable).")] = None,
    out: Annotated[Path, typer.Option(help="Directory for eval.md and eval.json.")] = Path("bench"),
    record: Annotated[
        Path | None, typer.Option(help="Write each need's session as a replayable model script (DIR/NEED.json).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Craft every need of a suite and score the tools on held-out checks; writes bench/eval.md and bench/eval.json."""
    from flakebot import api
    from flakebot.cli.live import console, json_line
    from flakebot.cli.live import out as stdout

    report, paths = api.evaluate(
        suite,
        model=model,
        only=only,
        out_dir=out,
        record=record,
        settings=G.settings,
        progress=lambda line: console.print(line, markup=False),
    )
    if as_json:
        json_line(report.to_dict())
    else:
        stdout.print(paths["markdown"].read_text(), markup=False, soft_wrap=True)  # the table eval.md holds
        stdout.print(f"written: {paths['markdown']} {paths['json']}", markup=False)
    if report.totals()["passed"] < len(report.results):
        raise typer.Exit(1)


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


# ---------------------------------------------------------------- models


@app.command("models")
def models_cmd(as_json: JsonOpt = False) -> None:
    """List model providers, the default model and whether each API key is set (keys are never shown).

    With a provider's key set (and the offline setting off), the provider is asked which models it serves now, and a default
    it no longer serves is a warning."""
    from flakebot import api
    from flakebot.cli.display import print_models
    from flakebot.cli.live import json_result, out

    report = api.models(G.settings)
    if as_json:
        json_result(report)
        return
    print_models(report["providers"])
    default = report["default"]
    out.print(
        f"default: {default['model']} (from {default['source']})"
        if default["model"]
        else f"default: none. {default['error']}",
        highlight=False,
    )
    for p in report["providers"]:
        if p.get("served"):
            out.print(
                f"{p['provider']} serves {len(p['served'])} models: {', '.join(p['served'])}",
                markup=False,
                highlight=False,
            )
        elif p.get("served_error"):
            out.print(p["served_error"], markup=False, highlight=False)
    for warning in report["warnings"]:
        out.print(f"warning: {warning}", markup=False, highlight=False)


# ---------------------------------------------------------------- package


@app.command("package")
@request_command("package", {"as_json": (JsonOpt, False)})
def package_cmd(request: RunRequest, as_json: bool) -> None:
    """Wrap a Rust crate as a pinned Nix flake, nix build it and smoke-run it (no model involved)."""
    from flakebot import api
    from flakebot.cli.live import event_sink, json_line, out

    with event_sink(as_json, f"package {request.target}", quiet=G.quiet) as sink:
        result = api.package_request(request, sink=sink, settings=G.settings)
    if as_json:
        json_line({"result": result.to_dict()})
        return
    from rich.markup import escape

    out.print(
        f"[green]{escape(result.pname)} {escape(result.version)}[/green] built ({result.nixpkgs_mode} nixpkgs): {result.store_path}"
    )
    for notice in result.notices:
        out.print(f"[yellow]note:[/yellow] {escape(notice)}")
    smoke = result.smoke
    colour = "green" if smoke.get("level") == "help" else "yellow"
    out.print(
        f"smoke level: [{colour}]{escape(str(smoke.get('level')))}[/{colour}] "
        f"('{escape(str(smoke.get('command')))}' exited {smoke.get('exit_code')}; docs/smoke-levels.md)"
    )
    out.print(f"flake: {escape(result.flake_dir)}")
    out.print(f"run it: {escape(result.nix_run_command['shell'])}", soft_wrap=True)
    if result.catalog:
        tool = f"{result.catalog['name']}@{result.catalog['version']}"
        out.print(f"catalogued as {escape(tool)}: flakebot run {escape(result.catalog['name'])} -- ARGS")


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
