"""`craft --service` end to end, offline, through the real pipeline: hand-written sessions behind the stub server
(the real openai SDK), the template crate, real cargo in bubblewrap running the frozen lifecycle test, flakebot's own
lifecycle check, nix with the host stand-in, the catalog; then `up`, requests through the forward, `down`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from flakebot import api
from tests.conftest import json_result, require, run_cli
from tests.fakes.mcp_call import mcp_call
from tests.fakes.service_sessions import DAEMON_MARK, NAME, session

OFFLINE = ["--registry", "local", "--offline"]
NEED = "need a key-value store over HTTP"
pytestmark = pytest.mark.slow


def craft(script: Path, *extra: str) -> tuple[int, dict]:
    done = run_cli("craft", "--service", NEED, "--model", f"scripted:{script}", *OFFLINE, *extra, "--json")
    last = json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip() else {}
    return done.returncode, last


def test_a_crafted_key_value_service_is_started_queried_and_stopped(tmp_path: Path) -> None:
    require("bwrap", "cargo", "nix", "pasta")
    code, crafted = craft(session(tmp_path))
    assert code == 0, crafted
    manifest = crafted["result"]["manifest"]
    assert manifest["kind"] == "service" and manifest["name"] == NAME
    assert manifest["service"]["health"] == {"kind": "http", "path": "/health"}
    assert manifest["service"]["stop_grace_s"] == 2
    flake = (Path(manifest["catalog_dir"]) / "flake" / "flake.nix").read_text()
    assert "lib.flakebot.service" in flake and "nixosModules.default" in flake  # package-service's outputs too
    steps = [s["step"] for s in manifest["lifecycle"] if s["ok"]]
    assert steps[-1] == "second start: SIGTERM, clean exit" and "second start: GET /kv/greeting" in steps

    assert not running(NAME), "a start of the service outlived the craft (cargo test's or flakebot's own)"
    exported = run_cli("export", NAME, "--nixos", "--out", str(tmp_path / "nixos"), timeout=300)
    assert exported.returncode == 0 and "systemd-analyze verify: passed" in exported.stdout, exported.stderr
    # the same need as a service, through each door (the option is declared once): the catalogued one
    offered = {"need": NEED, "service": True, "model": "scripted:/nonexistent.json", "registry": "local"}
    answer = mcp_call("craft", offered)
    assert answer.get("status") == "cached", answer
    assert api.craft(NEED, service=True, model="scripted:/nonexistent.json", offline=True).status == "cached"
    as_tool = run_cli("craft", NEED, "--model", "scripted:/nonexistent.json", *OFFLINE, "--json")
    assert as_tool.returncode != 0 and "nonexistent" in as_tool.stdout  # a service never answers a tool's need
    script = f"scripted:{tool_session(tmp_path)}"
    as_tool = json_result(run_cli("craft", NEED, "--model", script, *OFFLINE, "--stop-after", "spec", "--json"))
    assert as_tool["name"] == f"{NAME}-2"  # the same need as a tool: never the service's next version
    improved = run_cli("improve", NAME, "also answer DELETE", "--json")
    assert improved.returncode == 2 and "is a service" in improved.stdout

    started = run_cli("up", NAME, "--json", timeout=120)
    assert started.returncode == 0, started.stderr
    port = json_result(started)["port"]
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=10) as http:
            assert http.put("/kv/colour", content=b"teal").text == "stored\n"
            assert http.get("/kv/colour").text == "teal"
    finally:
        stopped = run_cli("down", NAME, "--json")
    assert stopped.returncode == 0, stopped.stderr
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False, timeout=2)
    assert not running(NAME)


def test_a_daemon_a_crafted_service_forks_outlives_neither_the_craft_nor_down(tmp_path: Path) -> None:
    """The attack on every host step that starts the model's service: cargo test's sandbox, flakebot's lifecycle
    checks in the loop and on the store path, and `up`/`down`."""
    require("bwrap", "cargo", "nix", "pasta")
    assert not daemons(), "a sleep with the test's mark runs already"
    code, crafted = craft(session(tmp_path, "forks-a-daemon"))
    assert code == 0, crafted  # otherwise a working service
    assert not daemons(), "the service's daemon outlived the craft"
    assert run_cli("up", NAME, timeout=120).returncode == 0
    assert daemons(), "the attack did not happen: no daemon beside the running service"
    assert run_cli("down", NAME).returncode == 0
    assert not daemons(), "the service's daemon outlived down"


def tool_session(tmp_path: Path) -> Path:
    """A spec stage that answers the same need as a command-line tool named like the service."""
    examples = [{"args": [arg], "stdout": "", "exit_code": 0} for arg in ("a", "b", "c")]
    answer = {"name": NAME, "summary": "a store", "usage": f"{NAME} KEY", "examples": examples}
    script = tmp_path / "as-a-tool.json"
    script.write_text(
        json.dumps({"format": 1, "stages": {"spec": [{"tool_calls": [{"name": "submit_spec", "arguments": answer}]}]}})
    )
    return script


def daemons() -> list[int]:
    return [pid for pid, argv in processes() if argv[:2] == ["sleep", DAEMON_MARK]]


def processes() -> list[tuple[int, list[str]]]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        found.append((int(pid), argv))
    return found


def running(name: str) -> list[int]:
    """Host processes whose program is named `name` (the crafted service, wherever it was built)."""
    return [pid for pid, argv in processes() if Path(argv[0]).name == name]


@pytest.mark.parametrize(
    ("variant", "shown"),
    [
        ("no-health", "GET /health answered 404"),
        ("ignores-sigterm", "did not exit within 2 s of SIGTERM"),
        ("loses-state", "GET /kv/greeting: status"),
        ("games-the-test", "lifecycle check run by flakebot on the built binary"),
    ],
)
def test_a_service_that_breaks_its_lifecycle_stays_red_and_is_not_catalogued(
    tmp_path: Path, workdir: Path, variant: str, shown: str
) -> None:
    require("bwrap", "cargo", "pasta")
    code, failed = craft(session(tmp_path, variant), "--max-iterations", "2")
    assert code == 41, failed  # EditError: the loop ended without green tests
    transcript = (workdir / "runs" / failed["run_id"] / "transcript.jsonl").read_text()
    assert shown in transcript, f"{variant}: the model was not told {shown!r}"
    listed = run_cli("list", "--json")
    assert NAME not in listed.stdout, listed.stdout
