"""Calling a catalogued tool with JSON arguments, the shape its OpenAI/MCP schema describes.

One mapping serves every caller: the MCP server's tools/call and `flakebot run TOOL --args-json`.
The arguments become argv with helpparse.to_argv; a `stdin` argument is the tool's standard input.
The tool runs sandboxed (deliver.toolrun) with its output captured.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.deliver.helpparse import CliParam, json_schema, parse_help, to_argv
from flakebot.deliver.schema import Field, field_schema
from flakebot.errors import UsageError
from flakebot.modeltext import tool_description

logger = logging.getLogger(__name__)
MAX_COUNT = 100  # times a counted flag (-vvv) is given: 10**9 was a billion-item argv in the server's memory

TIMED_OUT = 124
HEAD_BYTES = 65536  # at most this much of a truncated stdout comes back in the result, in whole lines
TRUNCATION = (
    "A stdout longer than flakebot's tool_output_limit setting is not returned whole: the result then has "
    "truncated: true, stdout_file (a file holding all of it), stdout_bytes and its first lines as stdout. Read "
    "stdout_file soon: flakebot keeps the newest such files within its outputs_mb setting and removes older ones."
)
WRITABLE = "writable"  # the paths a call lets the tool write, beside its schema's arguments
WRITABLE_SCHEMA = field_schema(
    Field(
        "array",
        "Existing files or directories the tool may write (e.g. its output file), each beneath a grant root the user "
        "allowed (the directory flakebot started in unless configured); nothing else is writable.",
    )
)


def writable_argument(arguments: Any) -> list[str]:
    """The `writable` paths of a JSON call: a list of strings (none when absent)."""
    value = arguments.get(WRITABLE) if isinstance(arguments, dict) else None
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(
            "writable must be a list of paths", fix='pass e.g. {"writable": ["out.csv"]} (the paths must exist)'
        )
    return value


@dataclass
class ToolCall:
    """What one call of a crafted tool did."""

    tool: str
    argv: list[str]
    exit_code: int
    stdout: str  # whole, or (truncated) its first lines
    stderr: str
    truncated: bool = False  # stdout passed tool_output_limit: the whole of it is in stdout_file
    stdout_file: str = ""
    stdout_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The call as JSON; the truncation keys only when stdout was truncated (then always all three)."""
        keys = ("truncated", "stdout_file", "stdout_bytes")
        return {k: v for k, v in asdict(self).items() if self.truncated or k not in keys}


def parameters(manifest: dict[str, Any]) -> list[CliParam]:
    """The tool's command-line parameters, read from its recorded --help by today's parser (so entries crafted
    before a parser fix get it too), else as the manifest recorded them."""
    if manifest.get("help_text"):
        return parse_help(manifest["help_text"])
    return [CliParam(**param) for param in manifest.get("parameters") or []]


def mcp_definition(manifest: dict[str, Any]) -> dict[str, Any]:
    """The MCP tool a catalogued tool is: its name, its clap-derived input schema, its summary and usage.

    The schema is built now from the parameters (the one the calls are mapped with), not the manifest's copy,
    with `writable` beside the tool's own arguments."""
    description = tool_description(manifest.get("summary", ""), manifest.get("usage", ""))
    description += (
        "\n\nPass standard input as the `stdin` argument and null for any argument you do not want; "
        "the result holds stdout, stderr and the exit code. " + TRUNCATION + " "
        "The tool runs in an empty directory: paths its arguments name are read-only; list the paths it may "
        "write (an output file or directory) in `writable`, beneath a directory the user allowed."
    )
    schema = json_schema(parameters(manifest))
    schema = {
        **schema,
        "properties": {**schema.get("properties", {}), WRITABLE: WRITABLE_SCHEMA},
        "required": [*schema.get("required", []), WRITABLE],
    }
    return {"name": manifest["name"], "description": description, "inputSchema": schema}


