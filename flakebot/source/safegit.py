"""Every host git call flakebot makes, hardened in one place: `git(cwd, ...)` and `clone(...)`.

Git runs programs that configuration names: core.fsmonitor, hooks (core.hooksPath), filter.<driver>.clean/
smudge/process and diff.<driver>.textconv/command (named by .gitattributes), diff.external, core.sshCommand,
core.askPass, credential.helper, gpg.program, core.editor... It reads configuration from the system, the user's
home, the repository, and any nested repository it descends into (`git status`/`git add -A` run git inside a
gitlink). flakebot's trees are written by a model, so every call here:

- reads no system or global configuration (GIT_CONFIG_NOSYSTEM, GIT_CONFIG_GLOBAL=/dev/null, HOME=/dev/null, which
  also hides ~/.config/git/attributes), in a minimal environment: no API key or token reaches a git child;
- passes the HARDENING options with -c; git hands command-line configuration on to the git processes it starts
  (GIT_CONFIG_PARAMETERS), so they hold inside a nested repository too;
- in a model's tree (`sweep=True`), first removes every `.git` entry below the top (sweep_nested): a nested
  repository's own config can define filters and diff drivers that no -c option undefines.

The repository's own .git/config is written only by flakebot (the sandbox binds .git read-only), so diff.external,
gpg.program and the like can come from nowhere else. A filter or diff driver that a tree's .gitattributes names
without configuration is undefined, and git then ignores it. safe.directory is not needed: every repository here is
made by flakebot's own user (a sandboxed command runs as that user too).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from flakebot import launcher
from flakebot.errors import FlakebotError
from flakebot.safefs import Tree

logger = logging.getLogger(__name__)

COMMIT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # SHA-1 or SHA-256

HARDENING = (
    "core.fsmonitor=false",  # a program git runs before every status/add
    "core.hooksPath=/dev/null",  # no hooks, whatever a template or a clone left in .git/hooks
    "core.pager=cat",
    "core.askPass=",
    "credential.helper=",  # an empty value clears the list: no helper program asked
    "core.sshCommand=ssh -o BatchMode=yes",
    "core.untrackedCache=false",
    "core.protectNTFS=true",  # refuse checking out .GIT, git~1 and the like
    "core.protectHFS=true",
    "submodule.recurse=false",  # never enter a submodule a tree declares in .gitmodules
    "protocol.ext.allow=never",  # ext:: runs a command; crate metadata names the URLs
    "protocol.file.allow=user",
    "filter.lfs.required=false",  # no LFS smudge on checkout (git-lfs installs itself in the global config)
    "filter.lfs.smudge=",
    "filter.lfs.process=",
    "commit.gpgsign=false",
    "tag.gpgsign=false",
    "gc.auto=0",  # no background gc or maintenance started by a commit
    "maintenance.auto=false",
    "user.name=flakebot",
    "user.email=flakebot@localhost",
)
PASSED_ENV = (  # what a git child may see of flakebot's environment: paths, locale, proxies and CA files
    "PATH",
    "TZ",
    "SSH_AUTH_SOCK",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "GIT_SSL_CAINFO",
)
GIT_DIR_NAME = ".git"


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a git child: the PASSED_ENV variables, no configuration outside the repository."""
    env = {k: v for k, v in os.environ.items() if k in PASSED_ENV}
    env.setdefault("PATH", os.defpath)
    env.update(
        HOME=os.devnull,
        LC_ALL="C",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
        GIT_LFS_SKIP_SMUDGE="1",
        GIT_OPTIONAL_LOCKS="0",
    )
    return {**env, **(extra or {})}


def argv(*args: str) -> list[str]:
    """`git -c ... ARGS`: the command line of a hardened git call."""
    return ["git", *(part for option in HARDENING for part in ("-c", option)), *args]


