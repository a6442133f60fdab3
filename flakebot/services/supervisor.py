"""The supervisor: one detached process per service (`python -m flakebot.services.supervisor DIR`).

It starts the service under bubblewrap (own network and PID namespaces, --die-with-parent) with its port either
handed in (handoff.py: the listening socket the supervisor holds from its start to its end, fd 3) or forwarded by
pasta (a service declared `socket: pasta`, and outbound network when its launch says `network`), checks its health, restarts it with backoff when it exits or
stops answering (failed after too many restarts in a window), writes status.json on every change, and on SIGTERM stops it: SIGTERM to the service's own process
(bubblewrap's init does not pass it on), SIGKILL of the namespace after the grace period, pasta stopped, port freed.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flakebot import launcher, processid
from flakebot.errors import FlakebotError, SandboxError
from flakebot.sandbox import BwrapSandbox, SandboxLimits, open_sandbox
from flakebot.sandbox.cgroup import Group
from flakebot.services import credentials, envelope, forward, handoff, health
from flakebot.services.declaration import ServiceSpec, reach_environment
from flakebot.services.layout import ServiceDir
from flakebot.services.logfile import LogFile

logger = logging.getLogger(__name__)

STEP = 0.1  # the loop's longest wait: a stop request is seen this fast
STARTING_CHECK = 0.02  # between health checks of a start not yet healthy (refused at once while it binds)
DRAIN_READ = 16384  # bytes of the service's output read at once (a short read's lines are logged within a STEP)


@dataclass
class Started:
    """One start of the service: bubblewrap (its host pid), the service's own pid, pasta."""

    bwrap: subprocess.Popen[bytes]
    ns_init: int  # bubblewrap's init in the new PID namespace (host pid): killing it ends the namespace
    service_pid: int
    pasta: subprocess.Popen[bytes] | None
    at: float
    group: Group | None = None  # its cgroup: memory and processes of the whole service (envelope.py)
    ns_start: int | None = None  # start times (processid): a pid is signalled only while it is still that process
    service_start: int | None = None


