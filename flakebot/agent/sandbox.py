"""The sandbox every command of the edit loop runs in (cargo build and test execute model-written code).

    open_sandbox(mode, workspace=..., writable=[...]) -> Sandbox
        BwrapSandbox   bubblewrap: read-only system and toolchain, writable workspace + target dir only,
                       private /tmp and HOME, no network, own PID/IPC/UTS namespaces, a process limit
        PlainSandbox   a plain process with the same timeout and output cap (bubblewrap missing, or mode "off")

Every command gets a wall-clock timeout (the whole process tree is killed), an output cap (head + tail
kept), a minimal environment (no API keys), and leaves no process behind.

Process limit: RLIMIT_NPROC is not enforced for real root (the kernel exempts uid 0, even inside a user
namespace mapped to it). So as root the command drops to an unused uid keeping only CAP_DAC_OVERRIDE
(it can still write the root-owned workspace) under `prlimit --nproc`; as a normal user, bubblewrap's
user namespace plus `prlimit --nproc` inside it limits the sandbox alone. One wrinkle of the root case:
access(2) ignores capabilities for a non-root uid, so a program asking "may I write the workspace?"
hears no (writing works); /tmp and HOME are mode 1777 so compilers find a temporary directory.
"""

from __future__ import annotations

import logging
import os
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from flakebot.config import Settings
from flakebot.errors import SandboxError

logger = logging.getLogger(__name__)

MODES = ("auto", "required", "off")
PERMISSIONS = ("READ_WRITE", "READ_ONLY")
MAX_PROCESSES = 512  # tasks (threads count too); cargo + rustc + a test binary stay far below
SYSTEM_DIRS = ("/usr", "/etc", "/opt", "/nix/store")
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SECRET_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers")
DEBIAN_REGISTRY = Path("/usr/share/cargo/registry")
SANDBOX_UID_BASE = 1_500_000_000  # as root: commands run as BASE + our pid, a uid nothing else uses
EXIT_GRACE = 1.0  # seconds to keep reading pipes after the command ended or was killed


