"""Bubblewrap: the system and toolchain read-only, only the workspace and named dirs writable, no network."""

from __future__ import annotations

import atexit
import fnmatch
import functools
import logging
import os
import shutil
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flakebot import launcher
from flakebot.errors import SandboxError
from flakebot.sandbox.ownership import adopt
from flakebot.sandbox.process import MIB, CommandResult, SandboxLimits, _base_env, _rustup_home, execute

logger = logging.getLogger(__name__)


SYSTEM_DIRS = ("/usr", "/opt", "/nix/store")

SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

# What of /etc toolchains and tools need (users, name lookup, the dynamic linker, certificates, Debian's
# alternatives such as cc); nothing else of it is visible. Root-only files under these stay unreadable: the
# command holds no capabilities.
ETC_ALLOWED = (
    "passwd", "group", "hosts", "host.conf", "nsswitch.conf", "resolv.conf", "gai.conf", "protocols", "services",
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl/certs", "ssl/openssl.cnf", "ca-certificates",
    "ca-certificates.conf", "pki/tls/certs", "alternatives", "localtime", "timezone", "os-release", "debian_version",
    "mime.types", "magic", "terminfo", "locale.alias",
)  # fmt: skip

# Masked (bound over with /dev/null) last in every sandbox: a caller's bind of /etc (a tool's argument) must not
# uncover them either.
SECRET_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers")

