"""Isolated homes for reliability scenarios: the real CLI in a subprocess, what a run left behind, stray processes.

Every scenario gets its own Home (config, catalog, work directory), so "no run dir / catalog entry
was added" can be checked exactly. The cache directory (local registry index, the nixpkgs stand-in)
is shared by all homes of one report: it is warmed once, as a user's would be.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.scenarios.escape_cases import reap

REPO = Path(__file__).resolve().parents[2]
SESSION = REPO / "flakebot/data/sessions/csv-dedup.json"
DEBIAN_REGISTRY = Path("/usr/share/cargo/registry")
OFFLINE = ["--registry", "local", "--offline"]
MARKER_VAR = "RELIABILITY_MARKER"  # no FLAKEBOT_ prefix: those are settings, and unknown ones are refused
SCRUBBED = (
    "GROQ_API_KEY",
    "OPENAI_API_KEY",
    "GITHUB_TOKEN",
    "GROQ_BASE_URL",
    "OPENAI_BASE_URL",
    "OPENAI_COMPATIBLE_API_KEY",
)


@dataclass
class Scratch:
    """Where a report's scenarios run: their homes under `root`, the cache they share, and whether only the quick
    subset of each section runs."""

    root: Path
    cache: Path
    quick: bool = False


@dataclass
class Outcome:
    """What one CLI invocation did."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def error_line(self) -> str:
        """The one red line the CLI prints for a FlakebotError (or the last stderr line)."""
        lines = [line.rstrip() for line in self.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith(("error:", "Error:"))]
        return (errors or lines or [""])[-1]

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.stderr

    def result(self) -> dict[str, Any]:
        """The {"result": ...} object a --json craft or resume ends with ({} if none)."""
        for line in reversed(self.stdout.splitlines()):
            if line.startswith('{"result"'):
                return dict(json.loads(line)["result"])
        return {}


@dataclass
class Home:
    """One isolated flakebot home under `root`, sharing `cache` with the other homes of a report."""

    root: Path
    cache: Path
    marker: str = field(default_factory=lambda: secrets.token_hex(6))

    def __post_init__(self) -> None:
        for sub in ("config", "data", "work"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.cache.mkdir(parents=True, exist_ok=True)

    @property
    def workdir(self) -> Path:
        return self.root / "work"

    @property
    def catalog_dir(self) -> Path:
        return self.root / "data/flakebot"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a flakebot process in this home: no keys, no FLAKEBOT_* from outside, a marker."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKEBOT_") and k not in SCRUBBED}
        env.update(
            XDG_CONFIG_HOME=str(self.root / "config"),
            XDG_DATA_HOME=str(self.root / "data"),
            XDG_CACHE_HOME=str(self.cache),
            FLAKEBOT_WORKDIR=str(self.workdir),
            COLUMNS="400",  # the error line and progress lines are never wrapped
        )
        env.update(extra or {})
        env[MARKER_VAR] = self.marker
        return env

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "flakebot", *args]

    def cli(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 900, input: str | None = None
    ) -> Outcome:
        """Run the real CLI to completion."""
        started = time.monotonic()
        proc = subprocess.run(
            self.argv(*args),
            cwd=self.root,
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
        )
        return Outcome(list(args), proc.returncode, proc.stdout, proc.stderr, round(time.monotonic() - started, 3))

    def popen(self, *args: str, env: dict[str, str] | None = None, log: str = "craft") -> subprocess.Popen[str]:
        """Start the real CLI in its own process group (so it can be killed as a whole); output goes to root/<log>.out and .err."""
        out = open(self.root / f"{log}.out", "w")  # noqa: SIM115 - the child has its own copy; ours is closed below
        err = open(self.root / f"{log}.err", "w")  # noqa: SIM115
        try:
            return subprocess.Popen(
                self.argv(*args),
                cwd=self.root,
                env=self.env(env),
                stdout=out,
                stderr=err,
                text=True,
                start_new_session=True,
            )
        finally:
            out.close()
            err.close()

    def run_ids(self) -> list[str]:
        runs = self.workdir / "runs"
        return sorted(p.name for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []

    def state(self, run_id: str) -> dict[str, Any]:
        return dict(json.loads((self.workdir / "runs" / run_id / "state.json").read_text()))

    def events(self, run_id: str) -> list[dict[str, Any]]:
        path = self.workdir / "runs" / run_id / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []

    def transcript(self, run_id: str) -> list[dict[str, Any]]:
        path = self.workdir / "runs" / run_id / "transcript.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []

    def run_files(self, run_id: str) -> list[str]:
        return sorted(p.name for p in (self.workdir / "runs" / run_id).iterdir())

    def catalog(self) -> dict[str, Any]:
        from flakebot.deliver.catalog import Catalog

        return Catalog(self.catalog_dir).tools()

    def strays(self, wait: float = 3.0) -> list[str]:
        """Processes still running for this home (its marker in their environment, or its root in their command
        line or working directory), given `wait` seconds to end. They are killed, and listed."""
        found: dict[int, str] = {}

        def find() -> list[int]:
            found.clear()
            found.update(processes_of(self.marker, self.root))
            return list(found)

        return [f"{pid} {found[pid]}" for pid in reap(find, wait, interval=0.1)]


def processes_of(marker: str, root: Path) -> dict[int, str]:
    """Live processes (not zombies, not this one) carrying MARKER_VAR=marker or naming `root`: pid -> command line."""
    needle, where = f"{MARKER_VAR}={marker}\0".encode(), str(root)
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().rsplit(") ", 1)[-1][:1] == "Z":
                continue
            cmdline = _cmdline(entry)
            cwd = os.readlink(entry / "cwd")
            ours = needle in (entry / "environ").read_bytes() or where in cmdline or cwd.startswith(where)
        except OSError:
            continue  # exited meanwhile, or not ours to read
        if ours:
            found[int(entry.name)] = cmdline[:160]
    return found


def descendants(pid: int) -> dict[int, str]:
    """Every live descendant of `pid`: pid -> command line (what a process was doing when it was killed)."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            names[int(entry.name)] = _cmdline(entry)
        except OSError:
            continue
        children.setdefault(int(stat.rsplit(") ", 1)[-1].split()[1]), []).append(int(entry.name))
    found: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop(0)
        found[child] = names.get(child, "")
        todo += children.get(child, [])
    return found


def survivors(snapshot: dict[int, str], wait: float = 3.0) -> list[str]:
    """Processes of `snapshot` still running (same pid, same command line) after `wait` seconds; they are killed, and listed."""
    return [f"{pid} {snapshot[pid][:160]}" for pid in reap(lambda: _alive(snapshot), wait, interval=0.1)]


def _alive(snapshot: dict[int, str]) -> list[int]:
    alive = []
    for pid, cmdline in snapshot.items():
        entry = Path(f"/proc/{pid}")
        try:
            if (entry / "stat").read_text().rsplit(") ", 1)[-1][:1] != "Z" and _cmdline(entry) == cmdline:
                alive.append(pid)
        except OSError:
            continue
    return alive


def _cmdline(entry: Path) -> str:
    return (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()


def wait_for(probe: Any, timeout: float, interval: float = 0.005) -> Any:
    """Poll `probe()` until it returns something truthy; None at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(interval)
    return None


def session() -> dict[str, Any]:
    """The recorded csv-dedup session (a fresh copy to modify)."""
    return dict(json.loads(SESSION.read_text()))


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data, indent=1))
    return path
