"""Attacks on a service's resource envelope (issue 41, class 4), each through the real supervisor and bubblewrap and
judged from outside: what status.json says, what the state directory holds on disk, whether the supervisor lives.

The service is the attacker's own program: a small Python script started as the service's binary (python3 from the
host's /usr, which every sandbox sees read-only) that answers /health on $PORT and then does one hostile thing. Its
supervisor is started as `up` starts it (supervised.start_supervised: launch.json, the detached supervisor, wait until
settled) and stopped with the real `flakebot down`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flakebot.services import envelope, forward
from flakebot.services.declaration import ServiceSpec
from flakebot.services.layout import ServiceDir
from tests.conftest import require, run_cli, wait_for
from tests.fakes.processes import cmdline, remove_cgroup

MIB = 1024 * 1024

SERVE = """#!/usr/bin/python3
import http.server, os, pathlib, threading, time
state = pathlib.Path(os.environ["STATE_DIRECTORY"])

def fill(after, mib, every):
    time.sleep(after)
    for i in range(mib):
        (state / f"fill{i}").write_bytes(os.urandom(1 << 20))
        time.sleep(every)

ATTACK

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Health).serve_forever()
"""


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Path]:
    """A work directory for one attack; whatever its supervisor leaves (a process, a cgroup) is removed after."""
    require("bwrap", "pasta")
    yield tmp_path
    for record in tmp_path.glob("services/*/status.json"):
        recorded = json.loads(record.read_text())
        pid = recorded.get("supervisor_pid")
        if isinstance(pid, int) and "flakebot.services.supervisor" in cmdline(pid):
            os.kill(pid, signal.SIGKILL)
        for path in (recorded.get("cgroup") or {}).get("paths", []):
            remove_cgroup(Path(path))
    # GNU rm, not shutil.rmtree: the deep tree one attack leaves is beyond Python's recursion limit (pytest's own
    # clean-up of old temp dirs included)
    subprocess.run(["rm", "-rf", str(tmp_path / "services")], check=True)


def start(work: Path, attack: str, *, disk_mb: int) -> tuple[ServiceDir, dict[str, Any]]:
    """The attacking service started under its supervisor, as `up` starts one; (its directory, its settled status)."""
    program = work / "bin" / "attacker"
    program.parent.mkdir(parents=True)
    program.write_text(SERVE.replace("ATTACK", attack))
    program.chmod(0o755)
    where = ServiceDir(work / "services" / "attacker")
    launch = {
        "name": "attacker", "version": "1", "previous_version": "", "binary": str(program),
        "spec": ServiceSpec(stop_grace_s=2, start_s=20).to_dict(), "host_port": forward.free_port(),
        "sandbox": "required", "limits": {"memory_mb": 256, "file_mb": disk_mb, "disk_mb": disk_mb},
        "secrets": {}, "network": False,
    }  # fmt: skip
    where.root.mkdir(parents=True)
    (where.root / "wanted.json").write_text(json.dumps(launch))
    starting = subprocess.run([sys.executable, "-c", STARTER, str(where.root)], capture_output=True, text=True,
                              timeout=120, cwd=str(Path(__file__).resolve().parents[2]))  # fmt: skip
    assert starting.returncode == 0, starting.stderr
    return where, json.loads(starting.stdout)


STARTER = """
import json, sys
from pathlib import Path
from flakebot.services.supervised import start_supervised
from flakebot.services.layout import ServiceDir
where = ServiceDir(Path(sys.argv[1]))
with where.control_lock():
    print(json.dumps(start_supervised(where, json.loads((where.root / "wanted.json").read_text()))))
"""


def down(work: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("down", "attacker", "--json", env={"FLAKEBOT_WORKDIR": str(work)}, timeout=60)


def allocated(path: Path) -> int:
    return int(
        subprocess.run(["du", "-s", "-B1", str(path)], capture_output=True, text=True, check=True).stdout.split()[0]
    )


FLOOD = """
def flood():
    time.sleep(1.5)
    os.execv("/usr/bin/yes", ["yes"])  # a child process printing 'y' lines as fast as it can

if os.fork() == 0:
    flood()
threading.Thread(target=fill, args=(2.5, 200, 0.02), daemon=True).start()
"""


@pytest.mark.slow
def test_a_service_flooding_its_output_is_still_measured_and_stopped_at_its_quota(services: Path) -> None:
    # the supervisor reads the service's output in the same loop that measures the state: an endless stream of short
    # lines must not keep it reading forever (it did: 201 MiB written under 16 MiB, health never checked again)
    where, settled = start(services, FLOOD, disk_mb=16)
    assert settled["state"] == "running", settled
    failed = wait_for(lambda: (s := where.status())["state"] == "failed" and s, timeout=25)
    assert "disk quota" in failed["message"], failed
    assert allocated(where.state) < 64 * MIB, f"{allocated(where.state) / MIB:.0f} MiB written under 16 MiB"
    assert where.log.stat().st_size <= 1024 * 1024  # its log rotated, still
    assert down(services).returncode == 0


DEEP = """
def deep():
    time.sleep(1.5)  # once it is up
    os.chdir(state)
    for _ in range(1500):
        os.mkdir("d")
        os.chdir("d")

threading.Thread(target=deep, daemon=True).start()
threading.Thread(target=fill, args=(2.0, 40, 0.05), daemon=True).start()
"""


@pytest.mark.slow
def test_a_deep_state_tree_is_measured_and_held_to_the_quota_not_a_supervisor_crash(services: Path) -> None:
    # a walk recursing once per level ended the supervisor (RecursionError) at 1000 levels: `lost`, never `failed`
    where, settled = start(services, DEEP, disk_mb=16)
    assert settled["state"] == "running", settled
    failed = wait_for(lambda: (s := where.status())["state"] in ("failed", "lost") and s, timeout=25)
    assert failed["state"] == "failed" and "disk quota" in failed["message"], failed
    assert "RecursionError" not in where.supervisor_log.read_text()
    assert down(services).returncode == 0


EMPTY_FILES = """
def many():
    (state / "many").mkdir(exist_ok=True)
    for i in range(200_000):  # more than any machine makes between two measures, their names under 16 MiB
        (state / "many" / str(i)).touch()

threading.Thread(target=many, daemon=True).start()
"""


@pytest.mark.slow
def test_empty_files_are_charged_against_the_quota_not_free(services: Path) -> None:
    # each file takes an inode whatever its size: 20,000 empty files measured 0.5 MiB (their directory's blocks), so a
    # 16 MiB quota let a service take the file system's inodes by the million
    where, settled = start(services, EMPTY_FILES, disk_mb=16)
    assert settled["state"] == "running", settled
    failed = wait_for(lambda: (s := where.status())["state"] == "failed" and s, timeout=30)
    assert "disk quota" in failed["message"], failed
    assert sum(1 for _ in (where.state / "many").iterdir()) < 200_000  # stopped by the quota, not by finishing
    assert down(services).returncode == 0


def test_a_state_changing_under_the_measure_is_still_measured(tmp_path: Path) -> None:
    # entries made and removed as the walk lists them made every measure fail, and a failed measure counted as under
    # the quota: a service that kept renaming files was never measured at all
    state = tmp_path / "state"
    (state / "data").mkdir(parents=True)
    (state / "data" / "held").write_bytes(os.urandom(2 * MIB))
    stop = threading.Event()

    def churn(k: int) -> None:
        while not stop.is_set():
            for n in range(50):
                path = state / f"c{k}-{n}"
                try:
                    path.mkdir()
                    (path / "f").write_bytes(b"x")
                    (path / "f").unlink()
                    path.rmdir()
                except OSError:
                    pass

    churners = [threading.Thread(target=churn, args=(k,)) for k in range(2)]
    for churner in churners:
        churner.start()
    try:
        measured = [envelope.state_bytes(state) for _ in range(200)]
        said = [envelope.over_quota(state, 1) for _ in range(50)]
    finally:
        stop.set()
        for churner in churners:
            churner.join()
    assert min(measured) >= 2 * MIB
    assert all("disk quota" in s for s in said), [s for s in said if not s][:1]


def test_the_measure_of_many_entries_is_bounded_by_the_quota(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "many").mkdir(parents=True)
    for n in range(30000):
        (state / "many" / str(n)).touch()
    began = time.monotonic()
    said = envelope.over_quota(state, 16)
    assert "disk quota" in said
    assert time.monotonic() - began < 1.0


def test_names_of_one_file_are_charged_each(tmp_path: Path) -> None:
    # hard links take no inode and no data, but a million names were free (only the first name was counted): each
    # name is an entry to walk, so each costs one
    state = tmp_path / "state"
    (state / "links").mkdir(parents=True)
    (state / "links" / "one").write_bytes(os.urandom(MIB))
    for n in range(5000):
        os.link(state / "links" / "one", state / "links" / f"also-{n}")
    assert envelope.state_bytes(state) >= MIB + 5000 * envelope.INODE_BYTES
    assert "disk quota" in envelope.over_quota(state, 16)


def test_a_recorded_pid_is_signalled_only_while_it_is_the_process_recorded() -> None:
    from flakebot import processid

    child = subprocess.Popen(["sleep", "60"])
    try:
        began = processid.start_time(child.pid)
        assert isinstance(began, int)
        assert not processid.signal_if(child.pid, began + 1, signal.SIGTERM)  # another start time: someone else
        assert not processid.signal_if(child.pid, None, signal.SIGTERM)  # no start time: never
        assert child.poll() is None
        assert processid.signal_if(child.pid, began, signal.SIGTERM)  # through a pidfd held across the check
        assert child.wait(timeout=5) == -signal.SIGTERM
        assert not processid.signal_if(child.pid, began, signal.SIGTERM)  # ended and reaped: its number is nobody's
    finally:
        child.kill()
        child.wait()


DRIP = """
class Health(http.server.BaseHTTPRequestHandler):
    answered = 0

    def do_GET(self):
        Health.answered += 1
        if Health.answered <= 2:  # healthy at first, as `up` wants it
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")
            return
        for _ in range(1000):  # then a first line that never ends, one byte at a time within each read's timeout
            self.wfile.write(b"H")
            self.wfile.flush()
            time.sleep(0.5)

    def log_message(self, *args):
        pass

