"""A service's whole lifecycle, checked before it is catalogued: start on a free port, wait for health, run the
request/response examples (status, named headers, body), SIGTERM and expect a clean exit (code 0) within the grace period, start again on the
same state directory and run the examples that must survive a restart.

It runs the built program exactly as `flakebot up` will (the supervisor's own start and stop: bubblewrap, its own
network namespace, its socket handed in or pasta), on a scratch state directory. A service without its health endpoint, one that ignores
SIGTERM and one that loses its state all fail here.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flakebot.config import Settings
from flakebot.errors import FlakebotError, UnsafePath, UsageError
from flakebot.modeltext import output_quoted
from flakebot.safefs import Budget, copy_tree
from flakebot.services import envelope, forward, health
from flakebot.services.declaration import ServiceSpec
from flakebot.services.layout import ServiceDir
from flakebot.services.logfile import tail
from flakebot.services.supervisor import Started, Supervisor

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)

METHODS = ("GET", "PUT", "POST", "DELETE")
MAX_ANSWER = 1024 * 1024  # bytes of one answer read at most
FIELDS = ("method", "path", "body", "status", "body_out", "headers", "headers_out")
TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110's field name
MAX_HEADERS = 8  # per request and per expected answer
MAX_HEADER_NAME, MAX_HEADER_VALUE = 64, 1024
# set by the frozen test and by flakebot's check themselves: an example saying otherwise would be ignored or
# would break the request
OWN_HEADERS = ("host", "content-length", "connection", "transfer-encoding")
HEADERS_FIX = (
    "give headers as {NAME: VALUE}: NAME an HTTP token (letters, digits, !#$%&'*+-.^_`|~, up to "
    f"{MAX_HEADER_NAME}), VALUE printable ASCII without CR/LF or leading/trailing spaces (up to {MAX_HEADER_VALUE}), "
    f"at most {MAX_HEADERS}, each name once"
)


@dataclass(frozen=True)
class Exchange:
    """One request and what must come back: the status; the body exactly when `body_out` is given; each header of
    `headers_out` (its name in any case, its value exactly; other headers may come too)."""

    method: str
    path: str
    body: str = ""
    status: int = 200
    body_out: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    """request headers to send, {NAME: VALUE}"""
    headers_out: dict[str, str] = field(default_factory=dict)
    """headers the answer must carry, {NAME: VALUE}: the name in any case, the value EXACTLY (e.g. Location, Content-Type)"""

    def __post_init__(self) -> None:
        if self.method not in METHODS or not isinstance(self.path, str) or not self.path.startswith("/"):
            raise UsageError(f"example {self.method} {self.path} is not a request", fix="use GET|PUT|POST|DELETE /path")
        if isinstance(self.status, bool) or not isinstance(self.status, int) or not 100 <= self.status <= 599:
            raise UsageError(f"example {self.method} {self.path}: status {self.status!r}", fix="give a status 100-599")
        for part in ("headers", "headers_out"):
            problem = header_problem(getattr(self, part), sent=part == "headers")
            if problem:
                raise UsageError(f"example {self.method} {self.path}: {part} {problem}", fix=HEADERS_FIX)

    @classmethod
    def from_dict(cls, data: Any) -> Exchange:
        """One example as a spec or a record keeps it (a record from before headers has none: no headers)."""
        if not isinstance(data, dict):
            raise UsageError(
                f"an example must be an object, got {type(data).__name__}", fix=f"give {{{', '.join(FIELDS)}}}"
            )
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise UsageError(
                f"example {data.get('method')} {data.get('path')}: unknown field {', '.join(map(repr, unknown))}",
                fix=f"an example has only {', '.join(FIELDS)}",
            )
        # a model's strict-mode call sends null for a field it leaves out: the field's default
        data = {k: v for k, v in data.items() if v is not None or k == "body_out"}
        missing = [name for name in ("method", "path") if name not in data]
        if missing:
            raise UsageError(f"an example has no {' or '.join(missing)}", fix="give method and path: GET /path")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """As a record keeps it: headers only when given, so a record without them reads as it did before them."""
        return {k: v for k, v in asdict(self).items() if v or k not in ("headers", "headers_out")}


def header_problem(headers: Any, *, sent: bool) -> str:
    """Why `headers` cannot be an example's headers ('' when they can): tokens for names, one line each for values."""
    if not isinstance(headers, dict):
        return f"must be an object {{NAME: VALUE}}, got {type(headers).__name__}"
    if len(headers) > MAX_HEADERS:
        return f"has {len(headers)} headers (at most {MAX_HEADERS})"
    seen: set[str] = set()
    for name, value in headers.items():
        if not isinstance(name, str) or not TOKEN.match(name) or len(name) > MAX_HEADER_NAME:
            return f"name {str(name)[:80]!r} is not an HTTP token of at most {MAX_HEADER_NAME} characters"
        if name.lower() in seen:
            return f"name {name!r} is given twice"
        seen.add(name.lower())
        if sent and name.lower() in OWN_HEADERS:
            return f"{name!r} is set by the check itself"
        if not isinstance(value, str):
            return f"{name}: the value must be a string, got {type(value).__name__}"
        if "\r" in value or "\n" in value:
            return f"{name}: the value holds CR or LF"
        if len(value) > MAX_HEADER_VALUE or value != value.strip() or not all(" " <= ch <= "~" for ch in value):
            return f"{name}: the value {value[:80]!r} is not printable ASCII of at most {MAX_HEADER_VALUE} without leading or trailing spaces"
    return ""


