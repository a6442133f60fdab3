"""`craft --service` end to end, offline, through the real pipeline: hand-written sessions behind the stub server
(the real openai SDK), the template crate, real cargo in bubblewrap running the frozen lifecycle test, flakebot's own
lifecycle check, nix with the host stand-in, the catalog; then `up`, requests through the forward, `down`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from flakebot import api
from tests.conftest import json_result, require, run_cli
from tests.fakes.mcp_call import mcp_call
from tests.fakes.processes import Listing, own_processes
from tests.fakes.service_sessions import DAEMON_MARK, LINKS, NAME, links_session, session

OFFLINE = ["--registry", "local", "--offline"]
NEED = "need a key-value store over HTTP"
LINKS_NEED = "need short links over HTTP that redirect"
pytestmark = pytest.mark.slow


def craft(script: Path, *extra: str, need: str = NEED) -> tuple[int, dict]:
    done = run_cli("craft", "--service", need, "--model", f"scripted:{script}", *OFFLINE, *extra, "--json")
    last = json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip() else {}
    return done.returncode, last


@pytest.fixture
def strangers(tmp_path: Path) -> Iterator[list[int]]:
    """A `kv-store` and a `sleep 31337` that are not this test's (another test run's on a shared machine): started
    before `ours`, in a session of their own whose parent exits, so they belong to init, not to this test."""
    named = tmp_path / "stranger" / NAME
    named.parent.mkdir()
    shutil.copy("/bin/sleep", named)
    pids = []
    for argv in ([str(named), "600"], ["sleep", DAEMON_MARK]):
        started = subprocess.run(
            ["sh", "-c", 'setsid "$@" >/dev/null 2>&1 & echo $!', "sh", *argv], capture_output=True, text=True
        )
        pids.append(int(started.stdout))
    yield pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def ours() -> Iterator[Listing]:
    """This test's own processes (by process tree: another `kv-store` on the machine is not this test's)."""
    with own_processes() as listing:
        yield listing


def test_a_crafted_key_value_service_is_started_queried_and_stopped(
    tmp_path: Path, strangers: list[int], ours: Listing
) -> None:
    require("bwrap", "cargo", "nix", "pasta")
    code, crafted = craft(session(tmp_path))
    assert code == 0, crafted
    manifest = crafted["result"]["manifest"]
    assert manifest["kind"] == "service" and manifest["name"] == NAME
    start = {"mcp_tool": "service_up", "arguments": {"service": NAME}, "cli": f"flakebot up {NAME}"}
    assert crafted["result"]["kind"] == "service" and crafted["result"]["start"] == start  # not a tool to call
    assert manifest["service"]["health"] == {"kind": "http", "path": "/health"}
    assert manifest["service"]["stop_grace_s"] == 2
    assert manifest["service"]["socket"] == "handoff"  # the template takes the socket flakebot holds (fd 3)
    flake = (Path(manifest["catalog_dir"]) / "flake" / "flake.nix").read_text()
    assert "lib.flakebot.service" in flake and "nixosModules.default" in flake  # package-service's outputs too
    steps = [s["step"] for s in manifest["lifecycle"] if s["ok"]]
    assert steps[-1] == "second start: SIGTERM, clean exit" and "second start: GET /kv/greeting" in steps

    assert not running(ours, NAME), "a start of the service outlived the craft (cargo test's or flakebot's own)"
    exported = run_cli("export", NAME, "--nixos", "--out", str(tmp_path / "nixos"), timeout=300)
    assert exported.returncode == 0 and "systemd-analyze verify: passed" in exported.stdout, exported.stderr
    # the same need as a service, through each door (the option is declared once): the catalogued one
    offered = {"need": NEED, "service": True, "model": "scripted:/nonexistent.json", "registry": "local"}
    answer = mcp_call("craft", offered)
    assert answer.get("status") == "cached", answer
    assert answer["kind"] == "service" and answer["start"]["mcp_tool"] == "service_up" and "call" not in answer
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
    assert json_result(started)["socket"] == "handoff"
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=10) as http:
            assert http.put("/kv/colour", content=b"teal").text == "stored\n"
            assert http.get("/kv/colour").text == "teal"
    finally:
        stopped = run_cli("down", NAME, "--json")
    assert stopped.returncode == 0, stopped.stderr
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False, timeout=2)
    assert not running(ours, NAME)


def test_a_daemon_a_crafted_service_forks_outlives_neither_the_craft_nor_down(
    tmp_path: Path, strangers: list[int], ours: Listing
) -> None:
    """The attack on every host step that starts the model's service: cargo test's sandbox, flakebot's lifecycle
    checks in the loop and on the store path, and `up`/`down`."""
    require("bwrap", "cargo", "nix", "pasta")
    assert not daemons(ours), "a sleep with the test's mark runs already"
    assert not running(ours, NAME) and all(Path(f"/proc/{pid}").exists() for pid in strangers)
    code, crafted = craft(session(tmp_path, "forks-a-daemon"))
    assert code == 0, crafted  # otherwise a working service
    assert not daemons(ours), "the service's daemon outlived the craft"
    assert run_cli("up", NAME, timeout=120).returncode == 0
    assert daemons(ours), "the attack did not happen: no daemon beside the running service"
    assert run_cli("down", NAME).returncode == 0
    assert not daemons(ours), "the service's daemon outlived down"


def tool_session(tmp_path: Path) -> Path:
    """A spec stage that answers the same need as a command-line tool named like the service."""
    examples = [{"args": [arg], "stdout": "", "exit_code": 0} for arg in ("a", "b", "c")]
    answer = {"name": NAME, "summary": "a store", "usage": f"{NAME} KEY", "examples": examples}
    script = tmp_path / "as-a-tool.json"
    script.write_text(
        json.dumps({"format": 1, "stages": {"spec": [{"tool_calls": [{"name": "submit_spec", "arguments": answer}]}]}})
    )
    return script


def daemons(ours: Listing) -> list[int]:
    return [pid for pid, argv in ours() if argv[:2] == ["sleep", DAEMON_MARK]]


def running(ours: Listing, name: str) -> list[int]:
    """This test's processes whose program is named `name` (the crafted service, wherever it was built)."""
    return [pid for pid, argv in ours() if Path(argv[0]).name == name]


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


