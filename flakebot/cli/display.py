"""Printing reports (a run's timeline, a tool's usage) for people."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flakebot.cli.consoles import out
from flakebot.cli.jsonout import json_result
from flakebot.cli.live import STATUS_STYLE
from flakebot.modeltext import markup, one_line, plain

if TYPE_CHECKING:
    from rich.table import Table
    from rich.text import Text

WRAPPED_MIN = 8  # the narrowest a wrapping column (a summary, a note) is drawn


def fitted(
    headers: tuple[str, ...],
    keys: tuple[str, ...],
    rows: list[tuple[Any, ...]],
    *,
    optional: tuple[str, ...] = (),
    width: int | None = None,
) -> Table:
    """A table that fits the terminal without cutting a word: the `keys` columns (names, ids, versions, states: what
    a reader tells rows apart by) and the `optional` ones keep their values whole on one line; the other columns
    wrap. Where the whole values do not fit `width`, optional columns are left out, the first named first, and
    the caption says which. Every cell is Text: nothing in it is read as markup."""
    from rich.table import Table
    from rich.text import Text

    whole = {h: max([len(h), *(len(str(row[i])) for row in rows)]) for i, h in enumerate(headers)}
    shown = list(headers)

    def needed() -> int:
        return sum(whole[h] if h in keys or h in optional else WRAPPED_MIN for h in shown) + 3 * len(shown) + 1

    left_out = []
    for header in optional:
        if width is None or needed() <= width:
            break
        shown.remove(header)
        left_out.append(header)
    caption = f"not shown at this width: {', '.join(left_out)} (--json has everything)" if left_out else None
    table = Table(caption=caption, caption_justify="left")
    for header in shown:
        if header in keys or header in optional:
            table.add_column(header, no_wrap=True, overflow="fold", min_width=whole[header])
        else:
            table.add_column(header, overflow="fold", ratio=1, min_width=WRAPPED_MIN)
    for row in rows:
        table.add_row(*(Text(str(cell)) for header, cell in zip(headers, row, strict=True) if header in shown))
    return table


def print_report(report: dict[str, Any]) -> None:
    if report.get("kind") == "run":
        print_run(report)
    else:
        print_tool(report)


def print_run(report: dict[str, Any]) -> None:
    from rich.table import Table

    out().print(f"[bold]run {report['id']}[/bold]  {report['status']}  ({report['pipeline']})")
    if report.get("need"):
        out().print(
            f"need: {markup(one_line(report['need'], 2000))}"
        )  # a caller's words (an agent's): one line, as data
    table = Table("", "stage", "status", "seconds", "attempts")
    for stage in report["stages"]:
        mark, style = STATUS_STYLE.get(stage["status"], ("?", ""))
        seconds = stage.get("seconds")
        table.add_row(
            mark,
            stage["name"],
            f"[{style}]{stage['status']}[/{style}]",
            f"{seconds:.1f}" if seconds is not None else "",
            str(stage.get("attempts", "")),
        )
    out().print(table)
    if report.get("error"):
        error = report["error"]
        message, fix = (one_line(error.get(key) or "", 2000) for key in ("message", "fix"))
        out().print(f"[red]error:[/red] {markup(message)}  [dim]{markup(fix)}[/dim]")
    out().print(f"[dim]{report['dir']}[/dim]")


def print_tool(report: dict[str, Any]) -> None:
    from rich.markdown import Markdown
    from rich.table import Table
    from rich.text import Text

    usage = report.get("usage_markdown") or f"# {report['name']}\n\n(no USAGE.md: craft it again with --fresh)"
    out().print(Markdown(plain(usage)))  # an older USAGE.md may still hold the model's control characters
    manifest = report.get("manifest") or {}
    smoke = manifest.get("smoke") or {}
    if smoke.get("level"):
        colour = "green" if smoke["level"] == "help" else "yellow"
        out().print(
            f"smoke level: [{colour}]{markup(smoke['level'])}[/{colour}] ({markup(smoke.get('meaning', ''))}; "
            f"'{markup(smoke.get('command', ''))}' exited {smoke.get('exit_code')})"
        )
    if manifest and not manifest.get("portable"):
        reason = manifest.get("portable_reason") or "built before flakebot recorded portability"
        out().print(f"[yellow]portable: no[/yellow] ({markup(reason)})")
    versions = report.get("versions") or []
    if len(versions) > 1:
        table = Table("version", "change", "run")
        for record in versions:
            current = " (current)" if record["version"] == report.get("current_version") else ""
            table.add_row(
                Text(record["version"] + current),
                Text(plain(record.get("change") or "first craft")),
                record.get("run_id") or "",
            )
        out().print(table)
        out().print(f"[dim]run an earlier version with: flakebot run {report['name']}@VERSION -- ARGS[/dim]")
    source = report.get("installed_from")
    if source:
        out().print(
            f"installed from {markup(source.get('catalog', ''))}, signed by {markup(source.get('public_key', ''))}",
            soft_wrap=True,
        )
    out().print(f"[dim]{report.get('dir', '')}[/dim]")


def print_craft_result(result: dict[str, Any], as_json: bool) -> None:
    """The final summary of a craft: the tool, how it was made, how to use it."""
    from flakebot.cli.live import json_line

    if as_json:
        json_line({"result": result})
        return
    if result["status"] == "stopped":
        out().print(
            f"[yellow]run {result['run_id']} stopped as asked[/yellow]; continue with 'flakebot resume {result['run_id']}'"
        )
        return
    manifest = result["manifest"]
    origin = "from the catalog" if result["from_catalog"] else f"in {result['seconds']:.0f}s"
    if result["status"] == "installed":
        source = result.get("installed_from") or {}
        origin = markup(f"installed from {source.get('catalog', '')}, signed by {source.get('signed_by', '')}")
    version = f" {result['version']}" if result.get("version") else ""
    summary = markup(one_line(manifest.get("summary", "")))
    title = f"[bold green]{result['name']}{version}[/bold green] {summary} ({origin})"
    out().print(_hanging([("[bold green]✔[/bold green]", title)]), soft_wrap=True)
    lines: list[tuple[str, str]] = []
    improves = manifest.get("improves")
    if improves and not result["from_catalog"]:
        kept = (manifest.get("spec") or {}).get("inherited_examples", 0)
        lines.append(("improves:", f"{result['name']}@{improves['version']} ({markup(improves['request'])}): its {kept} "
                      f"examples still pass; the earlier version stays runnable as {result['name']}@{improves['version']}"))  # fmt: skip
    if result.get("choice", {}).get("crate") and not improves:
        choice = result["choice"]
        reason = markup(choice.get("reason", ""))
        lines.append(("from:", f"[bold]{markup(choice['crate'])}[/bold] ({choice.get('mode')}): {reason}"))
    if result.get("service"):
        lines.append(("note:", f"[yellow]{markup(result['service'])}[/yellow]"))
    usage = result.get("usage") or {}
    if usage:
        cost = usage.get("cost_usd")
        tokens = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
        lines.append(("model:", f"{tokens} tokens" + (f", ${cost:.4f}" if cost else "")))
    verification = manifest.get("verification_command") or {}
    verified = "[green]nix run of the catalogued flake passed[/green]" if verification.get("passed") else "no"
    if manifest.get("kind") == "service":
        passed = [step for step in manifest.get("lifecycle") or [] if step.get("ok")]
        verified = f"[green]its lifecycle passed on the store path ({len(passed)} steps)[/green]" if passed else "no"
        lines.append(
            ("start it:", f"[bold]flakebot up {markup(result['name'])}[/bold] (sandboxed, its port on 127.0.0.1)")
        )
    else:
        lines.append(("run it:", f"[bold]flakebot run {markup(result['name'])} -- ARGS[/bold] (sandboxed: it sees only "
                      "the paths its arguments name)"))  # fmt: skip
    lines.append(
        ("usage:", f"{markup(manifest.get('catalog_dir', ''))}/USAGE.md, or flakebot show {markup(result['name'])}")
    )
    lines.append(("verified:", verified))
    if not manifest.get("portable", True):
        lines.append(("host-only:", f"[yellow]{markup(manifest.get('portable_reason', ''))}[/yellow]"))
    out().print(_hanging(lines, indent=2), soft_wrap=True)
    # on a line of its own, never broken by rich: the terminal may wrap it, a copy of it still runs
    out().print("  without flakebot:")
    out().print(f"    {markup(manifest.get('nix_run', ''))}", soft_wrap=True)


def _hanging(rows: list[tuple[str, str]], indent: int = 0) -> Text:
    """`label value` rows whose values wrap under themselves (a hanging indent), not under the label, at the
    terminal's width, with no padding after the last word (a pipe gets the words only)."""
    from rich.text import Text

    labels = [Text.from_markup(label) for label, _ in rows]
    width = max(len(label) for label in labels)
    room = max(out().width - indent - width - 1, 20)
    shown = Text()
    for label, (_, value) in zip(labels, rows, strict=True):
        label.pad_right(width - len(label))
        for number, line in enumerate(Text.from_markup(value).wrap(out(), room, overflow="fold")):
            line.rstrip()
            shown.append(" " * indent)
            shown.append(label if number == 0 else " " * width)
            shown.append(" ")
            shown.append(line)
            shown.append("\n")
    shown.rstrip()
    return shown


