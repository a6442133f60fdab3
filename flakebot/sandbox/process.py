"""Running one command with limits: timeout (the whole process tree is killed), output cap, minimal environment."""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from flakebot import launcher
from flakebot.homes import rustup_home

logger = logging.getLogger(__name__)


MAX_PROCESSES = 512  # tasks (threads count too); cargo + rustc + a test binary stay far below
EXIT_GRACE = 1.0  # seconds to keep reading pipes after the command ended or was killed
# Seconds between checks of the disk limit while a command runs: a writer filling the page cache writes 1-2 GiB/s,
# so the check must be frequent for the overshoot to stay small (statvfs costs microseconds).
WATCH_INTERVAL = 0.05
MIB = 1024 * 1024
# The longest stdout line handed to an on_line reader (cargo's JSON messages, a rendered diagnostic included, are far
# shorter): past it the line's rest is dropped, so a command writing without a newline cannot grow our memory.
LINE_CAP = MIB
R = TypeVar("R")
# The stops of the callers running this thread's commands (at_once): Ctrl-C and SIGTERM land in the main thread only,
# so a command on another thread is killed when its caller's stop is set, as the main thread's own is by `finally`.
_stops: ContextVar[tuple[threading.Event, ...]] = ContextVar("flakebot_command_stops", default=())
INTERRUPTED = "the caller was interrupted: the command was killed"


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
    limit: str = ""  # the limit that killed the command ("disk"), when one did
    stdout_file: str = ""  # with SandboxLimits.spill: the file holding the whole stdout, when it passed spill.limit
    stdout_bytes: int = 0  # the whole stdout's size, when it went to stdout_file

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.limit

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Sandbox(Protocol):
    """Runs one command with limits. `name` says which kind ("bubblewrap", "plain", "off")."""

    name: str

    def run(
        self,
        argv: list[str],
        *,
        cwd: Path,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        stdin: str | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> CommandResult: ...

    def command(
        self, argv: list[str], *, cwd: Path, env: dict[str, str] | None = None
    ) -> tuple[list[str], dict[str, str]]:
        """The full command line and environment (with `env` added) that `run` uses, also for a caller that runs
        it attached to its own terminal (no timeout, no capture): `flakebot run TOOL`."""
        ...


@dataclass(frozen=True)
class Spill:
    """Where a command's whole stdout goes once it passes `limit` bytes: a new file in `directory` (the command is
    killed if the file would pass `file_cap` bytes). Below the limit stdout stays in memory, whole."""

    directory: Path
    limit: int
    file_cap: int


@dataclass
class SandboxLimits:
    """Per-command limits shared by every sandbox kind."""

    timeout: float = 600.0
    output_cap: int = 200_000  # bytes kept per stream (stdout, stderr): half from the start, half from the end
    max_processes: int = MAX_PROCESSES
    memory_mb: int = (
        4096  # RLIMIT_DATA per process: heap and private mappings; rustc on a large crate stays under 2 GiB
    )
    file_mb: int = 2048  # RLIMIT_FSIZE: the largest file one process may write
    disk_mb: int = 10240  # growth of the workspace's file system while one command runs; past it the command is killed
    tmp_mb: int = 1024  # size of the private /tmp and HOME tmpfs (bubblewrap only)
    spill: Spill | None = None  # a crafted tool's call: stdout whole, past a limit in a file (never capped)

    def prlimit_argv(self) -> list[str]:
        """`prlimit` with the per-process limits, or nothing when prlimit is missing (logged)."""
        if not shutil.which("prlimit"):
            logger.warning("prlimit is missing: sandboxed commands run without process, memory and file-size limits")
            return []
        limits = {"nproc": self.max_processes, "data": self.memory_mb * MIB, "fsize": self.file_mb * MIB}
        return ["prlimit", *(f"--{name}={value}:{value}" for name, value in limits.items()), "--"]

    def disk_watch(self, path: Path) -> Callable[[], str]:
        """A check run while a command runs: '' while the file system holding `path` grew by less than disk_mb."""
        start = _used_bytes(path)

        def watch() -> str:
            grown = (_used_bytes(path) - start) // MIB
            return (
                f"disk: the command wrote more than {self.disk_mb} MiB and was killed" if grown > self.disk_mb else ""
            )

        return watch


def _used_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


class PlainSandbox:
    """A plain process in its own process group: timeout, output cap, per-process limits and a minimal environment, no isolation."""

    def __init__(self, limits: SandboxLimits, *, name: str = "plain") -> None:
        self.name = name
        self.limits = limits

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
        full, full_env = self.command(argv, cwd=cwd, env=env)
        timeout = timeout or self.limits.timeout
        watch = self.limits.disk_watch(Path(cwd))
        return execute(
            argv,
            full,
            cwd=Path(cwd),
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
        full_env = {**_base_env(Path.home()), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env or {})}
        return [*self.limits.prlimit_argv(), *argv], full_env

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "isolated": False, **asdict(self.limits)}