@dataclass
class CommandResult:
    """What one command did: exit code, captured output (capped), time, and whether it was cut short."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Sandbox(Protocol):
    """Runs one command with limits. `name` says which kind ("bubblewrap", "plain", "off")."""

    name: str

    def run(
        self, argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float | None = None, stdin: str | None = None
    ) -> CommandResult: ...


@dataclass
class Limits:
    """Per-command limits shared by every sandbox kind."""

    timeout: float = 600.0
    output_cap: int = 200_000  # bytes kept per stream (stdout, stderr): half from the start, half from the end
    max_processes: int = MAX_PROCESSES


def open_sandbox(
    mode: str,
    *,
    workspace: Path,
    writable: list[Path],
    permission: str = "READ_WRITE",
    timeout: float = 600,
    output_cap: int = 200_000,
    readable: Sequence[Path] = (),
    max_processes: int = MAX_PROCESSES,
    keep_root: bool = False,
) -> Sandbox:
    """The sandbox for commands in `workspace`: bubblewrap when usable, else (mode "auto") a logged plain fallback.

    `keep_root` (for running nix itself, which refuses a root-owned store under another uid) keeps uid 0
    without capabilities: still no network, private home and /tmp, read-only system; no process limit."""
    if mode not in MODES:
        raise SandboxError(f"unknown sandbox mode '{mode}'", fix=f"use one of: {', '.join(MODES)}")
    if permission not in PERMISSIONS:
        raise SandboxError(f"unknown sandbox permission '{permission}'", fix=f"use one of: {', '.join(PERMISSIONS)}")
    limits = Limits(timeout=timeout, output_cap=output_cap, max_processes=max_processes)
    if not Path(workspace).is_dir():
        raise SandboxError(f"workspace {workspace} is not a directory", fix="acquire the crate first (flakebot craft ... runs the acquire stage)")
    if mode == "off":
        logger.warning("sandbox off: model-written code runs as a plain process with full access to this machine and the network")
        return PlainSandbox(limits, name="off")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return _without_bwrap(mode, limits, "bubblewrap (bwrap) is not installed", "install bubblewrap (apt-get install bubblewrap)")
    sandbox = BwrapSandbox(
        bwrap, Path(workspace), [Path(p) for p in writable], limits, read_only=permission == "READ_ONLY", readable=readable, keep_root=keep_root
    )
    problem = sandbox.probe()
    if problem:
        return _without_bwrap(mode, limits, f"bubblewrap cannot create a sandbox here ({problem})", _userns_fix())
    return sandbox


def open_for_run(settings: Settings, *, workspace: Path, target_dir: Path, permission: str = "READ_WRITE") -> Sandbox:
    """open_sandbox() configured from Settings (sandbox, command_timeout, output_cap, local_registry) for one run."""
    return open_sandbox(
        settings.sandbox,
        workspace=workspace,
        writable=[target_dir],
        permission=permission,
        timeout=settings.command_timeout,
        output_cap=settings.output_cap,
        readable=[Path(settings.local_registry)],
    )


def _without_bwrap(mode: str, limits: Limits, problem: str, fix: str) -> Sandbox:
    if mode == "required":
        raise SandboxError(f"sandbox required, but {problem}", fix=f"{fix}, or pass --sandbox auto to run without isolation")
    logger.warning("%s: commands run as plain processes (timeout and output cap only, no isolation). Fix: %s", problem, fix)
    return PlainSandbox(limits, name="plain")


def _userns_fix() -> str:
    return (
        "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces>0, "
        "or on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0)"
    )


class PlainSandbox:
    """A plain process in its own process group: timeout, output cap and a minimal environment, no isolation."""

    def __init__(self, limits: Limits, *, name: str = "plain") -> None:
        self.name = name
        self.limits = limits

    def run(self, argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float | None = None, stdin: str | None = None) -> CommandResult:
        full_env = {**_base_env(Path.home()), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env or {})}
        return execute(argv, argv, cwd=Path(cwd), env=full_env, timeout=timeout or self.limits.timeout, stdin=stdin, output_cap=self.limits.output_cap)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "isolated": False, **asdict(self.limits)}


@dataclass
class BwrapSandbox:
    """Bubblewrap: the system and toolchain read-only, only the workspace and `writable` dirs writable."""

    bwrap: str
    workspace: Path
    writable: list[Path]
    limits: Limits
    read_only: bool = False
    readable: Sequence[Path] = ()
    keep_root: bool = False
    name: str = "bubblewrap"
    start_overhead: float | None = None  # seconds bubblewrap adds to starting a process (measured by probe())
    home: Path = field(default_factory=lambda: _sandbox_home())

    def run(self, argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float | None = None, stdin: str | None = None) -> CommandResult:
        cwd = Path(cwd).resolve()
        if not any(cwd.is_relative_to(p.resolve()) for p in [self.workspace, *self.writable]):
            raise SandboxError(f"working directory {cwd} is outside the sandbox", fix=f"run commands inside {self.workspace}")
        full = [*self.bwrap_argv(cwd), *self.limit_argv(), *argv]
        return execute(argv, full, cwd=cwd, env=self.env(env), timeout=timeout or self.limits.timeout, stdin=stdin, output_cap=self.limits.output_cap)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The command's environment: minimal, the caller's additions, HOME and CARGO_HOME inside the sandbox."""
        env = {**_base_env(self.home), "PATH": _sandbox_path(), **(extra or {})}
        env["HOME"] = str(self.home)
        env["CARGO_HOME"] = str(self.home / ".cargo")  # the real one may hold credentials; only its bin/ is bound
        return env

    def bwrap_argv(self, cwd: Path) -> list[str]:
        """The bubblewrap command line up to the command itself; order matters (later mounts cover earlier ones)."""
        args = [self.bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "flakebot-sandbox"]
        args += ["--die-with-parent", "--new-session"]
        if not real_root():
            args.append("--unshare-user")
        args += _system_mounts()
        # 1777: as root the command runs as an unprivileged uid whose access(2) checks ignore CAP_DAC_OVERRIDE (cc picks TMPDIR so)
        args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777", "--tmpfs", str(self.home)]
        for path in _readable_paths(self.readable):
            args += ["--ro-bind", str(path), str(path)]
        workspace = self.workspace.resolve()
        args += ["--ro-bind" if self.read_only else "--bind", str(workspace), str(workspace)]
        for path in self.writable:
            path.mkdir(parents=True, exist_ok=True)
            if path.resolve() != workspace:  # the workspace's mode (read-only or not) is the permission's
                args += ["--bind", str(path.resolve()), str(path.resolve())]
        if (workspace / ".git").is_dir():  # last: git hooks/config written here would run later outside the sandbox
            args += ["--ro-bind", str(workspace / ".git"), str(workspace / ".git")]
        return [*args, "--chdir", str(cwd), "--"]

    def limit_argv(self) -> list[str]:
        """prlimit (and, as root, setpriv to an unprivileged uid) so the process limit is really enforced."""
        limit = []
        if shutil.which("prlimit"):
            limit = ["prlimit", f"--nproc={self.limits.max_processes}:{self.limits.max_processes}", "--"]
        if not real_root() or self.keep_root:
            return limit
        uid = SANDBOX_UID_BASE + os.getpid()
        if not shutil.which("setpriv") or not _uid_mapped(uid):
            logger.warning("setpriv missing or uid %d unmapped: sandboxed commands run as root and the process limit is not enforced", uid)
            return limit
        caps = ["--inh-caps=-all,+dac_override", "--ambient-caps=+dac_override", "--bounding-set=-all,+dac_override"]
        return [*limit, "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *caps, "--no-new-privs", "--"]

    def probe(self) -> str:
        """Start `true` in this sandbox: '' when it works (and measure the start overhead), else bwrap's complaint."""
        start = time.perf_counter()
        result = self.run(["true"], cwd=self.workspace, timeout=30)
        sandboxed = time.perf_counter() - start
        if not result.ok:
            return (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
        start = time.perf_counter()
        subprocess.run(["true"], check=False)
        self.start_overhead = max(sandboxed - (time.perf_counter() - start), 0.0)
        logger.info("sandbox: bubblewrap, start overhead %.1f ms over a plain process", self.start_overhead * 1000)
        return ""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "isolated": True, "read_only": self.read_only, "start_overhead_s": self.start_overhead, **asdict(self.limits)}


def real_root() -> bool:
    """Whether we are uid 0 of the initial user namespace: the one uid the kernel exempts from RLIMIT_NPROC.
    (Root in a rootless container maps to an ordinary uid outside and is treated like any user.)"""
    if os.geteuid() != 0:
        return False
    for line in Path("/proc/self/uid_map").read_text().splitlines():
        inside, outside, _count = (int(field) for field in line.split())
        if inside == 0:
            return outside == 0
    return False


def _uid_mapped(uid: int) -> bool:
    for line in Path("/proc/self/uid_map").read_text().splitlines():
        inside, _outside, count = (int(field) for field in line.split())
        if inside <= uid < inside + count:
            return True
    return False


def _sandbox_home() -> Path:
    """HOME inside the sandbox: a tmpfs over the real home path, so the real ~/.ssh and friends are not visible."""
    home = Path.home().resolve()
    return home if home != Path("/") and not any(home.is_relative_to(d) for d in SYSTEM_DIRS) else Path("/home/sandbox")


def _sandbox_path() -> str:
    dirs = [str(p) for p in _toolchain_dirs() if p.name == "bin"]
    return ":".join([*dirs, "/usr/local/bin", "/usr/bin", "/bin"])


def _base_env(home: Path) -> dict[str, str]:
    """The environment every command starts from: nothing secret from flakebot's own environment."""
    env = {"HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb", "TMPDIR": "/tmp", "USER": "sandbox"}
    env["RUSTUP_HOME"] = str(_rustup_home())
    for key in ("RUSTUP_TOOLCHAIN", "CARGO_HOME"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def _rustup_home() -> Path:
    return Path(os.environ.get("RUSTUP_HOME") or Path.home() / ".rustup")


def _toolchain_dirs() -> list[Path]:
    """rustup's toolchains and the directory holding cargo (never the rest of CARGO_HOME: credentials live there)."""
    cargo_home = Path(os.environ.get("CARGO_HOME") or Path.home() / ".cargo")
    dirs = [_rustup_home(), cargo_home / "bin"]
    found = shutil.which("cargo")
    if found:
        dirs.append(Path(found).parent)
    return [d for d in dict.fromkeys(dirs) if d.is_dir()]


def _readable_paths(extra: Sequence[Path]) -> list[Path]:
    paths = [*_toolchain_dirs(), DEBIAN_REGISTRY, *(Path(p) for p in extra)]
    covered = [Path(d) for d in SYSTEM_DIRS]
    keep = [p.resolve() for p in paths if p.exists()]
    return [p for p in dict.fromkeys(keep) if not any(p.is_relative_to(c) for c in covered)]


def _system_mounts() -> list[str]:
    """Read-only binds of the system, the usual /lib -> usr/lib links as links, and secrets masked."""
    args: list[str] = []
    for d in SYSTEM_DIRS:
        if Path(d).is_dir():
            args += ["--ro-bind", d, d]
    for link in SYSTEM_LINKS:
        path = Path(link)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), link]
        elif path.is_dir():
            args += ["--ro-bind", link, link]
    for secret in [*SECRET_FILES, *map(str, Path("/etc/ssh").glob("ssh_host_*key"))]:
        if Path(secret).is_file():
            args += ["--ro-bind", "/dev/null", secret]
    return args