def print_tools(tools: list[dict[str, Any]], as_json: bool) -> None:
    from flakebot.cli.live import json_result

    if as_json:
        json_result({"tools": tools})
        return
    if not tools:
        out().print("The catalog is empty: craft a tool with 'flakebot craft \"...\"'.")
        return
    rows = []
    for tool in tools:
        older = len(tool.get("versions") or {}) - 1
        version = str(tool.get("version", "")) + (f" (+{older} earlier)" if older > 0 else "")
        rows.append((tool["name"], tool.get("kind", "tool"), version, one_line(tool.get("summary", "")),
                     plain(tool.get("need", "")), tool.get("run_id", "")))  # fmt: skip
    headers = ("tool", "kind", "version", "summary", "need", "run")
    out().print(fitted(headers, ("tool", "kind", "version", "run"), rows))


def print_remote_tools(tools: list[dict[str, Any]], as_json: bool) -> None:
    """The shared catalogs' tools: each version, where it is, who signed it and whether that key is trusted."""
    from rich.table import Table
    from rich.text import Text

    from flakebot.cli.live import json_result

    if as_json:
        json_result({"tools": tools})
        return
    if not tools:
        out().print("The shared catalogs list no tools yet: publish one with 'flakebot publish TOOL --to URL'.")
        return
    table = Table("tool", "version", "summary", "need", "catalog", "signed by")
    for tool in tools:
        signer = f"{tool.get('signed_by') or '?'}" + ("" if tool.get("trusted") else " (key not configured)")
        cells = (tool["name"], tool["version"], tool.get("summary", ""), tool.get("need", ""), tool["catalog"], signer)
        table.add_row(*(Text(one_line(cell)) for cell in cells))  # a cache's text: data, never markup or escapes
    out().print(table)


