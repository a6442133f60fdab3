"""The command table (flakebot.commands.table) is the one place a command is declared: the CLI, the MCP tools and
the Python API are made from it, no door wires a command by hand, and a command added to the table (a module and
its line in MODULES) reaches all three doors."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Annotated, Any

import typer.main
from mcp import ClientSession, StdioServerParameters, stdio_client

from flakebot import api
from flakebot.cli.app import app
from flakebot.commands.table import Command, Param, commands
from flakebot.mcp.server import OWN_TOOLS
from flakebot.mcp.tooltable import table_tools
from flakebot.pipeline.request import RunRequest

PACKAGE = Path(__file__).resolve().parents[2] / "flakebot"
# `flakebot mcp` (stdio) and `flakebot serve` (HTTP) start the MCP door themselves: doors, not commands
DOOR_ENTRIES = {"mcp", "serve"}


def _cli_commands() -> dict[str, Any]:
    """Every CLI command by its full name ("config show" for a group's)."""
    root = typer.main.get_command(app)
    found = {}
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        for sub, inner in getattr(command, "commands", {}).items():
            found[f"{name} {sub}"] = inner
        found[name] = command
    return found


def test_every_command_is_in_each_door_it_names() -> None:
    cli = _cli_commands()
    for command in commands():
        if "cli" in command.doors:
            made = cli[command.name]
            names = {p.name for p in made.params}
            assert {p.name for p in command.params("cli") if not p.param.request} <= names, command.name
        if command.mcp:
            properties = OWN_TOOLS[command.mcp][1]["properties"]
            plain = {p.name for p in command.params("mcp") if not p.param.request}
            assert plain <= set(properties), command.mcp
        if "api" in command.doors:
            assert getattr(api, command.api).__wrapped__ is command.run  # checked first (table.checked)
            assert command.api in api.__all__


def test_the_doors_offer_nothing_the_table_does_not_declare() -> None:
    declared_cli = {c.name for c in commands() if "cli" in c.doors}
    groups = {name.split(" ")[0] for name in declared_cli if " " in name}
    assert set(_cli_commands()) - groups - DOOR_ENTRIES == declared_cli
    assert set(OWN_TOOLS) == set(table_tools())


def test_integers_are_declared_as_integers() -> None:
    """A number an agent sends as 1 is an integer: smolagents refuses a call whose integer is declared `number`."""
    for name, (_, schema) in OWN_TOOLS.items():
        for key, prop in schema["properties"].items():
            kinds = prop["type"] if isinstance(prop["type"], list) else [prop["type"]]
            assert "number" not in kinds, f"{name}.{key}"


def _door_files() -> list[Path]:
    return [*sorted((PACKAGE / "cli").glob("*.py")), *sorted((PACKAGE / "mcp").glob("*.py")), PACKAGE / "api.py"]


def test_no_door_wires_a_command_by_hand() -> None:
    """Only cli/generated.py makes typer commands (beside the door entries), the MCP server has no tool methods of
    its own, and flakebot.api imports no command function by name."""
    command_functions = {c.api for c in commands()}
    problems = []
    for path in _door_files():
        tree = ast.parse(path.read_text())
        where = path.relative_to(PACKAGE)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "command":
                if path.name == "generated.py":
                    continue
                name = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
                if name not in DOOR_ENTRIES:
                    problems.append(f"{where}: a typer command {name!r} made by hand")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(("_tool_", "_work_")):
                problems.append(f"{where}: {node.name} wires an MCP tool by hand")
            if isinstance(node, ast.ClassDef) and node.name == "OwnTools":
                problems.append(f"{where}: OwnTools declares MCP tools by hand")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flakebot.commands."):
                if node.module != "flakebot.commands.table":
                    imported = {a.name for a in node.names} & command_functions
                    problems += [f"{where}: imports the command function {n} by hand" for n in sorted(imported)]
    assert problems == []


def test_a_service_command_declares_its_kind_of_result() -> None:
    """Every command's data is a dict (what --json prints and an agent gets), whatever its function returns."""
    for command in commands():
        assert isinstance(command, Command)
        assert command.summary, f"{command.name} has no help"


# ---------------------------------------------------------------- adding a command


HELLO = '''
"""A command added to the table for a test: it greets."""

from typing import Annotated, Any

from flakebot.commands.table import Command, Hints, Param


def hello(
    name: Annotated[str, Param("Who to greet.", positional=True)],
    times: Annotated[int, Param("How many times.")] = 1,
    settings: Any = None,
) -> dict[str, Any]:
    """Greet someone, TIMES times."""
    return {"greeting": " ".join([f"hello {name}"] * times), "workdir_set": settings is not None}


COMMANDS = [Command("hello", hello, mcp="hello", hints=Hints("Greet", read_only=True), text=lambda r: r["greeting"])]
'''


def _prelude(folder: Path) -> str:
    """Python that adds `hello` (a module in `folder`) to the table as its one line, then runs the CLI's entry."""
    return textwrap.dedent(f"""
        import sys
        import flakebot.commands
        flakebot.commands.__path__.append({str(folder)!r})
        import flakebot.commands.table as table
        table.MODULES = (*table.MODULES, "hello")
        from flakebot.cli.entry import main
        sys.argv = ["flakebot", *sys.argv[1:]]
        main()
    """)


def test_a_command_added_to_the_table_reaches_the_cli_mcp_and_api(flakebot_home: Path, tmp_path: Path) -> None:
    (tmp_path / "hello.py").write_text(HELLO)
    prelude = _prelude(tmp_path)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", prelude, *args], capture_output=True, text=True, timeout=120)

    helped = cli("hello", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "Greet someone" in helped.stdout and "--times" in helped.stdout
    said = cli("hello", "ann", "--times", "2")
    assert said.returncode == 0, said.stderr
    assert said.stdout.strip() == "hello ann hello ann"
    data = json.loads(cli("hello", "bob", "--json").stdout.splitlines()[-1])
    assert data == {"result": {"greeting": "hello bob", "workdir_set": True}}

    async def over_mcp() -> tuple[Any, Any]:
        params = StdioServerParameters(command=sys.executable, args=["-c", prelude, "mcp"], env=dict(os.environ))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = {t.name: t for t in (await session.list_tools()).tools}
            called = await session.call_tool("hello", {"name": "cy", "times": 3})
            return tools["hello"], called

    tool, called = asyncio.run(over_mcp())
    assert tool.description == "Greet someone, TIMES times."
    assert tool.input_schema["properties"]["times"]["type"] == ["integer", "null"]
    assert tool.annotations.read_only_hint is True
    assert json.loads(called.content[0].text) == {
        "ok": True,
        "greeting": "hello cy hello cy hello cy",
        "workdir_set": True,
    }

    python = textwrap.dedent(f"""
        import flakebot.commands
        flakebot.commands.__path__.append({str(tmp_path)!r})
        import flakebot.commands.table as table
        table.MODULES = (*table.MODULES, "hello")
        from flakebot import api
        print(api.hello("dee")["greeting"], "hello" in api.__all__)
    """)
    from_api = subprocess.run([sys.executable, "-c", python], capture_output=True, text=True, timeout=60)
    assert from_api.stdout.split() == ["hello", "dee", "True"], from_api.stderr


def _checked_export(
    service: Annotated[str, Param("A service.", positional=True)],
    run_check: Annotated[bool, Param("Check what was written.", cli=("--check/--no-check",))] = True,
) -> dict[str, Any]:
    """Export, checked unless told not to."""
    return {"service": service, "checked": run_check}


def test_a_flag_that_defaults_to_true_can_be_turned_off_over_mcp() -> None:
    """`false` reads as absent over MCP (hosts that strip null make a model send it), and absent is the default:
    for a flag whose default is true that made false unsayable."""
    from flakebot.mcp.tooltable import arguments, input_schema

    command = Command("checked-export", _checked_export, mcp="checked_export")
    assert input_schema(command)["properties"]["run_check"]["type"] == ["boolean", "null"]
    for given, checked in ((False, False), (None, True), (True, True)):
        assert command.call(arguments(command, {"service": "kv", "run_check": given}))["checked"] is checked, given
    assert command.call(arguments(command, {"service": "kv"}))["checked"] is True


def test_ctrl_c_during_up_all_names_no_empty_service(flakebot_home: Path) -> None:
    """`up --all` names no service: Ctrl-C while it works says so, not "interrupted:  is not started"."""
    prelude = textwrap.dedent("""
        import sys
        import flakebot.services.control as control
        def interrupted(settings):
            raise KeyboardInterrupt
        control.up_all = interrupted
        from flakebot.cli.entry import main
        sys.argv = ["flakebot", *sys.argv[1:]]
        main()
    """)
    done = subprocess.run([sys.executable, "-c", prelude, "up", "--all"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "interrupted" in line and "  " not in line and "'flakebot down '" not in line, line
    assert "flakebot services" in line, line


def _package_like(request: Annotated[RunRequest, Param("The crate to package and how.", request="package")]) -> Any:
    """Package a crate."""
    return {"target": request.target}


def test_a_request_field_the_schema_requires_is_refused_when_empty() -> None:
    """A RunRequest's required field (package's target) sent as "" or blank is refused in one line before any work,
    as the hand-written tools refused it ("'target' is required"), not a request with no target."""
    import pytest

    from flakebot.errors import UsageError
    from flakebot.mcp.tooltable import arguments, input_schema

    command = Command("package-like", _package_like, mcp="package_like")
    assert input_schema(command)["properties"]["target"]["type"] == "string"
    for empty in ("", "  ", None):
        with pytest.raises(UsageError, match="'target' is required"):
            arguments(command, {"target": empty})
    assert command.call(arguments(command, {"target": "hexyl"})) == {"target": "hexyl"}