DEBIAN_REGISTRY = Path("/usr/share/cargo/registry")

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
    cargo_home: Path | None = None  # flakebot's CARGO_HOME: its registry/ is bound read-only into the sandbox's own
    cargo_git: Path | None = None  # the run's own view of CARGO_HOME's git/ (cargo.fetch), bound read-only as git/
    # flakebot's own trees (as root): hand the writable dirs to the sandbox uid before each command; otherwise the
    # command keeps the caller's uid (a caller's own directory is never changed), still with no capabilities
    adopt: bool = False
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
        on_line: Callable[[str], None] | None = None,
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
            spill=self.limits.spill,
            on_line=on_line,
        )

    def command(
        self, argv: list[str], *, cwd: Path, env: dict[str, str] | None = None
    ) -> tuple[list[str], dict[str, str]]:
        return self.command_line(argv, cwd=cwd), self.env(env)

    def command_line(self, argv: list[str], *, cwd: Path) -> list[str]:
        """command's argv alone: for a caller that gives the command its own whole environment (a service's
        supervisor), which then never reads rustup's settings for an environment it drops."""
        limit = self.limit_argv()
        uid = self.sandbox_uid()
        for path in self.writable:  # made before they are adopted: a directory made after would stay root's
            path.mkdir(parents=True, exist_ok=True)
        if uid is not None:  # with adopt, a writable bind's source is flakebot's own too (a tool's staged writes)
            own = [self.workspace, *self.writable, *(source for rw, source, _ in self.binds if rw)]
            trees = [p for p in dict.fromkeys(own) if not (self.read_only and p == self.workspace)]
            adopt(trees, uid, self.frozen)
        return [*self.bwrap_argv(Path(cwd).resolve()), *limit, *argv]

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
        if (uid := self.sandbox_uid()) is not None:
            # as a Nix builder's /etc/passwd names its build user: tools that look up their own user find one
            users = _users_with(uid, self.home)
            args += ["--ro-bind", str(users / "passwd"), "/etc/passwd", "--ro-bind", str(users / "group"), "/etc/group"]
        # 1777: as root the command runs as an unprivileged uid with no capabilities
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
        if _real_directory(str(workspace / ".git")):  # last: hooks/config written here would run outside later
            args += ["--ro-bind", str(workspace / ".git"), f"{at}/.git"]
        # over the writable workspace: a build script or test cannot rewrite them, nor move a directory above them
        # aside to put another file at their path for the command's while (each such directory bound onto itself:
        # a mount point cannot be renamed)
        frozen = _frozen_paths(self.frozen, workspace)
        for directory in dict.fromkeys(d for path in frozen for d in path.parents if d.is_relative_to(workspace)):
            if directory != workspace:
                args += ["--bind", str(directory), str(directory)]
        for path in frozen:
            args += ["--ro-bind", str(path), str(path)]
        # last of all: no bind above, whatever path it names, uncovers a secret
        return [*_parents_first([*args, *_secret_masks(args)]), "--chdir", str(cwd), "--"]

    def _cargo_cache_binds(self) -> list[str]:
        """The crates fetched on the host, read-only at the sandbox's CARGO_HOME (a tmpfs: cargo takes its lock files there).
        Nothing else of that CARGO_HOME is visible (its config.toml and credentials stay outside)."""
        inside = self.home / ".cargo"
        sources = {"registry": self.cargo_home / "registry" if self.cargo_home else None, "git": self.cargo_git}
        binds = [
            arg
            for sub, source in sources.items()
            if source is not None and source.is_dir()
            for arg in ("--ro-bind", str(source.resolve()), str(inside / sub))
        ]
        return ["--perms", "1777", "--dir", str(inside), *binds] if binds else []

    def limit_argv(self) -> list[str]:
        """prlimit, and as root setpriv: every capability dropped and, for flakebot's own trees, an unprivileged uid
        so the process limit is really enforced."""
        limit = self.limits.prlimit_argv()
        if not real_root():
            return limit  # bubblewrap's user namespace: the command holds no capabilities outside it
        if not shutil.which("setpriv"):
            raise SandboxError(
                "setpriv is missing: as root the sandbox cannot drop its capabilities",
                fix="install util-linux (it provides setpriv)",
            )
        uid = self.sandbox_uid()
        user = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if uid is not None else []
        caps = ["--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"]
        return [*limit, "setpriv", *user, *caps, "--no-new-privs", "--"]

    def sandbox_uid(self) -> int | None:
        """As root with `adopt`: the unused uid (and gid) commands run as; else None (the caller's uid)."""
        if not (real_root() and self.adopt):
            return None
        uid = SANDBOX_UID_BASE + os.getpid()
        if not _uid_mapped(uid):
            raise SandboxError(f"uid {uid} is not mapped here", fix="run flakebot where the full uid range is mapped")
        return uid

    def probe(self) -> str:
        """Start `true` in this sandbox: '' when it works (and measure the start overhead), else bwrap's complaint."""
        start = time.perf_counter()
        result = self.run(["true"], cwd=self.workspace_at or self.workspace, timeout=30)
        sandboxed = time.perf_counter() - start
        if not result.ok:
            return (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
        start = time.perf_counter()
        launcher.run(["true"], check=False)
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
    for inside, outside, _count in _uid_map():
        if inside == 0:
            return outside == 0
    return False


def _uid_mapped(uid: int) -> bool:
    return any(inside <= uid < inside + count for inside, _outside, count in _uid_map())


def _uid_map() -> tuple[tuple[int, int, int], ...]:
    """/proc/self/uid_map as (inside, outside, count) lines, read once per user namespace: the kernel takes a
    namespace's map once and never changes it, and every sandboxed command's start asked for it eight times. Kept
    with the namespace's identity, so a process that moved to another namespace reads its map anew; an empty map (not
    written yet) is never kept."""
    global _kept_uid_map
    try:
        status = os.stat("/proc/self/ns/user")
        namespace: tuple[int, int] | None = (status.st_dev, status.st_ino)
    except OSError:
        namespace = None
    kept = _kept_uid_map
    if namespace is not None and kept is not None and kept[0] == namespace:
        return kept[1]
    with open("/proc/self/uid_map", encoding="ascii") as file:
        lines = tuple(_map_line(line) for line in file.read().splitlines() if line.strip())
    if namespace is not None and lines:
        _kept_uid_map = (namespace, lines)
    return lines


def _map_line(line: str) -> tuple[int, int, int]:
    inside, outside, count = (int(field) for field in line.split())
    return inside, outside, count


_kept_uid_map: tuple[tuple[int, int], tuple[tuple[int, int, int], ...]] | None = None


def _sandbox_home() -> Path:
    """HOME inside the sandbox: a tmpfs over the real home path, so the real ~/.ssh and friends are not visible."""
    home = Path.home().resolve()
    return home if home != Path("/") and not any(home.is_relative_to(d) for d in SYSTEM_DIRS) else Path("/home/sandbox")


def _new_directory(parent: Path, prefix: str) -> Path:
    """A new directory (0700) `PREFIX<random>` in `parent`: tempfile.mkdtemp's, without tempfile and random in a
    service's supervisor (benchmarks S5: its memory)."""
    while True:
        directory = parent / f"{prefix}{os.urandom(6).hex()}"
        try:
            directory.mkdir(mode=0o700)
            return directory
        except FileExistsError:
            continue


@functools.cache
def _users_with(uid: int, home: Path) -> Path:
    """A directory holding the host's /etc/passwd and /etc/group plus a line for the sandbox uid (and its gid), made
    once per process and removed at exit."""
    directory = _new_directory(Path(os.environ.get("TMPDIR") or "/tmp"), "flakebot-users-")
    directory.chmod(0o755)
    atexit.register(shutil.rmtree, directory, True)
    lines = {"passwd": f"flakebot:x:{uid}:{uid}:flakebot sandbox:{home}:/bin/sh", "group": f"flakebot:x:{uid}:"}
    for name, line in lines.items():
        host = Path("/etc", name)
        text = host.read_text().rstrip("\n") + "\n" if host.is_file() else ""
        (directory / name).write_text(text + line + "\n")
        (directory / name).chmod(0o644)
    return directory


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


def _real_directory(path: str) -> bool:
    """Whether `path` is a directory itself, not a link to one: a link a command left in its workspace, bound by its
    name, is followed on the host for the source and inside for the destination (.git -> ../../root would put the
    host's home over the sandbox's)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _system_mounts() -> list[str]:
    """Read-only binds of the system, the usual /lib -> usr/lib links as links, and of /etc only ETC_ALLOWED
    (secrets are masked last). One stat per path, as strings: pathlib's tests of these ~35 paths were a fifth of
    every sandboxed command's start (each acceptance example starts one)."""
    args: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for link in [*SYSTEM_LINKS, *(f"/etc/{name}" for name in ETC_ALLOWED)]:
        try:
            mode = os.lstat(link).st_mode
        except OSError:
            continue
        if stat.S_ISLNK(mode):
            args += ["--symlink", os.readlink(link), link]
        else:
            args += ["--ro-bind", link, link]
    return args


def secret_files() -> list[Path]:
    """Host files no sandbox may read (password hashes, sudoers, ssh host keys): masked last in every sandbox."""
    return [Path(p) for p in _secret_paths()]


def _secret_paths() -> list[str]:
    """secret_files as strings, found without pathlib (every sandboxed command's start asks)."""
    try:
        with os.scandir("/etc/ssh") as listing:
            keys = sorted(f"/etc/ssh/{e.name}" for e in listing if fnmatch.fnmatchcase(e.name, "ssh_host_*key"))
    except OSError:
        keys = []
    return [p for p in [*SECRET_FILES, *keys] if os.path.isfile(p)]


def _secret_masks(args: list[str]) -> list[str]:
    """/dev/null over each secret a bind in `args` shows, wherever that bind puts it (a bind of /etc at /x shows
    /etc/shadow as /x/shadow); secrets no bind shows are not there to mask."""
    binds = [
        (args[i + 1], args[i + 2]) for i, op in enumerate(args) if op in ("--bind", "--ro-bind") and i + 2 < len(args)
    ]
    shown: dict[str, None] = {}
    where = _secrets_under()
    for source, dest in binds:  # strings, not Paths: pathlib's tests cost 2 ms of every sandboxed command's start
        try:  # what the bind shows, links followed as bubblewrap follows them: one stat, not a realpath's walk
            status = os.stat(source)
        except OSError:
            continue  # nothing there: it shows nothing (bubblewrap refuses the bind)
        for below in where.get((status.st_dev, status.st_ino), ()):
            shown[str(Path(dest) / below)] = None
    return [arg for path in shown for arg in ("--ro-bind", "/dev/null", path)]


def _secrets_under() -> dict[tuple[int, int], list[str]]:
    """For each secret file and each directory above it, by (device, inode): where below it each secret lies ('' for
    the secret itself). A bind whose source is one of them (by any path: a link, another mount of it, a hard link of
    the file) shows those secrets below its destination."""
    where: dict[tuple[int, int], list[str]] = {}
    for text in _secret_paths():
        for top in [text, *_parents(text)]:
            try:
                status = os.stat(top)
            except OSError:
                continue
            below = _below(text, top)
            if below is not None:
                where.setdefault((status.st_dev, status.st_ino), []).append(below)
    return where


def _below(path: str, top: str) -> str | None:
    """`path` relative to `top` ('' for `top` itself) when it lies there, else None; both absolute and normalised
    (as str(Path) and os.path.realpath spell them): Path.relative_to's answer, without building Paths."""
    if path == top:
        return ""
    prefix = top if top.endswith("/") else top + "/"
    if not path.startswith(prefix) or path.startswith("/", len(prefix)):  # '//x' is not below '/': '//' is an anchor
        return None
    return path[len(prefix) :]


MOUNT_OPS = {"--ro-bind": 2, "--bind": 2, "--symlink": 2, "--tmpfs": 1, "--proc": 1, "--dev": 1, "--dir": 1}
PREFIX_OPS = {"--perms", "--size"}


def _parents_first(args: list[str]) -> list[str]:
    """`args` with each mount point's missing parents made first as mode-0755 directories: bubblewrap makes them
    0700, which the unprivileged uid (without capabilities) could not traverse to reach its workspace."""
    out: list[str] = []
    made: set[str] = {"/"}  # paths as str(Path) spells them
    bound: dict[str, str] = {}  # real directories mounted (dest -> source): what exists under them needs no --dir
    i, pending = 0, []
    while i < len(args):
        op = args[i]
        if op in PREFIX_OPS:
            pending += args[i : i + 2]
            i += 2
            continue
        if op not in MOUNT_OPS:
            out.append(op)
            i += 1
            continue
        count = MOUNT_OPS[op]
        dest = _spelled(args[i + count])
        for parent in _parents(dest):
            if parent not in made and not _exists_under(parent, bound):
                out += ["--perms", "0755", "--dir", parent]
                made.add(parent)
        out += [*pending, *args[i : i + count + 1]]
        made.add(dest)
        if op in ("--ro-bind", "--bind") and os.path.isdir(args[i + 1]):
            bound[dest] = args[i + 1]
        i, pending = i + count + 1, []
    return out


@functools.lru_cache(maxsize=1024)
def _spelled(path: str) -> str:
    """`path` as str(Path) spells it; kept, as it depends on the text alone (a command's ~50 mount points, each
    spelled as a Path again at every sandboxed command's start, were a tenth of it)."""
    return str(Path(path))


@functools.lru_cache(maxsize=1024)
def _parents(text: str) -> tuple[str, ...]:
    """Each of `text`'s parents as str(Path) spells it, the root first: reversed(Path(text).parents), without a Path
    each; kept, as it depends on the text alone."""
    if text == "/" or not text.startswith("/") or text.startswith("//"):
        return tuple(str(p) for p in reversed(Path(text).parents))
    parts = text.split("/")
    return ("/", *("/".join(parts[:k]) for k in range(2, len(parts))))


def _exists_under(path: str, bound: dict[str, str]) -> bool:
    """Whether `path` lies in a mounted directory that really holds it (an empty scratch directory mounted at the
    caller's path does not hold the caller's subdirectories: bubblewrap would make those 0700)."""
    for dest, source in bound.items():
        below = _below(path, dest)
        if below is not None and os.path.isdir(os.path.join(source, below)):
            return True
    return False
