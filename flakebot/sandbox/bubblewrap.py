"""Bubblewrap: the system and toolchain read-only, only the workspace and named dirs writable, no network."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flakebot.errors import SandboxError
from flakebot.sandbox.process import MIB, CommandResult, SandboxLimits, _base_env, _rustup_home, execute

logger = logging.getLogger(__name__)


SYSTEM_DIRS = ("/usr", "/etc", "/opt", "/nix/store")

SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

SECRET_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers")

DEBIAN_REGISTRY = Path("/usr/share/cargo/registry")

CARGO_CACHE_DIRS = ("registry", "git")  # what host-side `cargo fetch` fills in CARGO_HOME

SANDBOX_UID_BASE = 1_500_000_000  # as root: commands run as BASE + our pid, a uid nothing else uses


@dataclass
class BwrapSandbox:
    """Bubblewrap: the system and toolchain read-only, only the workspace and `writable` dirs writable."""

    bwrap: str
    workspace: Path
    writable: list[Path]
    limits: SandboxLimits
    read_only: bool = False
    readable: Sequence[Path] = ()
    frozen: Sequence[Path] = ()  # files inside the workspace bound read-only over it (the acceptance test)
    # Where the workspace appears inside (a tool run: at the caller's directory, so relative arguments resolve),
    # and (writable, source, destination) binds over it in order: the paths a tool's caller names.
    workspace_at: Path | None = None
    binds: Sequence[tuple[bool, Path, Path]] = ()
    cargo_home: Path | None = (
        None  # flakebot's CARGO_HOME: its registry/ and git/ are bound read-only into the sandbox's own
    )
    name: str = "bubblewrap"
    start_overhead: float | None = None  # seconds bubblewrap adds to starting a process (measured by probe())
    home: Path = field(default_factory=lambda: _sandbox_home())

    def run(
        self,
        argv: list[str],
        *,
        cwd: Path,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        stdin: str | None = None,
    ) -> CommandResult:
        cwd = Path(cwd).resolve()
        inside = [self.workspace_at or self.workspace, *self.writable, *(dest for rw, _, dest in self.binds if rw)]
        if not any(cwd.is_relative_to(p.resolve()) for p in inside):
            raise SandboxError(
                f"working directory {cwd} is outside the sandbox", fix=f"run commands inside {self.workspace}"
            )
        full, full_env = self.command(argv, cwd=cwd, env=env)
        timeout = timeout or self.limits.timeout
        watch = self.limits.disk_watch(self.workspace)
        return execute(
            argv,
            full,
            cwd=cwd,
            env=full_env,
            timeout=timeout,
            stdin=stdin,
            output_cap=self.limits.output_cap,
            watch=watch,
        )

    def command(
        self, argv: list[str], *, cwd: Path, env: dict[str, str] | None = None
    ) -> tuple[list[str], dict[str, str]]:
        return [*self.bwrap_argv(Path(cwd).resolve()), *self.limit_argv(), *argv], self.env(env)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The command's environment: minimal, the caller's additions, HOME and CARGO_HOME inside the sandbox."""
        env = {**_base_env(self.home), "PATH": _sandbox_path(), **(extra or {})}
        env["HOME"] = str(self.home)
        env["CARGO_HOME"] = str(self.home / ".cargo")  # the real one may hold credentials; only its bin/ is bound
        return env

    def bwrap_argv(self, cwd: Path) -> list[str]:
        """The bubblewrap command line up to the command itself; order matters (later mounts cover earlier ones)."""
        args = [
            self.bwrap,
            "--unshare-net",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--hostname",
            "flakebot-sandbox",
        ]
        args += ["--die-with-parent", "--new-session"]
        if not real_root():
            args.append("--unshare-user")
        args += _system_mounts()
        # 1777: as root the command runs as an unprivileged uid whose access(2) checks ignore CAP_DAC_OVERRIDE (cc picks TMPDIR so)
        size = str(self.limits.tmp_mb * MIB)
        args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", size, "--tmpfs", "/tmp"]
        args += ["--perms", "1777", "--size", size, "--tmpfs", str(self.home)]
        for path in _readable_paths(self.readable):
            args += ["--ro-bind", str(path), str(path)]
        args += self._cargo_cache_binds()
        workspace = self.workspace.resolve()
        at = str(self.workspace_at or workspace)
        args += ["--ro-bind" if self.read_only else "--bind", str(workspace), at]
        for path in self.writable:
            path.mkdir(parents=True, exist_ok=True)
            if path.resolve() != workspace:  # the workspace's mode (read-only or not) is the permission's
                args += ["--bind", str(path.resolve()), str(path.resolve())]
        for writable, source, dest in self.binds:
            args += ["--bind" if writable else "--ro-bind", str(source), str(dest)]
        if (workspace / ".git").is_dir():  # last: git hooks/config written here would run later outside the sandbox
            args += ["--ro-bind", str(workspace / ".git"), f"{at}/.git"]
        # over the writable workspace: a build script or test cannot rewrite them
        for path in _frozen_paths(self.frozen, workspace):
            args += ["--ro-bind", str(path), str(path)]
        # last of all: no bind above, whatever path it names, uncovers a secret
        return [*args, *_secret_masks(), "--chdir", str(cwd), "--"]

    def _cargo_cache_binds(self) -> list[str]:
        """The crates fetched on the host, read-only at the sandbox's CARGO_HOME (a tmpfs: cargo takes its lock files there).
        Nothing else of that CARGO_HOME is visible (its config.toml and credentials stay outside)."""
        if self.cargo_home is None:
            return []
        inside = self.home / ".cargo"
        return [
            arg
            for sub in CARGO_CACHE_DIRS
            if (self.cargo_home / sub).is_dir()
            for arg in ("--ro-bind", str((self.cargo_home / sub).resolve()), str(inside / sub))
        ]

    def limit_argv(self) -> list[str]:
        """prlimit (and, as root, setpriv to an unprivileged uid) so the process limit is really enforced."""
        limit = self.limits.prlimit_argv()
        if not real_root():
            return limit
        uid = SANDBOX_UID_BASE + os.getpid()
        if not shutil.which("setpriv") or not _uid_mapped(uid):
            logger.warning(
                "setpriv missing or uid %d unmapped: sandboxed commands run as root and the process limit is not enforced",
                uid,
            )
            return limit
        caps = ["--inh-caps=-all,+dac_override", "--ambient-caps=+dac_override", "--bounding-set=-all,+dac_override"]
        return [*limit, "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *caps, "--no-new-privs", "--"]

    def probe(self) -> str:
        """Start `true` in this sandbox: '' when it works (and measure the start overhead), else bwrap's complaint."""
        start = time.perf_counter()
        result = self.run(["true"], cwd=self.workspace_at or self.workspace, timeout=30)
        sandboxed = time.perf_counter() - start
        if not result.ok:
            return (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
        start = time.perf_counter()
        subprocess.run(["true"], check=False)
        self.start_overhead = max(sandboxed - (time.perf_counter() - start), 0.0)
        logger.info("sandbox: bubblewrap, start overhead %.1f ms over a plain process", self.start_overhead * 1000)
        return ""

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "isolated": True,
            "read_only": self.read_only,
            "frozen": [str(p) for p in self.frozen],
            "start_overhead_s": self.start_overhead,
            **asdict(self.limits),
        }


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


def _frozen_paths(frozen: Sequence[Path], workspace: Path) -> list[Path]:
    paths = [Path(p).resolve() for p in frozen]
    for path in paths:
        if not path.is_file() or not path.is_relative_to(workspace):
            raise SandboxError(
                f"frozen file {path} is not a file inside the workspace {workspace}",
                fix="write the acceptance test again (flakebot resume)",
            )
    return paths


def _system_mounts() -> list[str]:
    """Read-only binds of the system and the usual /lib -> usr/lib links as links (secrets are masked last)."""
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
    return args


def secret_files() -> list[Path]:
    """Host files no sandbox may read (password hashes, sudoers, ssh host keys): masked last in every sandbox."""
    return [Path(p) for p in [*SECRET_FILES, *map(str, Path("/etc/ssh").glob("ssh_host_*key"))] if Path(p).is_file()]


def _secret_masks() -> list[str]:
    return [arg for secret in secret_files() for arg in ("--ro-bind", "/dev/null", str(secret))]
