"""The socket handoff through the real commands: tests/fixtures/kv-service packaged with `--socket handoff`, started
by `flakebot up` under its supervisor and real bubblewrap, which binds the port on the host and hands it in as fd 3
(LISTEN_FDS, LISTEN_PID); then killed with SIGKILL while a client keeps connecting, and raced for its port."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, json_result, require, run_cli, wait_for
from tests.fakes.processes import alive, cmdline, descendants, own_processes
from tests.services.test_upgrade import UPGRADED_HEALTH, version_of

KV_SERVICE = REPO / "tests" / "fixtures" / "kv-service"
NAME = "kv-socket"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def catalog_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A home whose catalog holds kv-service as `kv-socket`, declared `socket: handoff` (its lifecycle check already
    ran it that way: two starts on one held socket)."""
    require("nix", "cargo", "bwrap")
    home = tmp_path_factory.mktemp("sockethome")
    env = {f"XDG_{d.upper()}_HOME": str(home / d) for d in ("data", "cache", "state", "config")}
    env["FLAKEBOT_WORKDIR"] = str(home / "work")
    later = version_of(home, "0.2.0", edits={'("GET", "/health") => reply(&mut stream, 200, "ok\\n")': UPGRADED_HEALTH})
    for crate in (KV_SERVICE, later):
        done = run_cli(
            "package-service", str(crate), "--offline", "--stop-grace", "2", "--name", NAME, "--socket", "handoff",
            "--examples", str(KV_SERVICE / "examples.json"), "--json", env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    return env


@pytest.fixture
def env(catalog_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    own = {**catalog_env, "FLAKEBOT_WORKDIR": str(tmp_path / "work")}
    with own_processes():
        yield own
        for status in (tmp_path / "work" / "services").glob("*/status.json"):
            pid = json.loads(status.read_text()).get("supervisor_pid")
            if isinstance(pid, int) and alive(pid) and "flakebot.services.supervisor" in cmdline(pid):
                os.kill(pid, signal.SIGKILL)


def up(env: dict[str, str], ref: str = f"{NAME}@0.1.0") -> dict[str, Any]:
    done = run_cli("up", ref, "--json", env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return dict(json_result(done))


def listed(env: dict[str, str]) -> dict[str, Any]:
    done = run_cli("services", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return dict(next(s for s in json_result(done)["services"] if s["name"] == NAME))


def below(pid: int) -> list[tuple[int, list[str]]]:
    """(pid, argv) of the processes under `pid` (this test's own tree only)."""
    tree = descendants()
    parents = {p: _parent(p) for p, _ in tree}
    found, frontier = [], {pid}
    while frontier:
        frontier = {p for p in parents if parents[p] in frontier}
        found += [(p, argv) for p, argv in tree if p in frontier]
    return found


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def test_the_service_accepts_on_the_socket_flakebot_holds_with_no_pasta_beside_it(env: dict[str, str]) -> None:
    started = up(env)
    port, service_pid, supervisor_pid = started["port"], started["service_pid"], started["supervisor_pid"]
    assert started["socket"] == "handoff" and listed(env)["socket"] == "handoff"
    with httpx.Client(trust_env=False, timeout=5) as http:
        fds = http.get(f"http://127.0.0.1:{port}/fds").text.split()
        assert http.get(f"http://127.0.0.1:{port}/net").text.splitlines()[1:] == []  # no route: an empty namespace
    values = dict(word.split("=", 1) for word in fds)
    nspid = next(
        line for line in Path(f"/proc/{service_pid}/status").read_text().splitlines() if line.startswith("NSpid:")
    )
    inner_pid = nspid.split()[-1]  # its pid in the innermost namespace: its own
    assert (
        values["LISTEN_PID"] == values["pid"] == inner_pid
    )  # its own pid in its PID namespace, as sd_listen_fds wants
    assert values["fd3"] in socket_inodes(supervisor_pid)  # fd 3 is the very socket the supervisor holds
    tree = below(supervisor_pid)
    assert service_pid in [pid for pid, _ in tree]
    assert not [argv for _, argv in tree if "pasta" in " ".join(argv)]
    table = run_cli("services", env=env)
    assert "handoff" in table.stdout and max(map(len, table.stdout.splitlines())) <= 80

    restarted = json_result(run_cli("restart", NAME, "--json", env=env, timeout=120))
    assert restarted["port"] == port and restarted["supervisor_pid"] != supervisor_pid
    with httpx.Client(trust_env=False, timeout=5) as http:  # the very socket, handed from one supervisor to the next
        assert f"fd3={values['fd3']}" in http.get(f"http://127.0.0.1:{port}/fds").text
    assert run_cli("down", NAME, env=env).returncode == 0
    with socket.socket() as sock:  # down gave the port up
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))


def test_a_kill_9_loses_no_connection_and_keeps_the_port(env: dict[str, str]) -> None:
    started = up(env)
    port = started["port"]
    answers: list[int] = []
    failures: list[str] = []
    done = threading.Event()

    def keep_asking() -> None:
        with httpx.Client(trust_env=False, timeout=10) as http:
            while not done.is_set():
                try:
                    answers.append(http.get(f"http://127.0.0.1:{port}/health").status_code)
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))

    client = threading.Thread(target=keep_asking)
    client.start()
    try:
        wait_for(lambda: len(answers) > 20, timeout=10)
        os.kill(started["service_pid"], signal.SIGKILL)
        back = wait_for(lambda: (s := listed(env))["restarts"] == 1 and s["health"] == "healthy" and s, timeout=15)
        before = len(answers)
        wait_for(lambda: len(answers) > before + 20, timeout=10)  # it serves again, through the same socket
    finally:
        done.set()
        client.join()
    # not one refused: they waited in the backlog while it restarted; only the request the killed process had
    # accepted and not answered can be lost (a reset, at most one: the client asks one at a time)
    assert not [f for f in failures if "ConnectError" in f] and len(failures) <= 1, failures
    assert set(answers) == {200}
    assert back["port"] == port and back["service_pid"] != started["service_pid"]
    assert run_cli("down", NAME, env=env).returncode == 0


