"""One health check of a service through its forward, bounded by a timeout (a hung service fails it)."""

from __future__ import annotations

import socket

from flakebot.services.declaration import Health


def check(health: Health, port: int, timeout: float) -> str:
    """'' when the service on 127.0.0.1:`port` passes `health`, else why not (one line)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            if health.kind == "tcp":
                return ""
            sock.settimeout(timeout)
            sock.sendall(f"GET {health.path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            first = _first_line(sock)
    except OSError as exc:  # refused, reset, timed out
        return f"{type(exc).__name__}: {exc}"
    parts = first.split()
    if len(parts) >= 2 and parts[0].startswith("HTTP/") and parts[1].startswith("2"):
        return ""
    return f"GET {health.path} answered {first[:80]!r}" if first else f"GET {health.path}: no answer"


def _first_line(sock: socket.socket) -> str:
    data = b""
    while b"\n" not in data and len(data) < 1024:
        chunk = sock.recv(1024)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode("latin-1").strip()
