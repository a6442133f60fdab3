"""Health-gated upgrade and rollback through the real commands: kv-service 0.1.0, a 0.2.0 that answers its health
check as "ok 0.2.0", and a 0.3.0 whose data format changed (tests/fixtures/kv-service's CHECK_FORMAT): it passes its
own lifecycle check on an empty state, so it is catalogued, but fails health on the state 0.1.0 wrote."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from benchmarks.reliability.services import set_version
from tests.conftest import json_result, require, run_cli
from tests.mcp.test_server import mcp_client
from tests.services.test_supervisor import KV_SERVICE, client, pasta_pids, status
from tests.services.test_supervisor import env as env  # noqa: F401 - the per-test fixture, on this module's catalog

pytestmark = pytest.mark.slow
UPGRADED_HEALTH = '("GET", "/health") => reply(&mut stream, 200, "ok 0.2.0\\n")'


def version_of(tmp: Path, version: str, *, edits: dict[str, str]) -> Path:
    """A copy of kv-service as crate `version`, its source edited (each edit must apply)."""
    crate = tmp / f"kv-{version}"
    shutil.copytree(KV_SERVICE, crate, ignore=shutil.ignore_patterns("target"))
    set_version(crate, version)
    source = crate / "src" / "main.rs"
    text = source.read_text()
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    source.write_text(text)
    return crate


@pytest.fixture(scope="module")
def catalog_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """kv-service 0.1.0, 0.2.0 and the 0.3.0 that cannot read 0.1.0's data, packaged once (each checked)."""
    require("nix", "cargo", "bwrap", "pasta")
    home = tmp_path_factory.mktemp("upgradehome")
    env = {f"XDG_{d.upper()}_HOME": str(home / d) for d in ("data", "cache", "state", "config")}
    env["FLAKEBOT_WORKDIR"] = str(home / "work")
    crates = {
        "0.1.0": KV_SERVICE,
        "0.2.0": version_of(home, "0.2.0", edits={'("GET", "/health") => reply(&mut stream, 200, "ok\\n")':
                                                  UPGRADED_HEALTH}),
        "0.3.0": version_of(home, "0.3.0", edits={"const CHECK_FORMAT: bool = false;": "const CHECK_FORMAT: bool = true;"}),
    }  # fmt: skip
    for version, crate in crates.items():
        done = run_cli(
            "package-service", str(crate), "--offline", "--stop-grace", "2", "--start-timeout", "4", "--name",
            "kv-service", "--examples", str(KV_SERVICE / "examples.json"), "--json", env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json_result(done)["version"] == version
    return env


def up(env: dict[str, str], ref: str, *args: str) -> dict[str, Any]:
    done = run_cli("up", ref, *args, "--json", env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return dict(json_result(done))


def test_a_failing_upgrade_never_replaces_the_running_version_and_rollback_keeps_state(env: dict[str, str]) -> None:  # noqa: F811
    first = up(env, "kv-service@0.1.0", "--network")  # outbound network: kept by the upgrade and the rollbacks
    url = f"http://127.0.0.1:{first['port']}"
    with client() as http:
        assert http.put(f"{url}/kv/kept", content=b"written by 0.1.0").status_code == 200

        refused = run_cli("up", "kv-service@0.3.0", "--json", env=env, timeout=120)
        assert refused.returncode == 43, refused.stderr  # UpgradeRefused: distinct from a start that failed (40)
        error = json.loads(refused.stdout.splitlines()[-1])
        assert "0.1.0 keeps serving" in error["error"] and "first start: healthy" in error["error"]
        assert "503" in error["error"] and "kv-service: listening" in error["fix"]  # the check's log tail
        still = status(env)  # the same process, untouched: never stopped for the check
        assert still["version"] == "0.1.0" and still["service_pid"] == first["service_pid"]
        assert still["restarts"] == 0 and still["health"] == "healthy"
        assert http.get(f"{url}/kv/kept").content == b"written by 0.1.0"
        assert http.get(f"{url}/kv/greeting").status_code == 404  # the check's examples wrote a copy, not this

        upgraded = up(env, "kv-service@0.2.0")
        assert upgraded["version"] == "0.2.0" and upgraded["previous_version"] == "0.1.0"
        assert upgraded["port"] == first["port"] and upgraded["service_pid"] != first["service_pid"]
        assert first["network"] is True and upgraded["network"] is True
        assert http.get(f"{url}/health").content == b"ok 0.2.0\n"
        assert http.get(f"{url}/kv/kept").content == b"written by 0.1.0"  # the live state, carried over
        assert http.put(f"{url}/kv/later", content=b"written by 0.2.0").status_code == 200
        assert len(pasta_pids(first["port"])) == 1  # one forward: the check's ran on a scratch port and is gone
        table = run_cli("services", env=env)
        assert "0.2.0" in table.stdout and "0.1.0" in table.stdout

        back = run_cli("rollback", "kv-service", "--json", env=env, timeout=120)
        assert back.returncode == 0, back.stderr
        rolled = json_result(back)
        assert (
            rolled["version"] == "0.1.0" and rolled["previous_version"] == "0.2.0" and rolled["port"] == first["port"]
        )
        assert rolled["network"] is True
        assert http.get(f"{url}/health").content == b"ok\n"
        assert http.get(f"{url}/kv/later").content == b"written by 0.2.0"  # state kept going back

    assert run_cli("down", "kv-service", env=env).returncode == 0
    # stopped, rollback starts the version before (0.2.0 again), on its port
    again = run_cli("rollback", "kv-service", "--json", env=env, timeout=120)
    assert again.returncode == 0, again.stderr
    assert json_result(again)["version"] == "0.2.0" and json_result(again)["network"] is True
    assert run_cli("down", "kv-service", env=env).returncode == 0


def test_rollback_without_a_previous_version_is_refused(env: dict[str, str]) -> None:  # noqa: F811
    assert run_cli("rollback", "kv-service", env=env).returncode == 2  # never started here
    assert up(env, "kv-service@0.1.0")["network"] is False  # never on unless asked
    done = run_cli("rollback", "kv-service", env=env)
    assert done.returncode == 2 and "no previous version" in done.stderr
    same = run_cli("up", "kv-service@0.1.0", env=env)
    assert same.returncode == 2 and "running already" in same.stderr
    assert run_cli("down", "kv-service", env=env).returncode == 0


def test_an_agent_rolls_a_service_back_over_mcp_but_never_one_holding_the_users_secrets(
    env: dict[str, str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    for key, value in env.items():  # the MCP server sees this module's catalog and the test's services
        monkeypatch.setenv(key, value)
    first = up(env, "kv-service@0.1.0")
    up(env, "kv-service@0.2.0")

    async def session(calls: list[tuple[str, dict[str, Any]]]) -> tuple[dict[str, Any], list[Any]]:
        async with mcp_client() as client:
            tools = {t.name: t for t in (await client.session.list_tools()).tools}
            return tools, [await client.call(name, arguments) for name, arguments in calls]

    tools, [(back, error), (unknown, unknown_error)] = asyncio.run(
        session([("service_rollback", {"service": "kv-service"}), ("service_rollback", {"service": "nope"})])
    )
    hints = tools["service_rollback"].annotations
    assert hints.destructive_hint is True and hints.idempotent_hint is False and hints.read_only_hint is False
    assert "secrets" in (tools["service_rollback"].description or "")
    assert not error and back["version"] == "0.1.0" and back["previous_version"] == "0.2.0", back
    assert back["port"] == first["port"] and "service_pid" not in back  # an agent's status: no pids
    with client() as http:
        assert http.get(f"http://127.0.0.1:{first['port']}/health").content == b"ok\n"
    assert unknown_error and "no service nope was started here" in unknown["error"]
    assert run_cli("down", "kv-service", env=env).returncode == 0

    # started by the user with a secret: an agent's rollback would hand it to another program
    secret = tmp_path / "token"
    secret.write_text("s3cret")
    up(env, "kv-service@0.1.0", "--secret", f"token={secret}")
    upgraded = up(env, "kv-service@0.2.0")
    _, [(refused, refused_error)] = asyncio.run(session([("service_rollback", {"service": "kv-service"})]))
    assert refused_error and "an agent cannot switch its program" in refused["error"], refused
    assert "flakebot rollback kv-service" in refused["fix"]
    still = status(env)
    assert still["version"] == "0.2.0" and still["service_pid"] == upgraded["service_pid"]
    mine = run_cli("rollback", "kv-service", "--json", env=env, timeout=120)  # the user's own rollback
    assert mine.returncode == 0 and json_result(mine)["version"] == "0.1.0", mine.stderr
    assert run_cli("down", "kv-service", env=env).returncode == 0
