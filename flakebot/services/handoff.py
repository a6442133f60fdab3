"""A service's port held by flakebot (systemd's socket activation): the supervisor binds 127.0.0.1:PORT on the host
once per `up`, keeps it across every restart of the service, and hands it in as fd 3 with LISTEN_FDS=1 and
LISTEN_PID (sd_listen_fds(3)). The service needs no network of its own: its namespace stays empty (no outbound
network, no pasta), a connection made while it restarts waits in the socket's backlog instead of being refused, and
no other process can take the port in the gap.

LISTEN_PID must be the service's pid as the service sees it (its own PID namespace), known only once it runs:
systemd sets it in the child between fork and exec; here bubblewrap forks, so a one-line shell (the sandbox's
/bin/sh) sets it to its own pid `$$` and execs the service, which keeps that pid. A program that checks LISTEN_PID
(sd_listen_fds, the listenfd crate) finds its own.
"""

from __future__ import annotations

import socket
import struct

FD = 3  # SD_LISTEN_FDS_START: the first passed descriptor
BACKLOG = 4096  # connections that queue while the service starts or restarts (the kernel caps it at somaxconn)
# exec keeps the pid: the service's own pid in its namespace, as LISTEN_PID must be
WRAPPER = ["/bin/sh", "-c", 'LISTEN_PID=$$; export LISTEN_PID; exec "$0" "$@"']


def mode(declared: str, network: bool) -> str:
    """How a service's port reaches it: its declaration's `socket`, but pasta for `--network` (outbound connections
    leave through pasta's sockets, so it runs anyway and forwards the port too)."""
    return "pasta" if network else declared


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


__all__ = ["BACKLOG", "FD", "argv", "bind", "environment", "mode", "prepare", "waiting"]