class Supervisor:
    def __init__(self, where: ServiceDir, launch: dict[str, Any], listener: socket.socket | None = None) -> None:
        """`listener`: the service's listening socket as the supervisor before this one held it (handoff.adopted)."""
        self.where = where
        self.launch = launch
        self.spec = ServiceSpec.from_dict(launch["spec"])
        self.port = int(launch["host_port"])
        self.binary = Path(launch["binary"])
        self.secrets: dict[str, str] = launch.get("secrets") or {}  # KEY -> the file's path, never its content
        self.network = forward.outbound_network(launch)
        self.needs: dict[str, int] = launch.get("needs") or {}  # each needed service's host port (needs.py)
        self.socket_mode = handoff.mode(self.spec, self.network)
        # handoff: bound at the first start (or the one before us held), kept until close(); handed over on request
        self.listener = listener if self.socket_mode == "handoff" else None
        if listener is not None and self.listener is None:
            listener.close()
        self.handover: socket.socket | None = None
        self.limits = SandboxLimits(**launch.get("limits", {}))
        self.quota_outcome = ""  # set when the state passed its disk quota: a stop without restarts
        self.log = LogFile(where.log, secrets=credentials.values(self.secrets))
        self.status_unwritten = False  # the disk refused the last status write (update says so once)
        self.stopping = False
        self.restarts: deque[float] = deque()
        self.total_restarts = 0
        self.status: dict[str, Any] = {
            "name": where.name,
            "version": launch.get("version", ""),
            "previous_version": launch.get("previous_version", ""),  # what `rollback` goes back to
            "state": "starting",
            "health": "unknown",
            "port": self.port,
            "inner_port": self.spec.port,
            "network": self.network,
            "socket": self.socket_mode,
            "restarts": 0,
            "supervisor_pid": os.getpid(),
            "supervisor_start": processid.start_time(os.getpid()),
            "service_pid": None,
            "service_start": None,
            "cgroup": None,
            "envelope": "",
            "started_at": None,
            "state_dir": str(where.state),
            "log": str(where.log),
            "message": "",
            "last_end": "",  # why its last start ended (kept once it runs again: an OOM kill, a crash, a failed check)
        }

    def update(self, **fields: Any) -> None:
        """Record `fields` in the status; a disk that refuses the status file leaves the last one there (this one
        is written at the next update it takes), never ending the supervisor or its service."""
        self.status.update(fields)
        self.status["updated_at"] = time.time()
        try:
            self.where.write_status(self.status)
        except OSError as exc:
            if not self.status_unwritten:
                logger.warning("status not written (%s): the last one stays until the disk takes one", exc.strerror)
            self.status_unwritten = True
            return
        self.status_unwritten = False

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._stop_requested)
        signal.signal(signal.SIGINT, self._stop_requested)
        self.update()
        try:
            self.listening()
        except OSError as exc:  # taken since `up` found it free: nothing started, nothing to restart
            return self.refuse(f"port {self.port} on 127.0.0.1 cannot be bound ({exc.strerror})")
        if self.listener is not None:
            try:
                self.handover = handoff.handover_server(self.where.handover)
            except OSError as exc:  # an upgrade or restart then binds again (a moment where the port is free)
                logger.warning("no handover socket (%s): the next version binds the port again", exc)
        try:
            return self._run()
        finally:
            self.close()

    def _run(self) -> int:
        while not self.stopping:
            if over := envelope.over_quota(self.where.state, self.limits.disk_mb):
                return self.refuse(over)
            try:
                started = self.start()
            except (FlakebotError, OSError) as exc:
                self.log.write(f"flakebot: the service did not start: {exc}")
                started, outcome = None, f"did not start: {exc}"
            if started is not None:
                outcome = self.watch(started)
                self.stop(started)
            if self.quota_outcome:
                return self.refuse(self.quota_outcome)
            if self.stopping:
                break
            if not self.may_restart(outcome):
                return 1
        self.update(state="stopped", health="unknown", service_pid=None, message="stopped by request")
        return 0

    def listening(self) -> socket.socket | None:
        """The listening socket handed to each start (bound at the first: OSError when the port is taken), or None
        for a service forwarded by pasta."""
        if self.socket_mode == "handoff" and self.listener is None:
            self.listener = handoff.bind(self.port)
        return self.listener

    def close(self) -> None:
        """The port given up (after the last start has stopped): kept only by a copy handed over."""
        if self.handover is not None:
            self.handover.close()
            self.handover = None
            self.where.handover.unlink(missing_ok=True)
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    def refuse(self, problem: str) -> int:
        """Failed for good, no restart: its state is past the disk quota (kept: it is the user's data)."""
        self.update(state="failed", health="unhealthy", service_pid=None, service_start=None, message=problem,
                    last_end=problem)  # fmt: skip
        self.log.write(f"flakebot: failed: {problem}")
        return 1

    def _stop_requested(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def may_restart(self, outcome: str) -> bool:
        """Wait the backoff before the next start; False (state failed) past the restart limit."""
        now = time.monotonic()
        self.restarts.append(now)
        while self.restarts and now - self.restarts[0] > self.spec.restart.window_s:
            self.restarts.popleft()
        limit = self.spec.restart
        if len(self.restarts) > limit.limit:
            self.update(
                state="failed", health="unhealthy", service_pid=None,
                message=f"{outcome}; gave up after {limit.limit} restarts within {limit.window_s:g} s",
            )  # fmt: skip
            self.log.write(f"flakebot: failed: {outcome}; no more restarts")
            return False
        self.total_restarts += 1
        delay = limit.delay(len(self.restarts))
        self.update(state="restarting", health="unhealthy", service_pid=None, restarts=self.total_restarts,
                    message=f"{outcome}; restart {self.total_restarts} in {delay:.1f} s", last_end=outcome)  # fmt: skip
        self.log.write(f"flakebot: {outcome}; restarting in {delay:.1f} s")
        end = time.monotonic() + delay
        while not self.stopping and time.monotonic() < end:
            self.wait_serving_handover(min(STEP, max(end - time.monotonic(), 0)))
        return True

    def wait_serving_handover(self, seconds: float) -> None:
        """Sleep `seconds`, answering a request for the listening socket meanwhile."""
        if self.handover is None or self.listener is None:
            time.sleep(seconds)
            return
        ready, _, _ = select.select([self.handover], [], [], seconds)
        if ready:
            handoff.serve_handover(self.handover, self.listener)

    def start(self) -> Started:
        sandbox = self.sandbox()
        listener = self.listening()
        program = [str(self.binary)] if listener is None else handoff.argv([str(self.binary)])
        full = sandbox.command_line(program, cwd=self.where.state)
        full_env = service_environment(self.spec, self.where.state, bool(self.secrets), self.needs)
        if listener is not None:
            handoff.prepare(listener)
            full_env.update(handoff.environment())
        secret_args, secret_fds = credentials.bwrap_args(self.secrets)
        info_read, info_write = os.pipe()
        full = [full[0], "--info-fd", str(info_write), *secret_args, *full[1:]]
        group = envelope.group_for(self.where.root, self.limits)
        if group is not None:
            # recorded before anything joins it: a supervisor killed from here on (before bubblewrap set its
            # --die-with-parent, say) leaves processes only in a group `down` finds and empties
            self.update(cgroup=group.to_dict())
        try:
            bwrap = launcher.popen(full, env=full_env, cwd=self.where.state, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   pass_fds=(info_write, *secret_fds),
                                   fds={handoff.FD: listener.fileno()} if listener is not None else None,
                                   preexec_fn=group.enter if group else None)  # fmt: skip
        finally:
            for fd in (info_write, *secret_fds):
                os.close(fd)
        try:
            ns_init = _read_child_pid(info_read)
        except BaseException:
            bwrap.kill()  # it never said which process is the service: nothing of it may stay
            bwrap.wait()
            if group is not None:
                group.remove()
            raise
        finally:
            os.close(info_read)
        service_pid = _child_of(ns_init, bwrap)
        started = Started(bwrap, ns_init, service_pid, None, time.time(), group, processid.start_time(ns_init),
                          processid.start_time(service_pid) if service_pid else None)  # fmt: skip
        try:
            started.pasta = None if listener is not None else self.forward(ns_init)
        except BaseException:
            self.stop(started)
            raise
        bound = (
            group.describe(self.limits.memory_mb * envelope.MIB, self.limits.max_processes)
            if group
            else (f"per process only: {self.limits.memory_mb} MiB (RLIMIT_DATA), {self.limits.max_processes} processes")
        )
        self.update(state="starting", health="unknown", service_pid=started.service_pid,
                    service_start=started.service_start, started_at=started.at, message="",
                    cgroup=group.to_dict() if group else None,
                    envelope=f"{bound}; state at most {self.limits.disk_mb} MiB")  # fmt: skip
        how = f"its socket handed in as fd {handoff.FD}" if listener is not None else "forwarded by pasta"
        self.log.write(
            f"flakebot: started {self.binary.name} (pid {started.service_pid}), 127.0.0.1:{self.port}, {how}"
        )
        return started

    def sandbox(self) -> BwrapSandbox:
        limits = SandboxLimits(**self.launch.get("limits", {}))
        self.where.state.mkdir(parents=True, exist_ok=True)
        sandbox = open_sandbox(self.launch.get("sandbox", "required"), workspace=self.where.state,
                               writable=[self.where.state], readable=[self.binary.parent], limits=limits,
                               adopt=True)  # fmt: skip
        if not isinstance(sandbox, BwrapSandbox):
            raise SandboxError(
                "a service needs bubblewrap (its own network namespace), not a plain process",
                fix="install bubblewrap and set sandbox = 'required'",
            )
        return sandbox

    def forward(self, ns_init: int) -> subprocess.Popen[bytes]:
        argv = forward.pasta_argv(forward.pasta_program(), self.port, self.spec.port, ns_init, network=self.network,
                                  reach=tuple(self.needs.values()))  # fmt: skip
        with open(self.where.supervisor_log, "ab") as out:
            return launcher.popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                  preexec_fn=forward.die_with_parent())  # fmt: skip

    def watch(self, started: Started) -> str:
        """Until the service exits, fails its checks or a stop is asked: why it ended ('' for a stop)."""
        assert started.bwrap.stdout is not None
        output = started.bwrap.stdout.fileno()
        os.set_blocking(output, False)
        failures, ever_healthy = 0, False
        next_check = next_measure = time.monotonic()
        while not self.stopping:
            watched = [output, *([self.handover.fileno()] if self.handover else [])]
            ready, _, _ = select.select(watched, [], [], min(STEP, max(next_check - time.monotonic(), 0)))
            if output in ready:
                self._drain(output)
            if self.handover is not None and self.listener is not None and self.handover.fileno() in ready:
                handoff.serve_handover(self.handover, self.listener)
            if over := self.out_of_memory(started):
                return over
            if started.bwrap.poll() is not None:
                self._drain(output, None)
                return f"the service exited with code {started.bwrap.returncode}"
            if time.monotonic() >= next_measure:
                began = time.monotonic()
                self.quota_outcome = envelope.over_quota(self.where.state, self.limits.disk_mb)
                # a state of many entries takes long to walk: the supervisor (outside the service's cgroup) spends
                # at most a fifth of its time measuring it
                next_measure = time.monotonic() + max(envelope.DISK_EVERY, 4 * (time.monotonic() - began))
                if self.quota_outcome:
                    return self.quota_outcome
            if started.pasta is not None and started.pasta.poll() is not None:
                return f"the port forward (pasta) exited with code {started.pasta.returncode}"
            if time.monotonic() < next_check:
                continue
            problem = health.check(self.spec.health, self.port, self.spec.check_timeout_s, self.listener)
            # until its first pass, checked often (a start is waited on); then at the declared interval
            next_check = time.monotonic() + (self.spec.interval_s if ever_healthy or not problem else
                                             min(self.spec.interval_s, STARTING_CHECK))  # fmt: skip
            if self.status_unwritten:
                self.update()  # the disk refused the last status: it is tried again at each check
            if not problem:
                failures, ever_healthy = 0, True
                if self.status["health"] != "healthy":
                    self.update(state="running", health="healthy", message="")
                continue
            if not ever_healthy:
                if time.time() - started.at > self.spec.start_s:
                    return f"not healthy within {self.spec.start_s:g} s ({problem})"
                continue
            failures += 1
            if failures >= self.spec.failures:
                return f"unhealthy: {failures} checks failed ({problem})"
            self.update(health="unhealthy", message=problem)
        return ""

    def out_of_memory(self, started: Started) -> str:
        """Why the service is ended when the kernel killed one of its processes at the cgroup's memory limit."""
        kills = started.group.oom_kills() if started.group else 0
        if not kills:
            return ""
        assert started.group is not None
        return (
            f"out of memory: the kernel killed {kills} of its processes at sandbox_memory_mb = "
            f"{self.limits.memory_mb} MiB for the whole service (peak {started.group.peak_bytes() / envelope.MIB:.0f} MiB)"
        )

    def _drain(self, fd: int, for_s: float | None = STEP) -> None:
        """What the service printed, into its log: for at most `for_s` seconds (None: all there is, once it has
        ended), so a service printing faster than its log is written never holds the loop that measures it."""
        end = None if for_s is None else time.monotonic() + for_s
        try:
            while data := os.read(fd, DRAIN_READ):
                self.log.feed(data)
                if end is not None and time.monotonic() >= end:
                    return
        except BlockingIOError:
            pass

    def stop(self, started: Started) -> None:
        """SIGTERM to the service's own process, SIGKILL of its whole namespace after the grace period, pasta
        stopped; nothing of this start is left running."""
        self.update(state="stopping" if self.stopping else self.status["state"])
        if started.bwrap.poll() is None:  # running still
            processid.signal_if(started.service_pid, started.service_start, signal.SIGTERM)
            try:
                started.bwrap.wait(timeout=self.spec.stop_grace_s)
            except subprocess.TimeoutExpired:
                self.log.write(f"flakebot: no exit {self.spec.stop_grace_s:g} s after SIGTERM: SIGKILL")
                processid.signal_if(started.service_pid, started.service_start, signal.SIGCONT)
                # pid 1 of the namespace: the kernel kills the rest
                processid.signal_if(started.ns_init, started.ns_start, signal.SIGKILL)
                started.bwrap.kill()
                started.bwrap.wait()
        if started.group is not None:
            started.group.remove()  # whatever of it is left (membership is identity), then the cgroup itself
            self.status["cgroup"] = None
        if started.bwrap.stdout is not None:
            self._drain(started.bwrap.stdout.fileno(), None)  # everything of it has ended: the pipe ends too
            started.bwrap.stdout.close()
        self.log.flush()
        if started.pasta is not None and started.pasta.poll() is None:
            started.pasta.terminate()
            try:
                started.pasta.wait(timeout=5)
            except subprocess.TimeoutExpired:
                started.pasta.kill()
                started.pasta.wait()
        self.log.write(f"flakebot: stopped (exit code {started.bwrap.returncode})")


