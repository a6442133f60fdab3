"""A crates.io stand-in on 127.0.0.1 (port 0) for the real httpx client.

It serves the real bodies in ../shared/fixtures/crates-io by default and scripted replies a test
adds, and records when each request arrived (time.monotonic(), measured here, by the server).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from flakebot.loopback import LoopbackServer
from tests.conftest import FIXTURES

CRATES_IO = FIXTURES / "crates-io"


@dataclass
class Reply:
    """One scripted answer."""

    status: int = 200
    body: Any = b""  # bytes, str, or anything json.dumps takes
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering (timeouts)

    def payload(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        return self.body.encode() if isinstance(self.body, str) else json.dumps(self.body).encode()


@dataclass
class Seen:
    """One request as the server saw it."""

    time: float
    path: str  # path and query
    headers: dict[str, str]


class CratesServer:
    """Routes by exact 'path?query' first, then by path; a route's replies are used in order, the last one sticks."""

    def __init__(self) -> None:
        self.routes: dict[str, list[Reply]] = {}
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.route("/api/v1/crates", Reply(body=(CRATES_IO / "search-postgres.json").read_bytes()))
        self.route("/api/v1/crates/foo/1.0.0", Reply(body=(CRATES_IO / "version-lib-and-bin.json").read_bytes()))
        self.route("/se/rd/serde", Reply(body=(CRATES_IO / "sparse-index-serde.jsonl").read_bytes()))
        self.httpd = LoopbackServer(_handler(self))
        self.httpd.poll_interval = 0.02

    @property
    def url(self) -> str:
        return self.httpd.url

    def route(self, path: str, *replies: Reply) -> None:
        with self.lock:
            self.routes[path] = list(replies)

    def requests(self, prefix: str = "/") -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.path.startswith(prefix)]

    def answer(self, target: str, headers: dict[str, str]) -> Reply:
        with self.lock:
            self.seen.append(Seen(time.monotonic(), target, headers))
            replies = self.routes.get(target) or self.routes.get(urlsplit(target).path)
            if not replies:
                return Reply(404, {"errors": [{"detail": "Not Found"}]})
            return replies.pop(0) if len(replies) > 1 else replies[0]

    def __enter__(self) -> CratesServer:
        self.httpd.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.close()


def _handler(server: CratesServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 5  # an idle keep-alive connection ends, so server_close() can join its thread

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            reply = server.answer(self.path, {k.lower(): v for k, v in self.headers.items()})
            time.sleep(reply.delay)
            body = reply.payload()
            try:
                self.send_response(reply.status)
                for name, value in {"Content-Type": "application/json", **reply.headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test): nothing to answer

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler
