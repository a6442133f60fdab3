"""What a service declares beside its program: how it listens, how it is checked, how it stops and restarts."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from flakebot.errors import UsageError
from flakebot.nix.service_outputs import url_variable  # where a dependent finds what it needs: one name for every door
from flakebot.services.layout import NAME, NAME_RULE

MAX_NEEDS = 16  # services one service needs directly
# How its port reaches it: "handoff", flakebot binds the host's port and hands the listening socket in as fd 3
# (systemd's socket activation: LISTEN_FDS, LISTEN_PID; the template takes it); "pasta", it binds its own port in its
# namespace and pasta forwards the host's port there (a program that cannot take a socket; what a declaration from
# before the handoff means).
SOCKET_MODES = ("handoff", "pasta")
PORT_VARIABLE = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")


def _in_range(what: str, value: object, low: float, high: float, fix: str) -> None:
    """One declared number checked where the declaration is made, whichever door made it (CLI, spec, manifest)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{what} {repr(value)[:40]} is not a number", fix=fix)
    if not low <= value <= high:
        raise UsageError(f"{what} {value:g} is out of range ({low:g} to {high:g})", fix=fix)


@dataclass(frozen=True)
class Health:
    """An HTTP GET of `path` that must answer 2xx, or (kind "tcp") a connect that must succeed."""

    kind: str = "http"
    path: str = "/health"

    @classmethod
    def parse(cls, text: str) -> Health:
        """`/health` (an HTTP path) or `tcp`."""
        if text == "tcp":
            return cls("tcp", "")
        if text.startswith("/") and not any(c.isspace() for c in text) and len(text) <= 256:
            return cls("http", text)
        raise UsageError(
            f"health check '{text}' is neither an HTTP path nor 'tcp'", fix="pass --health /health or --health tcp"
        )


@dataclass(frozen=True)
class Restart:
    """Restart after an exit or a failed health check, waiting `backoff_s` doubled each time (at most
    `backoff_max_s`); more than `limit` restarts within `window_s` seconds and the service is failed."""

    limit: int = 5
    window_s: float = 60.0
    backoff_s: float = 0.2
    backoff_max_s: float = 5.0

    def __post_init__(self) -> None:
        _in_range("restart limit", self.limit, 0, 1000, "declare restart.limit between 0 and 1000")
        _in_range("restart window", self.window_s, 1, 86400, "declare restart.window_s between 1 and 86400")
        _in_range("restart backoff", self.backoff_s, 0, 3600, "declare restart.backoff_s between 0 and 3600")
        _in_range("longest backoff", self.backoff_max_s, 0, 3600, "declare restart.backoff_max_s between 0 and 3600")

    def delay(self, recent: int) -> float:
        return float(min(self.backoff_s * 2 ** max(recent - 1, 0), self.backoff_max_s))


@dataclass(frozen=True)
class ServiceSpec:
    """A service's declaration, kept in its manifest (`service`)."""

    port: int = 8080  # where it listens inside its own network namespace
    port_env: str = "PORT"  # the environment variable that tells it so
    health: Health = field(default_factory=Health)
    interval_s: float = 1.0  # between health checks
    check_timeout_s: float = 1.0  # one check's timeout (a hung service fails it)
    failures: int = 3  # consecutive failed checks that make a healthy service unhealthy (then restarted)
    start_s: float = 30.0  # how long a start may take to become healthy
    stop_grace_s: float = 10.0  # SIGTERM to the service, SIGKILL after this
    restart: Restart = field(default_factory=Restart)
    needs: tuple[str, ...] = ()  # services started (healthy) before it, stopped after it; reached at url_variable
    socket: str = "pasta"  # SOCKET_MODES: how the host's port reaches it

    def __post_init__(self) -> None:
        object.__setattr__(self, "needs", checked_needs(self.needs))
        if self.socket not in SOCKET_MODES:
            raise UsageError(
                f"socket {str(self.socket)[:40]!r} is neither of {', '.join(SOCKET_MODES)}",
                fix="pass --socket handoff (it accepts on fd 3 when LISTEN_FDS is set) or --socket pasta",
            )
        if not 1 <= self.port <= 65535:
            raise UsageError(f"port {self.port} is not a TCP port", fix="pass --port between 1 and 65535")
        if not PORT_VARIABLE.match(self.port_env):
            raise UsageError(
                f"port variable '{self.port_env}' is not an upper-case environment variable name",
                fix="pass --port-env PORT (or the variable the service reads)",
            )
        if not 0 < self.start_s <= 3600:
            raise UsageError(f"start timeout {self.start_s:g} s is out of range", fix="pass --start-timeout 1..3600")
        if self.port_env in ("STATE_DIRECTORY", "PATH", "HOME", "LISTEN_ADDRESS", "CREDENTIALS_DIRECTORY"):
            raise UsageError(f"port variable '{self.port_env}' is taken", fix="pass --port-env PORT")
        _in_range("stop grace", self.stop_grace_s, 0, 3600, "pass --stop-grace SECONDS between 0 and 3600")
        _in_range("health check interval", self.interval_s, 0.05, 3600, "declare interval_s between 0.05 and 3600")
        _in_range(
            "health check timeout", self.check_timeout_s, 0.05, 600, "declare check_timeout_s between 0.05 and 600"
        )
        _in_range("failed checks", self.failures, 1, 100, "declare failures between 1 and 100")

    def to_dict(self) -> dict[str, Any]:
        found = asdict(self)
        found["needs"] = list(self.needs)
        return found

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServiceSpec:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k not in ("health", "restart")}
        health = data.get("health", {})
        return cls(
            **known,
            # as written by hand ("/health" or "tcp", as --health takes it) or as to_dict() writes it
            health=Health.parse(health) if isinstance(health, str) else Health(**health),
            restart=Restart(**data.get("restart", {})),
        )


def reach_environment(reach: dict[str, int]) -> dict[str, str]:
    """FLAKEBOT_<NAME>_URL for each needed service (`reach`: name -> its port, the same number inside the
    dependent's namespace as on the host)."""
    return {url_variable(name): f"http://127.0.0.1:{port}" for name, port in reach.items()}


def checked_needs(needs: Any) -> tuple[str, ...]:
    """A declaration's `needs`: a list of service names, each once, whose variables differ (a-b and a_b do not)."""
    fix = f"declare needs as a list of service names ({NAME_RULE}), each once, at most {MAX_NEEDS}"
    if isinstance(needs, str) or not isinstance(needs, (list, tuple)):
        raise UsageError(f"needs {repr(needs)[:60]} is not a list of service names", fix=fix)
    if len(needs) > MAX_NEEDS:
        raise UsageError(f"{len(needs)} services needed (at most {MAX_NEEDS})", fix=fix)
    seen: dict[str, str] = {}
    for name in needs:
        if not isinstance(name, str) or not NAME.match(name):
            raise UsageError(f"needs {repr(name)[:70]}: not a service name", fix=fix)
        if url_variable(name) in seen:
            twice = (
                f"{name!r} twice" if seen[url_variable(name)] == name else f"{seen[url_variable(name)]!r} and {name!r}"
            )
            raise UsageError(f"needs {twice}: one {url_variable(name)} for both", fix=fix)
        seen[url_variable(name)] = name
    return tuple(needs)
