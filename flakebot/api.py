"""What Python users call: every command of the command table (flakebot.commands.table) under its function's name,
bound from the table (a command added there is here too), and the library functions the doors use beside them
(a crafted tool's call and definitions). Each function returns plain data or a typed result."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flakebot import config
from flakebot.commands.catalog_tools import call_tool, call_tool_argv, tool_arguments, tool_definitions, tool_manifest
from flakebot.commands.common import settings_or_default
from flakebot.commands.craft import CraftResult, craft, craft_request, craft_result
from flakebot.commands.improve import improve, improve_request
from flakebot.commands.packaging import package, package_request
from flakebot.commands.runs import list_runs, remove_runs, resume, resume_report, run_result, show, show_run, status
from flakebot.commands.setup import models, search, set_setting, settings_report
from flakebot.commands.share import list_remote
from flakebot.commands.table import commands
from flakebot.pipeline.request import Improvement, RunRequest

if TYPE_CHECKING:
    from flakebot.evaluate.harness import EvalReport

__all__ = [  # the public API; run_result and craft_result take a Run, flakebot's own
    "CraftResult",
    "Improvement",
    "RunRequest",
    "call_tool",
    "call_tool_argv",
    "craft",
    "craft_request",
    "evaluate",
    "improve",
    "improve_request",
    "list_remote",
    "list_runs",
    "models",
    "package",
    "package_request",
    "remove_runs",
    "resume",
    "resume_report",
    "search",
    "set_setting",
    "settings_report",
    "show",
    "show_run",
    "status",
    "tool_arguments",
    "tool_definitions",
    "tool_manifest",
]
INTERNAL = (craft_result, run_result)  # public-looking, but they take a Run (flakebot's own)

# The command table's functions: each command under its function's name (commands/table.py).
COMMANDS = {command.api: command.run for command in commands() if "api" in command.doors}
globals().update(COMMANDS)
__all__ = sorted({*__all__, *COMMANDS})


def __getattr__(name: str) -> Any:  # for type checkers: a command's function is bound above, from the table
    raise AttributeError(f"module 'flakebot.api' has no attribute {name!r}")


def evaluate(
    suite: str = "default",
    *,
    model: str | None = None,
    only: list[str] | None = None,
    out_dir: Path = Path("bench"),
    record: Path | None = None,
    settings: config.Settings | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[EvalReport, dict[str, Path]]:
    """Craft every need of a suite and score the tools on held-out checks; the report and the files written
    (out_dir/eval.md, out_dir/eval.json). `model`: give every need to it; default: each need's own session."""
    from flakebot.evaluate.harness import run_eval

    return run_eval(
        suite,
        model=model,
        only=only,
        out_dir=out_dir,
        record=record,
        settings=settings_or_default(settings),
        progress=progress,
    )
