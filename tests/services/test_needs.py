"""Services that need others, through the real commands: kv-service (tests/fixtures) packaged three times, as
kv-service, kv-app (--needs kv-service) and kv-top (--needs kv-app); each started under its supervisor by `up`, each
dependent reaching what it needs from inside its own network namespace (kv-service's GET /connect), and nothing else
of the host's loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import json_result, require, run_cli
from tests.mcp.test_server import mcp_client
from tests.services.test_supervisor import KV_SERVICE, client, status
from tests.services.test_supervisor import env as env  # noqa: F401 - the per-test fixture, on this module's catalog
from tests.services.test_upgrade import UPGRADED_HEALTH, version_of

pytestmark = pytest.mark.slow
CHAIN = {"kv-service": (), "kv-app": ("kv-service",), "kv-top": ("kv-app",)}


def package(env: dict[str, str], name: str, *needs: str) -> Any:
    args = [arg for need in needs for arg in ("--needs", need)]
    return run_cli(
        "package-service", str(KV_SERVICE), "--offline", "--stop-grace", "2", "--start-timeout", "4", "--name", name,
        *args, "--json", env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def catalog_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """kv-service, kv-app needing it and kv-top needing kv-app, packaged once."""
    require("nix", "cargo", "bwrap", "pasta")
    home = tmp_path_factory.mktemp("needshome")
    env = {f"XDG_{d.upper()}_HOME": str(home / d) for d in ("data", "cache", "state", "config")}
    env["FLAKEBOT_WORKDIR"] = str(home / "work")
    for name, needs in CHAIN.items():
        done = package(env, name, *needs)
        assert done.returncode == 0, done.stderr
        manifest = json.loads((Path(json_result(done)["dir"]) / "manifest.json").read_text())
        assert manifest["service"]["needs"] == list(needs)
    return env


def environ(pid: int) -> dict[str, str]:
    """The service's own environment, as the kernel holds it."""
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(pair.decode().split("=", 1) for pair in pairs if pair)


def reaches(port: int, other: int) -> str:
    """What the service on host port `port` says of a connect, from inside its namespace, to 127.0.0.1:`other`."""
    with client() as http:
        return http.get(f"http://127.0.0.1:{port}/connect?127.0.0.1:{other}").text.split()[0]


def states(env: dict[str, str]) -> dict[str, str]:
    listed = json_result(run_cli("services", "--json", env=env))["services"]
    return {s["name"]: s["state"] for s in listed}


