"""The catalog's tools: list them, read their manifests and MCP definitions, run them sandboxed, remove them. The
commands list, run and rm are declared here for every door (table.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from flakebot import config
from flakebot.commands.common import settings_or_default
from flakebot.commands.table import Command, Hints, Param
from flakebot.errors import CatalogError, UsageError

if TYPE_CHECKING:
    from flakebot.deliver.toolcall import ToolCall

logger = logging.getLogger(__name__)

CLI_API = frozenset({"cli", "api"})
MCP_API = frozenset({"mcp", "api"})
AGENT_LIST_FIELDS = ("name", "kind", "version", "summary", "need", "run_id")  # an entry as `list` gives it an agent
STDERR_TAIL = 4000  # characters of a `run`'s stderr an agent gets: its end, where the error is


def list_tools(
    settings: config.Settings | None = None,
    *,
    remote: Annotated[
        bool,
        Param("List the shared catalogs' tools (the catalogs setting) instead.", cli=("--remote",), doors=CLI_API),
    ] = False,
    from_url: Annotated[
        str | None, Param("With --remote: only this configured catalog (its URL).", cli=("--from",), doors=CLI_API)
    ] = None,
) -> dict[str, Any]:
    """List the tools in the catalog, or with --remote those the shared catalogs offer."""
    if remote or from_url:
        from flakebot.commands.share import list_remote

        return {"tools": list_remote(from_url, settings)}
    from flakebot.deliver.catalog import Catalog
    from flakebot.deliver.definitions import service_names

    catalog = Catalog.open(settings_or_default(settings))
    services = service_names(catalog)
    entries = sorted(catalog.tools().values(), key=lambda e: e["name"])
    return {"tools": [{**entry, "kind": "service" if entry["name"] in services else "tool"} for entry in entries]}


def tool_manifest(name: str, settings: config.Settings | None = None) -> dict[str, Any]:
    """A catalogued tool's manifest (its schemas, how to run it)."""
    from flakebot.deliver.catalog import show_tool

    manifest: dict[str, Any] = show_tool(name, settings_or_default(settings))["manifest"]
    if not manifest.get("nix_run_argv"):
        raise CatalogError(
            f"tool '{name}' has no manifest",
            fix=f"craft it again with 'flakebot craft --fresh' or remove it with 'flakebot rm {name}'",
        )
    return manifest


def _runnable_manifest(name: str, settings: config.Settings) -> dict[str, Any]:
    """A catalogued tool's manifest for a run; a service is refused at once, naming the door that starts it (run in
    the foreground it would listen and never answer)."""
    manifest = tool_manifest(name, settings)
    if manifest.get("kind") == "service":
        service = manifest.get("name", name)
        raise UsageError(
            f"{service} is a service, not a tool: it is started, not run",
            fix=f"start it with 'flakebot up {service}' (MCP: service_up), then send it requests",
        )
    return manifest


def tool_definitions(settings: config.Settings | None = None) -> list[dict[str, Any]]:
    """Every catalogued tool as an MCP tool definition (name, description, inputSchema), cached per version
    (deliver/definitions.py); services and tools without a manifest are left out."""
    from flakebot.deliver.catalog import Catalog
    from flakebot.deliver.definitions import catalog_definitions

    return catalog_definitions(Catalog.open(settings_or_default(settings)))


def tool_arguments(name: str, arguments: Any, settings: config.Settings | None = None) -> tuple[list[str], str | None]:
    """(argv, stdin or None) for a catalogued tool called with its schema's JSON arguments."""
    from flakebot.deliver.toolcall import arguments_to_argv

    return arguments_to_argv(tool_manifest(name, settings), arguments)


def call_tool(name: str, arguments: Any, settings: config.Settings | None = None, cwd: Path | None = None) -> ToolCall:
    """Run a catalogued tool (sandboxed) with JSON arguments, at `cwd` (default: the current directory; also the
    start of relative grant roots); its output and exit code come back as data."""
    from flakebot.deliver.toolcall import call

    settings = settings_or_default(settings)
    return call(_runnable_manifest(name, settings), arguments, settings=settings, cwd=cwd)


