"""Git for workspaces, through safegit (hardened, one place): a safe clone, version tags, init + commit, branches, push."""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from flakebot.errors import AcquireError
from flakebot.source import safegit

logger = logging.getLogger(__name__)

# Crate metadata is untrusted: only plain transports, never remote helpers such as ext:: (runs commands).
SAFE_SCHEMES = ("https", "http", "git", "ssh", "file")
UPSTREAM_BRANCH = "upstream"
_FORGE_HOSTS = {"github.com", "gitlab.com", "codeberg.org", "bitbucket.org"}


def check_url(url: str) -> str:
    """The clonable form of a repository URL; refuses schemes git should not run for untrusted input."""
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in SAFE_SCHEMES or "::" in url:
        raise AcquireError(
            f"repository URL {url!r} is not an http(s), git, ssh or file URL",
            fix="pass a plain https:// or git:// repository URL",
        )
    if any(c.isspace() or not c.isprintable() for c in url):  # no clone of it can work: say so before a run
        shown = url if len(url) <= 64 else url[:64] + "..."
        raise AcquireError(
            f"repository URL {shown!r} has a space or control character",
            fix="percent-encode it (a space is %20), or pass the repository's plain URL",
        )
    if parts.hostname in _FORGE_HOSTS:
        # crates.io metadata often links a subfolder (.../tree/main/cli): the repository is owner/name.
        segments = [s for s in parts.path.split("/") if s][:2]
        url = f"{parts.scheme}://{parts.netloc}/{'/'.join(segments)}"
    return url


def git_env(url: str = "", token: str = "") -> dict[str, str]:
    """Extra environment for a network git command: the token as a header sent to that host only (never in argv)."""
    parts = urlsplit(url)
    if not (token and parts.scheme == "https"):
        return {}
    basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": f"http.https://{parts.netloc}/.extraHeader",
        "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}",
    }


def clone(url: str, dest: Path, timeout: float, token: str = "") -> None:
    """Clone `url` into the empty directory `dest` (all branches and tags), hardened (safegit.clone)."""
    logger.info("cloning %s", url)
    try:
        safegit.clone(url, dest, timeout, env=git_env(url, token), error=AcquireError)
    except AcquireError as exc:
        raise AcquireError(f"git clone {url} failed: {exc.message.partition(': ')[2]}", fix=exc.fix) from None
    if not head(dest):
        raise AcquireError(f"repository {url} is empty", fix="choose another crate or pass --method archive")


def _git(path: Path, *args: str, sweep: bool = False, **kw: Any) -> str:
    return safegit.git(path, *args, sweep=sweep, error=AcquireError, **kw)


def head(path: Path) -> str:
    """The commit checked out in the repository at `path`; '' when it has none yet."""
    try:
        return _git(path, "rev-parse", "--verify", "--quiet", "HEAD^{commit}").strip()
    except AcquireError:
        return ""


def version_tags(name: str, version: str) -> list[str]:
    """Tag names a release of `name` `version` is commonly published under, most common first."""
    return [f"v{version}", version, f"{name}-v{version}", f"{name}-{version}"]


def find_tag(path: Path, name: str, version: str) -> str | None:
    tags = set(_git(path, "tag", "--list").split())
    return next((tag for tag in version_tags(name, version) if tag in tags), None)


def default_branch(path: Path) -> str:
    try:
        return _git(path, "symbolic-ref", "--quiet", "--short", "HEAD").strip() or "HEAD"
    except AcquireError:
        return "HEAD"  # detached


def resolve_ref(path: Path, ref: str) -> str:
    """`ref` as something to check out in a fresh clone: a tag, a commit, or a branch (only the default one is local)."""
    for candidate in (ref, f"origin/{ref}"):
        try:
            _git(path, "rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}")
            return candidate
        except AcquireError:
            continue
    raise AcquireError(f"the repository has no branch, tag or commit '{ref}'", fix="check the ref after # (or --ref)")


def checkout_branch(path: Path, branch: str, start: str) -> str:
    """Create (or reset) `branch` at `start` and check it out; returns the commit."""
    try:
        _git(path, "checkout", "-q", "-B", branch, f"{start}^{{commit}}")
    except AcquireError as exc:
        raise AcquireError(
            f"cannot create branch {branch} at {start}: {exc.message.partition(': ')[2]}",
            fix="use a tool name that is a valid git branch name",
        ) from None
    return safegit.head_from_files(path) or head(path)  # the branch just written: read, not asked of git


def init_commit(path: Path, message: str, branch: str) -> str:
    """Make `path` a git repository whose first commit (branch `upstream`) holds every file; check out `branch`."""
    _git(path, "init", "--quiet", "--template=", f"--initial-branch={UPSTREAM_BRANCH}")
    # --force: a crate's own .gitignore may list files it ships (csv ignores Cargo.lock); keep the crate whole.
    _git(path, "add", "--all", "--force", ".", sweep=True)  # an unpacked .crate or a copy may hold nested .git
    _git(path, "commit", "-q", "--no-verify", "--allow-empty", "-m", message)
    return checkout_branch(path, branch, "HEAD")


def commit_files(path: Path, files: list[str], message: str) -> str:
    _git(path, "add", "--force", "--", *files, sweep=True)
    _git(path, "commit", "-q", "--no-verify", "-m", message)
    return head(path)


def push(path: Path, url: str, timeout: float, token: str = "") -> tuple[str, str]:
    """Push the checked-out branch of the repository at `path` (a model's tree) to `url`; returns (branch, commit)."""
    branch = default_branch(path)
    try:
        _git(
            path,
            "push",
            "--quiet",
            "--no-verify",
            "--recurse-submodules=no",
            url,
            f"{branch}:refs/heads/{branch}",
            sweep=True,
            timeout=timeout,
            env=git_env(url, token),
        )
    except AcquireError as exc:
        raise AcquireError(
            f"git push to {url} failed: {exc.message.partition(': ')[2]}",
            fix="check the token's scopes and that the fork still exists",
        ) from None
    return branch, head(path)
