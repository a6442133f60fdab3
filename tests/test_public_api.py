"""The public surface: the names `flakebot` and flakebot.api export, each documented, typed for type checkers,
and `import flakebot` cheap (no SDK, no pipeline) until a name is used."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flakebot
from flakebot import api, errors, events
from flakebot.commands.table import commands as table_commands
from tests.conftest import REPO

TOP = [
    "CraftResult",
    "FlakebotError",
    "RunRequest",
    "Settings",
    "__version__",
    "call_tool",
    "craft",
    "down",
    "improve",
    "list_services",
    "list_tools",
    "package",
    "resume",
    "search",
    "status",
    "up",
]
# flakebot.api: the library functions the doors use beside the commands, and every command of the table (bound from
# it: tests/commands/test_table.py), the request types and CraftResult
LIBRARY = [
    "CraftResult",
    "Improvement",
    "RunRequest",
    "call_tool",
    "call_tool_argv",
    "craft",  # the keyword forms of the craft_request, improve_request and package_request commands
    "improve",
    "list_remote",  # list --remote's listing on its own
    "package",
    "resume",  # resume_report's run, for callers that want the Run's outputs only
    "run_tool",
    "show_run",
    "tool_arguments",
    "tool_definitions",
    "tool_manifest",
]
# public-looking, but they take a Run or its CraftResult (flakebot's own), or serve the team worker (in_flight)
API_INTERNAL = {"run_result", "craft_result", "with_service_note", "in_flight"}
# the command table's own types (flakebot.commands.table): how a command is declared, not a command
TABLE = {
    "Command",
    "Hints",
    "Param",
    "Parameter",
    "commands",
    "by_mcp_name",
    "parameters",
    "plain",
    "checked",
    "check_types",
    "check_values",
    "required_text",
    "schema",
    "spelled",
    "value_schema",
    "typed",
    "bound",
    "check_given",
}  # the table and the checks every door shares
# what the commands share among themselves (flakebot.commands.common), not the API
COMMON = {
    "settings_or_default",
    "workdir_of",
    "run_overrides",
    "check_limits",
    "check_craft_options",
    "check_host",
    "check_crate",
}
API_REEXPORTED = {"RunRequest", "Improvement"}  # the request types, defined in flakebot.pipeline.request
# imported only when a model, a registry, a repository or the CLI is used
HEAVY = ("openai", "groq", "httpx", "git", "mcp", "rich", "typer", "jinja2", "tomlkit", "flakebot.api")


def test_the_exported_names_are_these() -> None:
    assert flakebot.__all__ == TOP
    commands = {c.api for c in table_commands() if "api" in c.doors}
    assert api.__all__ == sorted({*LIBRARY, *commands})


def test_every_public_function_and_class_of_the_commands_is_exported_or_named_internal() -> None:
    """The API is the commands (flakebot.commands, one module per verb) re-exported: a public name defined there is
    either in api.__all__ or named internal, so nothing is public by accident."""
    import importlib
    import pkgutil

    import flakebot.commands

    defined = {api.evaluate.__name__}
    for info in pkgutil.iter_modules(flakebot.commands.__path__):
        module = importlib.import_module(f"flakebot.commands.{info.name}")
        defined |= {
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and (inspect.isfunction(value) or inspect.isclass(value))
            and value.__module__ == module.__name__
        }
    not_api = {c.api for c in table_commands() if "api" not in c.doors}  # a command of the CLI only (worker)
    assert defined - API_INTERNAL - COMMON - TABLE - not_api == set(api.__all__) - API_REEXPORTED


@pytest.mark.parametrize("module", [flakebot, api, errors, events], ids=lambda m: m.__name__)
def test_each_exported_name_resolves_and_is_documented(module: object) -> None:
    for name in module.__all__:  # type: ignore[attr-defined]
        value = getattr(module, name)
        if name == "__version__" or not (inspect.isfunction(value) or inspect.isclass(value)):
            continue  # EventSink, a type alias, is documented by its comment
        doc = inspect.getdoc(value) or ""
        # a dataclass without a docstring gets its signature as __doc__
        assert doc and not doc.startswith(f"{name}("), f"{module.__name__}.{name} has no docstring"  # type: ignore[attr-defined]


def test_top_level_names_are_the_library_objects_themselves() -> None:
    assert flakebot.craft is api.craft and flakebot.CraftResult is api.CraftResult
    assert flakebot.FlakebotError is errors.FlakebotError and flakebot.RunRequest is api.RunRequest
    with pytest.raises(AttributeError, match="no attribute 'craftt'"):
        flakebot.craftt  # type: ignore[attr-defined]  # noqa: B018


def _loaded_after(code: str) -> list[str]:
    probe = f"import sys\n{code}\nprint('\\n'.join(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    return result.stdout.split()


def test_importing_flakebot_imports_no_sdk_and_not_the_api() -> None:
    loaded = _loaded_after("import flakebot")
    assert [m for m in loaded if m.split(".")[0] in HEAVY or m in HEAVY] == []
    assert "flakebot" in loaded


def test_using_a_name_imports_the_api_but_still_no_model_sdk() -> None:
    loaded = _loaded_after("import flakebot\nflakebot.craft")
    assert "flakebot.api" in loaded
    assert [m for m in loaded if m.split(".")[0] in ("openai", "groq", "mcp", "typer", "rich")] == []


def test_flakebot_run_starts_without_typer_rich_or_an_sdk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`flakebot run TOOL -- ARGS` (an agent's call in a loop) is read without building the typer app."""
    run = (
        "sys.argv = ['flakebot', 'run', 'nope', '--', 'x']\nfrom flakebot.cli import main\n"
        "try:\n    main()\nexcept Exception as exc:\n    print(type(exc).__name__)"
    )
    for sub in ("config", "data", "cache", "state"):
        monkeypatch.setenv(f"XDG_{sub.upper()}_HOME", str(tmp_path / sub))
    monkeypatch.setenv("FLAKEBOT_RAISE_ERRORS", "1")  # the error is raised, not printed (printing it imports rich)
    loaded = _loaded_after(run)
    assert loaded[0] == "CatalogError"  # it looked the tool up: the command ran
    assert [m for m in loaded if m.split(".")[0] in ("typer", "rich", "pydantic", "tomlkit", "mcp")] == []


