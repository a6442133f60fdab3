"""A service's port held by flakebot (systemd's socket activation): the supervisor binds 127.0.0.1:PORT on the host
once per `up`, keeps it across every restart of the service, and hands it in as fd 3 with LISTEN_FDS=1 and
LISTEN_PID (sd_listen_fds(3)). The service needs no network of its own: its namespace stays empty (no outbound
network, no pasta), a connection made while it restarts waits in the socket's backlog instead of being refused, and
no other process can take the port in the gap.

LISTEN_PID must be the service's pid as the service sees it (its own PID namespace), known only once it runs:
systemd sets it in the child between fork and exec; here bubblewrap forks, so a one-line shell (the sandbox's
/bin/sh) sets it to its own pid `$$` and execs the service, which keeps that pid. A program that checks LISTEN_PID
(sd_listen_fds, the listenfd crate) finds its own.

The socket outlives its supervisor when the service's program is replaced (an upgrade, a rollback, `restart`): the
command doing it takes a copy from the running supervisor over a Unix socket in the service's directory
(`handover.sock`, SCM_RIGHTS, only to a peer of the supervisor's own uid), stops that supervisor and starts the next
one with the copy (`--socket-fd`). The port stays bound and listening throughout: a connection made meanwhile waits
in the backlog for the next version, none is refused, and no other process can take the port.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flakebot.services.declaration import ServiceSpec

logger = logging.getLogger(__name__)

FD = 3  # SD_LISTEN_FDS_START: the first passed descriptor
BACKLOG = 4096  # connections that queue while the service starts or restarts (the kernel caps it at somaxconn)
# exec keeps the pid: the service's own pid in its namespace, as LISTEN_PID must be
WRAPPER = ["/bin/sh", "-c", 'LISTEN_PID=$$; export LISTEN_PID; exec "$0" "$@"']


def mode(spec: ServiceSpec, network: bool) -> str:
    """How a service's port reaches it: its declaration's `socket`, but pasta for `--network` and for a service that
    needs others (outbound connections, and the one host port of each service it needs, go through pasta's sockets,
    so it runs anyway and forwards the port too)."""
    return "pasta" if network or spec.needs else spec.socket


def bind(port: int) -> socket.socket:
    """A listening TCP socket on 127.0.0.1:`port` (0: the kernel's pick); OSError (EADDRINUSE) when it is taken.
    SO_REUSEADDR: connections of an earlier start lingering in TIME_WAIT do not keep it from binding."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def prepare(sock: socket.socket) -> None:
    """Before each start: blocking again, as sd_listen_fds promises (the file description is shared, and a service
    that made it non-blocking before it crashed would hand that to the next start)."""
    sock.setblocking(True)


def argv(program: list[str]) -> list[str]:
    """`program` under the wrapper that sets LISTEN_PID to its own pid and execs it."""
    return [*WRAPPER, *program]


def environment() -> dict[str, str]:
    """What the service's environment adds (LISTEN_PID comes from the wrapper)."""
    return {"LISTEN_FDS": "1", "LISTEN_FDNAMES": "http"}


def waiting(sock: socket.socket) -> int:
    """Connections in the socket's accept queue now (TCP_INFO of a listening socket: tcpi_unacked)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int(struct.unpack_from("I", info, 24)[0])  # 8 one-byte fields, then rto, ato, snd_mss, rcv_mss, unacked


def adopted(fd: int, port: int) -> socket.socket | None:
    """The listening socket a supervisor was started with (`--socket-fd`), when it is a TCP socket listening on
    127.0.0.1:`port`; else None (closed: the supervisor binds the port itself)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        if sock.type == socket.SOCK_STREAM and listening and sock.getsockname() == ("127.0.0.1", port):
            return sock
    except OSError:
        pass
    logger.warning("fd %d is not a socket listening on 127.0.0.1:%d: not adopted", fd, port)
    sock.close()
    return None


def _short(path: Path) -> tuple[str, int]:
    """`path` as /proc/self/fd/DIR/NAME (a Unix socket's path holds at most 107 bytes; a service's directory may be
    deeper than that), and the directory's descriptor to close after the bind or connect."""
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{directory}/{path.name}", directory


def handover_server(path: Path) -> socket.socket:
    """The Unix socket a supervisor gives its listening socket away on (non-blocking: served from its loop)."""
    path.unlink(missing_ok=True)  # a killed supervisor's
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name, directory = _short(path)
    try:
        server.bind(name)
        os.chmod(path, 0o600)
        server.listen(4)
        server.setblocking(False)
    except BaseException:
        server.close()
        raise
    finally:
        os.close(directory)
    return server


def serve_handover(server: socket.socket, listener: socket.socket) -> None:
    """Each waiting request answered with a copy of `listener` (SCM_RIGHTS), to a peer of our own uid only."""
    while True:
        try:
            peer, _ = server.accept()
        except (BlockingIOError, InterruptedError):
            return
        with peer:
            try:
                _pid, uid, _gid = struct.unpack("3i", peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
                if uid != os.getuid():
                    logger.warning("handover refused to uid %d", uid)
                    continue
                peer.settimeout(1)
                socket.send_fds(peer, [b"L"], [listener.fileno()])
            except OSError as exc:
                logger.warning("handover failed: %s", exc)


def take(path: Path, timeout: float = 5.0) -> socket.socket | None:
    """A copy of the listening socket the service's supervisor holds, or None (no supervisor answering there)."""
    if not path.exists():
        return None
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(timeout)
    try:
        name, directory = _short(path)
        try:
            client.connect(name)
        finally:
            os.close(directory)
        _data, fds, _flags, _addr = socket.recv_fds(client, 16, 1)
    except OSError as exc:
        logger.info("no socket taken from %s (%s)", path, exc)
        return None
    finally:
        client.close()
    if not fds:
        return None
    taken = socket.socket(fileno=fds[0])
    taken.set_inheritable(False)  # the launcher places it where a child must find it, nowhere else
    return taken


__all__ = [
    "BACKLOG", "FD", "adopted", "argv", "bind", "environment", "handover_server", "mode", "prepare", "serve_handover",
    "take", "waiting",
]  # fmt: skip
