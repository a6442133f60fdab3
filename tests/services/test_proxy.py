"""The request tool's proxy (flakebot.services.proxy) attacked: a caller names a service and a path, and must not
make flakebot send anything to another host or port. Real HTTP servers on 127.0.0.1: "the service" (whose port its
launch.json names, as `flakebot up` writes it, its supervisor lock held) and a victim on another port that counts
every connection it gets. Fast: no sandbox, no nix; the whole path through `up` is in tests/mcp/test_services.py."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from flakebot import config
from flakebot.errors import UsageError
from flakebot.services import proxy
from flakebot.services.layout import ServiceDir


class Recorder(BaseHTTPRequestHandler):
    """Answers per path: /redirect (302 to the victim), /big (2 MiB), /drip (a byte a second), else 200 echo."""

    victim_port = 0

    def do_GET(self) -> None:
        self.server.seen.append(self.requestline)  # type: ignore[attr-defined]
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.victim_port}/stolen")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/big":
            body = b"x" * (2 * 1024 * 1024)
        elif self.path == "/drip":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.5)
            return
        else:
            body = f"{self.command} {self.path} {self.headers.get('Host')}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_PUT = do_POST = do_DELETE = do_GET

    def log_message(self, *args: Any) -> None:
        pass


def serve() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.seen = []  # type: ignore[attr-defined]
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[config.Settings, ThreadingHTTPServer, ThreadingHTTPServer]]:
    """Settings whose workdir has a running service `kv` on the first server's port; the victim on another."""
    service, victim = serve(), serve()
    Recorder.victim_port = victim.server_address[1]
    settings = config.Settings(workdir=str(tmp_path / "work"), catalog_dir=str(tmp_path / "catalog"))
    where = ServiceDir.of("kv", settings)
    where.root.mkdir(parents=True)
    port = service.server_address[1]
    where.launch_file.write_text(json.dumps({"name": "kv", "version": "0.1.0", "host_port": port}))
    where.write_status({"name": "kv", "state": "running", "health": "healthy", "port": port})
    lock = os.open(where.root / "supervisor.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # what a live supervisor holds
    yield settings, service, victim
    os.close(lock)
    for server in (service, victim):
        server.shutdown()
        server.server_close()


def test_a_request_reaches_the_service_and_only_its_port(
    services: tuple[config.Settings, ThreadingHTTPServer, ThreadingHTTPServer],
) -> None:
    settings, service, victim = services
    port, other = service.server_address[1], victim.server_address[1]
    answer = proxy.request("kv", settings, "PUT", "/kv/a?x=1", body="v")
    assert answer["status"] == 200 and answer["body"] == f"PUT /kv/a?x=1 127.0.0.1:{port}"
    attacks = [
        f"@127.0.0.1:{other}/x",  # userinfo: http://127.0.0.1:PORT@127.0.0.1:OTHER/x
        f"http://127.0.0.1:{other}/x",
        f"/x HTTP/1.1\r\nHost: 127.0.0.1:{other}\r\n\r\nGET /y",  # request smuggling through the path
        "/x\nGET /y",
        "/x#@127.0.0.1",
        "x",
        "/" + "a" * 9000,
    ]
    for path in attacks:
        with pytest.raises(UsageError):
            proxy.request("kv", settings, "GET", path)
    with pytest.raises(UsageError):
        proxy.request("kv", settings, "CONNECT", f"/127.0.0.1:{other}")
    for name in ("../kv", "kv/../../x", "KV", f"127.0.0.1:{other}"):
        with pytest.raises(UsageError):
            proxy.request(name, settings, "GET", "/")
    # a path that looks like an authority is a path on the service, not another host
    odd = proxy.request("kv", settings, "GET", f"//127.0.0.1:{other}/x")
    assert odd["status"] == 200 and odd["body"].endswith(f"/127.0.0.1:{other}/x 127.0.0.1:{port}")
    assert f"GET //127.0.0.1:{other}/x HTTP/1.1" in service.seen  # type: ignore[attr-defined]
    redirected = proxy.request("kv", settings, "GET", "/redirect")
    assert redirected["status"] == 302  # handed back, never followed
    assert victim.seen == []  # type: ignore[attr-defined]


def test_answers_are_bounded_in_size_and_time(
    services: tuple[config.Settings, ThreadingHTTPServer, ThreadingHTTPServer],
) -> None:
    settings, _, _ = services
    big = proxy.request("kv", settings, "GET", "/big")
    assert big["truncated"] is True and len(big["body"]) == proxy.MAX_ANSWER
    began = time.monotonic()
    slow = proxy.request("kv", settings, "GET", "/drip", timeout=2)
    assert slow["timed_out"] is True and time.monotonic() - began < 4  # a whole-exchange deadline, not per read
    with pytest.raises(UsageError):
        proxy.request("kv", settings, "PUT", "/kv/a", body="x" * (proxy.MAX_BODY + 1))
    with pytest.raises(UsageError):
        proxy.request("kv", settings, "GET", "/", timeout=10_000)


def test_a_service_that_is_not_running_is_not_asked(
    services: tuple[config.Settings, ThreadingHTTPServer, ThreadingHTTPServer],
) -> None:
    """Its port may belong to another program by now: a stopped or lost service gets no request."""
    settings, service, _ = services
    where = ServiceDir.of("kv", settings)
    where.write_status({**where.status(), "state": "stopped"})
    with pytest.raises(UsageError, match="not running"):
        proxy.request("kv", settings, "GET", "/")
    assert service.seen == []  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match="no service"):
        proxy.request("nothere", settings, "GET", "/")


def test_a_tool_cannot_be_let_write_a_services_files(flakebot_home: Path, tmp_path: Path) -> None:
    """launch.json says which port the request tool asks and which host files become a service's credentials:
    a tool run with --writable naming it (or the services directory) could turn the request tool on another port
    or hand a host file to a service. Refused like the catalog, cache and config are."""
    from tests.conftest import require, run_cli
    from tests.deliver.test_toolrun import _tool

    require("bwrap")
    _tool(
        tmp_path,
        "rewrite",
        'for f in "$@"; do echo \'{"host_port": 22, "secrets": {"k": "/etc/shadow"}}\' > "$f"; done\n',
    )
    where = ServiceDir.of("kv", config.load())
    where.root.mkdir(parents=True)
    where.launch_file.write_text(json.dumps({"name": "kv", "host_port": 40000, "secrets": {}}))
    for writable in (where.launch_file, where.root, where.root.parent):
        done = run_cli("run", "rewrite", "--writable", str(writable), "--", str(where.launch_file), input="")
        refused = "flakebot's own files" in done.stderr or "grant root" in done.stderr  # the allow list decides first
        assert done.returncode == 2 and refused, (writable, done.stdout, done.stderr)
    assert json.loads(where.launch_file.read_text())["host_port"] == 40000