class _Capture:
    """Keeps the first and last `cap // 2` bytes of a stream and counts the bytes dropped between them."""

    def __init__(self, cap: int) -> None:
        self.half = max(cap // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        excess = len(self.tail) - self.half
        if excess > 0:
            del self.tail[:excess]
            self.dropped += excess

    def text(self) -> str:
        if not self.dropped:
            return (self.head + self.tail).decode(errors="replace")
        marker = f"\n[... {self.dropped} bytes dropped by the output cap ...]\n"
        return self.head.decode(errors="replace") + marker + self.tail.decode(errors="replace")


def execute(shown: list[str], argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float, stdin: str | None, output_cap: int) -> CommandResult:
    """Run `argv` in a new session: capped output, stdin fed, the whole group killed at `timeout` and at the end."""
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        return CommandResult(shown, 127, "", f"flakebot: cannot run {argv[0]}: {exc.strerror}\n", time.perf_counter() - start)
    out, err = _Capture(output_cap), _Capture(output_cap)
    try:
        timed_out = _pump(proc, out, err, stdin.encode() if stdin is not None else None, start + timeout)
    finally:  # also on Ctrl-C: nothing outlives the call
        _kill_group(proc.pid)
        returncode = proc.wait()
    seconds = time.perf_counter() - start
    if timed_out:
        logger.info("command timed out after %.0f s and was killed: %s", timeout, " ".join(shown)[:200])
    return CommandResult(shown, returncode, out.text(), err.text(), seconds, timed_out, bool(out.dropped or err.dropped))


def _pump(proc: subprocess.Popen[bytes], out: _Capture, err: _Capture, data: bytes | None, deadline: float) -> bool:
    """Move bytes between the pipes and the captures until both close. True if the deadline killed the command."""
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    if data is not None and proc.stdin is not None:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE, memoryview(data))
    timed_out, stop = False, deadline
    try:
        while sel.get_map():
            now = time.perf_counter()
            if now >= stop:
                if timed_out or _exited(proc.pid):
                    break  # pipes held open by processes that escaped the group: stop waiting for them
                timed_out = True
                _kill_group(proc.pid)
                stop = now + EXIT_GRACE
            elif stop > now + EXIT_GRACE and _exited(proc.pid):
                stop = now + EXIT_GRACE
            for key, _ in sel.select(timeout=max(min(stop - now, 0.2), 0.0)):
                _transfer(sel, key)
    finally:
        for key in list(sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        sel.close()
    return timed_out


def _transfer(sel: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
    fd = key.fd
    if isinstance(key.data, _Capture):
        chunk = os.read(fd, 65536)
        if chunk:
            key.data.add(chunk)
            return
    else:
        try:
            written = os.write(fd, key.data[:65536])
        except BlockingIOError:
            written = 0
        except BrokenPipeError:
            written = len(key.data)  # the command stopped reading stdin: drop the rest
        rest = key.data[written:]
        if rest:
            sel.modify(key.fileobj, selectors.EVENT_WRITE, rest)
            return
    sel.unregister(key.fileobj)
    key.fileobj.close()  # type: ignore[union-attr]


def _exited(pid: int) -> bool:
    """Whether the command ended, without reaping it: its pid keeps the process group id from being reused."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_group(pgid: int) -> None:
    """SIGKILL the command's process group; for bubblewrap this takes the whole PID namespace with it."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
