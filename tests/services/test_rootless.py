"""Without root: an unprivileged uid (nobody, through `setpriv`) runs `flakebot up` of a packaged `socket: handoff`
service from its own home and catalog, gets a healthy answer on its port, sees it in `services`, and `down` leaves
no process. Its interpreter is Debian's /usr/bin/python3 in a venv made here (pyenv's lives under /root, mode 700).
The uid runs in a mount namespace of its own where this checkout is bound at a path it can reach (a clone may lie
under /root too): the venv's one .pth file puts the bound checkout and its site-packages on the path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from flakebot.errors import PrivilegeError
from tests.conftest import REPO, json_result, require, run_cli
from tests.fakes.processes import alive, own_processes

KV_SERVICE = REPO / "tests" / "fixtures" / "kv-service"
NAME = "kv-socket"
UID = GID = 65534  # nobody: no home, no groups, nothing of root's readable
SYSTEM_PYTHON = Path("/usr/bin/python3")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def user_home() -> Iterator[Path]:
    """A home owned by the unprivileged uid, holding a catalog that root packaged kv-service into as `kv-socket`
    (`socket: handoff`), then handed over (chown), and a Debian-python venv the uid can run flakebot with."""
    require("nix", "cargo", "bwrap", "setpriv")
    if not SYSTEM_PYTHON.exists():
        pytest.fail(f"{SYSTEM_PYTHON} is not installed; run 'make setup'")
    home = Path(tempfile.mkdtemp(prefix="flakebot-rootless-"))  # in /tmp: pytest's own tmp dirs are root's, 700
    try:
        env = _dirs(home)
        done = run_cli(
            "package-service", str(KV_SERVICE), "--offline", "--stop-grace", "2", "--name", NAME, "--socket",
            "handoff", "--examples", str(KV_SERVICE / "examples.json"), "--json", env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", home / "python"], check=True)
        (
            home / "python" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        ).joinpath("checkout.pth").write_text(
            f"import sys, site; sys.path.insert(0, {str(home / 'checkout')!r}); site.addsitedir({str(home / 'site')!r})\n"
        )
        (home / "checkout").mkdir()
        (home / "site").mkdir()
        (home / "tun").touch(mode=0o600)
        subprocess.run(["chown", "-R", f"{UID}:{GID}", home], check=True)
        os.chown(home / "tun", 0, 0)
        yield home
    finally:
        if (home / "python").exists():  # a test that failed before its `down` leaves no service running
            as_user(home, "down", NAME)
        shutil.rmtree(home, ignore_errors=True)


def _dirs(home: Path) -> dict[str, str]:
    env = {f"XDG_{d.upper()}_HOME": str(home / d) for d in ("data", "cache", "state", "config")}
    return {**env, "FLAKEBOT_WORKDIR": str(home / "work"), "HOME": str(home)}


def as_user(home: Path, *args: str, timeout: float = 120, no_tun: bool = False) -> subprocess.CompletedProcess[str]:
    """`flakebot ARGS` run by the unprivileged uid with only its own environment (none of root's). `no_tun`: in a
    mount namespace of its own where /dev/net/tun is root's alone (mode 600, as on this machine; most distributions
    give it 666), so the refusal below is the same on every machine."""
    env = {**_dirs(home), "PATH": "/usr/local/bin:/usr/bin:/bin:/nix/var/nix/profiles/default/bin", "LANG": "C.UTF-8"}
    if os.environ.get("PATH"):  # nix and the toolchains where root's PATH finds them (unreadable ones are skipped)
        env["PATH"] += ":" + os.environ["PATH"]
    # the checkout and its site-packages bound where the uid can reach them (their own modes still apply: 755, 644)
    site = sysconfig.get_paths()["purelib"]
    bind = 'mount --bind "$0" "$1" && mount --bind "$2" "$3" && '
    bind += 'mount --bind "$4" /dev/net/tun && ' if no_tun else ""
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind + 'shift 4 && exec "$@"', str(REPO),
            str(home / "checkout"), site, str(home / "site"), str(home / "tun")]  # fmt: skip
    argv += ["setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups", "--"]
    argv += [str(home / "python" / "bin" / "python3"), "-m", "flakebot", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=home)


def test_an_unprivileged_user_runs_a_handoff_service_up_and_down(user_home: Path) -> None:
    with own_processes() as listing:
        done = as_user(user_home, "up", f"{NAME}@0.1.0", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        started: dict[str, Any] = json_result(done)
        port, supervisor_pid, service_pid = started["port"], started["supervisor_pid"], started["service_pid"]
        assert started["socket"] == "handoff"
        for pid in (supervisor_pid, service_pid):
            assert os.stat(f"/proc/{pid}").st_uid == UID  # run by the user, not root
        assert supervisor_pid in [pid for pid, _ in listing()]  # under this test's tree (a subreaper)
        with httpx.Client(trust_env=False, timeout=5) as http:
            assert http.get(f"http://127.0.0.1:{port}/health").status_code == 200
        shown = json_result(as_user(user_home, "services", "--json"))["services"]
        assert [(s["name"], s["state"]) for s in shown] == [(NAME, "running")], json.dumps(shown)
        stopped = as_user(user_home, "down", NAME)
        assert stopped.returncode == 0, stopped.stderr
        assert not alive(supervisor_pid) and not alive(service_pid)
        assert listing() == []


def test_a_port_forward_without_root_is_refused_before_anything_starts(user_home: Path) -> None:
    """`--network` needs pasta, which needs /dev/net/tun: as a user that cannot open it, pasta exited 1 at each of
    the supervisor's 5 restarts and `up` failed after them; now one line, exit 44, and nothing started."""
    with own_processes() as listing:
        done = as_user(user_home, "up", f"{NAME}@0.1.0", "--network", no_tun=True)
        assert done.returncode == PrivilegeError.exit_code, done.stdout + done.stderr
        assert done.stderr.count("error:") == 1 and "Fix: declare the service 'socket: handoff'" in done.stderr
        assert "Traceback" not in done.stderr
        assert listing() == []
        status = user_home / "work" / "services" / NAME / "status.json"
        assert not status.exists() or json.loads(status.read_text()).get("state") != "running"
