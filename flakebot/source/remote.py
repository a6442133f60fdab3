"""The end of a craft that started from a repository: push the branch, delete the fork."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.errors import AcquireError
from flakebot.pipeline.run import Run
from flakebot.source import gitrepo
from flakebot.source.github import GitHub, github_token

logger = logging.getLogger(__name__)


def release_fork(origin: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Delete the fork an acquisition made. Failure (a token without delete_repo answers 403) is a warning, never an error."""
    full_name = origin.get("fork")
    if origin.get("method") != "fork" or not full_name:
        return {"deleted": False, "reason": "the workspace did not come from a fork"}
    try:
        with GitHub(settings, github_token()) as hub:
            hub.delete(full_name)
    except AcquireError as exc:
        logger.warning("fork %s was not deleted: %s", full_name, exc.one_line())
        return {"fork": full_name, "deleted": False, "warning": exc.one_line()}
    logger.info("deleted fork %s", full_name)
    return {"fork": full_name, "deleted": True}


def release_run_forks(run: Run, settings: Settings) -> list[dict[str, Any]]:
    """For `flakebot clean RUN`: delete the forks a run registered, if the run asked for --delete-fork."""
    if not run.request.delete_fork:
        return []
    forks = [r for r in run.state.get("resources", []) if r.get("kind") == "fork"]
    return [release_fork({"method": "fork", "fork": r["full_name"]}, settings) for r in forks]


def push_branch(workspace: Path, origin: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Push the workspace's branch to the repository it was cloned from (the fork, with --fork)."""
    if origin.get("method") not in ("fork", "git"):
        raise AcquireError(
            f"cannot push {origin.get('crate', 'the crate')}: its workspace came from {origin.get('method')}, not a repository",
            fix="craft with --fork to have a repository to push to",
        )
    url = str(origin["url"])
    try:
        branch, revision = gitrepo.push(workspace, url, settings.git_timeout, github_token())
    except AcquireError as exc:
        raise AcquireError(f"cannot push {origin.get('crate', 'the crate')}: {exc.message}", fix=exc.fix) from None
    logger.info("pushed %s to %s", branch, url)
    return {"pushed": branch, "url": url, "revision": revision}