def _read_child_pid(fd: int, timeout: float = 30.0) -> int:
    """bubblewrap's --info-fd JSON: the pid (host view) of its init in the new PID namespace."""
    data, end = b"", time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], STEP)
        if ready:
            chunk = os.read(fd, 4096)
            data += chunk
            try:
                return int(json.loads(data)["child-pid"])
            except (ValueError, KeyError):
                if not chunk:
                    break
    raise SandboxError(f"bubblewrap did not start the service ({data[:200]!r})", fix="see the service's log")


SERVICE_PATH = "/usr/local/bin:/usr/bin:/bin"  # the sandbox's own /usr; a Nix-built service needs none of it


def service_environment(
    spec: ServiceSpec, state: Path, secrets: bool, reach: dict[str, int] | None = None
) -> dict[str, str]:
    """A service's whole environment, declared (as systemd gives a unit): its port variable, STATE_DIRECTORY,
    CREDENTIALS_DIRECTORY when it has secrets, FLAKEBOT_<NAME>_URL for each service it needs (`reach`: name ->
    port), a fixed PATH and LANG. Nothing of the supervisor's or the build's (no RUSTUP_*, CARGO_HOME, HOME or the
    host's PATH) reaches it."""
    env = {**reach_environment(reach or {}), "PATH": SERVICE_PATH, "LANG": "C.UTF-8", spec.port_env: str(spec.port),
           "STATE_DIRECTORY": str(state)}  # fmt: skip
    if secrets:
        env["CREDENTIALS_DIRECTORY"] = str(credentials.INSIDE)
    return env