def print_runs(runs: list[dict[str, Any]]) -> None:
    """The runs table: id, status, age, pipeline, need."""
    from flakebot.cli.live import age

    now = time.time()
    rows = [(r["id"], r["status"], age(now - (r.get("created") or now)), r["pipeline"], one_line(r.get("need") or ""))
            for r in runs]  # fmt: skip
    out().print(fitted(("run", "status", "age", "pipeline", "need"), ("run", "status", "age", "pipeline"), rows))


def print_services(found: list[dict[str, Any]]) -> None:
    """The services table: each service's version (and the one before), state, port, how the port reaches it
    (socket: handoff or pasta), network, health, restarts, and the services it needs (the first column left out
    where the table does not fit)."""
    rows = []
    for s in found:
        uptime = f"{s['uptime_s']:.0f}s" if s.get("uptime_s") is not None else "-"
        network = "outbound" if s.get("network") else "none"
        needs = ",".join(s.get("needs") or []) or "-"
        rows.append((s["name"], s.get("version", ""), s.get("previous_version") or "-", s["state"], s.get("port"),
                     s.get("socket") or "pasta", network, s.get("health"), s.get("restarts"), uptime, needs,
                     one_line(s.get("message", ""))))  # fmt: skip
    headers = ("service", "version", "previous", "state", "port", "socket", "network", "health", "restarts", "uptime",
               "needs", "note")  # fmt: skip
    optional = ("needs", "uptime", "restarts", "network", "health", "previous", "socket")
    out().print(fitted(headers, ("service", "version", "state", "port"), rows, optional=optional, width=out().width))


def print_candidates(query: str, found: list[Any]) -> None:
    """The search table: one crate a tool could start from per row, best first."""
    from rich.table import Table

    table = Table(title=f"{found[0].crate.source}: {query}")
    for column in ("crate", "version", "bin?", "licence", "downloads", "why", "description"):
        table.add_column(
            column, no_wrap=column in ("crate", "version"), justify="right" if column == "downloads" else "left"
        )
    for c in found:
        info = c.crate
        downloads = "" if info.downloads is None else f"{info.downloads:,}"
        cells = (info.name, info.version, ", ".join(info.bin_names) or "-", info.license, downloads, c.why)
        # a crate's metadata is its author's text: shown as text, never read as markup
        table.add_row(*(markup(one_line(cell)) for cell in (*cells, info.description)))
    out().print(table)


