"""The loopback server base: serves on 127.0.0.1 from a thread, stops whole on leaving, refuses other addresses."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from flakebot.loopback import LoopbackServer


class Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = f"hello {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


def test_serves_on_a_free_loopback_port_and_stops_whole_on_leaving() -> None:
    threads_before = set(threading.enumerate())
    with LoopbackServer(Hello) as server:
        assert server.url == f"http://127.0.0.1:{server.port}" and server.port > 0
        assert httpx.get(server.url + "/x").text == "hello /x"
        serving = set(threading.enumerate()) - threads_before
    # the serving thread was joined (a request's own daemon thread may still be closing its connection: the base
    # promises no join of those: a subclass sets daemon_threads = False for that)
    assert not [thread for thread in serving if thread.is_alive() and "process_request" not in thread.name]
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", server.port), timeout=2):
        pass  # nothing listens on the port any more
    server.close()  # a second close is harmless


def test_refuses_an_address_that_is_not_loopback() -> None:
    with pytest.raises(ValueError, match="loopback addresses only, not 0.0.0.0"):
        LoopbackServer(Hello, host="0.0.0.0")


class Patient(LoopbackServer):
    poll_interval = 3600.0  # a serving loop that would notice a shutdown only an hour later


def test_close_stops_the_serving_loop_at_once_not_at_its_next_poll() -> None:
    """close() wakes the loop's wait for a connection: a stage closing its stub model server does not wait out the
    poll interval (50 ms, three times a craft). Here the interval is an hour: only the wake-up can stop it."""
    server = Patient(Hello).start()
    assert httpx.get(server.url + "/before").text == "hello /before"
    closing = threading.Thread(target=server.close, daemon=True)
    closing.start()
    closing.join(timeout=60)  # a bound on a hang, not a measure: the wake-up takes a millisecond
    assert not closing.is_alive(), "close() waited for the serving loop's poll interval"
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", server.port), timeout=2):
        pass
