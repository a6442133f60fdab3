"""Every process flakebot starts is started here: its working directory, its environment and, for flakebot's own
Python children, its interpreter are fixed by flakebot, never inherited from whoever started flakebot.

- The working directory is `neutral_dir()`, an empty directory of flakebot's own (state_home/empty), unless the
  caller passes a directory it trusts (a sandbox's workspace, a service's state directory): a caller's cwd could
  hold a rust-toolchain.toml, a flake, a .cargo/config.toml or a Python package named flakebot.
- The environment is built from a dict: `host_env()` (the HOST_ENV names and HOST_PREFIXES of os.environ, nothing
  else) unless the caller passes its own; a caller that needs a variable adds it. PYTHON*, LD_* and model keys
  never reach a child by accident.
- A Python child is `python -I` (no PYTHONPATH, PYTHONSTARTUP, user site, and neither its cwd nor a script's
  directory on sys.path) that imports flakebot from PACKAGE_ROOT, the directory this process imported it from.

Who passes what (anything not listed: neutral_dir() and host_env()):

    sandbox.process.execute          the sandbox's cwd (the workspace or scratch dir it binds); the sandbox's env
    deliver.toolrun.run_attached     the tool's scratch directory; the sandbox's env
    services.supervisor (bwrap)      the service's state directory; the sandbox's env; its listening socket as fd 3
    source.safegit.git               the repository git works on; safegit.environment()
    cargo.runner, cargo.depcache     a fresh empty temp directory; the toolchain's own env (host_env for rustc -V)
    nix.build (nix build)            the flake directory flakebot generated; host_env()
    nix.standin (rustc --print)      neutral_dir(); host_env() and flakebot's cargo env
    mcp.server (a long call's job)   neutral_dir(), then run_job works in the server's cwd; flakebot_env(keys=True)
    services.control (supervisor)    neutral_dir(); flakebot_env()

A child that must find a descriptor at a fixed number (a service's listening socket at fd 3, as systemd's socket
activation passes it) gets it through `fds` {NUMBER: OUR_FD}: moved there between fork and exec, never by the
caller reshuffling its own descriptors.

A process that counts the CPU-seconds of what it starts (a team worker: a job's build CPU-seconds) becomes the reaper of
what its children leave behind (`become_subreaper`) and reaps it between two jobs (`reap_orphans`): bubblewrap's monitor, the
process a sandboxed command's caller waits for, exits once the sandbox's init reports the command's exit, without
waiting for that init, so the init (and in its reaped children's time, everything the command ran) would otherwise
be reaped by the machine's init and counted nowhere of ours.

tests/test_launcher.py keeps every subprocess, os.exec*, os.spawn*, os.system and asyncio subprocess call out of
every other module (git included: flakebot.source.safegit runs the git program through run(), no GitPython).
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import subprocess
import sys
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, overload

logger = logging.getLogger(__name__)

PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)  # the directory `import flakebot` found us in
# What a child gets of flakebot's own environment unless its caller says otherwise: the user's locale, home and
# directories, proxies and certificates, the toolchains' and Nix's own settings (a shared catalog in S3: AWS_*).
HOST_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ", "TMPDIR",
    "TERM", "NO_COLOR", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "SSH_AUTH_SOCK", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN", "CARGO_HOME",
)  # fmt: skip
HOST_PREFIXES = ("NIX_", "AWS_")
# What flakebot's own Python children add: its settings, and (for a job that calls a model) the providers' keys.
FLAKEBOT_PREFIXES = ("FLAKEBOT_",)
# ...but never these: the team database's URL and its password (flakebot.team.dburl) are the front's or worker's own;
# no child (a detached job, a service's supervisor) talks to the database.
PRIVATE_ENV = ("FLAKEBOT_DATABASE_URL",)
KEY_SUFFIXES = ("_API_KEY", "_BASE_URL")
KEY_NAMES = ("GITHUB_TOKEN",)
PR_SET_CHILD_SUBREAPER = 36  # prctl(2)
REAP_GRACE = 1.0  # seconds reap_orphans() waits for an inherited process still running
_STARTED: weakref.WeakSet[subprocess.Popen[Any]] = weakref.WeakSet()  # popen()'s, while their callers hold them
BOOTSTRAP = "import sys; sys.path.insert(0, sys.argv.pop(1)); "  # then the child's own code, argv as with -c


def host_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a trusted host program (nix, pasta, systemd-analyze...): HOST_ENV and HOST_PREFIXES of
    ours, then `extra`."""
    env = {k: v for k, v in os.environ.items() if k in HOST_ENV or k.startswith(HOST_PREFIXES)}
    env.setdefault("PATH", os.defpath)
    return {**env, **(extra or {})}