def print_settings(report: dict[str, Any]) -> None:
    """The settings table (key, value, where the value came from, meaning) and the configuration files read."""
    from rich.table import Table

    table = Table("key", "value", "from", "meaning")
    for row in report["settings"]:
        source = row["source"] + (" (may be lowered in ./flakebot.toml)" if row["trust"] == "limit" else "")
        # "[/path]" is text, not markup
        table.add_row(row["key"], markup(repr(row["value"])), markup(source), markup(row["meaning"]))
    out().print(table)
    out().print("files read: " + (", ".join(report["files"]) or "none"))


def print_models(providers: list[dict[str, Any]]) -> None:
    """The model providers table: how to name each, its default model, its API key's state, its base URL."""
    from rich.table import Table

    table = Table("use as", "default model", "API key", "base URL")
    for p in providers:
        key = f"{p['key_env']} {'set' if p['key_present'] else 'NOT SET'}" if p["key_required"] else "not needed"
        table.add_row(p["usage"], p["default_model"] or "", key, p["base_url"] or "")
    out().print(table)


# ---------------------------------------------------------------- displays of the command table's commands

# command name -> how the CLI shows its result to a person, or as JSON (cli/generated.py); may return an exit code.
# Called as display(result, as_json), and by name with any of the command's arguments and `settings` it takes, or
# all its arguments as `arguments`.
SHOWN: dict[str, Callable[..., int | None]] = {}


def shows(name: str) -> Callable[[Callable[..., int | None]], Callable[..., int | None]]:
    """Make the decorated function the CLI's display of command `name`'s result."""

    def register(display: Callable[..., int | None]) -> Callable[..., int | None]:
        SHOWN[name] = display
        return display

    return register


