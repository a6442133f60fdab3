"""Printing reports (a run's timeline, a tool's usage) for people."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from flakebot.ui import STATUS_STYLE, out


def print_report(report: dict[str, Any]) -> None:
    if report.get("kind") == "run":
        print_run(report)
    else:
        print_tool(report)


def print_run(report: dict[str, Any]) -> None:
    out.print(f"[bold]run {report['id']}[/bold]  {report['status']}  ({report['pipeline']})")
    if report.get("need"):
        out.print(f"need: {report['need']}")
    table = Table("", "stage", "status", "seconds", "attempts")
    for stage in report["stages"]:
        mark, style = STATUS_STYLE.get(stage["status"], ("?", ""))
        seconds = stage.get("seconds")
        table.add_row(
            mark, stage["name"], f"[{style}]{stage['status']}[/{style}]", f"{seconds:.1f}" if seconds is not None else "", str(stage.get("attempts", ""))
        )
    out.print(table)
    if report.get("error"):
        out.print(f"[red]error:[/red] {report['error'].get('message')}  [dim]{report['error'].get('fix') or ''}[/dim]")
    out.print(f"[dim]{report['dir']}[/dim]")


def print_tool(report: dict[str, Any]) -> None:
    out.print(report.get("usage_markdown") or report)
