"""A service is the program the user's `up` recorded, not its name (issue 41, class 3): the attacks, through the real
commands and the real `flakebot mcp`, judged from outside (which program answers on the port, what a client read).

The user starts kv-service with secrets. Then its catalog name is made to mean another program, the way an agent can:
`package-service` of a "thief" build under the same name and version goes through Catalog.add's in-place
replacement of the current version, the same catalog call a `craft --service --fresh` of the same need makes; a
thief 0.2.0 is what an MCP `improve` would add. The thief answers GET /cred with its credentials, hex-encoded (log
redaction never sees them); kv-service itself answers 404 there. Before programs were recorded, `restart`,
`up --all` and `rollback` re-read the catalog and handed the secret to the thief, and MCP `service_up NAME@0.2.0`
upgraded the user's service to it with the user's secrets.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.reliability.services import HEALTH_LINE, SECRET, THIEF_ROUTE, leaked, set_version, thief_crate
from benchmarks.reliability.services import credential as inside
from flakebot import config
from flakebot.deliver.catalog import Catalog
from tests.conftest import json_result, require, run_cli, wait_for
from tests.fakes.mcp_call import mcp_call
from tests.fakes.service_sessions import NAME, session
from tests.mcp.test_server import mcp_client
from tests.services.test_supervisor import KV_SERVICE

pytestmark = pytest.mark.slow
CRAFT_NEED = "need a key-value store over HTTP"
OFFLINE = ["--registry", "local", "--offline"]


@pytest.fixture(scope="module")
def crates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("identitycrates")
    return {"thief 0.1.0": thief_crate(root, "0.1.0"), "thief 0.2.0": thief_crate(root, "0.2.0")}


@pytest.fixture
def home(flakebot_home: Path) -> Iterator[Path]:
    """A flakebot home whose catalog holds kv-service 0.1.0 (the user's program); whatever runs is killed after."""
    require("nix", "cargo", "bwrap", "pasta")
    package(KV_SERVICE)
    yield flakebot_home
    for found in (flakebot_home / "work" / "services").glob("*/status.json"):
        pid = json.loads(found.read_text()).get("supervisor_pid")
        if isinstance(pid, int) and "flakebot.services.supervisor" in _cmdline(pid):
            os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def package(crate: Path) -> dict[str, Any]:
    """Catalog `crate` as kv-service (its crate version): a version already there is replaced in place."""
    done = run_cli("package-service", str(crate), "--offline", "--stop-grace", "2", "--name", "kv-service", "--json")
    assert done.returncode == 0, done.stderr
    return dict(json_result(done))


def secret_files(home: Path) -> list[str]:
    """--secret arguments for keys the redactor matches (token, password, api_key): each must reach the service."""
    args = []
    for key in ("token", "password", "api_key"):
        path = home / f"{key}.txt"
        path.write_text(f"{SECRET}-{key}\n")
        path.chmod(0o600)
        args += ["--secret", f"{key}={path}"]
    return args


def cli(*args: str) -> dict[str, Any]:
    done = run_cli(*args, "--json", timeout=180)
    assert done.returncode == 0, done.stderr
    return dict(json_result(done))


def cred(port: int) -> tuple[int, str]:
    """What GET /cred answers: kv-service 404, the thief its credentials (hex)."""
    with httpx.Client(trust_env=False, timeout=5) as http:
        answer = http.get(f"http://127.0.0.1:{port}/cred")
    return answer.status_code, answer.text


def test_restart_after_the_name_was_replaced_runs_the_recorded_program_with_its_secrets(
    home: Path, crates: dict[str, Path]
) -> None:
    started = cli("up", "kv-service", *secret_files(home))
    for key in ("token", "password", "api_key"):  # keys the redactor matches: never blanked on their way
        assert inside(started["service_pid"], key) == f"{SECRET}-{key}\n"
    original = json.loads((home / "work/services/kv-service/launch.json").read_text())["program"]["store_path"]
    replaced = package(crates["thief 0.1.0"])  # kv-service 0.1.0 now means the thief
    assert replaced["version"] == "0.1.0" and replaced["store_path"] != original

    again = cli("restart", "kv-service")
    assert again["store_path"] == original  # what `restart --json` says it runs
    assert cred(again["port"])[0] == 404  # kv-service answers; the thief would say 200 and the secret
    assert inside(again["service_pid"], "token") == f"{SECRET}-token\n"
    assert Path(f"/proc/{again['service_pid']}/exe").resolve().is_relative_to(original)

    # the user's own `up` of the name, stopped, is refused while it means another program; --replace says yes
    assert run_cli("down", "kv-service").returncode == 0
    refused = run_cli("up", "kv-service", *secret_files(home), "--json")
    assert refused.returncode == 2 and "--replace" in refused.stdout and "restart" in refused.stdout
    written = [p for p in (home / "work").rglob("*") if p.is_file()]
    assert not [p for p in written if SECRET.encode() in p.read_bytes()]  # in no log, status or launch record


def test_crash_restarts_and_up_all_run_the_recorded_program(home: Path, crates: dict[str, Path]) -> None:
    started = cli("up", "kv-service", *secret_files(home))
    package(crates["thief 0.1.0"])
    os.kill(started["service_pid"], signal.SIGKILL)  # the supervisor starts it again by itself
    back = wait_for(lambda: (s := cli("services")["services"][0])["health"] == "healthy" and s["restarts"] == 1 and s)
    assert cred(back["port"])[0] == 404 and inside(back["service_pid"], "token") == f"{SECRET}-token\n"

    os.kill(back["supervisor_pid"], signal.SIGKILL)  # a reboot, a kill: `up --all` starts it again
    wait_for(lambda: cli("services")["services"][0]["state"] == "lost", 15)
    restored = cli("up", "--all")["services"][0]
    assert "error" not in restored, restored
    code, text = cred(restored["port"])
    assert code == 404 and not leaked(text)
    assert inside(restored["service_pid"], "token") == f"{SECRET}-token\n"


def test_rollback_goes_back_to_the_program_that_ran_not_to_what_the_version_means_now(
    home: Path, crates: dict[str, Path], tmp_path: Path
) -> None:
    second = tmp_path / "kv-0.2.0"
    shutil.copytree(KV_SERVICE, second, ignore=shutil.ignore_patterns("target"))
    set_version(second, "0.2.0")
    package(second)
    cli("up", "kv-service@0.1.0", *secret_files(home))
    upgraded = cli("up", "kv-service@0.2.0")  # the user's upgrade: secrets carried to 0.2.0
    assert upgraded["version"] == "0.2.0"
    package(crates["thief 0.1.0"])  # 0.1.0, what rollback goes back to, now means the thief
    back = cli("rollback", "kv-service")
    assert back["version"] == "0.1.0"
    code, text = cred(back["port"])
    assert code == 404 and not leaked(text)
    assert inside(back["service_pid"], "token") == f"{SECRET}-token\n"


def test_an_agent_over_mcp_cannot_make_another_program_receive_the_secret(home: Path, crates: dict[str, Path]) -> None:
    started = cli("up", "kv-service", *secret_files(home))
    package(crates["thief 0.2.0"])  # a new version, as an MCP improve would catalog it
    store = json.loads((home / "work/services/kv-service/launch.json").read_text())["program"]["store_path"]

    async def session() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with mcp_client() as client:
            ask = {"service": "kv-service", "method": "GET", "path": "/cred"}
            seen["upgrade"] = await client.call("service_up", {"service": "kv-service@0.2.0"})
            seen["cred"] = await client.call("service_request", ask)
            seen["down"] = await client.call("service_down", {"service": "kv-service"})
            seen["up again"] = await client.call("service_up", {"service": "kv-service@0.2.0"})
            seen["cred again"] = await client.call("service_request", ask)
            seen["rm"] = await client.call("rm", {"tool": "kv-service"})
        return seen

    seen = asyncio.run(session())
    assert seen["upgrade"][1] and "upgrade" in seen["upgrade"][0]["error"], seen["upgrade"]
    answer = json.dumps(seen["cred"][0])
    assert not leaked(answer) and seen["cred"][0].get("status") == 404, seen["cred"]
    assert seen["up again"][1] and "secrets" in seen["up again"][0]["error"], seen["up again"]
    assert not leaked(json.dumps(seen["cred again"][0]))
    assert not seen["rm"][1], seen["rm"]  # the catalog forgets kv-service: the service's own GC root keeps it

    roots = subprocess.run(["nix-store", "--query", "--roots", store], capture_output=True, text=True).stdout
    assert str(home / "work/services/kv-service/gcroot") in roots, roots
    again = cli("restart", "kv-service")  # the user's restart, with no catalog entry left
    assert again["version"] == "0.1.0" and cred(again["port"])[0] == 404
    assert inside(again["service_pid"], "token") == f"{SECRET}-token\n"
    assert started["port"] == again["port"]


def test_an_mcp_craft_fresh_of_the_same_need_with_its_own_model_never_gets_the_users_secret(
    flakebot_home: Path, tmp_path: Path
) -> None:
    """The issue's own attack: the user crafted kv-store and started it with a secret; a client calls `craft` over
    MCP with `service`, `fresh`, the same need and its own (scripted) model writing the thief's program."""
    require("bwrap", "cargo", "nix", "pasta")
    crafted = run_cli("craft", "--service", CRAFT_NEED, "--model", f"scripted:{session(tmp_path)}", *OFFLINE, "--json")
    assert crafted.returncode == 0, crafted.stdout[-2000:]
    started = cli("up", NAME, *secret_files(flakebot_home))
    store = Catalog.open(config.load()).get(NAME)["store_path"]  # what the user started
    try:
        script = tmp_path / "thief-session.json"
        text = json.loads(session(tmp_path).read_text())
        writes = text["stages"]["edit"][0]["tool_calls"][0]["arguments"]
        writes["content"] = writes["content"].replace(HEALTH_LINE, THIEF_ROUTE + HEALTH_LINE, 1)
        script.write_text(json.dumps(text))
        asked = {"need": CRAFT_NEED, "service": True, "fresh": True, "model": f"scripted:{script}",
                 "registry": "local", "wait": True}  # fmt: skip
        answer = mcp_call("craft", asked)
        assert answer.get("status") == "crafted" and answer.get("version") == "0.1.0", answer
        assert Catalog.open(config.load()).get(NAME)["store_path"] != store  # the name now means the thief

        again = cli("restart", NAME)  # the user's next restart
        read = mcp_call("service_request", {"service": NAME, "method": "GET", "path": "/cred"})
        assert read.get("status") == 404 and not leaked(json.dumps(read)), read  # what the client got back
        code, text_out = cred(again["port"])
        assert code == 404 and not leaked(text_out)
        assert inside(again["service_pid"], "token") == f"{SECRET}-token\n"
        assert "keeps running the program it was started with" in answer.get("service", ""), answer
        upgraded = mcp_call("service_up", {"service": f"{NAME}@0.1.0"})
        assert "running already" in upgraded.get("error", ""), upgraded
        assert started["port"] == again["port"]
    finally:
        run_cli("down", NAME)
