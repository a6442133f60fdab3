"""Nix remote builders on this machine, for the builders tests and benchmark: each an sshd in its own mount and
network namespace, with its own /nix (a directory bound over /nix: Nix starts a fresh store and database there),
its own nix.conf and no build users (two builders sharing this host's nixbld users would kill each other's builds).
A builder's sshd listens on 127.0.0.1:22 of its own network namespace (only its loopback is up): the client shares no
network with it and reaches it through ssh's ProxyCommand (nsrelay.py: enters that namespace, relays the stream), as
ssh-ng://NAME through an ssh config (NIX_SSHOPTS="-F CONFIG") that holds each proxy, the client key made here and a
known_hosts of the builders' host keys.

Each ssh session runs a wrapper (ForceCommand) that logs the connection and starts `nix-daemon --stdio` with the
builder's NIX_CONF_DIR and TMPDIR. A builder is stopped, or killed as a machine dies, by SIGKILL to its whole
process tree (found from its sshd's pid, never by name); a killed builder's namespace goes with it, so a later
connection is refused as by a machine that is down. Needs root (mount, namespaces), sshd (openssh-server) and ssh.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from flakebot import processid

SSHD = "/usr/sbin/sshd"
RELAY = Path(__file__).with_name("nsrelay.py")
PORT = 22  # inside each builder's own network namespace


@dataclass
class Builder:
    """One builder: `root` holds its nix/ (its /nix), etc/nix.conf, ssh/, tmp/ and log (one line per session)."""

    name: str
    root: Path
    features: str
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    started: int = 0  # its sshd's start time (clock ticks after boot): the relay never enters a reused pid

    def proxy(self) -> list[str]:
        """The command that connects to its sshd inside its network namespace (ssh's ProxyCommand)."""
        assert self.process is not None
        return [sys.executable, str(RELAY), str(self.process.pid), str(self.started), str(PORT)]

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
            builder = Builder(name, root / name, features)
            host_key = _prepare(builder, conf, key.with_suffix(".pub").read_text())
            known.append(f"{name} {host_key}")
            started.builders.append(builder)
        for builder in started.builders:
            _start(builder)
            config.append(
                f"Host {builder.name}\n  ProxyCommand {' '.join(builder.proxy())}\n  HostKeyAlias {builder.name}\n"
                f"  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
                f"  UserKnownHostsFile {root / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
                "  BatchMode yes\n  ConnectTimeout 10\n"
            )
        (root / "known_hosts").write_text("\n".join(known) + "\n")
        (root / "ssh_config").write_text("".join(config))
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
        f"ListenAddress 127.0.0.1\nPort {PORT}\nHostKey {ssh / 'host'}\n"
        f"AuthorizedKeysFile {ssh / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\n"
        f"ForceCommand {wrapper}\n"
    )
    return (ssh / "host.pub").read_text().strip()


def _start(builder: Builder) -> None:
    """sshd in a mount and network namespace of its own (only loopback up) where builder.root/nix is /nix; returns
    once it answers through the relay."""
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation directory
    script = f'ip link set lo up && mount --bind "$1" /nix && exec {SSHD} -D -e -f "$2"'
    # setpriv: the sshd dies with the test or benchmark that started it, even one killed with SIGKILL; unshare and
    # sh exec in place, so the pid started here is the sshd's, holding the namespaces
    argv = ["setpriv", "--pdeathsig", "KILL", "--", "unshare", "--mount", "--net", "--propagation", "private"]
    argv += ["sh", "-c", script, "sh"]
    argv += [str(builder.root / "nix"), str(builder.root / "ssh" / "sshd_config")]
    log = (builder.root / "sshd.log").open("ab")
    builder.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    log.close()
    started = processid.start_time(builder.process.pid)
    if started is None:  # gone already: its log says why
        raise RuntimeError(f"sshd of {builder.name} ended: {(builder.root / 'sshd.log').read_text()[-2000:]}")
    builder.started = started
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if builder.process.poll() is not None:
            raise RuntimeError(f"sshd of {builder.name} ended: {(builder.root / 'sshd.log').read_text()[-2000:]}")
        # a client's banner through the relay: sshd's comes back once it listens (to a bare end, it sends none)
        probe = subprocess.run(builder.proxy(), input=b"SSH-2.0-probe\r\n", capture_output=True, timeout=15)
        if probe.stdout.startswith(b"SSH-"):
            return
        time.sleep(0.1)
    raise RuntimeError(f"sshd of {builder.name} did not answer in its namespace")
