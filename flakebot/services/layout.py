"""A service's files under the workdir (services/NAME/): what survives restarts, what says how it runs."""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flakebot.errors import UsageError
from flakebot.fsutil import atomic_write_json

if TYPE_CHECKING:  # a type only: the supervisor imports this module, never config (benchmarks S5: its memory)
    from flakebot.config import Settings

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
NAME_RULE = "lower-case letters, digits, '-' and '_', at most 64"


def checked_name(name: str, *, fix: str = "use the catalogued name, e.g. kv-service") -> str:
    """`name` when it can name a service (its directory, its unit), else one line saying so (the name cut short)."""
    if not NAME.match(name):
        shown = name if len(name) <= 64 else name[:64] + "..."
        raise UsageError(f"'{shown}' is not a service name ({NAME_RULE})", fix=fix)
    return name


@dataclass(frozen=True)
class ServiceDir:
    """services/NAME/: state/ (the service's STATE_DIRECTORY, kept across restarts, stops and versions),
    service.log (+ .1), supervisor.log, launch.json (what `up` asked), status.json (what the supervisor says)."""

    root: Path

    @classmethod
    def of(cls, name: str, settings: Settings) -> ServiceDir:
        return cls(settings.path("workdir") / "services" / checked_name(name))

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def log(self) -> Path:
        return self.root / "service.log"

    @property
    def supervisor_log(self) -> Path:
        return self.root / "supervisor.log"

    @property
    def handover(self) -> Path:
        """Where its supervisor gives a copy of the service's listening socket to the next one (handoff.py)."""
        return self.root / "handover.sock"

    @property
    def launch_file(self) -> Path:
        return self.root / "launch.json"

    @property
    def status_file(self) -> Path:
        return self.root / "status.json"

    def read_json(self, path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def status(self) -> dict[str, Any]:
        return self.read_json(self.status_file)

    def write_status(self, status: dict[str, Any]) -> None:
        atomic_write_json(self.status_file, status)

    def supervisor_alive(self) -> bool:
        """Whether a supervisor holds this service's lock (a flock dies with its process: no stale pid files)."""
        try:
            fd = os.open(self.root / "supervisor.lock", os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def hold_supervisor_lock(self) -> int:
        """Take the lock for this process's life (the supervisor); its fd is not inherited by what it starts."""
        fd = os.open(self.root / "supervisor.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd

    @contextmanager
    def control_lock(self) -> Iterator[None]:
        """Serialize `up` and `down` of one service."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "control.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield


def all_service_dirs(settings: Settings) -> list[ServiceDir]:
    root = settings.path("workdir") / "services"
    return [ServiceDir(p) for p in sorted(root.iterdir()) if p.is_dir()] if root.is_dir() else []
