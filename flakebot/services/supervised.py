"""A service's supervisor from the outside: start it on a launch (launch.json) and wait until the service settles,
stop it, and read the service's status as it is now. What up, down, rollback and an upgrade share; each caller
holds the service's control lock."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from flakebot import launcher, processid
from flakebot.fsutil import atomic_write_text
from flakebot.sandbox.cgroup import Group
from flakebot.services import handoff, identity
from flakebot.services.declaration import ServiceSpec
from flakebot.services.layout import ServiceDir

SETTLED = ("running", "failed", "stopped")
SETTLE_POLL = 0.01  # between reads of status.json while `up` waits (a small file: 50 ms cost `up` 25 ms on average)


def start_supervised(
    where: ServiceDir, launch: dict[str, Any], listener: socket.socket | None = None
) -> dict[str, Any]:
    """Write `launch`, start its supervisor and wait until the service settles (running, failed, stopped); the status
    then. The caller holds the control lock. `listener`: the service's listening socket, taken from the supervisor
    before (handoff.take), handed to the new one (its copy here is the caller's to close)."""
    spec = ServiceSpec.from_dict(launch["spec"])
    where.state.mkdir(parents=True, exist_ok=True)
    identity.hold_roots(where, launch)
    write_launch(where, launch)
    where.status_file.unlink(missing_ok=True)
    _spawn_supervisor(where, listener)
    return _wait_settled(where, spec.start_s + spec.stop_grace_s + 10)


def write_launch(where: ServiceDir, launch: dict[str, Any]) -> None:
    """launch.json exactly as given, never through the redactor: a secret's KEY (token, password, api_key) is a key
    it would blank, and the supervisor would look for a file called [REDACTED]. It holds paths, never a secret."""
    atomic_write_text(where.launch_file, json.dumps(launch, indent=2, sort_keys=True, default=str) + "\n")


def _spawn_supervisor(where: ServiceDir, listener: socket.socket | None = None) -> None:
    """The supervisor, detached: its own session, no terminal, output to supervisor.log; `listener` at fd 3."""
    # isolated python in flakebot's empty directory: the caller's cwd and PYTHON* never steer flakebot's code
    args = [str(where.root), *(["--socket-fd", str(handoff.FD)] if listener is not None else [])]
    with open(where.supervisor_log, "ab") as out:
        launcher.popen(
            # the standard library and flakebot only (tests/services/test_supervisor.py holds it to that): no site
            launcher.python_module("flakebot.services.supervisor", *args, site=False), env=launcher.flakebot_env(),
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, close_fds=True,
            fds={handoff.FD: listener.fileno()} if listener is not None else None,
        )  # fmt: skip


def _wait_settled(where: ServiceDir, timeout: float) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        status = where.status()
        if status.get("state") in SETTLED:
            return status
        if status and not where.supervisor_alive():
            return {**status, "state": "lost", "message": "the supervisor exited: see " + str(where.supervisor_log)}
        time.sleep(SETTLE_POLL)
    return {**where.status(), "state": "timeout", "message": f"not healthy within {timeout:g} s"}


def stop_supervised(where: ServiceDir) -> dict[str, Any]:
    """What `down` does, the control lock held by the caller."""
    status = where.status()
    spec = ServiceSpec.from_dict(where.read_json(where.launch_file).get("spec", {}))
    pid, started = status.get("supervisor_pid"), _supervisor_start(where, status)
    if where.supervisor_alive() and processid.signal_if(pid, started, signal.SIGTERM):
        if not _wait(lambda: not where.supervisor_alive(), spec.stop_grace_s + 10):
            # bubblewrap (--die-with-parent) and pasta (PDEATHSIG) go with it
            processid.signal_if(pid, started, signal.SIGKILL)
            _wait(lambda: not where.supervisor_alive(), 5)
    status = where.status()
    if status.get("state") != "stopped":  # a pid is signalled only while it is the process recorded
        processid.signal_if(status.get("service_pid"), status.get("service_start"), signal.SIGKILL)
    group = Group.from_dict(status.get("cgroup"))
    if group is not None and not where.supervisor_alive():
        group.remove()  # what a killed supervisor left in its cgroup: members only, never a guessed pid
        status["cgroup"] = None
    if status.get("state") != "failed":
        status = {**status, "state": "stopped", "health": "unknown", "service_pid": None}
        where.write_status(status)
    return show(where)


def _supervisor_start(where: ServiceDir, status: dict[str, Any]) -> int | None:
    """The recorded supervisor's start time; for a status written before start times were kept, its process's own
    when its command line is this service's supervisor (else None: not signalled)."""
    if "supervisor_start" in status:
        started = status["supervisor_start"]
        return started if isinstance(started, int) else None
    pid = status.get("supervisor_pid")
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, TypeError):
        return None
    ours = b"flakebot.services.supervisor" in argv and os.fsencode(str(where.root)) in argv
    return processid.start_time(pid) if ours and isinstance(pid, int) else None


def _wait(done: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if done():
            return True
        time.sleep(0.05)
    return bool(done())


def show(where: ServiceDir) -> dict[str, Any]:
    """A service's status as its supervisor last wrote it, corrected by what is true now: a supervisor that is gone
    (killed) makes a running service `lost`; uptime counted from its last start."""
    status = dict(where.status())
    alive = where.supervisor_alive()
    if status.get("state") not in ("stopped", "failed") and not alive:
        service = status.get("service_pid")
        left = processid.is_running(service, status.get("service_start"))
        status.update(
            state="lost", health="unknown",
            message="the supervisor is gone (killed?)" + (f"; service pid {service} still runs" if left else
                    "; nothing of the service is left running") + f": start it again with 'flakebot up {where.name}'",
        )  # fmt: skip
    started = status.get("started_at")
    running = status.get("state") in ("running", "starting", "restarting") and alive
    status["uptime_s"] = round(time.time() - started, 1) if running and isinstance(started, float) else None
    status["supervised"] = alive
    status.setdefault("network", False)  # a status from a supervisor before `up --network` had none
    status.setdefault("socket", "pasta")  # ... and one from before the socket handoff was forwarded by pasta
    launch = where.read_json(where.launch_file)
    recorded = launch.get("program")
    status["store_path"] = recorded.get("store_path") if isinstance(recorded, dict) else None  # what it runs
    declared = launch.get("spec")
    status["needs"] = (
        list(declared.get("needs") or []) if isinstance(declared, dict) else []
    )  # what its recorded program's declaration needs
    return status


__all__ = ["SETTLED", "show", "start_supervised", "stop_supervised", "write_launch"]
