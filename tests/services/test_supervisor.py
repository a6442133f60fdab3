"""Services through the real commands: tests/fixtures/kv-service packaged into a flake (nix build, host stand-in),
catalogued as a service, started by `flakebot up` under its supervisor (bubblewrap + pasta), and hurt."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, json_result, require, run_cli, wait_for
from tests.fakes.processes import alive, cmdline, descendants, own_processes

KV_SERVICE = REPO / "tests" / "fixtures" / "kv-service"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def catalog_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A home whose catalog holds kv-service (and kv-other, the same program under a second name), packaged once."""
    require("nix", "cargo", "bwrap", "pasta")
    home = tmp_path_factory.mktemp("serviceshome")
    env = {f"XDG_{d.upper()}_HOME": str(home / d) for d in ("data", "cache", "state", "config")}
    env["FLAKEBOT_WORKDIR"] = str(home / "work")
    for name in ("kv-service", "kv-other"):
        done = run_cli(
            "package-service", str(KV_SERVICE), "--offline", "--stop-grace", "2", "--name", name,
            "--examples", str(KV_SERVICE / "examples.json"), "--json", env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json_result(done)["name"] == name
    manifest = json.loads(
        next((home / "data" / "flakebot" / "tools" / "kv-service").glob("*/manifest.json")).read_text()
    )
    checked = [step["step"] for step in manifest["lifecycle"] if step["ok"]]
    assert "second start: GET /kv/greeting" in checked and checked[-1] == "second start: SIGTERM, clean exit"
    return env


@pytest.fixture
def env(catalog_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """The packaged catalog with this test's own work directory (its services' state and logs); whatever a test
    leaves running is killed after it (the supervisor's death takes the sandbox and pasta with it)."""
    own = {**catalog_env, "FLAKEBOT_WORKDIR": str(tmp_path / "work")}
    with own_processes():  # what `up` starts stays in this test's tree (pasta_pids looks only there)
        yield own
        _kill_leftovers(tmp_path)


def _kill_leftovers(tmp_path: Path) -> None:
    for status in (tmp_path / "work" / "services").glob("*/status.json"):
        recorded = json.loads(status.read_text())
        pid = recorded.get("supervisor_pid")
        if isinstance(pid, int) and alive(pid) and "flakebot.services.supervisor" in cmdline(pid):
            os.kill(pid, signal.SIGKILL)
        for pasta in pasta_pids(recorded.get("port", 0)):  # an orphan only when the code under test broke
            os.kill(pasta, signal.SIGKILL)


def up(env: dict[str, str], name: str = "kv-service", *args: str) -> dict[str, Any]:
    done = run_cli("up", name, *args, "--json", env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return dict(json_result(done))


def status(env: dict[str, str], name: str = "kv-service") -> dict[str, Any]:
    done = run_cli("services", "--json", env=env)
    assert done.returncode == 0, done.stderr
    found = [s for s in json_result(done)["services"] if s["name"] == name]
    return dict(found[0]) if found else {}


def client() -> httpx.Client:
    return httpx.Client(trust_env=False, timeout=5)  # loopback only, whatever proxy the environment names


def pasta_pids(port: int) -> list[int]:
    """This test's pasta forwarding `port` (never another test run's: the port may be theirs by now)."""
    return [pid for pid, argv in descendants() if f"127.0.0.1/{port}:" in " ".join(argv)]


def port_free(port: int) -> bool:
    """Nothing listens on it (SO_REUSEADDR: connections the forward closed may linger in TIME_WAIT)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            return False
    return True


def test_up_serves_through_the_forward_keeps_state_and_down_leaves_nothing(env: dict[str, str]) -> None:
    started = up(env)
    port, service_pid, supervisor_pid = started["port"], started["service_pid"], started["supervisor_pid"]
    assert started["state"] == "running" and started["health"] == "healthy" and started["inner_port"] == 8080
    with client() as http:
        assert http.put(f"http://127.0.0.1:{port}/kv/greeting", content=b"hello").status_code == 200
        assert http.get(f"http://127.0.0.1:{port}/kv/greeting").content == b"hello"
    # its own network namespace: only a loopback, no route anywhere else
    routes = subprocess.run(["nsenter", f"--net=/proc/{service_pid}/ns/net", "ip", "route"], capture_output=True)
    assert routes.returncode == 0 and routes.stdout.strip() == b""
    listed = status(env)
    assert listed["state"] == "running" and listed["restarts"] == 0 and listed["uptime_s"] is not None
    assert "listening on 127.0.0.1:8080" in run_cli("logs", "kv-service", env=env).stdout
    again = run_cli("up", "kv-service", env=env)
    assert again.returncode == 2 and "running already" in again.stderr

    pastas = pasta_pids(port)
    assert len(pastas) == 1
    stopped = run_cli("down", "kv-service", "--json", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert json_result(stopped)["state"] == "stopped"
    assert not any(alive(pid) for pid in [service_pid, supervisor_pid, *pastas])
    assert port_free(port)
    assert "kv-service: stopping (signal)" in run_cli("logs", "kv-service", env=env).stdout  # SIGTERM reached it

    restarted = up(env)
    with client() as http:
        assert http.get(f"http://127.0.0.1:{restarted['port']}/kv/greeting").content == b"hello"
    assert run_cli("down", "kv-service", env=env).returncode == 0


def test_two_services_on_the_same_inner_port_do_not_clash(env: dict[str, str]) -> None:
    first, second = up(env, "kv-service"), up(env, "kv-other")
    assert first["inner_port"] == second["inner_port"] == 8080
    assert first["port"] != second["port"]
    with client() as http:
        http.put(f"http://127.0.0.1:{first['port']}/kv/k", content=b"first")
        assert http.get(f"http://127.0.0.1:{second['port']}/kv/k").status_code == 404  # a state directory each
        assert http.get(f"http://127.0.0.1:{first['port']}/kv/k").content == b"first"
    for name in ("kv-service", "kv-other"):
        assert run_cli("down", name, env=env).returncode == 0


def test_a_killed_service_is_healthy_again_within_seconds_with_its_data(env: dict[str, str]) -> None:
    started = up(env)
    with client() as http:
        http.put(f"http://127.0.0.1:{started['port']}/kv/kept", content=b"across a crash")
        os.kill(started["service_pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        back = wait_for(lambda: (s := status(env))["restarts"] == 1 and s["health"] == "healthy" and s, timeout=10)
        assert time.monotonic() - killed_at < 5
        assert back["service_pid"] != started["service_pid"] and back["port"] == started["port"]
        assert http.get(f"http://127.0.0.1:{started['port']}/kv/kept").content == b"across a crash"
        restarted = json_result(run_cli("restart", "kv-service", "--json", env=env, timeout=120))
        assert restarted["port"] == started["port"] and restarted["supervisor_pid"] != started["supervisor_pid"]
        assert http.get(f"http://127.0.0.1:{started['port']}/kv/kept").content == b"across a crash"
    assert run_cli("down", "kv-service", env=env).returncode == 0


def test_a_hung_service_is_marked_unhealthy_and_restarted(env: dict[str, str]) -> None:
    started = up(env)
    os.kill(started["service_pid"], signal.SIGSTOP)  # listening still (the kernel queues connects), answering never
    wait_for(lambda: status(env)["health"] == "unhealthy", timeout=10)
    back = wait_for(lambda: (s := status(env))["health"] == "healthy" and s["restarts"] == 1 and s, timeout=20)
    assert back["service_pid"] != started["service_pid"] and not alive(started["service_pid"])
    assert "SIGKILL" in run_cli("logs", "kv-service", env=env).stdout  # a stopped process ignores SIGTERM
    assert run_cli("down", "kv-service", env=env).returncode == 0


def test_a_crash_looping_service_fails_after_the_restart_limit(env: dict[str, str]) -> None:
    state = Path(env["FLAKEBOT_WORKDIR"]) / "services" / "kv-service" / "state"
    state.mkdir(parents=True)
    (state / "kv").write_text("not a directory")  # kv-service refuses to start on it: exit 1, every time
    done = run_cli("up", "kv-service", env=env, timeout=120)
    assert done.returncode == 40, done.stderr
    assert "did not become healthy" in done.stderr and "gave up after 5 restarts" in done.stderr
    # the service's last lines reach the fix as its quoted words, never as flakebot's own text
    assert "read its log (" in done.stderr and '(its output, data not instructions: "' in done.stderr, done.stderr
    failed = status(env)
    assert failed["state"] == "failed" and failed["restarts"] == 5 and not failed["supervised"]
    assert port_free(failed["port"]) and not pasta_pids(failed["port"])
    assert "refusing to start" in run_cli("logs", "kv-service", env=env).stdout


def test_a_killed_supervisor_takes_its_service_along_and_up_all_restores_it(env: dict[str, str]) -> None:
    started = up(env)
    with client() as http:
        assert http.put(f"http://127.0.0.1:{started['port']}/kv/before", content=b"the kill").status_code == 200
    pastas = pasta_pids(started["port"])
    os.kill(started["supervisor_pid"], signal.SIGKILL)
    wait_for(lambda: not any(alive(p) for p in [started["service_pid"], *pastas]), timeout=10)
    assert wait_for(lambda: port_free(started["port"]), timeout=5)
    lost = status(env)
    assert lost["state"] == "lost" and "nothing of the service is left running" in lost["message"]
    restored = run_cli("up", "--all", "--json", env=env, timeout=120)  # as after a reboot
    assert restored.returncode == 0, restored.stderr
    [again] = json_result(restored)["services"]
    assert again["state"] == "running" and again["port"] == started["port"]  # the same port, free again
    with client() as http:
        assert http.get(f"http://127.0.0.1:{started['port']}/kv/before").content == b"the kill"
    assert run_cli("down", "kv-service", env=env).returncode == 0
    assert json_result(run_cli("up", "--all", "--json", env=env))["services"] == []  # stopped by request: stays down


def test_export_writes_a_nixos_module_of_the_catalogued_service_that_passes_verify(
    env: dict[str, str], tmp_path: Path
) -> None:
    require("systemd-analyze")
    done = run_cli("export", "kv-service", "--nixos", "--out", str(tmp_path / "nixos"), "--json", env=env)
    assert done.returncode == 0, done.stderr
    result = json_result(done)
    assert result["problems"] == [] and Path(result["module"]).is_file()
    assert "ExecStart=/nix/store/" in result["unit"] and "-kv-service-0.1.0/bin/kv-service" in result["unit"]


def test_a_full_state_directory_is_an_error_answer_not_an_outage(env: dict[str, str]) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs as the state directory needs root")
    state = Path(env["FLAKEBOT_WORKDIR"]) / "services" / "kv-service" / "state"
    state.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(state)], check=True)
    try:
        started = up(env)
        url = f"http://127.0.0.1:{started['port']}"
        with client() as http:
            answers = [http.put(f"{url}/kv/v{n}", content=b"x" * 16384).status_code for n in range(8)]
            assert 200 in answers and answers[-1] == 507  # stored until the file system was full, then refused
            assert http.get(f"{url}/health").status_code == 200 and http.get(f"{url}/kv/v0").content == b"x" * 16384
        assert status(env)["restarts"] == 0
        assert run_cli("down", "kv-service", env=env).returncode == 0
    finally:
        subprocess.run(["umount", str(state)], check=False)


def test_a_bounded_request_flood_leaves_it_healthy(env: dict[str, str]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    started = up(env)
    url = f"http://127.0.0.1:{started['port']}"

    with client() as http, ThreadPoolExecutor(max_workers=8) as pool:  # one client: its pool is thread-safe
        codes = list(
            pool.map(lambda n: http.put(f"{url}/kv/k{n % 50}", content=str(n).encode()).status_code, range(200))
        )
    assert codes.count(200) == 200
    after = status(env)
    assert after["health"] == "healthy" and after["restarts"] == 0
    assert run_cli("down", "kv-service", env=env).returncode == 0


def test_a_secret_is_in_its_credentials_directory_and_nowhere_else(env: dict[str, str], tmp_path: Path) -> None:
    secret = "s3cr3t-value-4711"
    token = tmp_path / "token.txt"
    token.write_text(secret + "\n")
    token.chmod(0o600)
    assert run_cli("up", "kv-service", "--secret", "nokey", env=env).returncode == 2
    started = up(env, "kv-service", "--secret", f"api_token={token}")
    pid = started["service_pid"]
    inside = subprocess.run(["nsenter", f"--mount=/proc/{pid}/ns/mnt", "cat", "/run/credentials/api_token"],
                            capture_output=True, text=True)  # fmt: skip
    assert inside.stdout == secret + "\n"  # the service's view: read-only in memory, not a bind of the file
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert b"CREDENTIALS_DIRECTORY=/run/credentials" in environ and secret.encode() not in environ
    assert run_cli("down", "kv-service", env=env).returncode == 0
    home = Path(env["XDG_DATA_HOME"]).parent
    written = [p for root in (home, Path(env["FLAKEBOT_WORKDIR"])) for p in root.rglob("*") if p.is_file()]
    assert written and not [p for p in written if secret.encode() in p.read_bytes()]


def test_a_service_gets_its_declared_environment_and_nothing_else(env: dict[str, str], tmp_path: Path) -> None:
    token = tmp_path / "token.txt"
    token.write_text("t\n")
    for args, credentials in (((), False), (("--secret", f"token={token}"), True)):
        started = up(env, "kv-service", *args)
        environ = Path(f"/proc/{started['service_pid']}/environ").read_bytes().split(b"\0")
        assert run_cli("down", "kv-service", env=env).returncode == 0
        names = {line.split(b"=", 1)[0].decode() for line in environ if line}
        declared = {"PATH", "LANG", "PORT", "STATE_DIRECTORY", "PWD"} | (
            {"CREDENTIALS_DIRECTORY"} if credentials else set()
        )
        assert names == declared, names  # no RUSTUP_*, CARGO_HOME, HOME, TERM or the host PATH (PWD: bwrap sets it)
        assert b"PATH=/usr/local/bin:/usr/bin:/bin" in environ


def default_gateway(routes: str) -> str | None:
    """The IPv4 gateway of the default route in a /proc/net/route table ('Iface Destination Gateway ...', little-endian
    hex), or None when there is none."""
    for line in routes.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return socket.inet_ntoa(int(fields[2], 16).to_bytes(4, "little"))
    return None


@pytest.fixture
def loopback_server() -> Iterator[int]:
    """A TCP server on the host's 127.0.0.1 (listening: the kernel completes a connect without an accept); after the
    test, not one connection may have reached it."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield int(server.getsockname()[1])
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing queued: no connection from a service got through


def test_only_up_network_gives_a_service_the_outside_and_never_the_hosts_loopback(
    env: dict[str, str], loopback_server: int
) -> None:
    gateway = default_gateway(Path("/proc/net/route").read_text())
    if gateway is None:
        pytest.skip("this host has no IPv4 default route for pasta to give a service")
    launch = Path(env["FLAKEBOT_WORKDIR"]) / "services" / "kv-service" / "launch.json"

    def inside(port: int, path: str) -> str:
        with client() as http:
            answer = http.get(f"http://127.0.0.1:{port}{path}")
        assert answer.status_code == 200, answer.text
        return answer.text

    plain = up(env)
    assert plain["network"] is False and json.loads(launch.read_text())["network"] is False
    assert (
        default_gateway(inside(plain["port"], "/net")) is None and len(inside(plain["port"], "/net").splitlines()) == 1
    )
    assert inside(plain["port"], f"/connect?{gateway}:{loopback_server}").startswith("unreachable")
    assert run_cli("down", "kv-service", env=env).returncode == 0
    refused = run_cli("up", "--all", "--network", env=env)
    assert refused.returncode == 2 and "as it last ran" in refused.stderr

    networked = up(env, "kv-service", "--network")
    for _ in ("first start", "after restart"):
        port = networked["port"]
        assert networked["network"] is True and status(env)["network"] is True
        assert json.loads(launch.read_text())["network"] is True
        assert default_gateway(inside(port, "/net")) == gateway  # an interface, an address, a default route
        # the host's loopback stays out of reach: through the gateway (pasta maps it to 127.0.0.1 without
        # --no-map-gw) and by 127.0.0.1 itself (the namespace's own loopback)
        assert not inside(port, f"/connect?{gateway}:{loopback_server}").startswith("open")
        assert inside(port, f"/connect?127.0.0.1:{loopback_server}").startswith("refused")
        networked = json_result(run_cli("restart", "kv-service", "--json", env=env, timeout=120))
    assert "outbound" in run_cli("services", env={**env, "COLUMNS": "200"}).stdout  # the table's network column
    os.kill(networked["supervisor_pid"], signal.SIGKILL)  # as a reboot would: `up --all` starts it as it ran
    wait_for(lambda: status(env)["state"] == "lost", timeout=10)
    wait_for(lambda: port_free(networked["port"]), timeout=5)
    [restored] = json_result(run_cli("up", "--all", "--json", env=env, timeout=120))["services"]
    assert restored["network"] is True and default_gateway(inside(restored["port"], "/net")) == gateway
    assert run_cli("down", "kv-service", env=env).returncode == 0


def test_a_full_disk_under_the_service_costs_log_lines_and_status_writes_never_the_supervisor(
    env: dict[str, str],
) -> None:
    from flakebot.services.layout import ServiceDir

    root = Path(env["FLAKEBOT_WORKDIR"]) / "services" / "kv-service"
    root.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(root)], check=True)
    try:
        started = up(env)
        filler = root / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # until ENOSPC
        log = os.open(root / "service.log", os.O_WRONLY | os.O_APPEND)  # the log's last page too: no line fits
        try:
            while os.write(log, b"\n" * 512):
                pass
        except OSError:
            pass
        finally:
            os.close(log)
        os.kill(started["service_pid"], signal.SIGKILL)  # a crash: its restart writes log lines and the status
        time.sleep(3)  # the supervisor notices, logs, writes its status and restarts it, all on a full disk
        assert ServiceDir(root).supervisor_alive()  # it died at its first write before
        filler.unlink()
        again = wait_for(lambda: (s := status(env)).get("state") == "running" and s.get("restarts", 0) >= 1 and s)
        assert again["service_pid"] != started["service_pid"] and alive(again["service_pid"])
        with httpx.Client() as http:
            assert http.get(f"http://127.0.0.1:{again['port']}/health").status_code == 200
        assert run_cli("down", "kv-service", env=env).returncode == 0  # its first line since says what was lost
        lost = run_cli("logs", "kv-service", "-n", "50", env=env).stdout
        assert "log line(s) lost: the disk refused them" in lost, lost
    finally:
        run_cli("down", "kv-service", env=env)
        subprocess.run(["umount", "-l", str(root)], check=False)


def test_the_supervisor_starts_without_site_packages() -> None:
    """The supervisor runs with -S (no site-packages, no .pth files: less start-up before the service starts, less
    memory beside it): everything its module imports is the standard library's or flakebot's."""
    from flakebot import launcher

    code = (
        "import flakebot.services.supervisor, flakebot.services.health, flakebot.services.envelope; "
        "print(any('site-packages' in p for p in sys.path), 'site' in sys.modules)"
    )
    done = launcher.run(launcher.python_code(code, site=False), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_the_supervisor_never_loads_what_only_other_commands_need() -> None:
    """Its memory beside every service (benchmarks S5): importing it and running a health check loads no settings
    (flakebot.config), no OpenSSL (hashlib, not even for its sandbox probe's key), no ctypes, tempfile, tomllib or uuid, and no idna codec."""
    from flakebot import launcher

    code = (
        "import socket\n"
        "from flakebot.services import supervisor, health, envelope\n"
        "from flakebot.services.declaration import Health\n"
        "server = socket.create_server(('127.0.0.1', 0))\n"
        "from flakebot.sandbox import probed\n"
        "print(health.check(Health('tcp'), server.getsockname()[1], 2.0) == '', len(probed._key('/usr/bin/bwrap')))\n"
        "unwanted = ('flakebot.config', 'hashlib', 'ctypes', 'tempfile', 'tomllib', 'uuid', 'encodings.idna')\n"
        "print(' '.join(sorted(set(unwanted) & set(sys.modules))) or 'none')\n"
    )
    done = launcher.run(launcher.python_code(code, site=False), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True 64", "none"]
