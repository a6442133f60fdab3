"""A service's whole lifecycle, checked before it is catalogued: start on a free port, wait for health, run the
request/response examples, SIGTERM and expect a clean exit (code 0) within the grace period, start again on the
same state directory and run the examples that must survive a restart.

It runs the built program exactly as `flakebot up` will (the supervisor's own start and stop: bubblewrap, its own
network namespace, pasta), on a scratch state directory. A service without its health endpoint, one that ignores
SIGTERM and one that loses its state all fail here.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from flakebot.config import Settings
from flakebot.errors import FlakebotError, UnsafePath, UsageError
from flakebot.modeltext import output_quoted
from flakebot.safefs import Budget, copy_tree
from flakebot.services import envelope, forward, health
from flakebot.services.declaration import ServiceSpec
from flakebot.services.layout import ServiceDir
from flakebot.services.logfile import tail
from flakebot.services.supervisor import Started, Supervisor

logger = logging.getLogger(__name__)

METHODS = ("GET", "PUT", "POST", "DELETE")
MAX_ANSWER = 1024 * 1024  # bytes of one answer read at most


@dataclass(frozen=True)
class Exchange:
    """One request and what must come back: the status, and the body exactly when `body_out` is given."""

    method: str
    path: str
    body: str = ""
    status: int = 200
    body_out: str | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS or not self.path.startswith("/"):
            raise UsageError(f"example {self.method} {self.path} is not a request", fix="use GET|PUT|POST|DELETE /path")


@dataclass(frozen=True)
class Examples:
    """What to ask the service after its first start, and after a SIGTERM and a second start (state kept)."""

    first: list[Exchange] = field(default_factory=list)
    after_restart: list[Exchange] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> Examples:
        """A JSON file {"first": [EXCHANGE...], "after_restart": [...]}, each {method, path, body, status, body_out}."""
        try:
            data = json.loads(path.read_text())
            return cls(
                [Exchange(**e) for e in data.get("first", [])], [Exchange(**e) for e in data.get("after_restart", [])]
            )
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise UsageError(f"examples file {path} is unreadable ({exc})", fix="see docs/services.md") from None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Examples:
        """As kept in a service's manifest (`examples`)."""
        return cls(
            [Exchange(**e) for e in data.get("first", [])], [Exchange(**e) for e in data.get("after_restart", [])]
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    ok: bool = True
    steps: list[dict[str, Any]] = field(default_factory=list)
    log_tail: list[str] = field(default_factory=list)

    def step(self, name: str, problem: str = "", seconds: float = 0.0) -> bool:
        self.steps.append({"step": name, "ok": not problem, "problem": problem, "seconds": round(seconds, 3)})
        self.ok = self.ok and not problem
        return not problem

    def first_problem(self) -> str:
        return next((f"{s['step']}: {s['problem']}" for s in self.steps if s["problem"]), "")

    def last_output(self) -> str:
        """The service's last lines, quoted as its words, for an error's fix."""
        return output_quoted(self.log_tail[-5:])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_lifecycle(
    binary: Path,
    spec: ServiceSpec,
    settings: Settings,
    examples: Examples | None = None,
    *,
    seed: Path | None = None,
    secrets: dict[str, str] | None = None,
    network: bool = False,
) -> Report:
    """Run the lifecycle of `binary` on a scratch state directory; a Report of each step (stops at the first failure).
    `seed`: a state directory copied into the scratch one first (an upgrade is checked on a copy of the live state,
    never on the state itself); `secrets` (KEY -> file path) as `up --secret` gives them; `network` as `up --network`
    (an upgrade of a service that has it)."""
    examples = examples or Examples()
    report = Report()
    limits = envelope.launch_limits(settings)
    scratch_root = settings.path("workdir") / "lifecycle"  # flakebot's own disk, not the host's /tmp
    scratch_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="check-", dir=scratch_root) as scratch:
        where = ServiceDir(Path(scratch) / "service")
        where.root.mkdir()
        copied = seed is None or report.step("copy of the state", _copy_state(seed, where.state, limits["disk_mb"]))
        if not copied:
            return report
        launch = {
            "binary": str(binary), "spec": spec.to_dict(), "host_port": forward.free_port(),
            "sandbox": settings.sandbox, "limits": limits,
            "secrets": secrets or {}, "network": network,
        }  # fmt: skip
        supervisor = Supervisor(where, launch)
        _ = _one_life(supervisor, report, "first start", examples.first) and _one_life(
            supervisor, report, "second start", examples.after_restart
        )
        report.log_tail = tail(where.log, 20)
    return report


