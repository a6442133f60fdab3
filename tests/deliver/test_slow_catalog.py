"""A shared catalog someone else serves never holds a command past its timeout (issue 41: a catalog that fails in any
way is skipped; attacked from outside).

The attack: an http(s) catalog that answers its index one byte every second. Every read gets a byte before the
per-read timeout, so without a deadline on the whole index `flakebot list --remote` (and craft, which asks the
catalogs first) waits for up to the 8 MiB an index may hold: days. Judged from outside: how long the real CLI took,
and that it said one line about that catalog."""

from __future__ import annotations

import base64
import http.server
import threading
import time
from typing import Any

from tests.conftest import run_cli

KEY = "someone-1:" + base64.b64encode(b"k" * 32).decode()
# catalog_read_timeout, lowered from its 30 s: the deadline is what is under test, not its length
ENV = {"FLAKEBOT_CATALOG_READ_TIMEOUT": "5"}


class Trickle(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        try:
            for _ in range(600):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(1)
        except OSError:  # the client gave up
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_catalog_that_trickles_its_index_is_given_up_on_at_its_timeout() -> None:
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        started = time.monotonic()
        listed = run_cli("list", "--remote", env={**ENV, "FLAKEBOT_CATALOGS": f"{url} {KEY}"}, timeout=90)
        took = time.monotonic() - started
        server.shutdown()
    assert took < 30, took  # the index's timeout (5 s) and start-up, not the 600 s the server would go on
    assert "within 5 s" in listed.stderr and "Traceback" not in listed.stderr, listed.stderr


class TrickleHeaders(Trickle):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        try:
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 600:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(1)
        except OSError:
            pass


def test_a_catalog_that_trickles_its_headers_is_given_up_on_too() -> None:
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), TrickleHeaders) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        started = time.monotonic()
        listed = run_cli("list", "--remote", env={**ENV, "FLAKEBOT_CATALOGS": f"{url} {KEY}"}, timeout=90)
        took = time.monotonic() - started
        server.shutdown()
    assert took < 30, took
    assert "within 5 s" in listed.stderr and "Traceback" not in listed.stderr, listed.stderr
