"""What Python users call: every command of the command table (flakebot.commands.table) under its function's name,
bound from the table (a command added there is here too), and the library functions the doors use beside them
(a crafted tool's call and definitions). Each function returns plain data or a typed result."""

from __future__ import annotations

from typing import Any

from flakebot.commands import catalog_tools, runs, share, wrap
from flakebot.commands import craft as crafting
from flakebot.commands import improve as improving
from flakebot.commands.catalog_tools import tool_definitions
from flakebot.commands.craft import CraftResult, craft_result
from flakebot.commands.runs import run_result
from flakebot.commands.table import bound, checked, commands, typed
from flakebot.pipeline.request import Improvement, RunRequest

__all__ = [  # the public API; run_result and craft_result take a Run, flakebot's own
    "CraftResult",
    "Improvement",
    "RunRequest",
    "call_tool",
    "call_tool_argv",
    "craft",
    "improve",
    "list_remote",
    "package",
    "resume",
    "show_run",
    "tool_arguments",
    "tool_definitions",
    "tool_manifest",
]
# the library functions, their arguments checked against their annotations as the commands' are (table.typed)
call_tool = typed(catalog_tools.call_tool)
call_tool_argv = typed(catalog_tools.call_tool_argv)
tool_arguments = typed(catalog_tools.tool_arguments)
tool_manifest = typed(catalog_tools.tool_manifest)
resume = typed(runs.resume)
show_run = typed(runs.show_run)
list_remote = typed(share.list_remote)
# the request-building functions check their own keywords (from_keywords); bound to their signatures here
craft = bound(crafting.craft)
improve = bound(improving.improve)
package = bound(wrap.package)
INTERNAL = (craft_result, run_result)  # public-looking, but they take a Run (flakebot's own)

# The command table's functions: each command under its function's name (commands/table.py), its arguments checked
# against the table's declaration as MCP's and the CLI's are (table.checked: types never coerced, blank or out of
# range refused) before it runs. Each one's __wrapped__ is the table's own function.
COMMANDS = {command.api: checked(command) for command in commands() if "api" in command.doors}
globals().update(COMMANDS)
__all__ = sorted({*__all__, *COMMANDS})


def __getattr__(name: str) -> Any:  # for type checkers: a command's function is bound above, from the table
    raise AttributeError(f"module 'flakebot.api' has no attribute {name!r}")