def _copy_state(seed: Path, to: Path, disk_mb: int) -> str:
    """Copy state directory `seed` to `to` ('' when done, else why not) through safefs: the running service writes
    `seed`, so nothing in it is followed (a directory it swaps for a link to a host directory mid-copy ends the copy
    instead of copying host files for the checked version to read), links stay links, files lose set-id bits, and
    sockets and FIFOs (a running service's, not its state) are left out. A copy the service's own writes disturbed
    is tried again once. Bounded by the service's disk quota (`disk_mb`): sparse files stay sparse, hard links stay
    hard links, and a state whose data passes the quota is refused (before the copy when measured over it)."""
    if over := envelope.over_quota(seed, disk_mb):
        return over
    problem = ""
    for _ in range(2):
        shutil.rmtree(to, ignore_errors=True)
        try:
            copy_tree(seed, to, budget=Budget(disk_mb * envelope.MIB, "the copy of the state"))
            return ""
        except (UnsafePath, OSError) as exc:
            problem = f"{type(exc).__name__}: {exc}"[:300]
    shutil.rmtree(to, ignore_errors=True)
    return problem


def _one_life(supervisor: Supervisor, report: Report, name: str, exchanges: list[Exchange]) -> bool:
    """Start, wait for health, run `exchanges`, SIGTERM: False at the first failed step."""
    begun = time.monotonic()
    try:
        started = supervisor.start()
    except (FlakebotError, OSError) as exc:
        return report.step(f"{name}: start", f"{type(exc).__name__}: {exc}")
    try:
        problem = _wait_healthy(supervisor, started)
        if not report.step(f"{name}: healthy", problem, time.monotonic() - begun):
            return False
        for exchange in exchanges:
            if not report.step(f"{name}: {exchange.method} {exchange.path}", _ask(supervisor.port, exchange)):
                return False
    finally:
        stopping = time.monotonic()
        supervisor.stop(started)
    code = started.bwrap.returncode
    problem = "" if code == 0 else f"exit code {code} (not 0 within {supervisor.spec.stop_grace_s:g} s of SIGTERM)"
    return report.step(f"{name}: SIGTERM, clean exit", problem, time.monotonic() - stopping)


def _wait_healthy(supervisor: Supervisor, started: Started) -> str:
    spec = supervisor.spec
    end = time.monotonic() + spec.start_s
    problem = "never checked"
    while time.monotonic() < end:
        if started.bwrap.poll() is not None:
            return f"the service exited with code {started.bwrap.returncode} before it was healthy"
        problem = health.check(spec.health, supervisor.port, spec.check_timeout_s)
        if not problem:
            return ""
        time.sleep(0.05)
    return f"not healthy within {spec.start_s:g} s ({problem})"


def _ask(port: int, exchange: Exchange) -> str:
    """'' when the service answers `exchange` as expected, else what it answered."""
    body = b""
    try:
        with httpx.Client(trust_env=False, timeout=5) as http:
            url = f"http://127.0.0.1:{port}{exchange.path}"
            with http.stream(exchange.method, url, content=exchange.body) as answer:
                for chunk in answer.iter_bytes():
                    body += chunk
                    if len(body) > MAX_ANSWER:  # the service is model-written: it may answer without end
                        return f"answer over {MAX_ANSWER // 1024} KiB"
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    if answer.status_code != exchange.status:
        return f"status {answer.status_code}, expected {exchange.status}"
    text = body.decode("utf-8", "replace")
    if exchange.body_out is not None and text != exchange.body_out:
        return f"body {text[:200]!r}, expected {exchange.body_out[:200]!r}"
    return ""
