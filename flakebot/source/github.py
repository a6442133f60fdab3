"""GitHub REST client for forks: create one, wait until its git objects are there, delete it.

The token comes from GITHUB_TOKEN and only travels in the Authorization header: it is never
logged, put into a URL, or written to disk.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from flakebot.config import Settings
from flakebot.errors import AcquireError

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)

API_VERSION = "2022-11-28"
TOKEN_FIX = "export GITHUB_TOKEN=<a token with the public_repo scope (and delete_repo for --delete-fork)>"
_GITHUB_URL = re.compile(
    r"^(?:https?://|git://|ssh://git@|git@)(?:www\.)?github\.com[/:]([\w.-]+)/([\w.-]+?)(?:\.git)?(?:[/#?].*)?$"
)


def github_token() -> str:
    return os.environ.get("GITHUB_TOKEN", "").strip()


def parse_github_url(url: str) -> tuple[str, str] | None:
    """(owner, repo) of a github.com repository URL, or None for other hosts."""
    match = _GITHUB_URL.match(url.strip())
    return (match.group(1), match.group(2)) if match else None


@dataclass(frozen=True)
class Fork:
    """A fork as GitHub describes it."""

    full_name: str
    clone_url: str
    html_url: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fork:
        return cls(
            full_name=str(data["full_name"]), clone_url=str(data["clone_url"]), html_url=str(data.get("html_url", ""))
        )


class GitHub:
    """The few GitHub REST calls flakebot makes, over one httpx client."""

    def __init__(self, settings: Settings, token: str) -> None:
        if not token:
            raise AcquireError("GITHUB_TOKEN is not set", fix=TOKEN_FIX)
        headers = {
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION,
            "Authorization": f"Bearer {token}",
            "User-Agent": f"flakebot ({settings.contact})",
        }
        # here, not at the top: every craft imports this module (acquisition), few fork; httpx is 0.1-0.2 s
        import httpx

        self._client = httpx.Client(base_url=settings.github_api_url.rstrip("/"), headers=headers, timeout=30.0)

    def __enter__(self) -> GitHub:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._client.close()

    def fork(self, owner: str, repo: str) -> Fork:
        """Ask GitHub to fork owner/repo (it answers 202 and copies the repository in the background)."""
        response = self._request("POST", f"/repos/{owner}/{repo}/forks", json={"default_branch_only": False})
        if response.status_code not in (200, 202):
            raise AcquireError(f"GitHub refused to fork {owner}/{repo}: {_describe(response)}", fix=_fix_for(response))
        fork = Fork.from_json(response.json())
        logger.info("fork %s requested (%s)", fork.full_name, response.status_code)
        return fork

    def wait_ready(self, fork: Fork, timeout: float, interval: float) -> int:
        """Poll until the fork has commits (its git objects are copied); returns the number of polls. Bounded by `timeout`."""
        deadline = time.monotonic() + timeout
        polls = 0
        while True:
            polls += 1
            response = self._request("GET", f"/repos/{fork.full_name}/commits", params={"per_page": 1})
            if response.status_code == 200 and response.json():
                return polls
            if response.status_code not in (404, 409, 200):  # 404: not created yet; 409: "Git Repository is empty."
                raise AcquireError(
                    f"GitHub answered {_describe(response)} while waiting for fork {fork.full_name}",
                    fix=_fix_for(response),
                )
            if time.monotonic() + interval > deadline:
                raise AcquireError(
                    f"fork {fork.full_name} was not ready after {timeout:g}s ({polls} checks)",
                    fix="try again in a minute (GitHub copies large repositories slowly) or raise fork_timeout",
                )
            time.sleep(interval)

    def delete(self, full_name: str) -> None:
        """Delete a repository (needs the delete_repo scope). A repository already gone counts as deleted."""
        response = self._request("DELETE", f"/repos/{full_name}")
        if response.status_code in (204, 404):
            return
        raise AcquireError(f"GitHub refused to delete {full_name}: {_describe(response)}", fix=_fix_for(response))

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        import httpx

        try:
            return self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise AcquireError(
                f"cannot reach the GitHub API at {self._client.base_url} ({type(exc).__name__}: {exc})",
                fix="check the network or the github_api_url setting",
            ) from None


def _describe(response: httpx.Response) -> str:
    try:
        message = response.json().get("message", "")
    except ValueError:
        message = response.text[:200]
    return f"HTTP {response.status_code} {message}".strip()


def _fix_for(response: httpx.Response) -> str:
    if response.status_code == 401:
        return "GITHUB_TOKEN is invalid or expired: " + TOKEN_FIX
    if response.status_code == 403:
        return "give the token the scope this needs (public_repo to fork, delete_repo to delete) or delete the fork on github.com"
    if response.status_code == 404:
        return "check the crate's repository URL; private repositories need a token that can read them"
    return "try again later; GitHub may be having trouble"
