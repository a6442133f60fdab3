"""The `flakebot` command: parse, load settings, call the library, render. No logic lives here."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from flakebot import config
from flakebot.errors import FlakebotError

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
        self._settings: config.Settings | None = None

    @property
    def settings(self) -> config.Settings:
        if self._settings is None:
            self._settings = config.load(self.overrides)
        return self._settings

    @property
    def workdir(self) -> Path:
        return Path(self.settings.workdir).expanduser().resolve()


G = Globals()

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (lines) for programs instead of tables.")]


@app.callback()
def main_options(
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="More log output (-vv for debug).")] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only errors.")] = False,
    log_file: Annotated[Path | None, typer.Option(help="Also write the log to this file.")] = None,
    workdir: Annotated[Path | None, typer.Option(help="Directory holding runs/ (default: ./scratch).")] = None,
) -> None:
    _setup_logging(verbose, quiet, log_file)
    G.overrides["workdir"] = str(workdir) if workdir else None


def _setup_logging(verbose: int, quiet: bool, log_file: Path | None) -> None:
    level = logging.ERROR if quiet else [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    from rich.logging import RichHandler

    from flakebot.ui import console

    handler = RichHandler(console=console, show_path=False, show_time=verbose > 1)
    handler.setLevel(level)
    root = logging.getLogger("flakebot")
    root.addHandler(handler)
    root.setLevel(min(level, logging.DEBUG if log_file else level))
    if log_file:
        file_handler = logging.FileHandler(log_file)
        file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(file_handler)


# ---------------------------------------------------------------- runs


@app.command("runs")
def runs_cmd(as_json: JsonOpt = False) -> None:
    """List runs, newest first, with status, age and need."""
    from flakebot import run as runmod
    from flakebot.ui import age, json_line, out

    runs = runmod.list_runs(G.workdir)
    if as_json:
        for r in runs:
            json_line({"id": r.id, "status": r.status, "pipeline": r.state["pipeline"], "need": r.state.get("need", ""), "created": r.state.get("created")})
        return
    if not runs:
        out.print(f"No runs in {runmod.runs_dir(G.workdir)}.")
        return
    from rich.table import Table

    table = Table("run", "status", "age", "pipeline", "need")
    now = time.time()
    for r in runs:
        table.add_row(r.id, r.status, age(now - r.state.get("created", now)), r.state["pipeline"], r.state.get("need", ""))
    out.print(table)


@app.command("show")
def show_cmd(name: Annotated[str, typer.Argument(help="A run id (or unique prefix) or a catalogued tool name.")], as_json: JsonOpt = False) -> None:
    """Show a run's stage timeline and outcome, or a catalogued tool's usage."""
    from flakebot import api

    report = api.show(name, G.settings)
    if as_json:
        from flakebot.ui import json_line

        json_line(report)
        return
    from flakebot.render import print_report

    print_report(report)


@app.command("resume")
def resume_cmd(
    run_id: Annotated[str, typer.Argument(help="The run to continue (id or unique prefix).")],
    as_json: JsonOpt = False,
) -> None:
    """Continue a run from its first unfinished stage (after a crash, Ctrl-C or failure)."""
    from flakebot import pipeline
    from flakebot.ui import event_sink

    with event_sink(as_json, f"resume {run_id}") as sink:
        run = pipeline.resume(G.workdir, run_id, G.settings, sink)
    _finish_run(run, as_json)


def _finish_run(run: Any, as_json: bool) -> None:
    from flakebot.ui import json_line, out

    if as_json:
        json_line({"result": {"run_id": run.id, "status": run.state["status"], "outputs": run.state["outputs"]}})
    else:
        out.print(f"[green]run {run.id} {run.state['status']}[/green]")


@app.command("clean")
def clean_cmd(
    run_id: Annotated[str | None, typer.Argument(help="The run whose directory to remove.")] = None,
    all_runs: Annotated[bool, typer.Option("--all", help="Remove every run directory.")] = False,
) -> None:
    """Remove run directories and everything the runs created."""
    from flakebot import cleanup
    from flakebot.errors import UsageError
    from flakebot.ui import out

    if bool(run_id) == all_runs:
        raise UsageError("give either a RUN id or --all", fix="run 'flakebot clean RUN' or 'flakebot clean --all'")
    removed = cleanup.remove_runs(G.workdir, None if all_runs else run_id)
    out.print(f"removed {len(removed)} run(s)")


# ---------------------------------------------------------------- config


@config_app.command("show")
def config_show(as_json: JsonOpt = False) -> None:
    """Print every setting, its value and what it is for."""
    from flakebot.ui import json_line, out

    settings = G.settings
    if as_json:
        json_line(settings.as_dict())
        return
    from rich.table import Table

    table = Table("key", "value", "meaning")
    for key in config.Settings.keys():
        table.add_row(key, repr(settings.get(key)), config.Settings.describe(key))
    out.print(table)
    out.print("files read: " + ", ".join(str(p) for p in config.config_files() if p.is_file()) or "none")


@config_app.command("set")
def config_set(
    key: Annotated[str, typer.Argument(help="Setting name (see 'flakebot config show').")],
    value: Annotated[str, typer.Argument(help="New value.")],
    local: Annotated[bool, typer.Option("--local", help="Write ./flakebot.toml instead of the user file.")] = False,
) -> None:
    """Write one setting to ~/.config/flakebot/flakebot.toml (comments are kept)."""
    from flakebot.ui import out

    path = config.set_value(key, value, Path.cwd() / "flakebot.toml" if local else None)
    out.print(f"{key} = {value!r} written to {path}")


# ---------------------------------------------------------------- entry point


def main() -> None:
    """Console-script entry: run the app, turning FlakebotErrors into one red line and an exit code."""
    try:
        app(standalone_mode=False)
    except FlakebotError as exc:
        if os.environ.get("FLAKEBOT_RAISE_ERRORS") == "1":
            raise
        _print_error(exc)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _print_error(FlakebotError("interrupted"))
        sys.exit(130)
    except Exception as exc:  # click's own usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.exceptions.Exit):
            sys.exit(exc.exit_code)
        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(2)
        if isinstance(exc, click.exceptions.Abort):
            sys.exit(130)
        raise


def _print_error(exc: FlakebotError) -> None:
    from flakebot.ui import console

    console.print(f"[bold red]error:[/bold red] {exc.one_line()}", highlight=False, soft_wrap=True)


if __name__ == "__main__":
    main()
