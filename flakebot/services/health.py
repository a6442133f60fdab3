"""One health check of a service through its forward, bounded as a whole by a timeout (a hung service fails it, and
so does one answering a byte at a time)."""

from __future__ import annotations

import socket
import time

from flakebot.services import handoff
from flakebot.services.declaration import Health


def check(health: Health, port: int, timeout: float, listener: socket.socket | None = None) -> str:
    """'' when the service on 127.0.0.1:`port` passes `health`, else why not (one line). `listener`: the socket
    flakebot holds for it (handoff.py), where a connect succeeds whether the service runs or not; a "tcp" check then
    also waits for the service to accept what is queued."""
    end = time.monotonic() + timeout  # for the whole check: a service answering a byte at a time fails it too
    try:
        # not create_connection: its getaddrinfo takes the host through the idna codec (unicodedata, stringprep) in
        # the supervisor (benchmarks S5: its memory); an address needs no lookup
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(("127.0.0.1", port))
            if health.kind == "tcp":
                return _accepted(listener, end) if listener is not None else ""
            sock.settimeout(_left(end))
            sock.sendall(f"GET {health.path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            first = _first_line(sock, end)
    except OSError as exc:  # refused, reset, timed out
        return f"{type(exc).__name__}: {exc}"
    parts = first.split()
    if len(parts) >= 2 and parts[0].startswith("HTTP/") and parts[1].startswith("2"):
        return ""
    return f"GET {health.path} answered {first[:80]!r}" if first else f"GET {health.path}: no answer"


def _left(end: float) -> float:
    left = end - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out (the whole check)")
    return left


def _first_line(sock: socket.socket, end: float) -> str:
    data = b""
    while b"\n" not in data and len(data) < 1024:
        sock.settimeout(_left(end))
        chunk = sock.recv(1024)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode("latin-1").strip()


def _accepted(listener: socket.socket, end: float) -> str:
    """'' once nothing waits in the held socket's queue (the check's own connection was taken by the service)."""
    while (queued := handoff.waiting(listener)) > 0:
        if time.monotonic() >= end:
            return f"the service accepted no connection ({queued} waiting on its socket)"
        time.sleep(0.01)
    return ""
