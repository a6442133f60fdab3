"""The usage instructions a calling agent gets: built from facts flakebot observed, not from model prose."""

from __future__ import annotations

import shlex
import time
from typing import Any

from flakebot.deliver.helpparse import CliParam, json_schema, parse_help
from flakebot.modeltext import tool_description
from flakebot.render import render

MANIFEST_FORMAT = 1


def tool_schemas(
    name: str, summary: str, params: list[CliParam], usage: str = ""
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(OpenAI function-calling tool, MCP tool definition) for the tool's command line; the description fences
    the summary and usage the model wrote and says they are data."""
    schema = json_schema(params)
    description = tool_description(summary, usage)
    openai_tool = {
        "type": "function",
        # the schema is strict-compatible as built (deliver/schema.py)
        "function": {
            "name": name.replace("-", "_"),
            "description": description,
            "parameters": schema,
            "strict": True,
        },
    }
    mcp_tool = {"name": name, "description": description, "inputSchema": schema}
    return openai_tool, mcp_tool


def shell_command(nix_run: list[str], args: list[str], stdin: str = "") -> str:
    """A copy-pasteable one-line shell command running the tool with `args` (and `stdin` piped in)."""
    command = shlex.join([*nix_run, "--", *args])
    if not stdin:
        return command
    # printf turns \n back into newlines, so the input stays on one line; % and \ are escaped for it.
    escaped = stdin.replace("\\", "\\\\").replace("%", "%%").replace("\n", "\\n").replace("\t", "\\t")
    return f"printf {shlex.quote(escaped)} | {command}"


def install_command(nix_run: list[str]) -> list[str]:
    """`nix profile install` of the same flake, with the same options as the run command."""
    at = nix_run.index("run")
    return [*nix_run[:at], "profile", "install", *nix_run[at + 1 :]]


def build_manifest(
    *,
    spec: dict[str, Any],
    need: str,
    package: dict[str, Any],
    flake_ref: str,
    nix_run: list[str],
    help_text: str,
    examples: list[dict[str, Any]],
    verification: dict[str, Any],
    origin: dict[str, Any],
    run_id: str,
    sandbox: str = "required",
    corrected_examples: list[dict[str, Any]] | None = None,
    untested: str = "",
) -> dict[str, Any]:
    params = parse_help(help_text)
    openai_tool, mcp_tool = tool_schemas(spec["name"], spec["summary"], params, spec.get("usage", ""))
    return {
        "format": MANIFEST_FORMAT,
        "name": spec["name"],
        "summary": spec["summary"],
        "need": need,
        "version": package.get("version", ""),  # the crate's; the catalog's version of the tool is catalog_version
        "package": package.get("pname", ""),
        "usage": spec.get("usage", ""),
        "flake_ref": flake_ref,
        "nix_run": shlex.join(nix_run) + " -- ARGS",
        "nix_run_argv": nix_run,
        "installation_command": shlex.join(install_command(nix_run)),
        "verification_command": verification,
        "help_text": help_text,
        "parameters": [p.to_dict() for p in params],
        "examples": examples,
        # the acceptance examples whole (with their files' contents): what `flakebot improve` keeps
        "spec": {
            k: spec.get(k) for k in ("name", "summary", "usage", "search_query", "examples", "inherited_examples")
        },
        "corrected_examples": corrected_examples
        or [],  # examples the spec model corrected after a dispute in the edit loop
        "openai_tool": openai_tool,
        "mcp_tool": mcp_tool,
        "store_path": package.get("store_path", ""),
        "main_program": package.get("main_program", spec["name"]),
        "nixpkgs_mode": package.get("nixpkgs_mode", ""),
        "portable": bool(package.get("portable", False)),  # false: the commands above work only on this machine
        "portable_reason": package.get("portable_reason", ""),
        "build": build_facts(package, untested),
        "smoke": smoke_facts(package),
        "origin": origin,
        "run_id": run_id,
        "sandbox": sandbox,  # "off": the tool's code ran unisolated while it was crafted
        "built_at": time.time(),
    }


def build_facts(package: dict[str, Any], untested: str = "") -> dict[str, Any]:
    """How the flake builds the tool: native inputs with the reason for each, features turned on, tests that could not run.

    `untested` comes from the acquire stage (fork mode); a packaged copy says it through its dropped dev-dependencies."""
    dropped = package.get("dropped_dev_dependencies") or []
    if dropped and not untested:
        untested = "the crate's own tests did not run: they need dev-dependencies left out: " + ", ".join(
            f"{d['name']} ({d['reason']})" for d in dropped
        )
    return {
        "native_inputs": package.get("native_inputs", {}),
        "features": package.get("build_features", []),
        "untested": untested,
    }


def smoke_facts(package: dict[str, Any]) -> dict[str, Any]:
    """The smoke run's level (help, usage, runs, starts-only; nix/smoke.py) with its evidence: the command, its exit code
    and the first lines it printed. A package made before levels passed only at `help`."""
    smoke = package.get("smoke") or {}
    level = smoke.get("level") or ("help" if smoke.get("exit_code") == 0 else "")
    return {
        "level": level,
        "meaning": smoke.get("meaning", ""),
        "command": smoke.get("command", ""),
        "exit_code": smoke.get("exit_code"),
        "first_lines": smoke.get("first_lines") or str(smoke.get("output_head", "")).splitlines()[:8],
    }


def usage_markdown(manifest: dict[str, Any]) -> str:
    """USAGE.md: the manifest for a reader."""
    return render("usage.md.j2", m=manifest)
