"""What the CLI, the MCP server and Python users call. Each function returns plain data or a typed result."""

from __future__ import annotations

import time
from typing import Any

from flakebot import config
from flakebot.errors import RunError
from flakebot.run import Run


def _settings(settings: config.Settings | None) -> config.Settings:
    return settings or config.load()


def show_run(run_id: str, settings: config.Settings | None = None) -> dict[str, Any]:
    """A run's stage timeline and outcome."""
    settings = _settings(settings)
    run = Run.load(_workdir(settings), run_id)
    from flakebot.pipeline import stage_names

    try:
        names = stage_names(run.state["pipeline"])
    except RunError:
        names = list(run.state["stages"])
    stages = [{"name": n, **run.state["stages"].get(n, {"status": "pending"})} for n in names]
    return {
        "kind": "run",
        "id": run.id,
        "dir": str(run.dir),
        "pipeline": run.state["pipeline"],
        "need": run.state.get("need", ""),
        "status": run.status,
        "created": run.state.get("created"),
        "age_seconds": round(time.time() - run.state.get("created", time.time())),
        "stages": stages,
        "error": run.state.get("error"),
        "outputs": run.state["outputs"],
    }


def show(name: str, settings: config.Settings | None = None) -> dict[str, Any]:
    """A run (by id) or, failing that, a catalogued tool (by name)."""
    settings = _settings(settings)
    try:
        return show_run(name, settings)
    except RunError as run_error:
        if run_error.details.get("reason") != "not_found":
            raise
    from flakebot.deliver import catalog
    from flakebot.errors import CatalogError

    try:
        return catalog.show_tool(name, settings)
    except CatalogError:
        raise RunError(f"no run or tool named '{name}'", fix="list them with 'flakebot runs' and 'flakebot list'") from None


def _workdir(settings: config.Settings) -> Any:
    from pathlib import Path

    return Path(settings.workdir).expanduser().resolve()
