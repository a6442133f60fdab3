"""GitPython helpers for workspaces: a safe clone, version tags, init + commit, branches, push."""

from __future__ import annotations

import base64
import logging
import re
from pathlib import Path
from urllib.parse import urlsplit

import git

from flakebot.errors import AcquireError

logger = logging.getLogger(__name__)

# Crate metadata is untrusted: only plain transports, never remote helpers such as ext:: (runs commands).
SAFE_SCHEMES = ("https", "http", "git", "ssh", "file")
IDENTITY = {
    ("user", "name"): "flakebot",
    ("user", "email"): "flakebot@localhost",
    ("commit", "gpgsign"): "false",
    ("tag", "gpgsign"): "false",
}
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
    if parts.hostname in _FORGE_HOSTS:
        # crates.io metadata often links a subfolder (.../tree/main/cli): the repository is owner/name.
        segments = [s for s in parts.path.split("/") if s][:2]
        url = f"{parts.scheme}://{parts.netloc}/{'/'.join(segments)}"
    return url


def git_env(url: str = "", token: str = "") -> dict[str, str]:
    """Environment for network git commands: never prompt; send the token as a header to that host only."""
    env = {"GIT_TERMINAL_PROMPT": "0", "GIT_SSH_COMMAND": "ssh -o BatchMode=yes"}
    parts = urlsplit(url)
    if token and parts.scheme == "https":
        basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        env.update(
            GIT_CONFIG_COUNT="1",
            GIT_CONFIG_KEY_0=f"http.https://{parts.netloc}/.extraHeader",
            GIT_CONFIG_VALUE_0=f"Authorization: Basic {basic}",
        )
    return env


def error_text(exc: git.GitCommandError) -> str:
    """The lines of a failed git command that say why (fatal:/error:), on one line."""
    # GitPython wraps stderr as "\n  stderr: '<text>'".
    stderr = re.sub(r"^\s*stderr: '", "", str(exc.stderr or "")).rstrip().removesuffix("'")
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    first = next(
        (i for i, line in enumerate(lines) if line.startswith(("fatal:", "error:", "Timeout"))), max(len(lines) - 1, 0)
    )
    return " ".join(lines[first:])[:400] or f"git exited {exc.status}"


def clone(url: str, dest: Path, timeout: float, token: str = "") -> git.Repo:
    """Clone `url` into the empty directory `dest` (all branches and tags). The caller closes the Repo."""
    logger.info("cloning %s", url)
    try:
        git.Git().clone("--quiet", "--", url, str(dest), kill_after_timeout=timeout, env=git_env(url, token))
    except git.GitCommandError as exc:
        raise AcquireError(
            f"git clone {url} failed: {error_text(exc)}", fix="check that the repository URL is right and reachable"
        ) from None
    repo = git.Repo(dest)
    configure(repo)
    if not repo.head.is_valid():
        repo.close()
        raise AcquireError(f"repository {url} is empty", fix="choose another crate or pass --method archive")
    return repo


def configure(repo: git.Repo) -> None:
    """Give the workspace a committer identity and no signing, so flakebot's commits never prompt."""
    with repo.config_writer("repository") as writer:
        for (section, option), value in IDENTITY.items():
            writer.set_value(section, option, value)


def version_tags(name: str, version: str) -> list[str]:
    """Tag names a release of `name` `version` is commonly published under, most common first."""
    return [f"v{version}", version, f"{name}-v{version}", f"{name}-{version}"]


def find_tag(repo: git.Repo, name: str, version: str) -> str | None:
    tags = {tag.name for tag in repo.tags}
    return next((tag for tag in version_tags(name, version) if tag in tags), None)


def default_branch(repo: git.Repo) -> str:
    return repo.active_branch.name if not repo.head.is_detached else "HEAD"


def resolve_ref(repo: git.Repo, ref: str) -> str:
    """`ref` as something to check out in a fresh clone: a tag, a commit, or a branch (only the default one is local)."""
    for candidate in (ref, f"origin/{ref}"):
        try:
            repo.git.rev_parse("--verify", "--quiet", f"{candidate}^{{commit}}")
            return candidate
        except git.GitCommandError:
            continue
    raise AcquireError(f"the repository has no branch, tag or commit '{ref}'", fix="check the ref after # (or --ref)")


def checkout_branch(repo: git.Repo, branch: str, start: str) -> str:
    """Create (or reset) `branch` at `start` and check it out; returns the commit."""
    try:
        repo.git.checkout("-q", "-B", branch, f"{start}^{{commit}}")
    except git.GitCommandError as exc:
        raise AcquireError(
            f"cannot create branch {branch} at {start}: {error_text(exc)}",
            fix="use a tool name that is a valid git branch name",
        ) from None
    return repo.head.commit.hexsha


def init_commit(path: Path, message: str, branch: str) -> str:
    """Make `path` a git repository whose first commit (branch `upstream`) holds every file; check out `branch`."""
    with git.Repo.init(path, initial_branch=UPSTREAM_BRANCH) as repo:
        configure(repo)
        # --force: a crate's own .gitignore may list files it ships (csv ignores Cargo.lock); keep the crate whole.
        repo.git.add("--all", "--force", ".")
        repo.git.commit("-q", "--allow-empty", "-m", message)
        return checkout_branch(repo, branch, "HEAD")


def commit_files(path: Path, files: list[str], message: str) -> str:
    with git.Repo(path) as repo:
        repo.git.add("--force", "--", *files)
        repo.git.commit("-q", "-m", message)
        return repo.head.commit.hexsha


def push(path: Path, url: str, timeout: float, token: str = "") -> tuple[str, str]:
    """Push the checked-out branch of the repository at `path` to `url`; returns (branch, commit)."""
    with git.Repo(path) as repo:
        branch = default_branch(repo)
        try:
            repo.git.push(
                "--quiet", url, f"{branch}:refs/heads/{branch}", kill_after_timeout=timeout, env=git_env(url, token)
            )
        except git.GitCommandError as exc:
            raise AcquireError(
                f"git push to {url} failed: {error_text(exc)}",
                fix="check the token's scopes and that the fork still exists",
            ) from None
        return branch, repo.head.commit.hexsha