@shows("services")
def show_services(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        json_result(result)
    elif not result["services"]:
        out().print("No services: start one with 'flakebot up NAME'.")
    else:
        print_services(result["services"])


@shows("logs")
def show_logs(result: dict[str, Any], as_json: bool) -> None:
    """A service's lines as they are (no markup); with follow, the lines written after them until Ctrl-C."""
    if as_json:
        json_result({k: v for k, v in result.items() if k != "following"})
        return
    for line in result["lines"]:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()
    try:
        for line in result.get("following", ()):
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        return


@shows("craft")
@shows("improve")
def show_crafted(result: Any, as_json: bool) -> None:
    """A craft's or improvement's CraftResult (print_craft_result)."""
    print_craft_result(result.to_dict(), as_json)


@shows("package")
def show_packaged(result: Any, as_json: bool) -> None:
    """A packaged crate (a PackageOut): what was built, its smoke level, where the flake is, how to run it."""
    from rich.markup import escape

    from flakebot.cli.live import json_line

    if as_json:
        json_line({"result": result.to_dict()})
        return
    out().print(
        f"[green]{escape(result.pname)} {escape(result.version)}[/green] built ({result.nixpkgs_mode} nixpkgs): {result.store_path}"
    )
    for notice in result.notices:
        out().print(f"[yellow]note:[/yellow] {escape(notice)}")
    smoke = result.smoke
    colour = "green" if smoke.get("level") == "help" else "yellow"
    out().print(
        f"smoke level: [{colour}]{escape(str(smoke.get('level')))}[/{colour}] "
        f"('{escape(str(smoke.get('command')))}' exited {smoke.get('exit_code')}; docs/smoke-levels.md)"
    )
    out().print(f"flake: {escape(result.flake_dir)}")
    out().print(f"run it: {escape(result.nix_run_command['shell'])}", soft_wrap=True)
    if result.catalog:
        tool = f"{result.catalog['name']}@{result.catalog['version']}"
        out().print(f"catalogued as {escape(tool)}: flakebot run {escape(result.catalog['name'])} -- ARGS")


@shows("eval")
def show_eval(result: Any, as_json: bool) -> None:
    """An evaluation's report: as JSON, or the table eval.md holds and where it was written."""
    from flakebot.cli.live import json_line

    report, paths = result
    if as_json:
        json_line(report.to_dict())
        return
    out().print(paths["markdown"].read_text(), markup=False, soft_wrap=True)  # the table eval.md holds
    out().print(f"written: {paths['markdown']} {paths['json']}", markup=False)


@shows("runs")
def show_runs(runs: list[dict[str, Any]], as_json: bool, settings: Any) -> None:
    if as_json:
        json_result({"runs": runs})
    elif not runs:
        out().print(f"No runs in {settings.path('workdir') / 'runs'}.")
    else:
        print_runs(runs)


@shows("show")
def show_run_or_tool(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        json_result(report)
    else:
        print_report(report)


@shows("resume")
def show_resumed(report: dict[str, Any], as_json: bool) -> None:
    """The run's id, status and outputs for programs; a person gets a craft's summary, or the run's status."""
    from flakebot.cli.jsonout import json_line

    if as_json:
        json_line({"result": {key: report[key] for key in ("run_id", "status", "outputs")}})
    elif report["craft"]:
        print_craft_result(report["craft"], as_json=False)
    else:
        out().print(f"[green]run {report['run_id']} {report['status']}[/green]")


@shows("search")
def show_candidates(found: list[Any], as_json: bool, query: str) -> None:
    if as_json:
        json_result({"candidates": [candidate.to_dict() for candidate in found]})
    elif not found:
        out().print(f"No crate matches '{query}'.")
    else:
        print_candidates(query, found)


@shows("config show")
def show_settings(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        json_result(report["values"])
    else:
        print_settings(report)


@shows("config set")
def show_written(written: dict[str, Any], as_json: bool, value: str) -> None:
    if as_json:
        json_result(written)
    else:
        out().print(f"{written['key']} = {value!r} written to {written['file']}")


@shows("models")
def show_models(report: dict[str, Any], as_json: bool) -> None:
    """The providers table, the default model, what each provider serves, and warnings."""
    if as_json:
        json_result(report)
        return
    print_models(report["providers"])
    default = report["default"]
    out().print(
        f"default: {default['model']} (from {default['source']})"
        if default["model"]
        else f"default: none. {default['error']}",
        highlight=False,
    )
    for p in report["providers"]:
        if p.get("served"):
            out().print(
                f"{p['provider']} serves {len(p['served'])} models: {', '.join(p['served'])}",
                markup=False,
                highlight=False,
            )
        elif p.get("served_error"):
            out().print(p["served_error"], markup=False, highlight=False)
    for warning in report["warnings"]:
        out().print(f"warning: {warning}", markup=False, highlight=False)


@shows("list")
def show_tools(result: dict[str, Any], as_json: bool, arguments: dict[str, Any]) -> None:
    if arguments.get("remote") or arguments.get("from_url"):
        print_remote_tools(result["tools"], as_json)
    else:
        print_tools(result["tools"], as_json)


@shows("run")
def show_run(call: dict[str, Any], as_json: bool) -> None:
    """Attached, the tool printed its own output; with --json (captured), {exit_code, stdout, stderr} is printed."""
    if as_json:
        json_result(call)


@shows("rm")
def show_removed(entry: dict[str, Any], as_json: bool, arguments: dict[str, Any]) -> None:
    if as_json:
        json_result({"removed": {key: entry.get(key) for key in ("name", "version", "store_path")}})
        return
    which = entry["name"] if "@" not in arguments["tool"] else f"{entry['name']} {entry['version']}"
    out().print(f"removed {which} (store path {entry.get('store_path', '?')} is no longer held)")


@shows("install")
def show_installed(entry: dict[str, Any], as_json: bool) -> None:
    if as_json:
        json_result(entry)
        return
    source = entry.get("installed_from") or {}  # a cache's text: no markup, no terminal escapes
    out().print(
        f"[green]installed[/green] {markup(entry['name'])} {markup(entry['version'])} from "
        f"{markup(source.get('catalog', ''))}, signed by {markup(source.get('signed_by') or '')}: "
        f"{markup(entry['store_path'])}",
        soft_wrap=True,
    )
    out().print(f"run it: flakebot run {markup(entry['name'])} -- ARGS", soft_wrap=True)


@shows("publish")
def show_published(result: dict[str, Any], as_json: bool) -> None:
    from rich.markup import escape

    if as_json:
        json_result(result)
        return
    size = f"{result['paths']} path{'s' if result['paths'] != 1 else ''}, {result['closure_size']:,} bytes"
    out().print(
        f"[green]published[/green] {escape(result['store_path'])} ({size}) to {escape(result['to'])}", soft_wrap=True
    )
    if result["public_key"]:
        out().print(f"signed by: {escape(result['public_key'])}", soft_wrap=True)
    out().print(f"fetch it: {escape(result['substitute_command']['shell'])}", soft_wrap=True)
    out().print(f"then run: {escape(result['run_command']['shell'])}", soft_wrap=True)
