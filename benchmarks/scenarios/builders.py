"""Nix remote builders on this machine, for the builders tests and benchmark: each an sshd on 127.0.0.1 (a port of
its own) in its own mount namespace, with its own /nix (a directory bound over /nix: Nix starts a fresh store and
database there), its own nix.conf and no build users (two builders sharing this host's nixbld users would kill each
other's builds). The client reaches them as ssh-ng://NAME through an ssh config (NIX_SSHOPTS="-F CONFIG") that
holds each port, the client key made here and a known_hosts of the builders' host keys.

Each ssh session runs a wrapper (ForceCommand) that logs the connection and starts `nix-daemon --stdio` with the
builder's NIX_CONF_DIR and TMPDIR. A builder is stopped, or killed as a machine dies, by SIGKILL to its whole
process tree (found from its sshd's pid, never by name). Needs root (mount), sshd (openssh-server) and ssh.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


@dataclass
class Builder:
    """One builder: `root` holds its nix/ (its /nix), etc/nix.conf, ssh/, tmp/ and log (one line per session)."""

    name: str
    root: Path
    port: int
    features: str
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def entry(self, jobs: int = 1) -> str:
        """Its line in Nix's `builders`: ssh-ng URL, system, key (from the ssh config), jobs, speed, features."""
        return f"ssh-ng://{self.name} x86_64-linux - {jobs} 1 {self.features or '-'}"

    def has(self, store_path: str) -> bool:
        """Whether the builder's own store holds store_path (its /nix is root/nix)."""
        return (self.root / "nix" / "store" / Path(store_path).name).exists()

    def sessions(self) -> list[str]:
        log = self.root / "log"
        return log.read_text().splitlines() if log.exists() else []

    def building(self) -> list[Path]:
        """Nix's build directories of builds running on it now."""
        tmp = self.root / "tmp"
        return sorted(tmp.glob("nix-build-*")) if tmp.is_dir() else []

    def kill(self) -> None:
        """SIGKILL its sshd and every process below it (sessions, nix-daemon, the builds), as if the machine died."""
        if self.process is None:
            return
        for _ in range(5):  # a process forked while we looked is caught on the next round
            tree = descendants(self.process.pid)
            if self.process.poll() is None:
                tree.add(self.process.pid)
            if not tree:
                break
            for pid in tree:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        self.process.wait(timeout=10)


def descendants(pid: int) -> set[int]:
    """Every process below pid (read from /proc; a sandboxed build in its own pid namespace included)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Fleet:
    """Builders and what the client needs to reach them: NIX_SSHOPTS and the `builders` setting."""

    root: Path
    builders: list[Builder]

    @property
    def sshopts(self) -> str:
        return f"-F {self.root / 'ssh_config'}"

    def setting(self, *names: str, jobs: int = 1) -> str:
        """The `builders` value naming the given builders (all when none is named)."""
        chosen = [b for b in self.builders if not names or b.name in names]
        return " ; ".join(b.entry(jobs) for b in chosen)

    def __getitem__(self, name: str) -> Builder:
        return next(b for b in self.builders if b.name == name)


@contextmanager
def fleet(root: Path, specs: dict[str, tuple[str, str]]) -> Iterator[Fleet]:
    """Start builders {name: (features it advertises, nix.conf lines)} under root; stop them all afterwards."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    key = root / "client_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    started = Fleet(root, [])
    config: list[str] = []
    known: list[str] = []
    try:
        for name, (features, conf) in specs.items():
            builder = Builder(name, root / name, free_port(), features)
            host_key = _prepare(builder, conf, key.with_suffix(".pub").read_text())
            known.append(f"[127.0.0.1]:{builder.port} {host_key}")
            config.append(
                f"Host {name}\n  HostName 127.0.0.1\n  Port {builder.port}\n  User root\n  IdentityFile {key}\n"
                f"  IdentitiesOnly yes\n  UserKnownHostsFile {root / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
                "  BatchMode yes\n  ConnectTimeout 10\n"
            )
            started.builders.append(builder)
        (root / "known_hosts").write_text("\n".join(known) + "\n")
        (root / "ssh_config").write_text("".join(config))
        for builder in started.builders:
            _start(builder)
        yield started
    finally:
        for builder in started.builders:
            builder.kill()


def _prepare(builder: Builder, conf: str, client_key: str) -> str:
    """Write the builder's files; return its host public key."""
    for sub in ("nix", "etc", "ssh", "tmp"):
        (builder.root / sub).mkdir(parents=True, exist_ok=True)
    ssh = builder.root / "ssh"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / "host")], check=True)
    (ssh / "authorized_keys").write_text(client_key)
    features = f"system-features = {builder.features}\n" if builder.features else "system-features =\n"
    (builder.root / "etc" / "nix.conf").write_text(
        "store = local\nbuild-users-group =\nsubstituters =\nexperimental-features = nix-command flakes\n"
        + features
        + conf
    )
    wrapper = ssh / "session"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'echo "$(date +%s.%N) $SSH_ORIGINAL_COMMAND" >> {builder.root / "log"}\n'
        f"export NIX_CONF_DIR={builder.root / 'etc'} TMPDIR={builder.root / 'tmp'}\n"
        f"exec {shutil.which('nix-daemon')} --stdio\n"
    )
    wrapper.chmod(0o755)
    (ssh / "sshd_config").write_text(
        f"ListenAddress 127.0.0.1\nPort {builder.port}\nHostKey {ssh / 'host'}\n"
        f"AuthorizedKeysFile {ssh / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\n"
        f"ForceCommand {wrapper}\n"
    )
    return (ssh / "host.pub").read_text().strip()


def _start(builder: Builder) -> None:
    """sshd in a mount namespace of its own where builder.root/nix is /nix; returns once it listens."""
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation directory
    script = f'mount --bind "$1" /nix && exec {SSHD} -D -e -f "$2"'
    # setpriv: the sshd dies with the test or benchmark that started it, even one killed with SIGKILL
    argv = ["setpriv", "--pdeathsig", "KILL", "--", "unshare", "--mount", "--propagation", "private"]
    argv += ["sh", "-c", script, "sh"]
    argv += [str(builder.root / "nix"), str(builder.root / "ssh" / "sshd_config")]
    log = (builder.root / "sshd.log").open("ab")
    builder.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    log.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if builder.process.poll() is not None:
            raise RuntimeError(f"sshd of {builder.name} ended: {(builder.root / 'sshd.log').read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", builder.port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"sshd of {builder.name} did not listen on {builder.port}")
