"""Calling nix: the command lines (Nix 2.8 flags), the nixpkgs mode, and bounded runs that keep the log tail."""

from __future__ import annotations

import collections
import functools
import grp
import json
import logging
import os
import platform
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from flakebot import launcher, probecache
from flakebot.config import Settings
from flakebot.errors import NixError
from flakebot.nix import builders as builders_module

logger = logging.getLogger(__name__)

FEATURES = ["--extra-experimental-features", "nix-command flakes"]
LOG_TAIL_LINES = 30
INSTALL_FIX = (
    "install Nix: 'apt-get install nix-bin' on Debian/Ubuntu (then scripts/setup.sh), or see https://nixos.org/download"
)
# Hosts a pinned (real nixpkgs) build needs: the nixpkgs tarball and the binary cache.
NETWORK_PROBES = (("github.com", 443), ("cache.nixos.org", 443))
# Who builds when flakebot runs as root: the users Nix's installers (and Debian's nix-bin) create.
BUILD_USERS_GROUP = "nixbld"
# Seconds between a waiting build's looks at another nix process's lock on the same output (Nix's default: 5).
POLL_SECONDS = "1"
# System directories a stand-in build reads (bash, coreutils, git, the C toolchain and libraries); root-owned,
# so a build user cannot write them.
SYSTEM_PATHS = ("/usr", "/bin", "/lib", "/lib32", "/lib64", "/etc/alternatives")


def nix_program(name: str = "nix") -> str:
    """Absolute path of a nix program, or a NixError saying how to install Nix."""
    found = shutil.which(name)
    if found is None:
        raise NixError(f"nix is not installed (no '{name}' on PATH)", fix=INSTALL_FIX)
    return found


def machine_options(mode: str, standin: Path | None = None, builders: str = "") -> list[str]:
    """Options every nix call of flakebot's takes (build, eval, check, develop, run): build users, Nix's sandbox,
    the host stand-in's needs, remote builders. One place, so no call builds model code another way."""
    options = build_user_options()
    if mode == "host" or options:
        # sandbox-fallback (Debian's default true) would build unsandboxed where the sandbox cannot be set up
        options += ["--option", "sandbox", "true", "--option", "sandbox-fallback", "false"]
    if mode == "host":
        # Builds run model-written code (build.rs, proc-macros, tests): Nix's sandbox (no network, no home
        # directory) with only the system, the host toolchain and the crate directory source let in.
        options += ["--offline", "--option", "extra-sandbox-paths", " ".join(sandbox_paths(standin))]
    return options + builders_module.builder_options(mode, builders, standin)


def build_user_options() -> list[str]:
    """As root without a daemon this process is Nix's build server: build as the unprivileged `nixbld` users (in
    Nix's sandbox, which machine_options turns on). Never `build-users-group =` (empty): Nix then builds as host
    root, and every bind-mounted host path (the toolchain, the registry, /usr) is writable by build.rs, proc macros
    and tests. Other users reach a daemon, whose own nix.conf decides."""
    if os.geteuid() != 0:
        return []
    require_build_users()
    # A build whose output another nix process is building (two workers' crafts on one new dependency set) waits for
    # that process's lock by polling: every 5 s by default, so it went on up to 5 s after the other's path was there.
    return ["--option", "build-users-group", BUILD_USERS_GROUP, "--option", "build-poll-interval", POLL_SECONDS]


def require_build_users() -> None:
    """A NixError unless the build users group exists with members (Nix refuses an empty group)."""
    try:
        members = grp.getgrnam(BUILD_USERS_GROUP).gr_mem
    except KeyError:
        members = None
    if not members:
        problem = "does not exist" if members is None else "has no members"
        raise NixError(
            f"the Nix build users group '{BUILD_USERS_GROUP}' {problem}: flakebot will not let Nix build as root",
            fix=f"run scripts/setup.sh, or create the group and its users as Nix's installer does "
            f"(groupadd --system {BUILD_USERS_GROUP}; useradd --system --no-create-home --home-dir /var/empty "
            f"--shell /usr/sbin/nologin --gid {BUILD_USERS_GROUP} --groups {BUILD_USERS_GROUP} nixbld1, ... nixbld10)",
        )


def sandbox_paths(standin: Path | None) -> list[str]:
    """Host paths a stand-in build reads: system directories, and (as `INSIDE=OUTSIDE`) the toolchain, RUSTUP_HOME
    and the crate registry under /flakebot (a build user cannot traverse /root or a 0700 temporary directory)."""
    facts = (
        json.loads((standin / "host.json").read_text())
        if standin is not None and (standin / "host.json").is_file()
        else {}
    )
    system = [path for path in SYSTEM_PATHS if Path(path).exists()]
    mounts = {inside: outside for inside, outside in facts.get("sandboxPaths", {}).items() if Path(outside).exists()}
    for inside, outside in mounts.items():
        if os.geteuid() == 0 and Path(outside).stat().st_mode & 0o005 != 0o005:
            raise NixError(
                f"{outside} (seen by builds as {inside}) is not readable by Nix's build users, who build as 'other'",
                fix=f"chmod o+rx {outside} (its files o+r), or point local_registry at a readable copy",
            )
    mapped = [f"{inside}={outside}" for inside, outside in mounts.items()]
    for entry in [*system, *mapped]:
        if any(char.isspace() for char in entry):
            raise NixError(
                f"the path {entry} holds white space, which Nix's extra-sandbox-paths cannot take",
                fix="move the toolchain or the crate registry (setting local_registry) to a path without spaces",
            )
    return system + mapped