def test_the_mcp_server_imports_the_sdks_server_without_its_client() -> None:
    loaded = _loaded_after("from flakebot.mcp.server import load_sdk\nload_sdk()")
    assert {"mcp.server.lowlevel.server", "mcp.server.stdio", "mcp_types"} <= set(loaded)
    assert [m for m in loaded if m.startswith(("mcp.client", "mcp.server.mcpserver", "typer"))] == []


def test_the_sdks_wire_models_are_built_when_first_used_and_then_work() -> None:
    """load_sdk defers the wire models' builds (start-up); a deferred model still validates and dumps as built."""
    probe = (
        "from flakebot.mcp.server import load_sdk\nload_sdk()\n"
        "from mcp_types import _v2025_11_25 as wire\n"
        "print(wire.Tool.__pydantic_complete__)\n"
        "tool = wire.Tool.model_validate({'name': 'hi', 'inputSchema': {'type': 'object'}})\n"
        "print(wire.Tool.__pydantic_complete__, tool.model_dump(by_alias=True, exclude_none=True))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.splitlines() == ["False", "True {'inputSchema': {'type': 'object'}, 'name': 'hi'}"]


@pytest.mark.slow
def test_type_checkers_see_the_names_typed_and_a_misspelt_name_as_an_error(tmp_path: Path) -> None:
    snippet = tmp_path / "use.py"
    snippet.write_text('import flakebot\n\nreveal_type(flakebot.craft)\nflakebot.craftt("x")\n')
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), str(snippet)],
        capture_output=True,
        text=True,
        env={**os.environ, "MYPYPATH": str(REPO)},
    )
    assert "-> flakebot.commands.craft.CraftResult" in result.stdout, result.stdout
    assert 'Module has no attribute "craftt"' in result.stdout
