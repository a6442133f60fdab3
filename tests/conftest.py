"""Shared fixtures: every test gets its own flakebot home, catalog, cache and work directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.registry import registry_for_tests

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures"
# The tests' own registry: exactly the crates setup installs for them, whatever else the machine has.
DEBIAN_REGISTRY = registry_for_tests()
FLAKEBOT = [sys.executable, "-m", "flakebot"]


@pytest.fixture(autouse=True)
def flakebot_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point config, data (catalog), cache and work directories at a fresh tmp dir."""
    home = tmp_path_factory.mktemp("home")
    for var, sub in (
        ("XDG_CONFIG_HOME", "config"),
        ("XDG_DATA_HOME", "data"),
        ("XDG_CACHE_HOME", "cache"),
        ("XDG_STATE_HOME", "state"),
    ):
        (home / sub).mkdir()
        monkeypatch.setenv(var, str(home / sub))
    for name in list(os.environ):
        if name.startswith("FLAKEBOT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("FLAKEBOT_WORKDIR", str(home / "work"))
    monkeypatch.setenv("FLAKEBOT_LOCAL_REGISTRY", str(DEBIAN_REGISTRY))
    for key in ("GROQ_API_KEY", "OPENAI_API_KEY", "GITHUB_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(home)
    return home


@pytest.fixture
def workdir(flakebot_home: Path) -> Path:
    return flakebot_home / "work"


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600, check: bool = False, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real `flakebot` CLI in a subprocess."""
    result = subprocess.run(
        [*FLAKEBOT, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        input=input,
        cwd=os.getcwd(),
    )
    if check and result.returncode != 0:
        raise AssertionError(f"flakebot {' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def json_result(completed: subprocess.CompletedProcess[str]) -> Any:
    """The result object a `--json` command printed last on stdout (fails on an error object)."""
    last = json.loads(completed.stdout.splitlines()[-1])
    assert "result" in last, f"no result object: {last}\n{completed.stderr}"
    return last["result"]


def wait_for(probe: Any, timeout: float = 60.0, interval: float = 0.05) -> Any:
    """Poll `probe` until it returns something truthy (returned), or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {getattr(probe, '__name__', 'a condition')}")


def require(*programs: str) -> None:
    """Fail (not skip) when a program the suite needs is missing: `make setup` installs it."""
    for program in programs:
        if shutil.which(program) is None:
            pytest.fail(f"{program} is not installed; run 'make setup'")


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Any:
    """A directory on a read-only bind mount of itself (root can write anywhere else)."""
    where = tmp_path / "ro"
    where.mkdir()
    subprocess.run(["mount", "--bind", str(where), str(where)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(where)], check=True)
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)