def test_up_starts_what_a_service_needs_first_and_down_stops_its_dependents_first(env: dict[str, str]) -> None:  # noqa: F811
    done = run_cli("up", "kv-top", "--json", env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    top = json_result(done)
    service, app = status(env, "kv-service"), status(env, "kv-app")
    assert service["state"] == app["state"] == top["state"] == "running"
    assert service["started_at"] < app["started_at"] < top["started_at"]  # each after what it needs
    assert top["needs"] == ["kv-app"] and app["needs"] == ["kv-service"] and service["needs"] == []
    # each reaches what it needs at FLAKEBOT_<NAME>_URL, and no other port of the host's loopback
    assert environ(top["service_pid"])["FLAKEBOT_KV_APP_URL"] == f"http://127.0.0.1:{app['port']}"
    assert environ(app["service_pid"])["FLAKEBOT_KV_SERVICE_URL"] == f"http://127.0.0.1:{service['port']}"
    assert "FLAKEBOT_KV_SERVICE_URL" not in environ(top["service_pid"])
    assert reaches(top["port"], app["port"]) == "open" and reaches(app["port"], service["port"]) == "open"
    assert reaches(top["port"], service["port"]) == "refused"
    wide = run_cli("services", env={**env, "COLUMNS": "160"})
    assert "needs" in wide.stdout and "kv-app" in wide.stdout.split("kv-top", 1)[1].splitlines()[0]

    # stopping kv-service stops what needs it first, the last dependent first (systemd's Requires)
    stopped = run_cli("down", "kv-service", "--json", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert json_result(stopped)["stopped_dependents"] == ["kv-top", "kv-app"]
    assert states(env) == {"kv-service": "stopped", "kv-app": "stopped", "kv-top": "stopped"}

    # after a reboot (supervisors killed), up --all starts each after what it needs, reached at its port now
    for name in CHAIN:
        assert run_cli("up", name, env=env, timeout=120).returncode == 0
    for name in CHAIN:
        os.kill(status(env, name)["supervisor_pid"], signal.SIGKILL)
    restored = run_cli("up", "--all", "--json", env=env, timeout=120)
    assert restored.returncode == 0, restored.stderr
    assert [s["name"] for s in json_result(restored)["services"]] == ["kv-service", "kv-app", "kv-top"]
    service, app = status(env, "kv-service"), status(env, "kv-app")
    assert service["started_at"] < app["started_at"] < status(env, "kv-top")["started_at"]
    assert environ(app["service_pid"])["FLAKEBOT_KV_SERVICE_URL"] == f"http://127.0.0.1:{service['port']}"
    assert reaches(app["port"], service["port"]) == "open"

    # a restart of what others need restarts them after it; down of a dependent leaves what it needs running
    restarted = json_result(run_cli("restart", "kv-service", "--json", env=env, timeout=120))
    assert restarted["restarted_dependents"] == ["kv-app", "kv-top"]
    assert set(states(env).values()) == {"running"}
    assert json_result(run_cli("down", "kv-top", "--json", env=env))["stopped_dependents"] == []
    assert states(env) == {"kv-service": "running", "kv-app": "running", "kv-top": "stopped"}
    assert json_result(run_cli("down", "kv-service", "--json", env=env))["stopped_dependents"] == ["kv-app"]


def test_a_dependency_that_fails_stops_the_chain_and_what_up_started(env: dict[str, str]) -> None:  # noqa: F811
    """kv-app cannot start (its state's `kv` is a file: kv-service exits 1): `up kv-top` names it, starts no kv-top
    and stops the kv-service it started; a kv-service that ran before the `up` keeps running."""
    broken = Path(env["FLAKEBOT_WORKDIR"]) / "services" / "kv-app" / "state" / "kv"
    broken.parent.mkdir(parents=True)
    broken.write_text("not a directory")
    failed = run_cli("up", "kv-top", "--json", env=env, timeout=120)
    assert failed.returncode == 40, failed.stderr
    error = json.loads(failed.stdout.splitlines()[-1])
    assert error["error"].startswith("service kv-top needs kv-app, which did not start: service kv-app did not")
    assert "flakebot up kv-app" in error["fix"] and len(failed.stderr.strip().splitlines()) == 1
    assert states(env) == {"kv-service": "stopped", "kv-app": "failed"}  # kv-top never started

    running = run_cli("up", "kv-service", "--json", env=env, timeout=120)
    assert running.returncode == 0, running.stderr
    assert run_cli("up", "kv-top", env=env, timeout=120).returncode == 40
    kept = status(env, "kv-service")
    assert kept["state"] == "running" and kept["service_pid"] == json_result(running)["service_pid"]
    assert run_cli("down", "kv-service", env=env).returncode == 0


def test_an_unknown_or_cyclic_need_is_refused_before_anything_starts(env: dict[str, str]) -> None:  # noqa: F811
    own = {**env}
    assert package(own, "kv-loop-a", "kv-loop-b").returncode == 0
    unknown = run_cli("up", "kv-loop-a", env=own, timeout=120)
    assert unknown.returncode == 2, unknown.stderr
    assert "service kv-loop-b is needed but is neither started here nor a catalogued service" in unknown.stderr
    assert "Fix:" in unknown.stderr and len(unknown.stderr.strip().splitlines()) == 1
    assert package(own, "kv-loop-b", "kv-service", "kv-loop-a").returncode == 0
    cycle = run_cli("up", "kv-loop-a", "--json", env=own, timeout=120)
    assert cycle.returncode == 2
    error = json.loads(cycle.stdout.splitlines()[-1])
    assert error["error"] == "services need each other in a cycle: kv-loop-a -> kv-loop-b -> kv-loop-a"
    assert "package it again" in error["fix"]
    assert not (Path(env["FLAKEBOT_WORKDIR"]) / "services").exists()  # nothing started, not even kv-service
    itself = package(own, "kv-self", "kv-self")
    assert itself.returncode == 2 and "cannot need itself" in itself.stderr
    twice = package(own, "kv-twice", "kv-service", "kv-service")
    assert twice.returncode == 2 and "needs 'kv-service' twice" in twice.stderr


def test_a_dependency_that_ran_here_starts_as_its_recorded_program_not_the_catalogs(  # noqa: F811
    env: dict[str, str], tmp_path: Path
) -> None:
    """kv-service ran here (0.1.0, recorded); the catalog's kv-service is now 0.2.0: `up kv-app` starts the recorded
    0.1.0 for it, as `restart` would (identity.py), never what the name means now."""
    assert run_cli("up", "kv-service", env=env, timeout=120).returncode == 0
    ran = status(env, "kv-service")["store_path"]
    assert run_cli("down", "kv-service", env=env).returncode == 0
    newer = version_of(tmp_path, "0.2.0", edits={'("GET", "/health") => reply(&mut stream, 200, "ok\\n")':
                                                 UPGRADED_HEALTH})  # fmt: skip
    done = run_cli("package-service", str(newer), "--offline", "--stop-grace", "2", "--name", "kv-service", env=env)
    assert done.returncode == 0, done.stderr
    assert run_cli("up", "kv-app", env=env, timeout=120).returncode == 0
    service = status(env, "kv-service")
    assert service["version"] == "0.1.0" and service["store_path"] == ran
    with client() as http:
        assert http.get(f"http://127.0.0.1:{service['port']}/health").content == b"ok\n"
    assert json_result(run_cli("down", "kv-service", "--json", env=env))["stopped_dependents"] == ["kv-app"]


def test_an_agents_refused_up_starts_nothing_it_needs(  # noqa: F811
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The user started kv-app with a secret; both stopped since. An agent's service_up of kv-app is refused (the
    user's secrets), and so is one of kv-top (its need kv-app holds them): neither starts kv-service first, which the
    agent could not start by its own name here either (its status and log unchanged)."""
    for key, value in env.items():  # the MCP server sees this module's catalog and the test's services
        monkeypatch.setenv(key, value)
    secret = tmp_path / "token"
    secret.write_text("s3cret")
    assert run_cli("up", "kv-app", "--secret", f"token={secret}", env=env, timeout=120).returncode == 0
    assert json_result(run_cli("down", "kv-service", "--json", env=env))["stopped_dependents"] == ["kv-app"]
    services = Path(env["FLAKEBOT_WORKDIR"]) / "services"
    before = {p: p.read_bytes() for p in (services / "kv-service").glob("*.json")}
    log = (services / "kv-service" / "supervisor.log").read_bytes()

    async def session() -> list[Any]:
        async with mcp_client() as mcp:
            return [await mcp.call("service_up", {"service": name}) for name in ("kv-app", "kv-top")]

    [(app, app_error), (top, top_error)] = asyncio.run(session())
    assert app_error and "an agent cannot start it" in app["error"], app
    assert top_error and "which the user started with secrets" in top["error"], top
    assert states(env) == {"kv-service": "stopped", "kv-app": "stopped"}
    assert {p: p.read_bytes() for p in (services / "kv-service").glob("*.json")} == before  # never started
    assert not (services / "kv-top").exists()
    assert (services / "kv-service" / "supervisor.log").read_bytes() == log


def lost(env: dict[str, str], name: str) -> None:
    """Kill service `name`'s supervisor (as a crash would) and wait until it is lost."""
    os.kill(status(env, name)["supervisor_pid"], signal.SIGKILL)
    for _ in range(50):
        if status(env, name)["state"] == "lost":
            return
        time.sleep(0.1)


def test_a_dependency_that_died_and_starts_again_elsewhere_is_reached_there(env: dict[str, str]) -> None:  # noqa: F811
    """kv-service's supervisor killed (a crash) while kv-app runs: kv-app's namespace still forwards kv-service's old
    port. No other service may take that port meanwhile (kv-app would reach it as kv-service); `up kv-service` starts
    it there or elsewhere, and kv-app (and kv-top, which needs kv-app) start again after it, reaching it there."""
    assert run_cli("up", "kv-top", env=env, timeout=120).returncode == 0
    assert package(env, "kv-other").returncode == 0
    service = status(env, "kv-service")
    lost(env, "kv-service")
    taken = run_cli("up", "kv-other", "--port", str(service["port"]), env=env, timeout=120)  # kv-app would reach it
    assert taken.returncode == 2, taken.stderr
    assert f"port {service['port']} is where running kv-app reaches kv-service" in taken.stderr
    assert "kv-other" not in states(env)
    again = json_result(run_cli("up", "kv-service", "--json", env=env, timeout=120))
    app, top = status(env, "kv-app"), status(env, "kv-top")
    assert again["state"] == app["state"] == top["state"] == "running"
    assert environ(app["service_pid"])["FLAKEBOT_KV_SERVICE_URL"] == f"http://127.0.0.1:{again['port']}"
    assert environ(top["service_pid"])["FLAKEBOT_KV_APP_URL"] == f"http://127.0.0.1:{app['port']}"
    moved = again["port"] != service["port"]  # its old port kept for it, unless still in TIME_WAIT
    assert again.get("restarted_dependents", []) == (["kv-app", "kv-top"] if moved else [])
    # the same through up --all (which starts only what is lost: kv-service), its old port taken meanwhile
    old_port = status(env, "kv-service")["port"]
    lost(env, "kv-service")
    with contextlib.ExitStack() as taken:
        with contextlib.suppress(OSError):  # taken already when its closed connections linger (TIME_WAIT)
            taken.enter_context(socket.create_server(("127.0.0.1", old_port)))
        restored = json_result(run_cli("up", "--all", "--json", env=env, timeout=120))["services"]
    assert restored[0]["port"] != old_port
    assert [s["name"] for s in restored] == ["kv-service"], restored
    app = status(env, "kv-app")
    assert environ(app["service_pid"])["FLAKEBOT_KV_SERVICE_URL"] == f"http://127.0.0.1:{restored[0]['port']}"
    assert status(env, "kv-top")["state"] == "running"
    assert json_result(run_cli("down", "kv-service", "--json", env=env))["stopped_dependents"] == ["kv-top", "kv-app"]


def test_an_agents_start_of_a_lost_dependency_never_starts_the_users_secret_holder_again(  # noqa: F811
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """kv-app runs with the user's secret; kv-service under it died and its old port is taken. An agent's
    service_up of kv-service moves it, stops kv-app (it would reach the old port) and leaves it stopped, named."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    secret = tmp_path / "token"
    secret.write_text("s3cret")
    assert run_cli("up", "kv-app", "--secret", f"token={secret}", env=env, timeout=120).returncode == 0
    old_port = status(env, "kv-service")["port"]
    lost(env, "kv-service")

    async def session() -> Any:
        async with mcp_client() as mcp:
            return await mcp.call("service_up", {"service": "kv-service"})

    with contextlib.ExitStack() as taken:
        with contextlib.suppress(OSError):
            taken.enter_context(socket.create_server(("127.0.0.1", old_port)))
        started, error = asyncio.run(session())
    assert not error and started["state"] == "running" and started["port"] != old_port, started
    assert started["stopped_dependents"] == ["kv-app"] and started["restarted_dependents"] == []
    assert states(env) == {"kv-service": "running", "kv-app": "stopped"}
    assert json_result(run_cli("restart", "kv-app", "--json", env=env, timeout=120))["state"] == "running"
    app = status(env, "kv-app")
    assert environ(app["service_pid"])["FLAKEBOT_KV_SERVICE_URL"] == f"http://127.0.0.1:{started['port']}"

    # the same when the agent's service_up of kv-top starts the lost kv-service as what it needs: kv-app (the user's,
    # with the secret) is stopped, not started again by the agent, and kv-top (which needs it) does not start
    old_port = started["port"]
    lost(env, "kv-service")

    async def top() -> Any:
        async with mcp_client() as mcp:
            return await mcp.call("service_up", {"service": "kv-top"})

    with contextlib.ExitStack() as taken:
        with contextlib.suppress(OSError):
            taken.enter_context(socket.create_server(("127.0.0.1", old_port)))
        refused, error = asyncio.run(top())
    assert error and "service kv-top needs kv-app" in refused["error"], refused
    assert states(env) == {"kv-service": "stopped", "kv-app": "stopped"}  # kv-top never started


def test_an_export_carries_what_the_service_needs(env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """`export --nixos` of kv-top: its unit requires kv-app's and finds it at kv-app's catalogued port, and the
    configuration lines import both modules; a need not catalogued is refused before anything is written."""
    done = run_cli("export", "kv-top", "--nixos", "--out", str(tmp_path / "nixos"), "--json", env=env, timeout=180)
    assert done.returncode == 0, done.stderr
    result = json_result(done)
    assert result["needs"] == ["kv-app"] and result["problems"] == []
    app_port = json.loads(
        next((Path(env["XDG_DATA_HOME"]) / "flakebot" / "tools" / "kv-app").glob("*/manifest.json")).read_text()
    )["service"]["port"]
    lines = result["unit"].splitlines()
    assert f'Environment="FLAKEBOT_KV_APP_URL=http://127.0.0.1:{app_port}"' in lines, lines
    assert "Requires=flakebot-kv-app.service" in lines
    assert "./flakebot-kv-app.nix" in result["configuration"]
    assert package(env, "kv-orphan", "kv-nowhere").returncode == 0
    orphan = run_cli("export", "kv-orphan", "--nixos", "--out", str(tmp_path / "orphan"), env=env, timeout=120)
    assert orphan.returncode == 60, orphan.stderr
    assert "needs kv-nowhere, which is not a catalogued service here" in orphan.stderr
    assert not (tmp_path / "orphan").exists()
