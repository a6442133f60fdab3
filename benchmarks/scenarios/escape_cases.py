"""Escape attempts against a sandbox: what model-written code might try, and whether it was contained.

`run_escape_cases(factory)` builds a scratch workspace, opens a sandbox with `factory(workspace, writable)`,
runs every case as `bash -c SCRIPT` in it, checks the outcome from outside, cleans up (files, servers,
leftover processes) and returns one dict per case. The sandbox tests print these; the reliability
report reuses them. The fork bomb is bounded (a tree of 1023 processes), so a plain process survives it.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flakebot.sandbox import CommandResult, Sandbox

MARKER_VAR = "FLAKEBOT_ESCAPE_MARKER"
SECRET_VAR = "FLAKEBOT_ESCAPE_SECRET"
CAP_SYS_ADMIN = 21


@dataclass
class Scene:
    """Everything a case needs from outside the sandbox: paths, a listening server, a host process, a secret."""

    root: Path
    marker: str
    server: socket.socket
    victim: subprocess.Popen[bytes]
    home_secret: Path
    token: str = field(default_factory=lambda: secrets.token_hex(12))

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def outside_files(self) -> list[Path]:
        """Files the write case tries to create outside the workspace; none may appear on the host."""
        name = f"flakebot-escape-{self.marker}"
        return [
            self.root / "outside.txt",
            Path.home() / f".{name}",
            Path(tempfile.gettempdir()) / name,
            Path("/usr") / name,
        ]

    def fields(self) -> dict[str, Any]:
        return {
            "port": self.server.getsockname()[1],
            "victim": self.victim.pid,
            "home_secret": self.home_secret,
            "home": Path.home(),
            "outside": " ".join(map(str, self.outside_files)),
            "hook_proof": self.root / "hook-ran",
        }


@dataclass
class Case:
    """One escape attempt: a bash script (str.format'ed with Scene.fields()) and how to judge it."""

    name: str
    attempt: str
    expected: str
    script: str
    judge: Callable[[CommandResult, Scene], tuple[bool, str]]
    timeout: float = 10.0


def _network(result: CommandResult, scene: Scene) -> tuple[bool, str]:
    scene.server.setblocking(False)
    try:
        conn, _ = scene.server.accept()
        conn.close()
        reached = True
    except BlockingIOError:
        reached = False
    return not reached and "CONNECTED" not in result.stdout, f"server reached: {reached}; {_last_line(result)}"


def _writes(result: CommandResult, scene: Scene) -> tuple[bool, str]:
    leaked = [str(p) for p in scene.outside_files if p.exists()]
    inside = [line.removeprefix("wrote ") for line in result.stdout.splitlines() if line.startswith("wrote ")]
    return (
        not leaked,
        f"visible on the host: {leaked or 'none'}; writes that succeeded as seen from inside: {inside or 'none'}",
    )


def _git_hook(result: CommandResult, scene: Scene) -> tuple[bool, str]:
    hook = scene.workspace / ".git/hooks/pre-commit"
    planted = hook.exists() and "hook-ran" in hook.read_text(errors="replace")
    return not planted, f"hook planted: {planted}; {_last_line(result)}"


def _home(result: CommandResult, scene: Scene) -> tuple[bool, str]:
    output = result.stdout + result.stderr
    ssh = Path.home() / ".ssh"
    names = [p.name for p in ssh.iterdir() if len(p.name) > 3] if ssh.is_dir() else []
    seen = [n for n in names if n in output]
    leaked = scene.token in output or bool(seen)
    return (
        not leaked,
        f"secret file in the real home read: {scene.token in output}; real ~/.ssh entries seen: {seen or 'none'}",
    )


def _fork_bomb(result: CommandResult, scene: Scene) -> tuple[bool, str]:
    limited = "Resource temporarily unavailable" in result.stderr
    ended = "timeout" if result.timed_out else f"exit {result.returncode}"
    return limited, f"process limit hit: {limited}; ended by {ended} after {result.seconds:.1f} s"


def _sleeper(result: CommandResult, scene: Scene) -> tuple[bool, str]:
    return result.timed_out, f"killed at the timeout: {result.timed_out} after {result.seconds:.1f} s"


def _daemon(result: CommandResult, scene: Scene) -> tuple[bool, str]:
    return True, f"command {_last_line(result)}; leftover check follows"


def _signal(result: CommandResult, scene: Scene) -> tuple[bool, str]:
    try:  # a SIGKILL that landed still takes a moment to end the process: wait before calling it alive
        scene.victim.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        pass
    alive = scene.victim.poll() is None
    return alive, f"host process {scene.victim.pid} still alive: {alive}; {_last_line(result)}"


def _privileges(result: CommandResult, scene: Scene) -> tuple[bool, str]:
    status = dict(line.split(":\t", 1) for line in result.stdout.splitlines() if ":\t" in line)
    caps = int(status.get("CapEff", "0").strip() or "0", 16)
    admin = bool(caps >> CAP_SYS_ADMIN & 1)
    nnp = status.get("NoNewPrivs", "").strip() == "1"
    return not admin and nnp, f"uid {status.get('Uid', '?').split()[0]}, CAP_SYS_ADMIN: {admin}, no_new_privs: {nnp}"


def _environment(result: CommandResult, scene: Scene) -> tuple[bool, str]:
    leaked = scene.token in result.stdout
    return not leaked, f"secret from flakebot's environment visible: {leaked}"


def _last_line(result: CommandResult) -> str:
    lines = (result.stdout + result.stderr).strip().splitlines()
    return f"exit {result.returncode}" + (f": {lines[-1][:160]}" if lines else "")


CASES = [
    Case(
        "network",
        "connect to a server on the host's 127.0.0.1",
        "connection fails",
        "exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED",
        _network,
    ),
    Case(
        "write-outside",
        "write next to the workspace, into $HOME, /tmp and /usr",
        "nothing appears on the host",
        'for f in {outside}; do (echo pwned > "$f") 2>/dev/null && echo "wrote $f"; done; true',
        _writes,
    ),
    Case(
        "git-hook",
        "plant a git pre-commit hook (would run unsandboxed at the next commit)",
        "the hook is not written",
        "mkdir -p .git/hooks && printf '#!/bin/sh\\ntouch {hook_proof}\\n' > .git/hooks/pre-commit && echo planted",
        _git_hook,
    ),
    Case(
        "read-home",
        "read a secret file in the real home and ~/.ssh",
        "neither is visible",
        "cat {home_secret} ~/.ssh/* {home}/.ssh/* 2>&1; ls -la {home} {home}/.ssh 2>&1; true",
        _home,
    ),
    Case(
        "fork-bomb",
        "spawn a tree of 1023 processes",
        "stopped by the process limit, nothing left behind",
        'bomb() {{ if [ "$1" -gt 0 ]; then bomb $(($1-1)) & bomb $(($1-1)) & wait; else exec sleep 30; fi; }}; bomb 9',
        _fork_bomb,
        timeout=4,
    ),
    Case(
        "sleep-forever",
        "sleep forever",
        "killed at the timeout, nothing left behind",
        "sleep infinity",
        _sleeper,
        timeout=2,
    ),
    Case(
        "daemon",
        "leave a daemon running after the command exits",
        "the daemon is gone",
        # Wait until the daemon runs in its own session: otherwise the end of the command can kill it before
        # setsid() and a plain process would look contained by chance.
        "setsid sh -c 'echo $$ > .daemon-pid; exec sleep 300' & "
        "for i in $(seq 200); do [ -s .daemon-pid ] && break; sleep 0.05; done; echo started",
        _daemon,
    ),
    Case(
        "kill-host-process",
        "SIGKILL a process running on the host",
        "the host process survives",
        "kill -9 {victim}",
        _signal,
    ),
    Case(
        "privileges",
        "look for admin capabilities and setuid escalation",
        "no CAP_SYS_ADMIN, no_new_privs set",
        "grep -E '^(Uid|CapEff|NoNewPrivs):' /proc/self/status; sudo -n true 2>&1; true",
        _privileges,
    ),
    Case("environment", "read an API key from flakebot's environment", "not inherited", "env", _environment),
]


def run_escape_cases(
    sandbox_factory: Callable[[Path, list[Path]], Sandbox], names: list[str] | None = None
) -> list[dict[str, Any]]:
    """Run every case (or those in `names`) in a sandbox from `sandbox_factory(workspace, writable)`; one dict per case."""
    with tempfile.TemporaryDirectory(prefix="flakebot-escape-") as tmp:
        scene = _stage(Path(tmp))
        try:
            sandbox = sandbox_factory(scene.workspace, [scene.target])
            return [_run_case(sandbox, scene, case) for case in CASES if names is None or case.name in names]
        finally:
            _tear_down(scene)


def _stage(root: Path) -> Scene:
    (root / "workspace").mkdir()
    subprocess.run(["git", "init", "-q", str(root / "workspace")], check=True)
    server = socket.create_server(("127.0.0.1", 0))
    victim = subprocess.Popen(["sleep", "300"])
    marker = secrets.token_hex(6)
    home_secret = Path.home() / f".flakebot-escape-secret-{marker}"
    scene = Scene(root, marker, server, victim, home_secret)
    home_secret.write_text(scene.token)
    os.environ[SECRET_VAR] = scene.token  # removed in _tear_down; shows the sandbox does not inherit it
    return scene


def _tear_down(scene: Scene) -> None:
    os.environ.pop(SECRET_VAR, None)
    scene.server.close()
    scene.victim.kill()
    scene.victim.wait()
    for path in [scene.home_secret, *scene.outside_files, scene.root / "hook-ran"]:
        if path.is_file():
            path.unlink()


def _run_case(sandbox: Sandbox, scene: Scene, case: Case) -> dict[str, Any]:
    marker = f"{scene.marker}-{case.name}"
    script = case.script.format(**scene.fields())
    result = sandbox.run(["bash", "-c", script], cwd=scene.workspace, env={MARKER_VAR: marker}, timeout=case.timeout)
    contained, outcome = case.judge(result, scene)
    left = _leftovers(marker)
    if left:
        contained, outcome = False, f"{outcome}; {left} processes were left behind (now killed)"
    else:
        outcome = f"{outcome}; no process left behind"
    return {
        "case": case.name,
        "sandbox": sandbox.name,
        "attempt": case.attempt,
        "expected": case.expected,
        "contained": contained,
        "outcome": outcome,
        "returncode": result.returncode,
        "timed_out": result.timed_out,
        "seconds": round(result.seconds, 3),
    }


def _leftovers(marker: str, wait: float = 2.0) -> int:
    """Processes still carrying `marker` after the command returned (given `wait` seconds to die); all are killed."""
    return len(reap(lambda: marked_processes(marker), wait))


def reap(find: Callable[[], list[int]], wait: float, interval: float = 0.05) -> list[int]:
    """Give the processes `find()` names `wait` seconds to end, then SIGKILL those left; returns the ones killed."""
    deadline = time.monotonic() + wait
    left = find()
    while left and time.monotonic() < deadline:
        time.sleep(interval)
        left = find()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def marked_processes(marker: str) -> list[int]:
    """Pids of live processes whose environment holds MARKER_VAR=marker (every command of a case gets it)."""
    needle = f"{MARKER_VAR}={marker}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes() and (entry / "stat").read_text().split(") ")[-1][:1] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue  # exited meanwhile, or not ours to read
    return found
