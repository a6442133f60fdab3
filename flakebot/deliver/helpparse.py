"""clap `--help` text -> parameters -> JSON Schema, and JSON arguments -> argv.

Understands clap 4 ("Usage:", "Arguments:", "Options:") and clap 2/3 ("USAGE:", "ARGS:", "FLAGS:",
"OPTIONS:") layouts, short and long help (descriptions on following indented lines), and gumdrop's usage
("Optional arguments:", value names bare: `-f, --file FILE`), which a packaged crate may print instead of help.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from flakebot.deliver import schema
from flakebot.deliver.schema import Field

SKIPPED = {"help", "version"}
# Section headers listing options: clap's, and gumdrop's and argparse's "Optional arguments:" / "options:".
OPTION_SECTIONS = ("options", "flags", "optional arguments")
ENTRY = re.compile(
    r"^\s{1,8}(?:(?P<short>-[A-Za-z0-9])(?:,\s*)?)?(?P<long>--[A-Za-z0-9][\w-]*)?"
    r"(?:[ =](?P<value>[<\[][^>\]]+[>\]](?:\.\.\.)?|[A-Z][A-Z0-9_-]*(?:\.\.\.)?(?=\s{2,}|$)))?(?P<rest>.*)$"
)
POSITIONAL = re.compile(r"^\s{1,8}(?P<open>[<\[])(?P<name>[^>\]]+)[>\]](?P<many>\.\.\.)?(?P<rest>.*)$")
# clap 4 shows an ArgAction::Append option as plain `--key <KEY>`: only its help text says it repeats.
REPEATS = re.compile(
    r"\(repeat\b|\brepeat (?:it|this|the option|for|to)\b|\brepeatable\b|"
    r"\b(?:can|may) be (?:repeated|(?:given|used|specified|passed|supplied|set)(?: \w+)? (?:multiple|several|many|more than once))",
    re.IGNORECASE,
)


@dataclass
class CliParam:
    """One thing the command line accepts."""

    name: str  # JSON property name
    kind: str  # "flag" | "option" | "positional"
    flag: str = ""  # --long or -s, for flags and options
    value_name: str = ""
    description: str = ""
    required: bool = False
    multiple: bool = False
    choices: list[str] = field(default_factory=list)
    default: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_help(text: str) -> list[CliParam]:
    """The parameters a clap help text describes, in order (help/version left out)."""
    usage = _usage_line(text)
    params: list[CliParam] = []
    section = ""
    for line in text.splitlines():
        header = re.match(r"^([A-Za-z][A-Za-z ]*):\s*(.*)$", line)
        if header and not line.startswith(" "):
            section = header.group(1).lower()
            continue
        if section in ("arguments", "args", "positional arguments") and POSITIONAL.match(line):
            params.append(_positional(POSITIONAL.match(line), usage))  # type: ignore[arg-type]
        elif section in OPTION_SECTIONS and re.match(r"^\s{1,8}-", line):
            param = _option(ENTRY.match(line))
            if param:
                params.append(param)
        elif params and line.strip() and re.match(r"^\s{9,}", line):
            _extend(params[-1], line.strip())
    return [p for p in params if p.name not in SKIPPED]


def _usage_line(text: str) -> str:
    match = re.search(r"(?im)^usage:\s*(.*)$", text) or re.search(r"(?im)^USAGE:\s*\n\s*(.*)$", text)
    return match.group(1) if match else ""


def _positional(match: re.Match[str], usage: str) -> CliParam:
    name = match.group("name")
    required = match.group("open") == "<" and f"[{name}]" not in usage and f"[{name}]..." not in usage
    param = CliParam(
        name=_json_name(name), kind="positional", value_name=name, required=required, multiple=bool(match.group("many"))
    )
    _extend(param, match.group("rest").strip())
    return param


def _option(match: re.Match[str] | None) -> CliParam | None:
    if match is None or not (match.group("long") or match.group("short")):
        return None
    flag = match.group("long") or match.group("short")
    value = match.group("value") or ""
    rest = match.group("rest").strip()
    counted = not value and rest.startswith("...")  # clap's ArgAction::Count: `-v...`
    param = CliParam(
        name=_json_name(flag.lstrip("-")),
        kind="option" if value else "flag",
        flag=flag,
        value_name=value.strip("<>[].").rstrip(">]"),
        multiple=value.endswith("...") or counted,
    )
    _extend(param, rest.removeprefix("...").strip() if counted else rest)
    return param


def _extend(param: CliParam, text: str) -> None:
    """Add description text, picking out clap's [default: ..] and [possible values: ..]."""
    default = re.search(r"\[default: ([^\]]*)\]", text)
    if default:
        param.default = default.group(1)
    choices = re.search(r"\[possible values: ([^\]]*)\]", text)
    if choices:
        param.choices = [c.strip() for c in choices.group(1).split(",")]
    cleaned = re.sub(r"\[(default|possible values): [^\]]*\]", "", text).strip()
    if cleaned:
        param.description = f"{param.description} {cleaned}".strip()
    if param.kind == "option" and REPEATS.search(param.description):
        param.multiple = True


def _json_name(raw: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", raw.lower().strip("<>[].")).strip("_") or "arg"


def json_schema(params: list[CliParam], *, with_stdin: bool = True) -> dict[str, Any]:
    """The tool's input schema (OpenAI strict-compatible, for OpenAI tools and MCP inputSchema: deliver/schema.py)."""
    fields = {p.name: _field(p) for p in params}
    if with_stdin:
        fields["stdin"] = Field("string", "Text passed to the tool on standard input.")
    return schema.closed_object(fields)


def _field(p: CliParam) -> Field:
    label = p.flag or f"<{p.value_name}>"
    text = f"{p.description} ({label})".strip() if p.description else label
    if p.default is not None:
        text += f" Default: {p.default}."
    if p.kind == "flag" and p.multiple:
        return Field("integer", f"{text} How many times to give the flag.")
    if p.kind == "flag":
        return Field("boolean", text)
    if p.multiple:
        return Field("array", f"{text} One item per value (repeatable).", p.required, tuple(p.choices))
    return Field("string", text, p.required, tuple(p.choices))


def to_argv(params: list[CliParam], arguments: dict[str, Any]) -> list[str]:
    """Command-line arguments for a JSON call: options and flags first, then positionals in order.

    null, "", false and [] mean the argument is absent (a strict client fills every property: schema.py)."""
    known = {p.name for p in params} | {"stdin"}
    unknown = sorted(set(arguments) - known)
    if unknown:
        raise ValueError(f"unknown argument(s): {', '.join(unknown)}")
    argv: list[str] = []
    positionals: list[str] = []
    missing: list[str] = []
    for p in params:
        value = arguments.get(p.name)
        values = [v for v in (value if isinstance(value, list) else [value]) if not schema.is_absent(v)]
        if p.required and not values:
            missing.append(p.name)
        if p.kind == "flag":
            argv += [p.flag] * (value if type(value) is int else 1 if values else 0)
        elif p.kind == "option":
            for item in values:
                argv += [p.flag, str(item)]
        else:
            positionals += [str(item) for item in values]
    if missing:
        raise ValueError(f"missing required argument(s): {', '.join(missing)}")
    return argv + positionals