def override_options(mode: str, standin: Path | None) -> list[str]:
    """`--override-input nixpkgs path:<stand-in>` in host mode; nothing when pinned."""
    if mode != "host":
        return []
    if standin is None:
        raise NixError("host mode needs the nixpkgs stand-in", fix="call flakebot.nix.standin.ensure_standin first")
    return ["--override-input", "nixpkgs", f"path:{standin}"]


def nix_argv(command: list[str], args: list[str], mode: str, standin: Path | None, builders: str = "") -> list[str]:
    """A full nix command line: features, the (sub)command, machine options, the nixpkgs override, then args."""
    return [
        nix_program(),
        *FEATURES,
        *command,
        *machine_options(mode, standin, builders),
        *override_options(mode, standin),
        *args,
    ]


def run_argv(flake: Path | str, mode: str, standin: Path | None) -> list[str]:
    """`nix run` of a built flake as a caller types it: no build options (the GC root keeps the output),
    only the features flag and, in host mode, the stand-in override. Callers append `--` and arguments.
    A pinned flake's command names plain `nix` (found on PATH): it carries no path of this machine's but the flake's."""
    program = nix_program() if mode == "host" else (nix_program() and "nix")
    return [program, *FEATURES, "run", *override_options(mode, standin), str(flake)]


def run_target(run: list[str]) -> tuple[str, str, Path | None]:
    """(flake, mode, stand-in) of a `nix run` command line as run_argv makes it: what another nix call on the same
    flake needs to take the same nixpkgs and flakebot's machine options (nix_argv)."""
    if "--override-input" not in run:
        return run[-1], "pinned", None
    at = run.index("--override-input")
    return run[-1], "host", Path(run[at + 2].removeprefix("path:"))


def resolved_program(run: list[str], timeout: float) -> str:
    """The program a `nix run` command line (as run_argv makes it) would start, found by evaluating the
    flake's default app: nothing built, nothing of the tool run. A trusted host step (flakebot.trust)."""
    return Resolving(run).program(timeout)


class Resolving:
    """resolved_program's `nix eval` started now, its answer taken later (`program`): the package step starts it beside
    the tool's `nix build` (evaluation builds nothing, so it needs no build to have ended), where its time is hidden."""

    def __init__(self, run: list[str]) -> None:
        flake, mode, standin = run_target(run)
        self.flake = flake
        argv = nix_argv(["eval", "--raw"], [f"{flake}#apps.{nix_system()}.default.program"], mode, standin)
        self.process = launcher.popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def program(self, timeout: float) -> str:
        try:
            stdout, stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise NixError(
                f"cannot evaluate what 'nix run {self.flake}' runs: nix eval took over {timeout:g} s",
                fix="check the Nix daemon, or raise nix_build_timeout",
            ) from None
        except BaseException:  # a cancel while it is still evaluating (KeyboardInterrupt: nix eval got no signal)
            self.stop()
            raise
        if self.process.returncode != 0:
            tail = stderr.strip().splitlines()[-1:] or [f"exit {self.process.returncode}"]
            raise NixError(
                f"cannot evaluate what 'nix run {self.flake}' runs: {tail[0]}",
                fix="inspect the flake in the run directory",
                log_tail=stderr[-3000:],
            )
        return stdout.strip()

    def stop(self) -> None:
        """End it (its answer is not wanted: the build failed, or the flake changed since it started)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


def require_nix_run_target(package: dict[str, Any], what: str, timeout: float) -> str:
    """The binary `nix run` of the package's flake would start (evaluated, not run), required to be the `what` one:
    the store path's main program; returned. The evaluation beside the build (`nix_run_program`) when it was made."""
    expected = str(Path(package["store_path"]) / "bin" / (package.get("main_program") or ""))
    program = package.get("nix_run_program") or resolved_program(package["nix_run_argv"], timeout=timeout)
    if program != expected:
        raise NixError(
            f"nix run would start {program}, not the {what} {expected}",
            fix="the flake's apps.default does not point at the built package: inspect flake.nix in the run directory",
        )
    return program


def nix_system() -> str:
    """This machine's Nix system name, such as x86_64-linux."""
    machine = {"arm64": "aarch64", "amd64": "x86_64"}.get(platform.machine().lower(), platform.machine().lower())
    return f"{machine}-{'darwin' if sys.platform == 'darwin' else 'linux'}"