def call_tool_argv(
    name: str,
    args: list[str],
    settings: config.Settings | None = None,
    stdin: str | None = None,
    writable: list[str] | None = None,
    cwd: Path | None = None,
) -> ToolCall:
    """Run a catalogued tool (sandboxed) with command-line `args` and `stdin` (None: the caller's own), capturing
    its output; `writable`: the existing paths it may write (beneath a grant root); `cwd` as call_tool's."""
    from flakebot.deliver.toolcall import run_captured

    settings = settings_or_default(settings)
    return run_captured(_runnable_manifest(name, settings), args, stdin, settings=settings, writable=writable, cwd=cwd)


def run_tool(
    tool: Annotated[
        str,
        Param(
            "A catalogued tool: NAME (its current version) or NAME@VERSION.",
            positional=True,
            mcp_help="The tool's name, or NAME@VERSION for an earlier version.",
        ),
    ],
    args: Annotated[
        list[str] | None,
        Param(
            "Arguments for the tool (put them after --).",
            positional=True,
            mcp_help="Command-line arguments, one item each (a single string is split as a shell would, shlex); "
            "paths they name are read-only to the tool.",
        ),
    ] = None,
    *,
    args_json: Annotated[
        str | None,
        Param(
            "The tool's schema arguments as JSON, as a function-calling agent passes them: "
            '\'{"key": "id", "stdin": "..."}\'.',
            cli=("--args-json",),
            doors=CLI_API,
        ),
    ] = None,
    capture: Annotated[
        bool,
        Param(
            "Capture the tool's output: print {exit_code, stdout, stderr} as one JSON object.",
            cli=("--json",),
            doors=CLI_API,
        ),
    ] = False,
    stdin: Annotated[str | None, Param("Standard input.", doors=MCP_API)] = None,
    writable: Annotated[
        list[str] | None,
        Param(
            "An existing file or directory the tool may write (repeatable); pass --writable . to let it write here.",
            cli=("--writable",),
            mcp_help="Existing files or directories the tool may write, each beneath a grant root the user started "
            "the server with (its start directory unless configured); nothing else is writable.",
        ),
    ] = None,
    grant_roots: Annotated[
        list[str] | None,
        Param(
            "A directory of yours --writable paths may lie beneath, beside the grant_roots setting (default: here); "
            "never a configuration directory (repeatable).",
            cli=("--grant-root",),
            doors=CLI_API,
        ),
    ] = None,
    sandbox: Annotated[
        str | None,
        Param(
            "required (default): bubblewrap or stop; auto: plain-process fallback; off: the tool runs here with your "
            "rights, sees this whole machine (unsafe).",
            cli=("--sandbox",),
            doors=CLI_API,
        ),
    ] = None,
    settings: config.Settings | None = None,
    agent: bool = False,
    cwd: Path | None = None,
) -> dict[str, Any]:
    """Run a catalogued tool: flakebot run csv-dedup -- --key id data.csv, or flakebot run csv-dedup --args-json '{"key": "id"}'

    The tool runs sandboxed in an empty directory at this directory's path.
    The files and directories its arguments name are there, read-only (relative paths work); nothing else is.
    It writes only where you allow it: --writable out.csv (create the file first), or --writable . for output
    it writes into this directory; a writable path must lie beneath a grant root (this directory, the grant_roots
    setting, --grant-root DIR). /, your home and the directories above this one are refused as arguments.
    No network, none of your environment variables.
    """
    settings = _run_settings(settings_or_default(settings), grant_roots, sandbox)
    argv, arguments = _argv(args), _json_arguments(args_json) if args_json is not None else None
    if arguments is not None and argv:
        raise UsageError(
            "give the tool's arguments either after -- or as --args-json, not both",
            fix="move them all into the --args-json object",
        )
    allowed = list(writable or [])
    if arguments is not None:  # the JSON call's own `writable` (toolcall is imported only for JSON calls)
        from flakebot.deliver.toolcall import writable_argument

        allowed += writable_argument(arguments)
    if agent:  # an agent's tool never reads the server's own standard input (the MCP stream)
        stdin = stdin or ""
    if capture or agent:
        # Without JSON arguments the tool reads the caller's standard input (or `stdin`), as it does attached.
        if arguments is None:
            return call_tool_argv(tool, argv, settings, stdin=stdin, writable=allowed, cwd=cwd).to_dict()
        with_writable = {**arguments, "writable": allowed} if isinstance(arguments, dict) else arguments
        return call_tool(tool, with_writable, settings, cwd=cwd).to_dict()
    if arguments is not None:
        argv, stdin = tool_arguments(tool, arguments, settings)
    return {"exit_code": _run_attached(tool, argv, settings, stdin=stdin, writable=allowed)}