def git(
    cwd: Path | str,
    *args: str,
    sweep: bool = False,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    fix: str = "check the repository at the path named, or start a new run",
    error: type[FlakebotError] = FlakebotError,
    passes: Callable[[subprocess.CompletedProcess[str]], bool] = lambda done: False,
) -> str:
    """Run `git ARGS` in `cwd`, hardened; its stdout. `sweep`: `cwd` is a model's tree, remove nested .git first.
    A failure raises `error` (the caller's stage's type) naming the command and git's reason on one line, unless
    `passes(done)` says it is an answer (`nothing_to_commit`)."""
    if sweep:
        try:
            sweep_nested(Path(cwd))
        except OSError as exc:  # git must not run while a nested repository is left
            raise error(f"cannot remove a nested .git in {cwd}: {exc.strerror} ({exc.filename})", fix=fix) from None
    command = argv(*args)
    try:
        done = launcher.run(
            command,
            cwd=cwd,
            env=environment(env),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise error(f"git {args[0]} in {cwd} took longer than {timeout:.0f} s", fix=fix) from None
    except OSError as exc:
        raise error(f"git cannot run: {exc.strerror}", fix="install git (it must be on PATH)") from None
    if done.returncode != 0 and not passes(done):
        raise error(f"git {args[0]} failed in {cwd}: {reason(done.stderr, done.returncode)}", fix=fix)
    return done.stdout


def nothing_to_commit(done: subprocess.CompletedProcess[str]) -> bool:
    """`git commit` found the index as HEAD has it (its status, in the C locale git runs in here): no failure. Any
    other wording is a failure its caller looks into."""
    last = done.stdout.strip().splitlines()[-1:]
    return done.returncode == 1 and bool(last) and last[0].startswith(("nothing to commit", "nothing added to commit"))


def head_from_files(repo: Path) -> str:
    """The commit HEAD names, read from repo/.git's own files beneath a descriptor (safefs): one git process fewer,
    for a repository whose .git only flakebot's git writes. '' when they do not hold it plainly (a packed or reftable
    ref, a gitdir file, no commit yet): then `rev-parse` answers."""
    try:
        with Tree(repo / ".git") as git_dir:  # a .git file (a gitdir line) is no directory: OSError
            head = git_dir.read_text("HEAD", limit=4096).strip()
            if head.startswith("ref: refs/"):
                head = git_dir.read_text(head.removeprefix("ref: "), limit=4096).strip()
    except (OSError, UnicodeDecodeError):  # missing, a link, not a file (safefs.UnsafePath is an OSError)
        return ""
    return head if COMMIT_ID.fullmatch(head) else ""


def reason(stderr: str, code: int) -> str:
    """The lines of git's stderr that say why (from the first fatal:/error:), on one line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("hint:")]
    first = next((i for i, line in enumerate(lines) if line.startswith(("fatal:", "error:"))), max(len(lines) - 1, 0))
    return " ".join(lines[first:])[:400] or f"git exited {code}"


def sweep_nested(top: Path) -> list[str]:
    """Remove every .git entry (directory, gitdir file or symlink; any case, for case-folding file systems) below
    `top`, leaving top/.git itself. Returns what was removed (relative paths).

    Removed rather than ending the run: a crate's build or tests may make a repository innocently (a test fixture);
    removing it makes the tree safe and keeps the model's work, and host git then sees plain files."""
    removed = []
    for root, dirs, files in os.walk(top):
        for name in [*dirs, *files]:
            path = Path(root, name)
            if name.casefold() == GIT_DIR_NAME and path != top / GIT_DIR_NAME:
                Tree(top).remove(str(path.relative_to(top)))  # the model's tree: a link is removed, never entered
                removed.append(str(path.relative_to(top)))
        dirs[:] = [d for d in dirs if d.casefold() != GIT_DIR_NAME]  # os.walk lists links to dirs here: not followed
    if removed:
        logger.warning("removed nested git repositories or gitdir files from %s: %s", top, ", ".join(removed))
    return removed


def clone(
    url: str, dest: Path, timeout: float, env: dict[str, str] | None = None, error: type[FlakebotError] = FlakebotError
) -> None:
    """`git clone` of a repository that is not ours: no hooks (empty template), no submodules, no LFS smudge, no
    checkout of .git-like paths; the hardened options are also written into the clone's own config."""
    persisted = [
        part for option in ("core.hooksPath=/dev/null", "core.fsmonitor=false") for part in ("--config", option)
    ]
    git(
        dest.parent,
        "clone",
        "--quiet",
        "--template=",
        "--no-recurse-submodules",
        *persisted,
        "--",
        url,
        str(dest),
        timeout=timeout,
        env=env,
        fix="check that the repository URL is right and reachable",
        error=error,
    )
