"""ssh's ProxyCommand for a builder in a network namespace of its own: `python nsrelay.py PID START PORT` enters the
network namespace of process PID (only while PID is still the process that started at START, in clock ticks after
boot: a reused pid is never entered), connects to 127.0.0.1:PORT there and relays stdin/stdout to that socket.

Run as a script by ssh (no imports from the project): the client and the builder share no network, only this
relay, as two machines share only a wire. A builder that is gone (its process ended) refuses the connection.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import socket
import sys

CLONE_NEWNET = 0x40000000


def start_time(pid: int) -> int:
    """Field 22 of /proc/PID/stat: when the process started, in clock ticks after boot."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[19])


def enter(pid: int, started: int) -> None:
    """Join pid's network namespace, refusing a pid that now names another process."""
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        # checked after the open: the namespace held is then the one of the process that started at `started`
        if start_time(pid) != started:
            raise ProcessLookupError(f"process {pid} is not the builder any more")
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns")
    finally:
        os.close(fd)


def relay(sock: socket.socket) -> None:
    """Copy stdin to the socket and the socket to stdout until the socket ends."""
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(sock, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj == 0:
                data = os.read(0, 65536)
                if not data:  # the client is done writing: pass the end on, keep reading the answer
                    sock.shutdown(socket.SHUT_WR)
                    selector.unregister(0)
                    continue
                sock.sendall(data)
            else:
                data = sock.recv(65536)
                if not data:
                    return
                view = memoryview(data)
                while view:
                    view = view[os.write(1, view) :]


def main(argv: list[str]) -> int:
    pid, started, port = (int(arg) for arg in argv)
    try:
        enter(pid, started)
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError as exc:
        print(f"nsrelay: builder process {pid} unreachable: {exc}", file=sys.stderr)
        return 1
    sock.settimeout(None)
    try:
        relay(sock)
    except OSError:  # the builder died mid-session: ssh sees the end of the stream
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
