"""An HTTP server on a loopback address, served from a background thread: the base of the stub model server and the
crates mirror, and of the stand-ins the tests and benchmarks serve.

    with LoopbackServer(Handler) as server:    # 127.0.0.1, a free port
        get(server.url + "/path")
    # left: serving stopped, the socket closed, the serving thread joined
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

__all__ = ["LoopbackServer", "is_loopback"]

logger = logging.getLogger(__name__)


class LoopbackServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer bound to a loopback address (port 0: any free one); `with` serves from a daemon thread
    and leaving stops it. Subclasses may set `daemon_threads = False` so close() also joins every handler thread."""

    poll_interval = 0.05  # how soon close() is noticed by the serving thread

    def __init__(self, handler: type[BaseHTTPRequestHandler], host: str = "127.0.0.1", port: int = 0) -> None:
        if not is_loopback(host):
            raise ValueError(f"a loopback server listens on loopback addresses only, not {host}")
        super().__init__((host, port), handler)
        self.host = host
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        """http://HOST:PORT, without a trailing slash."""
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        return f"http://{host}:{self.port}"

    def start(self, name: str | None = None) -> Self:
        """Serve from a daemon thread until close()."""
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": self.poll_interval}, name=name, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, close the socket and join the serving thread; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._wake()
            self.shutdown()
            self._thread.join()
        self.server_close()

    def _wake(self) -> None:
        """Make the serving loop's wait for a connection return now, so shutdown() is seen at once rather than up to
        poll_interval later (a scripted craft closed three stub servers, 25 ms each on average). On Linux a listening
        socket shut down reads as ready and accept() fails, which the loop shrugs off until it sees the shutdown;
        where shutting it down is refused, the poll interval still ends the wait."""
        try:
            self.socket.shutdown(socket.SHUT_RDWR)
        except OSError as exc:
            logger.debug("could not wake the serving loop early: %s", exc)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up (a closed keep-alive connection, a timeout) is routine, not a traceback on stderr."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):
            logger.debug("%s hung up: %s", client_address, error)
        else:
            logger.exception("%s failed to answer %s", type(self).__name__, client_address)


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