def _child_of(pid: int, bwrap: subprocess.Popen[bytes], timeout: float = 5.0) -> int:
    """The (first) child of `pid`: under bubblewrap's init in the namespace, the service itself; 0 when there is
    none (it exited at once: the watch sees bubblewrap exit)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and bwrap.poll() is None:
        if found := _children(pid):
            return found[0]
        time.sleep(0.002)
    return 0


def _children(pid: int) -> list[int]:
    """`pid`'s children: the kernel's list of them (one small read), else every process's parent read from /proc (a
    kernel without CONFIG_PROC_CHILDREN; on a busy machine that walk took 50-100 ms a turn)."""
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        if Path(f"/proc/{pid}").exists():
            with os.scandir("/proc") as entries:
                return [int(e.name) for e in entries if e.name.isdigit() and _parent(e.name) == pid]
        return []
    except OSError:
        return []


def _parent(pid: str) -> int:
    try:
        stat = Path("/proc", pid, "stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def main(argv: list[str]) -> int:
    """`DIR [--socket-fd N]`: N, the listening socket the supervisor before this one held (handoff.py)."""
    where = ServiceDir(Path(argv[0]))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    inherited = int(argv[2]) if argv[1:2] == ["--socket-fd"] else None
    lock = where.hold_supervisor_lock()
    try:
        launch = where.read_json(where.launch_file)
        listener = handoff.adopted(inherited, int(launch["host_port"])) if inherited is not None else None
        if listener is not None:
            listener.set_inheritable(False)  # pasta or anything else it starts never gets it (bubblewrap: fd 3)
        return Supervisor(where, launch, listener).run()
    finally:
        os.close(lock)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