def flakebot_env(*, keys: bool = False, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of flakebot's own Python child: host_env() and FLAKEBOT_* (but PRIVATE_ENV); `keys`: the model
    providers' keys and URLs and GITHUB_TOKEN too (a job that crafts)."""
    env = host_env()
    for name, value in os.environ.items():
        if name in PRIVATE_ENV:
            continue
        if name.startswith(FLAKEBOT_PREFIXES) or keys and (name.endswith(KEY_SUFFIXES) or name in KEY_NAMES):
            env[name] = value
    return {**env, **(extra or {})}


def neutral_dir() -> str:
    """An empty directory of flakebot's own, the working directory of every child whose caller names none (made
    again if it was removed since the last child)."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local/state") / "flakebot"
    directory = base / "empty"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.lstat()
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022:
            return str(directory)
        logger.warning("%s is not a private directory of ours: children start in /", directory)
    except OSError as exc:
        logger.warning("cannot make %s (%s): children start in /", directory, exc.strerror)
    return "/"  # root's: nothing flakebot or a tool runs can write there


def _checked(argv: Sequence[str], options: dict[str, Any]) -> None:
    if options.get("shell"):
        raise ValueError("flakebot.launcher runs argv lists, never a shell command line")
    if not argv:
        raise ValueError("an empty command line")


Where = Path | str | None
Env = Mapping[str, str] | None


@overload
def run(
    argv: Sequence[str], *, cwd: Where = None, env: Env = None, text: Literal[True], **options: Any
) -> subprocess.CompletedProcess[str]: ...
@overload
def run(
    argv: Sequence[str], *, cwd: Where = None, env: Env = None, text: Literal[False] = False, **options: Any
) -> subprocess.CompletedProcess[bytes]: ...
def run(
    argv: Sequence[str], *, cwd: Where = None, env: Env = None, text: bool = False, **options: Any
) -> subprocess.CompletedProcess[Any]:
    """subprocess.run of `argv` in `cwd` (default neutral_dir()) with exactly `env` (default host_env());
    `options` as subprocess.run takes them (capture_output, text, timeout, input, stdin, check...)."""
    _checked(argv, options)
    where = str(cwd) if cwd is not None else neutral_dir()
    return subprocess.run(list(argv), cwd=where, env=dict(host_env() if env is None else env), text=text, **options)


Fds = Mapping[int, int] | None


@overload
def popen(
    argv: Sequence[str], *, cwd: Where = None, env: Env = None, text: Literal[True], fds: Fds = None, **options: Any
) -> subprocess.Popen[str]: ...
@overload
def popen(
    argv: Sequence[str],
    *,
    cwd: Where = None,
    env: Env = None,
    text: Literal[False] = False,
    fds: Fds = None,
    **options: Any,
) -> subprocess.Popen[bytes]: ...
def popen(
    argv: Sequence[str], *, cwd: Where = None, env: Env = None, text: bool = False, fds: Fds = None, **options: Any
) -> subprocess.Popen[Any]:
    """subprocess.Popen of `argv`, its cwd and environment as run() fixes them; `options` as Popen takes them.
    `fds` {NUMBER: OUR_FD}: the child finds each OUR_FD at NUMBER (3 and up, none of `pass_fds`)."""
    _checked(argv, options)
    where = str(cwd) if cwd is not None else neutral_dir()
    held = _hold_numbers(fds or {})
    try:
        options = _with_fds(dict(fds), options) if fds else options
        started = subprocess.Popen(
            list(argv), cwd=where, env=dict(host_env() if env is None else env), text=text, **options
        )
        _STARTED.add(started)
        return started
    finally:
        for fd in held:
            os.close(fd)


def _hold_numbers(fds: Mapping[int, int]) -> list[int]:
    """Each target number that is free here, taken (by a copy of its source) until the child is started: Popen
    marks every kept number inheritable in the child before our move, and a number not open fails that. Taken
    atomically (F_DUPFD gives the lowest free number from the target on: the target itself only when free)."""
    held = []
    for target, source in fds.items():
        copy = fcntl.fcntl(source, fcntl.F_DUPFD_CLOEXEC, target)
        if copy == target:
            held.append(copy)
        else:
            os.close(copy)  # the number is open already (someone else's): the child's copy of it is replaced
    return held


def _with_fds(fds: dict[int, int], options: dict[str, Any]) -> dict[str, Any]:
    """Popen options placing `fds` in the child: each source copied above every number in play first (a source may
    sit at another's target), then moved to its number, after the caller's own preexec_fn (a cgroup's entry)."""
    passed = tuple(options.get("pass_fds", ()))
    if any(target < 3 for target in fds) or set(fds) & set(passed):
        raise ValueError(f"fds {sorted(fds)} must be 3 or more and not among pass_fds {sorted(passed)}")
    before = options.get("preexec_fn")
    above = max([*fds, *fds.values(), *passed]) + 1

    def place() -> None:
        if before is not None:
            before()
        copies = {target: fcntl.fcntl(source, fcntl.F_DUPFD, above) for target, source in fds.items()}
        for target, copy in copies.items():
            os.dup2(copy, target)  # inheritable: it outlives the exec
            os.close(copy)

    return {**options, "preexec_fn": place, "pass_fds": (*passed, *fds)}


def python_code(code: str, *args: str, site: bool = True) -> list[str]:
    """The command line of a flakebot Python child running `code` (sys.argv: ['-c', *args], as with `python -c`):
    an isolated interpreter (-I) that imports flakebot from PACKAGE_ROOT only. `site=False`: a child of the standard
    library and flakebot alone (-S: no site-packages, no .pth files run; 20-30 ms less start-up, less memory)."""
    return [sys.executable, "-I", *([] if site else ["-S"]), "-c", BOOTSTRAP + code, PACKAGE_ROOT, *args]


def python_module(module: str, *args: str, site: bool = True) -> list[str]:
    """The command line of `python -m MODULE ARGS` as a flakebot Python child (see python_code)."""
    code = "import runpy; runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
    return python_code(code, module, *args, site=site)


def become_subreaper() -> bool:
    """Make this process the reaper of every process its descendants leave behind (PR_SET_CHILD_SUBREAPER), so
    that their CPU-seconds reach its RUSAGE_CHILDREN once reap_orphans() waits for them; whether the kernel agreed
    (Linux only). For a process that counts its children's CPU and calls reap_orphans() between jobs: whatever a
    child leaves running stays this process's child until it ends."""
    import ctypes  # here, not at the top: a service's supervisor starts processes through this module (its memory, S5)

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
            return True
        logger.warning("processes our children leave behind are not reaped by us (%s)", os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        logger.warning("processes our children leave behind are not reaped by us (%s)", exc)
    return False


def reap_orphans(grace: float = REAP_GRACE) -> int:
    """Wait for every child of this process that is no Popen's a caller still holds (what become_subreaper let it
    inherit: a sandbox's init), those still running for at most `grace` seconds (an init exits just after the
    monitor its caller waited for; one that runs on is left for a later call); how many were reaped. Call it when
    no other thread starts processes through subprocess.run (a worker between two jobs): a run() whose child just
    ended could find it taken."""
    held = {p.pid for p in list(_STARTED) if p.returncode is None}
    reaped, deadline = 0, time.monotonic() + grace
    while True:
        running = 0
        for pid in _children():
            if pid in held:
                continue
            if _state(pid) != "Z":
                running += 1
                continue
            try:
                reaped += os.waitpid(pid, os.WNOHANG)[0] == pid
            except ChildProcessError:  # reaped meanwhile by its Popen
                continue
        if not running or time.monotonic() >= deadline:
            return reaped
        time.sleep(0.01)


def _children() -> list[int]:
    found: list[int] = []
    for task in os.listdir("/proc/self/task"):
        try:
            found += [int(pid) for pid in Path(f"/proc/self/task/{task}/children").read_text().split()]
        except OSError:  # the thread ended meanwhile
            continue
    return found


def _state(pid: int) -> str:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return text[text.rindex(")") + 2 :].split()[0]