@dataclass(frozen=True)
class Examples:
    """What to ask the service after its first start, and after a SIGTERM and a second start (state kept)."""

    first: list[Exchange] = field(default_factory=list)
    after_restart: list[Exchange] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> Examples:
        """A JSON file {"first": [EXCHANGE...], "after_restart": [...]}, each {method, path, body, status, body_out,
        headers, headers_out}."""
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"examples file {path} is unreadable ({exc})", fix="see docs/services.md") from None
        except RecursionError:  # json's decoder recurses per level
            raise UsageError(f"examples file {path} is nested too deeply to read", fix="see docs/services.md") from None
        if not isinstance(data, dict):
            raise UsageError(f"examples file {path} is not a JSON object", fix="see docs/services.md")
        try:
            return cls.from_dict(data)
        except UsageError as exc:
            raise UsageError(f"examples file {path}: {exc.message}", fix=exc.fix) from None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Examples:
        """As a spec or a service's manifest keeps them (`examples`, `lifecycle_examples`)."""
        lives = [data.get(part) or [] for part in ("first", "after_restart")]
        if not all(isinstance(life, list) for life in lives):
            raise UsageError("first and after_restart must be lists of examples", fix="see docs/services.md")
        return cls(*([Exchange.from_dict(e) for e in life] for life in lives))

    def to_dict(self) -> dict[str, Any]:
        return {"first": [e.to_dict() for e in self.first], "after_restart": [e.to_dict() for e in self.after_restart]}


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
        try:
            _ = _one_life(supervisor, report, "first start", examples.first) and _one_life(
                supervisor, report, "second start", examples.after_restart
            )
        finally:
            supervisor.close()  # a handed-in socket: held across both starts, as `up` holds it across restarts
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
        problem = health.check(spec.health, supervisor.port, spec.check_timeout_s, supervisor.listener)
        if not problem:
            return ""
        time.sleep(0.05)
    return f"not healthy within {spec.start_s:g} s ({problem})"


def _ask(port: int, exchange: Exchange) -> str:
    """'' when the service answers `exchange` as expected, else what it answered."""
    import httpx  # here, not at the top: `up` imports this module and never asks (httpx is 0.1-0.2 s of start-up)

    body = b""
    try:
        with httpx.Client(trust_env=False, timeout=5) as http:
            url = f"http://127.0.0.1:{port}{exchange.path}"
            with http.stream(exchange.method, url, content=exchange.body, headers=exchange.headers) as answer:
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
    return header_mismatch(answer.headers, exchange.headers_out)


def header_mismatch(got: httpx.Headers, expected: dict[str, str]) -> str:
    """'' when the answer carries every expected header (name in any case, one of its values exactly), else the
    first that is missing or differs."""
    for name, value in expected.items():
        values = got.get_list(name)  # httpx.Headers: names compared case-insensitively
        if value not in values:
            seen = ", ".join(repr(v[:200]) for v in values) if values else "none"
            return f"header {name}: {seen}, expected {value!r}"
    return ""