def _base_env(home: Path) -> dict[str, str]:
    """The environment every command starts from: nothing secret from flakebot's own environment."""
    env = {"HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb", "TMPDIR": "/tmp", "USER": "sandbox"}
    env["RUSTUP_HOME"] = str(_rustup_home())
    for key in ("RUSTUP_TOOLCHAIN", "CARGO_HOME"):
        if key in os.environ:
            env[key] = os.environ[key]
    toolchain = env.get("RUSTUP_TOOLCHAIN") or _default_toolchain()
    if toolchain:  # pinned: a rust-toolchain.toml the model plants must not make rustup pick (or fetch) another one
        env["RUSTUP_TOOLCHAIN"] = toolchain
    return env


def _default_toolchain() -> str:
    """rustup's default toolchain (its settings.toml), or '' without rustup."""
    import tomllib  # here: the supervisor, which never reads it, imports this module (benchmarks S5: its memory)

    try:
        return str(tomllib.loads((_rustup_home() / "settings.toml").read_text()).get("default_toolchain") or "")
    except (OSError, tomllib.TOMLDecodeError):
        return ""


def _rustup_home() -> Path:
    return rustup_home()


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

    def close(self) -> None:
        pass


class _Spill(_Capture):
    """A stream kept whole: in memory up to `spill.limit` bytes; past it, all of it in a new file in
    `spill.directory` (only the first `limit` bytes stay in memory), up to `spill.file_cap` bytes."""

    def __init__(self, spill: Spill) -> None:
        super().__init__(0)
        self.spill, self.size = spill, 0
        self.path: Path | None = None
        self.file: Any = None

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.file is None:
            self.head += chunk
            if len(self.head) <= self.spill.limit:
                return
            self.path = self._open()
            chunk = bytes(self.head)
            del self.head[self.spill.limit :]
        kept = chunk[: max(self.spill.file_cap - self.file.tell(), 0)]
        self.file.write(kept)
        self.dropped += len(chunk) - len(kept)

    def _open(self) -> Path:
        self.spill.directory.mkdir(parents=True, exist_ok=True)
        path = self.spill.directory / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(4).hex()}.stdout"
        self.file = open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")  # noqa: SIM115 - closed by close()
        return path

    def over(self) -> str:
        """The limit check: the file would grow past file_cap (the rest would be lost), so the command is killed."""
        return (
            f"output: stdout passed {self.spill.file_cap} bytes: the rest was dropped and the command stopped"
            if self.dropped
            else ""
        )

    def text(self) -> str:
        return self.head.decode(errors="replace")

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class _Lines(_Capture):
    """A capture that also hands each whole line to `on_line` as it arrives (cargo's artifact messages, read while
    the tests still run); the capture itself stays the one `execute` reads. A line is handed on at most LINE_CAP long:
    the rest of a longer one is never held (a test may write without a newline for as long as it likes)."""

    def __init__(self, inner: _Capture, on_line: Callable[[str], None]) -> None:
        super().__init__(0)
        self.inner, self.on_line, self.partial = inner, on_line, bytearray()

    def add(self, chunk: bytes) -> None:
        self.inner.add(chunk)
        *lines, rest = chunk.split(b"\n")
        for line in lines:
            self.on_line((self.partial + line[: max(0, LINE_CAP - len(self.partial))]).decode(errors="replace"))
            self.partial = bytearray()
        self.partial += rest[: max(0, LINE_CAP - len(self.partial))]

    def text(self) -> str:
        return self.inner.text()

    def close(self) -> None:
        self.inner.close()


_commands_lock = threading.Lock()
_commands = [0, 0]  # sandboxed commands this process started, and of them those that ended (execute)


def commands_seen() -> tuple[int, int]:
    """How many sandboxed commands this process has started, and how many of them ended (each one's whole process
    group killed by then): while both stay as they were and equal, no sandboxed command has written anything since."""
    with _commands_lock:
        return _commands[0], _commands[1]


@contextlib.contextmanager
def _counted() -> Iterator[None]:
    with _commands_lock:
        _commands[0] += 1
    try:
        yield
    finally:
        with _commands_lock:
            _commands[1] += 1