def test_a_crafted_service_whose_answers_carry_headers_is_catalogued_and_redirects(tmp_path: Path) -> None:
    """The links service, written into the template's `route` (a Response with headers): the frozen test and both
    lifecycle checks hold it to its Location and Content-Type, the manifest keeps them, and `up` redirects."""
    require("bwrap", "cargo", "nix", "pasta")
    code, crafted = craft(links_session(tmp_path), need=LINKS_NEED)
    assert code == 0, crafted
    manifest = crafted["result"]["manifest"]
    assert manifest["lifecycle_examples"]["after_restart"][0]["headers_out"] == {"location": "https://example.org/docs"}
    steps = [s["step"] for s in manifest["lifecycle"] if s["ok"]]
    assert "first start: GET /docs" in steps and "second start: GET /docs" in steps
    started = run_cli("up", LINKS, "--json", timeout=120)
    assert started.returncode == 0, started.stderr
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{json_result(started)['port']}", trust_env=False) as http:
            assert http.put("/links/home", content=b"https://example.org/").status_code == 201
            redirect = http.get("/home")
    finally:
        run_cli("down", LINKS)
    assert (redirect.status_code, redirect.headers["location"]) == (302, "https://example.org/")


@pytest.mark.parametrize(
    ("variant", "shown"),
    [
        ("no-location", "GET /docs: header Location: []"),  # the frozen test, in cargo test's sandbox
        (
            "location-only-for-the-test",
            "lifecycle check run by flakebot on the built binary: first start: GET /docs: header Location: none",
        ),
    ],
)
def test_a_crafted_service_whose_redirect_has_no_location_stays_red_and_is_not_catalogued(
    tmp_path: Path, workdir: Path, variant: str, shown: str
) -> None:
    """Before headers both were crafted green and catalogued: an example said only status and body."""
    require("bwrap", "cargo", "pasta")
    code, failed = craft(links_session(tmp_path, variant), "--max-iterations", "2", need=LINKS_NEED)
    assert code == 41, failed
    transcript = (workdir / "runs" / failed["run_id"] / "transcript.jsonl").read_text()
    assert shown in transcript, f"{variant}: the model was not told {shown!r}"
    assert LINKS not in run_cli("list", "--json").stdout