def resolve_mode(settings: Settings) -> tuple[str, str]:
    """(mode, notice): pinned or host. `auto` picks host when neither the network nor a cached nixpkgs is there, or
    when this Nix is too old to evaluate the pinned nixpkgs (then `pinned` is refused)."""
    from flakebot.nix.lock import NIXPKGS_BRANCH, NIXPKGS_MIN_NIX

    if settings.nixpkgs == "host":
        return "host", ""
    old = nix_too_old(NIXPKGS_MIN_NIX)
    if settings.nixpkgs == "pinned":
        if old:
            raise NixError(
                f"Nix {old} cannot evaluate nixpkgs {NIXPKGS_BRANCH}, which needs Nix >= {NIXPKGS_MIN_NIX}",
                fix="upgrade Nix (https://nixos.org/download), or build with the host stand-in (--nixpkgs host)",
            )
        return "pinned", ""
    if settings.offline:
        return "host", "offline is set: building with the host-toolchain stand-in for nixpkgs (--nixpkgs host)"
    if old:
        return "host", (
            f"Nix {old} is older than {NIXPKGS_MIN_NIX}, which nixpkgs {NIXPKGS_BRANCH} needs: building with the "
            "host-toolchain stand-in for nixpkgs (--nixpkgs host)"
        )
    if _reachable(settings.connect_timeout) or pinned_nixpkgs_cached():
        return "pinned", ""
    return (
        "host",
        "no network to github.com/cache.nixos.org and no cached nixpkgs: building with the host-toolchain stand-in (--nixpkgs host)",
    )


def nix_too_old(minimum: str) -> str:
    """This Nix's version when it is older than `minimum`; '' when it is not (or cannot be told)."""
    from flakebot.nix.lock import version_tuple

    version = nix_version()
    return version if version and version_tuple(version) < version_tuple(minimum) else ""


@functools.cache
def nix_version() -> str:
    """`nix --version`'s number ("2.8.0"), or '' without nix."""
    try:
        shown = probecache.output(nix_program(), "--version")
    except (NixError, OSError, subprocess.SubprocessError):
        return ""
    words = shown.split()
    return words[-1] if words else ""


def _reachable(timeout: float) -> bool:
    for host, port in NETWORK_PROBES:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                pass
        except OSError:
            return False
    return True


def pinned_nixpkgs_cached() -> bool:
    """Whether the pinned nixpkgs source is already in the Nix store (so pinned needs no download)."""
    import base64

    from flakebot.nix.lock import PINNED_NIXPKGS

    digest = base64.b64decode(PINNED_NIXPKGS["narHash"].removeprefix("sha256-")).hex()
    try:
        argv = [nix_program("nix-store"), "--print-fixed-path", "--recursive", "sha256", digest, "source"]
        path = launcher.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return False
    return bool(path) and Path(path).exists()


@dataclass
class Outcome:
    """How a bounded command ended."""

    returncode: int
    stdout: str
    tail: list[str]
    seconds: float
    timed_out: bool


def run_streaming(
    argv: list[str], timeout: float, on_line: Callable[[str], None] | None = None, cwd: Path | None = None
) -> Outcome:
    """Run argv in its own process group, passing stderr lines to on_line; kill the group at the timeout."""
    started = time.monotonic()
    argv = dies_with_parent(argv)
    proc = launcher.popen(
        argv,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    stdout_parts: list[str] = []
    readers = [
        threading.Thread(target=_pump, args=(proc.stderr, lines), daemon=True),
        threading.Thread(target=_collect, args=(proc.stdout, stdout_parts), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        timed_out = _drain(lines, tail, on_line, started + timeout)
        if timed_out:
            kill_group(proc)
        proc.wait()
    except BaseException:
        kill_group(proc)  # interrupted (Ctrl-C, SIGTERM): never leave nix running
        raise
    finally:
        _close(proc, readers)
    while not lines.empty():
        line = lines.get()
        if line is not None:
            tail.append(line)
    return Outcome(proc.returncode, "".join(stdout_parts), list(tail), time.monotonic() - started, timed_out)


def dies_with_parent(argv: list[str]) -> list[str]:
    """argv run through `setpriv --pdeathsig KILL` when setpriv exists: in its own session the command would
    otherwise outlive a flakebot killed with SIGKILL (kill -9 of the craft's process group), building on for nobody."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv else argv


def _close(proc: subprocess.Popen[str], readers: list[threading.Thread]) -> None:
    for reader in readers:
        reader.join(timeout=5)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _drain(
    lines: queue.Queue[str | None], tail: collections.deque[str], on_line: Callable[[str], None] | None, deadline: float
) -> bool:
    """Consume stderr lines until EOF (False) or the deadline (True)."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return True
        try:
            line = lines.get(timeout=min(remaining, 1.0))
        except queue.Empty:
            continue
        if line is None:
            return False
        tail.append(line)
        if on_line is not None:
            on_line(line)


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    try:
        for raw in stream:
            lines.put(raw.rstrip("\n"))
    except (OSError, ValueError):  # the stream was closed under us after a kill
        pass
    lines.put(None)


def _collect(stream: IO[str], parts: list[str]) -> None:
    try:
        parts.append(stream.read())
    except (OSError, ValueError):
        pass


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the process group, give it a few seconds, then SIGKILL whatever is left of it."""
    signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass
    signal_group(proc, signal.SIGKILL)
    proc.wait()


def signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    """Send sig to proc's process group (proc was started with start_new_session=True)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
