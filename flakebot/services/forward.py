"""A service's port on the host: a free 127.0.0.1 port, forwarded by pasta into the service's network namespace.

pasta (Debian `passt`) rather than a relay of our own: it joins the namespace itself and splices loopback to
loopback in the kernel, so the supervisor never carries the traffic, and by default it configures nothing else
there (the namespace's interface stays down: no outbound network). A service started with `--network` (the user's
own choice, kept in its launch.json) also gets its tap interface configured (`--config-net`: the host's address,
its default route) with `--no-map-gw`, so the gateway address is the real gateway and never the host's loopback:
outbound connections leave through pasta's sockets on the host, and 127.0.0.1 of the host (other services,
flakebot's own) stays out of reach. It runs in the foreground (`-f`: it daemonizes and outlives
the sandbox otherwise) as the supervisor's child, killed with it (PR_SET_PDEATHSIG), one per start of the service
(a new start is a new namespace).
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
from collections.abc import Callable
from typing import Any

from flakebot.errors import PrivilegeError, SandboxError
from flakebot.sandbox import real_root

PR_SET_PDEATHSIG = 1
TUN = "/dev/net/tun"  # pasta opens it inside the service's namespace


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int) -> bool:
    """Whether something listens on 127.0.0.1:`port` (SO_REUSEADDR: closed connections in TIME_WAIT do not count,
    and pasta binds with it too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def port_if_free(port: object) -> int | None:
    """A recorded host port to start on again, or None (a free one) when it is not a number or is taken now."""
    return port if isinstance(port, int) and not port_in_use(port) else None


def outbound_network(launch: dict[str, Any]) -> bool:
    """Whether a service's launch asks for outbound network: only a literal true, which only `up --network` writes."""
    return launch.get("network") is True


def pasta_program() -> str:
    found = shutil.which("pasta")
    if found is None:
        raise SandboxError(
            "pasta is not installed: a service's port cannot reach the host", fix="apt-get install passt"
        )
    if not real_root() and not os.access(TUN, os.R_OK | os.W_OK):
        # seen: pasta as a user exits 1 ("Failed to open tun socket in namespace") and the service fails restarting
        raise PrivilegeError(
            f"pasta cannot forward a port without root here: {TUN} is not readable and writable by this user",
            fix="declare the service 'socket: handoff' and start it without --network (no pasta, runs without root),"
            f" run flakebot as root, or let users open {TUN} (chmod 0666 {TUN}, most distributions' default)",
        )
    return found


def pasta_argv(
    pasta: str, host_port: int, inner_port: int, ns_pid: int, *, network: bool = False, reach: tuple[int, ...] = ()
) -> list[str]:
    """pasta forwarding TCP 127.0.0.1:host_port to the namespace of `ns_pid`, port `inner_port`; nothing else
    (no UDP, no port of the host's forwarded in). `network`: the namespace's interface configured too (address,
    default route), its gateway not mapped to the host's loopback. `reach`: ports of the host's 127.0.0.1 (the
    services it needs) it reaches at the same port of its own 127.0.0.1, and no other."""
    outward = ",".join(map(str, reach)) if reach else "none"
    argv = [pasta, "-f", "-q", "-t", f"127.0.0.1/{host_port}:{inner_port}", "-T", outward, "-u", "none", "-U", "none"]
    if network:
        # without --no-map-gw, a connection to the gateway address reaches the host's 127.0.0.1 (seen by hand)
        argv += ["--config-net", "--no-map-gw"]
    argv += ["--netns", f"/proc/{ns_pid}/ns/net"]
    if real_root():
        return [*argv, "--runas", "0"]  # root's namespace: pasta as root may join it (it drops to nobody otherwise)
    return [*argv, "--userns", f"/proc/{ns_pid}/ns/user"]  # bubblewrap's user namespace owns the network one


def die_with_parent() -> Callable[[], None]:
    """A preexec_fn: SIGKILL this child when the supervisor dies (the supervisor is single-threaded). ctypes and libc
    are loaded here, in the parent, at the first pasta start: a supervisor whose service takes its socket never loads
    them (benchmarks S5: its memory)."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return preexec