def test_the_port_cannot_be_taken_in_the_restart_gap(env: dict[str, str]) -> None:
    started = up(env)
    port = started["port"]
    taken: list[socket.socket] = []
    os.kill(started["service_pid"], signal.SIGKILL)
    end = time.monotonic() + 1.0  # the old failure: a bind within 0.2 s of the kill took it and the service failed
    try:
        while time.monotonic() < end:
            thief = socket.socket()
            thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                thief.bind(("127.0.0.1", port))
                thief.listen()
                taken.append(thief)  # held, as the process that stole it would
                break
            except OSError as exc:
                thief.close()
                assert exc.errno == errno.EADDRINUSE
        back = wait_for(lambda: (s := listed(env))["restarts"] == 1 and s["state"] in ("running", "failed") and s,
                        timeout=20)  # fmt: skip
    finally:
        for sock in taken:
            sock.close()
    assert not taken, "another process bound the service's port while it restarted"
    assert back["state"] == "running" and back["health"] == "healthy" and back["port"] == port
    with httpx.Client(trust_env=False, timeout=5) as http:
        assert http.get(f"http://127.0.0.1:{port}/health").status_code == 200
    assert run_cli("down", NAME, env=env).returncode == 0


class Asking:
    """A client asking /health in a loop from another thread until stopped: every answer's body, every failure."""

    def __init__(self, port: int) -> None:
        self.port, self.answers, self.failures = port, list[str](), list[str]()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._ask)

    def __enter__(self) -> Asking:
        self.thread.start()
        wait_for(lambda: len(self.answers) > 20, timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    def _ask(self) -> None:
        with httpx.Client(trust_env=False, timeout=10) as http:
            while not self.done.is_set():
                try:
                    self.answers.append(http.get(f"http://127.0.0.1:{self.port}/health").text)
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))


def test_an_upgrade_hands_the_same_socket_to_the_new_version_and_refuses_no_connection(env: dict[str, str]) -> None:
    first = up(env)
    port = first["port"]
    with httpx.Client(trust_env=False, timeout=5) as http:
        socket_before = http.get(f"http://127.0.0.1:{port}/fds").text.split()[-1]
    with Asking(port) as asking:
        upgraded = up(env, f"{NAME}@0.2.0")
        wait_for(lambda: "ok 0.2.0\n" in asking.answers[-5:], timeout=10)
    assert asking.failures == []  # none refused or reset while 0.1.0 stopped and 0.2.0 started
    assert upgraded["version"] == "0.2.0" and upgraded["port"] == port
    assert upgraded["supervisor_pid"] != first["supervisor_pid"]
    with httpx.Client(trust_env=False, timeout=5) as http:
        assert http.get(f"http://127.0.0.1:{port}/fds").text.split()[-1] == socket_before  # the same socket
    with Asking(port) as asking:  # `restart` too: the supervisor's socket passes to the next one
        restarted = json_result(run_cli("restart", NAME, "--json", env=env, timeout=120))
        served = len(asking.answers)
        wait_for(lambda: len(asking.answers) > served + 20, timeout=10)  # the restarted one answers
    assert asking.failures == [] and restarted["port"] == port and restarted["state"] == "running"
    assert run_cli("down", NAME, env=env).returncode == 0


def test_a_network_service_keeps_pasta_whatever_it_declares(env: dict[str, str]) -> None:
    """`up --network`: its outbound connections leave through pasta's sockets, so pasta forwards its port too."""
    require("pasta")
    done = run_cli("up", f"{NAME}@0.1.0", "--network", "--json", env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    started = json_result(done)
    assert started["socket"] == "pasta" and started["network"] is True
    assert [argv for _, argv in below(started["supervisor_pid"]) if "pasta" in " ".join(argv)]
    with httpx.Client(trust_env=False, timeout=5) as http:
        assert http.get(f"http://127.0.0.1:{started['port']}/fds").text.startswith("LISTEN_PID= ")  # none handed in
    assert run_cli("down", NAME, env=env).returncode == 0
