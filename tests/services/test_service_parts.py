"""The supervisor's parts on their own, fast: the declaration, the health check against real sockets, the log file."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flakebot.errors import UsageError
from flakebot.services.declaration import Health, Restart, ServiceSpec
from flakebot.services.health import check
from flakebot.services.logfile import LogFile, tail
from tests.conftest import run_cli


def test_a_declaration_round_trips_and_refuses_what_no_service_could_use() -> None:
    spec = ServiceSpec(port=9000, port_env="KV_PORT", health=Health.parse("tcp"), restart=Restart(limit=2))
    assert ServiceSpec.from_dict(spec.to_dict()) == spec
    assert Health.parse("/ready") == Health("http", "/ready")
    for bad in ("health", "/a b", ""):
        with pytest.raises(UsageError):
            Health.parse(bad)
    assert ServiceSpec.from_dict({}).socket == "pasta"  # a declaration from before the handoff: forwarded as it was
    assert ServiceSpec.from_dict({"socket": "handoff"}).socket == "handoff"
    for kwargs in ({"port": 0}, {"port": 70000}, {"port_env": "port"}, {"port_env": "STATE_DIRECTORY"},
                   {"socket": "systemd"}):  # fmt: skip
        with pytest.raises(UsageError):
            ServiceSpec(**kwargs)  # type: ignore[arg-type]


def test_backoff_doubles_up_to_its_cap() -> None:
    policy = Restart(backoff_s=0.5, backoff_max_s=3)
    assert [policy.delay(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/health" else 500)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_health_is_a_2xx_answer_or_a_connect(http_port: int) -> None:
    assert check(Health("http", "/health"), http_port, 2) == ""
    assert "500" in check(Health("http", "/broken"), http_port, 2)
    assert check(Health("tcp", ""), http_port, 2) == ""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: refused
        assert "Refused" in check(Health("tcp", ""), port, 1)


def test_a_service_that_accepts_but_never_answers_fails_within_the_timeout() -> None:
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen()  # the kernel completes connects; nothing ever reads them (a SIGSTOPped service)
        start = time.monotonic()
        problem = check(Health("http", "/health"), hung.getsockname()[1], 0.5)
        assert problem and time.monotonic() - start < 2
        assert check(Health("tcp", ""), hung.getsockname()[1], 0.5) == ""  # why an HTTP check finds hangs, TCP not


def test_a_tcp_check_on_a_held_socket_waits_for_the_service_to_accept() -> None:
    """flakebot's own listening socket (the handoff) completes every connect: the check also needs the connection
    taken off its queue by the service."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert "accepted no connection" in check(Health("tcp", ""), port, 0.5, held)  # nothing accepts
        taken: list[socket.socket] = []
        done = threading.Event()

        def accept() -> None:  # a service: accepts what comes (the failed check's connection waits there too)
            held.settimeout(0.05)
            while not done.is_set():
                try:
                    taken.append(held.accept()[0])
                except TimeoutError:
                    pass

        accepting = threading.Thread(target=accept)
        accepting.start()
        try:
            assert check(Health("tcp", ""), port, 2, held) == ""  # a service that accepts passes
        finally:
            done.set()
            accepting.join()
            for sock in taken:
                sock.close()


def test_the_log_is_redacted_line_by_line_and_rotated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVICE_TOKEN", "tok-very-secret-value")
    log = LogFile(tmp_path / "service.log", limit=400)
    log.feed(b"using key sk-abcdefghijklmnop and tok-very-")
    log.feed(b"secret-value\npartial")
    log.flush()
    LogFile(tmp_path / "service.log", secrets=["credential-from-a-file"]).write("got credential-from-a-file")
    text = (tmp_path / "service.log").read_text()
    assert "credential-from-a-file" not in text
    assert "sk-abcdefghijklmnop" not in text and "tok-very-secret-value" not in text and "[REDACTED]" in text
    assert "partial\n" in text
    for n in range(40):
        log.write(f"line {n:02d} " + "x" * 20)
    assert (tmp_path / "service.log").stat().st_size <= 400
    assert (tmp_path / "service.log.1").exists()
    last = tail(tmp_path / "service.log", 2)
    assert [line.split(" ", 1)[1] for line in last] == [f"line 38 {'x' * 20}", f"line 39 {'x' * 20}"]


def test_up_and_down_of_what_is_not_there_say_so() -> None:
    missing = run_cli("up", "nothing-here")
    assert missing.returncode == 60 and "no service 'nothing-here' in the catalog" in missing.stderr
    assert "Fix:" in missing.stderr or "fix" in missing.stderr.lower()
    never = run_cli("down", "nothing-here")
    assert never.returncode == 2 and "no service nothing-here was started here" in never.stderr
    bad = run_cli("logs", "../etc")
    assert bad.returncode == 2 and "not a service name" in bad.stderr


def test_a_catalogued_service_is_not_offered_as_an_mcp_tool(tmp_path: Path) -> None:
    from flakebot import api, config
    from flakebot.deliver.catalog import Catalog
    from flakebot.services.catalogued import service_manifest, service_manifest_of

    (tmp_path / "flake").mkdir()
    package = {"pname": "kv", "version": "0.1.0", "store_path": str(tmp_path), "main_program": "kv",
               "nix_run_argv": ["nix", "run", str(tmp_path / "flake")]}  # fmt: skip
    manifest = service_manifest("kv", package, ServiceSpec())
    Catalog.open(config.load()).add("kv", need="service kv", flake_dir=tmp_path / "flake", manifest=manifest,
                                    usage_md="# kv\n", store_path=str(tmp_path), run_id="test", origin={})  # fmt: skip
    assert api.tool_definitions(config.load()) == []
    assert service_manifest_of("kv@0.1.0", config.load())["service"]["port"] == 8080
