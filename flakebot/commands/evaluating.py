"""eval: every need of a suite crafted and the tools scored on held-out checks (flakebot.evaluate's harness, handed
the craft function: evaluate/ does not import the commands)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from flakebot import config
from flakebot.commands.common import settings_or_default
from flakebot.commands.table import Command, Param

if TYPE_CHECKING:
    from flakebot.evaluate.harness import EvalReport


def evaluate(
    suite: Annotated[
        str, Param("A shipped suite's name or a directory holding suite.json.", positional=True)
    ] = "default",
    *,
    model: Annotated[
        str | None,
        Param("Give every need to this model (provider:model); default: replay each need's hand-written session."),
    ] = None,
    only: Annotated[list[str] | None, Param("Evaluate only this need (repeatable).")] = None,
    out_dir: Annotated[Path, Param("Directory for eval.md and eval.json.", cli=("--out",))] = Path("bench"),
    record: Annotated[
        Path | None, Param("Write each need's session as a replayable model script (DIR/NEED.json).")
    ] = None,
    settings: config.Settings | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[EvalReport, dict[str, Path]]:
    """Craft every need of a suite and score the tools on held-out checks; writes bench/eval.md and bench/eval.json."""
    from flakebot.commands.craft import craft
    from flakebot.evaluate.harness import run_eval

    return run_eval(
        suite,
        model=model,
        only=only,
        out_dir=Path(out_dir),
        record=Path(record) if record is not None else None,
        settings=settings_or_default(settings),
        progress=progress,
        craft=craft,
    )


def _data(result: tuple[EvalReport, dict[str, Path]]) -> dict[str, Any]:
    return result[0].to_dict()


def _all_passed(report: dict[str, Any]) -> int:
    """1 when a need did not pass."""
    return 1 if report["totals"]["passed"] < len(report["results"]) else 0


COMMANDS = [Command("eval", evaluate, doors=frozenset({"cli", "api"}), data=_data, exit_code=_all_passed)]
