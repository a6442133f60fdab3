"""The reference pages that mirror the code: docs/settings.md from Settings and docs/cli.md from the typer app.
`python -m benchmarks.readme docs` writes them; tests/test_docs.py fails when either has drifted from the code."""

from __future__ import annotations

import dataclasses
from typing import Any

from flakebot import config


def settings_table() -> str:
    """Every setting: its key, default, environment variable, trust class and one-line meaning."""
    rows = ["| key | default | environment | trust | meaning |", "| --- | --- | --- | --- | --- |"]
    for field in dataclasses.fields(config.Settings):
        default = _cell(repr(field.default) if field.default not in ("", ()) else "(empty)")
        env = f"`{config.ENV_PREFIX}{field.name.upper()}`"
        trust = config.Settings.trust_class(field.name)
        meaning = _cell(config.Settings.describe(field.name))
        rows.append(f"| `{field.name}` | {default} | {env} | {trust} | {meaning} |")
    return "\n".join(rows)


def cli_reference() -> str:
    """Every command of the typer app with its help and its arguments and options."""
    from typer.main import get_command

    from flakebot.cli.app import app

    root = get_command(app)
    blocks = [_command_block("flakebot", root, top=True)]
    blocks += _group_blocks("flakebot", root)
    return "\n\n".join(blocks)


# Typer's commands and parameters are click's, vendored (typer._click): read by their attributes, not their classes.
def _group_blocks(prefix: str, group: Any) -> list[str]:
    blocks = []
    for name, command in getattr(group, "commands", {}).items():
        path = f"{prefix} {name}"
        blocks.append(_command_block(path, command))
        blocks += _group_blocks(path, command)
    return blocks


def _command_block(path: str, command: Any, top: bool = False) -> str:
    lines = [f"## `{path}`", "", (command.help or "").strip()]
    params = [p for p in command.params if p.name != "help"]
    if params:
        lines += ["", "| argument or option | default | meaning |", "| --- | --- | --- |"]
        lines += [_param_row(p) for p in params]
    if top:
        lines += ["", "These options go before the command: `flakebot -v craft NEED`."]
    return "\n".join(lines)


def _param_row(param: Any) -> str:
    if param.param_type_name == "argument":
        name = f"`{(param.name or '').upper()}`" + ("" if param.required else " (optional)")
        return f"| {name} | | {_cell(getattr(param, 'help', '') or '')} |"
    names = " / ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
    return f"| {names} | {_default(param.default)} | {_cell(getattr(param, 'help', '') or '')} |"


def _default(value: Any) -> str:
    if value is None or value == () or value == []:
        return ""
    return _cell(
        repr(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)
    )


def _cell(text: str) -> str:
    """Text fit for one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")