def execute(
    shown: list[str],
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    stdin: str | None,
    output_cap: int,
    watch: Callable[[], str] | None = None,
    spill: Spill | None = None,
    inherit_stdin: bool = False,
    on_line: Callable[[str], None] | None = None,
) -> CommandResult:
    """Run `argv` in a new session: capped output (with `spill`, stdout whole: in memory or in a file), stdin fed
    (or the caller's own, `inherit_stdin`), the whole group killed at `timeout`, when `watch()` names a limit it
    passed, and at the end. `on_line(line)`: each whole stdout line as it arrives (before the command ends), whatever
    the cap keeps."""
    with _counted():  # commands_seen: started before anything runs, ended once the whole group is gone
        start = time.perf_counter()
        try:
            proc = launcher.popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=None if inherit_stdin else subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            return CommandResult(
                shown, 127, "", f"flakebot: cannot run {argv[0]}: {exc.strerror}\n", time.perf_counter() - start
            )
        out: _Capture = _Capture(output_cap) if spill is None else _Spill(spill)
        err = _Capture(output_cap)
        breach = _Breach(_also(watch, out.over) if isinstance(out, _Spill) else watch)
        if stops := _stops.get():
            breach = _Breach(_also(breach.watch, lambda: INTERRUPTED if any(s.is_set() for s in stops) else ""))
        try:
            sink = out if on_line is None else _Lines(out, on_line)
            timed_out = _pump(proc, sink, err, stdin.encode() if stdin is not None else None, start + timeout, breach)
        finally:  # also on Ctrl-C: nothing outlives the call
            _kill_group(proc.pid)
            returncode = proc.wait()
            out.close()
        if isinstance(out, _Spill) and not breach.reason:  # it ended before the watch looked: the cut is still said
            breach.reason = out.over()
        seconds = time.perf_counter() - start
        if timed_out:
            logger.info("command timed out after %.0f s and was killed: %s", timeout, " ".join(shown)[:200])
        if breach.reason:
            logger.warning("%s: %s", breach.reason, " ".join(shown)[:200])
            err.add(f"\nflakebot: {breach.reason}\n".encode())
        spilled = out.path if isinstance(out, _Spill) and out.path else None
        return CommandResult(
            shown, returncode, out.text(), err.text(), seconds, timed_out, bool(out.dropped or err.dropped), breach.reason,
            str(spilled or ""), out.size if isinstance(out, _Spill) and spilled else 0,
        )  # fmt: skip


def at_once(calls: Sequence[Callable[[], R]], workers: int) -> list[R]:
    """Each call on a thread of a pool (`workers` at once), the results in the calls' order. When the caller is
    interrupted or a call raises, the commands the other calls are running are killed (execute), not left to run to
    their timeouts while the caller waits for its pool."""
    from concurrent.futures import Future, ThreadPoolExecutor

    stop = threading.Event()
    stops = (*_stops.get(), stop)  # a nested caller's stop reaches the commands of the calls it made

    def stoppable(call: Callable[[], R]) -> R:
        token = _stops.set(stops)
        try:
            return call()
        finally:
            _stops.reset(token)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="at-once") as pool:
        futures: list[Future[R]] = []
        try:  # submitting too: a Ctrl-C between two submits must stop the calls already running
            for call in calls:
                futures.append(pool.submit(stoppable, call))
            return [future.result() for future in futures]
        except BaseException:
            stop.set()
            for future in futures:
                future.cancel()
            raise


def _also(first: Callable[[], str] | None, second: Callable[[], str]) -> Callable[[], str]:
    return lambda: (first() if first else "") or second()


class _Breach:
    """Calls a limit check at most every WATCH_INTERVAL seconds; remembers the first limit passed."""

    def __init__(self, watch: Callable[[], str] | None) -> None:
        self.watch, self.reason, self.next = watch, "", 0.0
        self.interval = WATCH_INTERVAL if watch is not None else 0.2  # the longest the pump sleeps between looks

    def check(self) -> bool:
        now = time.perf_counter()
        if self.watch is not None and not self.reason and now >= self.next:
            self.next = now + WATCH_INTERVAL
            self.reason = self.watch()
        return bool(self.reason)


def _pump(
    proc: subprocess.Popen[bytes], out: _Capture, err: _Capture, data: bytes | None, deadline: float, breach: _Breach
) -> bool:
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
            elif stop > now + EXIT_GRACE and (_exited(proc.pid) or breach.check()):
                _kill_group(proc.pid)  # a no-op when it ended by itself
                stop = now + EXIT_GRACE
            for key, _ in sel.select(timeout=max(min(stop - now, breach.interval), 0.0)):
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