def arguments_to_argv(manifest: dict[str, Any], arguments: Any) -> tuple[list[str], str | None]:
    """(the tool's arguments, its stdin or None) for JSON `arguments`; bad arguments are a UsageError."""
    name = manifest.get("name", "the tool")
    if not isinstance(arguments, dict):
        raise UsageError(
            f"arguments for {name} must be a JSON object, got {type(arguments).__name__}",
            fix='pass an object such as {"stdin": "..."}',
        )
    arguments = {k: v for k, v in arguments.items() if k != WRITABLE}
    params = parameters(manifest)
    problem = _type_problem(params, arguments)
    try:
        if problem:
            raise ValueError(problem)
        argv = to_argv(params, arguments)
    except ValueError as exc:
        fields = ", ".join(p.name for p in params) or "none"
        raise UsageError(
            f"bad arguments for {name}: {exc}", fix=f"use the tool's schema (parameters: {fields}, and stdin)"
        ) from None
    stdin = arguments.get("stdin")
    return argv, None if stdin is None else str(stdin)


def _type_problem(params: list[CliParam], arguments: dict[str, Any]) -> str | None:
    """Flags take booleans (counted ones a count), the rest strings (repeatable ones lists of them): say which
    argument breaks that."""
    for param in params:
        value = arguments.get(param.name)
        if value is None:
            continue
        if param.kind == "flag" and param.multiple and not (isinstance(value, int) and 0 <= value <= MAX_COUNT):
            return f"{param.name} is a counted flag: pass how many times (0 to {MAX_COUNT}) or true or false"
        if param.kind == "flag" and not param.multiple and not isinstance(value, bool):
            return f"{param.name} is a flag: pass true or false"
        items = value if isinstance(value, list) and param.multiple else [value]
        if param.kind != "flag" and not all(isinstance(item, str) for item in items):  # 5 is not "5": never coerced
            return f"{param.name} takes " + ("a list of strings" if param.multiple else "one string")
    stdin = arguments.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        return "stdin takes one string (the text the tool reads)"
    return None


def call(manifest: dict[str, Any], arguments: Any, *, settings: Settings, cwd: Path | None = None) -> ToolCall:
    """Run the tool with JSON arguments and capture what it printed; a non-zero exit is a result, not an error.

    Without a `stdin` argument the tool reads an empty input (never the caller's: an MCP server's stdin is its protocol)."""
    args, stdin = arguments_to_argv(manifest, arguments)
    writable = writable_argument(arguments)
    return run_captured(manifest, args, stdin or "", settings=settings, cwd=cwd, writable=writable)


def run_captured(
    manifest: dict[str, Any],
    args: list[str],
    stdin: str | None,
    *,
    settings: Settings,
    cwd: Path | None = None,
    writable: list[str] | None = None,
) -> ToolCall:
    """Run the tool (sandboxed, deliver.toolrun) with command-line `args` and capture its output; `stdin` None
    passes the caller's own standard input; `writable`: the paths it may write."""
    from flakebot.deliver import toolrun  # the sandbox's modules: imported by a call, not by an MCP server's tools/list

    result = toolrun.run_captured(manifest, args, stdin, settings=settings, cwd=cwd, writable=writable)
    stderr = result.stderr
    if result.timed_out:  # exit 124, as coreutils' timeout reports it
        stderr += f"\n[flakebot: stopped after {settings.tool_timeout:g}s; raise tool_timeout to allow more]\n"
    if result.truncated:
        stderr += f"\n[flakebot: stderr cut to its first and last bytes (output_cap {settings.output_cap})]\n"
    code = TIMED_OUT if result.timed_out else result.returncode
    if not result.stdout_file:
        return ToolCall(manifest["name"], args, code, result.stdout, stderr)
    logger.info("%s printed %d bytes: stdout is in %s", manifest["name"], result.stdout_bytes, result.stdout_file)
    head = _head(result.stdout, min(HEAD_BYTES, settings.tool_output_limit))
    return ToolCall(manifest["name"], args, code, head, stderr, True, result.stdout_file, result.stdout_bytes)


def _head(text: str, size: int) -> str:
    """The first whole lines of `text` within `size` bytes (the first `size` bytes when one line is longer)."""
    data = text.encode()[:size]
    cut = data.rfind(b"\n")
    return (data[: cut + 1] if cut >= 0 else data).decode(errors="replace")
