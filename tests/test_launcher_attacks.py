"""Issue 41, class 1: flakebot's own processes cannot be steered by the directory they start in or by PYTHON*
variables. A directory holding a planted `flakebot/` package (and sitecustomize.py, usercustomize.py), with
PYTHONPATH and PYTHONSTARTUP naming it, starts the real `flakebot up` and `flakebot mcp` (a long tool's job,
service_up); judged from outside: each planted module appends its process's command line to a marker file, and
only the command the test started (the user's own choice of PYTHONPATH) may appear there, never a child's."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from tests.mcp.test_server import Client
from tests.services.test_supervisor import catalog_env, pasta_pids, port_free  # noqa: F401 - catalog_env: a fixture

pytestmark = pytest.mark.slow
CONSOLE_SCRIPT = Path(sys.executable).with_name("flakebot")  # as a user starts it: sys.path[0] is bin/, not the cwd
PLANTED = ("flakebot/__init__.py", "flakebot/__main__.py", "flakebot/mcp/server.py", "flakebot/services/__init__.py",
           "flakebot/services/supervisor.py", "sitecustomize.py", "usercustomize.py")  # fmt: skip
SPY = """import os
with open({marker!r}, "a") as out:
    out.write({name!r} + " " + open("/proc/self/cmdline", "rb").read().replace(b"\\0", b" ").decode() + "\\n")
"""


def plant(directory: Path, marker: Path, only: tuple[str, ...] = PLANTED) -> Path:
    for name in only:
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(SPY.format(marker=str(marker), name=name))
    return directory


def steered(marker: Path, started: str | tuple[str, ...]) -> list[str]:
    """The marker's lines written by any process but those the test started (their command lines end `started`)."""
    lines = marker.read_text().splitlines() if marker.exists() else []
    return [line for line in lines if not line.rstrip().endswith(started)]


@pytest.fixture
def attack(tmp_path: Path, catalog_env: dict[str, str]) -> tuple[Path, Path, dict[str, str]]:  # noqa: F811
    """(the planted working directory, the marker, the environment naming a second planted directory)."""
    if not CONSOLE_SCRIPT.exists():
        pytest.skip(f"no console script at {CONSOLE_SCRIPT} (make setup installs it)")
    marker = tmp_path / "marker"
    cwd = plant(tmp_path / "cwd", marker)
    on_path = plant(tmp_path / "path", marker, only=("sitecustomize.py", "usercustomize.py"))
    env = {**os.environ, **catalog_env, "FLAKEBOT_WORKDIR": str(tmp_path / "work")}
    env |= {"PYTHONPATH": str(on_path), "PYTHONSTARTUP": str(on_path / "sitecustomize.py"), "PYTHONUSERBASE": str(cwd)}
    return cwd, marker, env


def cli(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CONSOLE_SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180, check=False
    )


def test_flakebot_up_from_a_planted_directory_runs_only_flakebot(attack: tuple[Path, Path, dict[str, str]]) -> None:
    cwd, marker, env = attack
    done = cli(cwd, env, "up", "kv-service", "--json")
    try:
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout.splitlines()[-1])["result"]
        assert result["state"] == "running" and result["health"] == "healthy", result
        restarted = cli(cwd, env, "restart", "kv-service", "--json")
        assert restarted.returncode == 0, restarted.stderr
    finally:
        stopped = cli(cwd, env, "down", "kv-service", "--json")
    assert stopped.returncode == 0, stopped.stderr
    assert port_free(result["port"]) and not pasta_pids(result["port"])
    assert steered(marker, ("up kv-service --json", "restart kv-service --json", "down kv-service --json")) == []


def test_flakebot_mcp_in_a_planted_directory_starts_jobs_and_supervisors_that_run_only_flakebot(
    attack: tuple[Path, Path, dict[str, str]],
) -> None:
    cwd, marker, env = attack

    async def session() -> dict[str, Any]:
        params = StdioServerParameters(command=str(CONSOLE_SCRIPT), args=["mcp"], env=env, cwd=str(cwd))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as raw:
            await raw.initialize()
            client = Client(raw, [])
            seen = {"job": await client.call("resume", {"run_id": "nope"})}  # no progress token: a detached job
            seen["up"] = await client.call("service_up", {"service": "kv-service"})
            seen["down"] = await client.call("service_down", {"service": "kv-service"})
            return seen

    seen = asyncio.run(session())
    job, error = seen["job"]
    assert error and job["exit_code"] == 4, job  # the job ran (flakebot's own code) and found no such run
    up, error = seen["up"]
    assert not error and up["state"] == "running" and up["health"] == "healthy", up
    assert seen["down"][0]["state"] == "stopped"
    assert steered(marker, "bin/flakebot mcp") == [], marker.read_text()