threading.Thread(target=fill, args=(3.0, 200, 0.05), daemon=True).start()
http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Health).serve_forever()
raise SystemExit
"""


@pytest.mark.slow
def test_a_health_answer_dripped_a_byte_at_a_time_does_not_hold_the_supervisor(services: Path) -> None:
    # the check's timeout bounded each read, not the check: 1,000 bytes half a second apart held the supervisor's
    # loop for minutes, the state unmeasured while the service wrote
    where, settled = start(services, DRIP, disk_mb=16)
    assert settled["state"] == "running", settled
    failed = wait_for(lambda: (s := where.status())["state"] == "failed" and s, timeout=25)
    assert "disk quota" in failed["message"], failed
    assert allocated(where.state) < 64 * MIB, f"{allocated(where.state) / MIB:.0f} MiB written under 16 MiB"
    assert down(services).returncode == 0


@pytest.mark.slow
def test_the_cgroup_is_recorded_before_anything_joins_it(services: Path) -> None:
    # a supervisor killed between starting bubblewrap and recording its cgroup (seen: killed 0.15 s into a start, a
    # bubblewrap outlived it in the group) left processes in a group no status named, so `down` never emptied it
    where = ServiceDir(services / "services" / "attacker")
    seen: list[dict[str, Any]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set() and not seen:
            for procs in Path("/sys/fs/cgroup").glob("**/flakebot-attacker-*/cgroup.procs"):
                if procs.read_text().split():
                    seen.append(where.status())
                    return
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        _, settled = start(services, "", disk_mb=16)
    finally:
        stop.set()
        watcher.join()
    assert settled["state"] == "running", settled
    if settled.get("cgroup") is None:
        pytest.skip("no writable cgroup on this host")
    assert seen and seen[0].get("cgroup") == settled["cgroup"], seen
    assert down(services).returncode == 0


PROBE = """
import subprocess
def probe():
    said = {}
    said["sys"] = os.path.exists("/sys/fs/cgroup")
    said["own_dir"] = sorted(os.listdir(state.parent))
    try:
        os.link("/etc/passwd", state / "passwd")
        said["hard_link"] = "made"
    except OSError as exc:
        said["hard_link"] = exc.strerror
    try:
        said["shadow"] = len(open("/etc/shadow", "rb").read())
    except OSError as exc:
        said["shadow"] = exc.strerror
    said["uid"] = os.getuid()
    forks = []
    try:
        for _ in range(2000):
            pid = os.fork()
            if pid == 0:
                os.execv("/bin/sleep", ["sleep", "30"])  # small: the memory limit is not what stops them
            forks.append(pid)
    except OSError as exc:
        said["fork_stopped"] = exc.strerror
    said["forks"] = len(forks)
    for pid in forks:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    (state / "probe.json").write_text(json.dumps(said))

import json
probe()
"""


@pytest.mark.slow
def test_from_inside_the_service_reaches_no_cgroup_no_status_no_host_file_and_512_processes(services: Path) -> None:
    # attacks that did not work, kept: no /sys to move itself out of its cgroup, no status.json to forge pids in
    # (only its state directory is there), no hard link to a host file, no /etc/shadow, a fork bomb ends at pids.max
    where, settled = start(services, PROBE, disk_mb=64)
    assert settled["state"] == "running", (settled["message"], settled["last_end"])
    said = json.loads((where.state / "probe.json").read_text())
    assert said["sys"] is False
    assert said["own_dir"] == ["state"]
    assert said["hard_link"] == "Invalid cross-device link"
    assert said["shadow"] in ("No such file or directory", "Permission denied", 0)
    assert said["uid"] != 0
    assert said.get("fork_stopped") and said["forks"] < 512, said
    assert down(services).returncode == 0