def _run_settings(settings: config.Settings, grant_roots: list[str] | None, sandbox: str | None) -> config.Settings:
    """The settings a run takes: the user's --grant-root directories added, --sandbox in place of the setting."""
    import dataclasses

    from flakebot.deliver.grants import check_flag_roots, widened

    check_flag_roots(grant_roots or [], settings, Path.cwd())
    settings = widened(settings, grant_roots or [])
    if sandbox is not None:
        settings = dataclasses.replace(settings, sandbox=config.coerce("sandbox", sandbox, "--sandbox"))
    return settings


def _argv(value: Any) -> list[str]:
    """`run`'s args: a list (items as strings), or one string split as a shell would (over MCP); None is none."""
    import shlex

    if value is None:
        return []
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise UsageError(f"cannot split args {value!r}: {exc}", fix="pass args as a list of strings") from None
    return [str(item) for item in value]


def _json_arguments(text: str) -> Any:
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--args-json is not JSON: {exc}", fix='pass one object, e.g. --args-json \'{"stdin": "a\\nb\\n"}\''
        ) from None
    except RecursionError:  # json's decoder recurses per level
        raise UsageError(
            "--args-json is nested too deeply to read", fix="pass one flat object of the tool's arguments"
        ) from None


def _run_attached(name: str, args: list[str], settings: config.Settings, stdin: str | None, writable: list[str]) -> int:
    """Run a catalogued tool in the sandbox with the caller's stdin (or `stdin`), stdout and stderr; its exit code.
    It runs in an empty directory: paths its arguments name are readable, only `writable` ones writable
    (deliver.toolrun)."""
    from flakebot.deliver.toolrun import run_attached

    return run_attached(_runnable_manifest(name, settings), args, settings=settings, stdin=stdin, writable=writable)


def remove_tool(
    tool: Annotated[
        str,
        Param(
            "A catalogued tool: NAME (every version) or NAME@VERSION (that one).",
            positional=True,
            mcp_help="The tool's name.",
        ),
    ],
    settings: config.Settings | None = None,
) -> dict[str, Any]:
    """Remove a tool from the catalog (its flakes, manifests and GC roots), or one version of it."""
    from flakebot.deliver.catalog import Catalog

    return Catalog.open(settings_or_default(settings)).remove(tool)


def _run_description() -> str:
    from flakebot.deliver.toolcall import TRUNCATION

    return (
        "Run a crafted tool with raw command-line arguments (the tool's own MCP tool takes schema arguments "
        f"instead). {TRUNCATION}"
    )


def _agent_list(result: dict[str, Any]) -> dict[str, Any]:
    return {"tools": [{k: entry.get(k) for k in AGENT_LIST_FIELDS} for entry in result["tools"]]}


def _agent_run(call: dict[str, Any]) -> dict[str, Any]:
    """A run as an agent gets it: ok (the tool exited 0), its output, the end of its stderr."""
    kept = {k: v for k, v in call.items() if k not in ("tool", "argv")} | {"stderr": call["stderr"][-STDERR_TAIL:]}
    return {"ok": call["exit_code"] == 0, **kept}


COMMANDS = [
    Command(
        "list",
        list_tools,
        mcp="list",
        hints=Hints("List crafted tools", read_only=True, idempotent=True),
        agent=_agent_list,
        mcp_description="List the crafted tools in flakebot's catalog with their summaries (kind: tool, or service: "
        "started with service_up, not called).",
    ),
    Command(
        "run",
        run_tool,
        mcp="run",
        hints=Hints("Run a crafted tool", destructive=True),
        agent=_agent_run,
        exit_code=lambda call: int(call["exit_code"]),
        cli_extra={"allow_extra_args": True, "ignore_unknown_options": True},
        mcp_description=_run_description,
    ),
    Command(
        "rm",
        remove_tool,
        mcp="rm",
        hints=Hints("Remove a crafted tool", destructive=True, idempotent=True),
        changes_catalog=True,
        mcp_description="Remove a crafted tool from the catalog.",
    ),
]
