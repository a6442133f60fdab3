"""`flakebot --help` answered from the text typer printed for it last time, without importing typer and rich (0.2 s of
imports against 0.02 s for the bare interpreter; an agent reads the help to learn the tool).

Typer stays the source of truth: the help is served only when a run of typer with the same inputs printed it, and
stored (when it exited 0) under a digest of everything its text depends on: flakebot's version and the sources of
the package (the command table is read from them), typer's and rich's installed files, and what decides how rich
lays it out (the terminal size rich finds on the standard streams, the environment variables rich and typer read).
Only output that is not a terminal is served or stored: a terminal gets colours and is left to typer every time.
The digest alone is kept, never the environment; a setting that may hold a secret enters it only as set or not.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flakebot import __version__, config
from flakebot.errors import FlakebotError

logger = logging.getLogger(__name__)

CACHE_FILE = "cli-help.json"
HELP_ARGV = (["--help"], ["-h"])
# What rich and typer read from the environment when they lay out help (rich.console, typer.rich_utils, typer.core).
LAYOUT_VARIABLES = (
    "COLUMNS", "LINES", "JUPYTER_COLUMNS", "JUPYTER_LINES", "NO_COLOR", "FORCE_COLOR", "PY_COLORS", "GITHUB_ACTIONS",
    "TTY_COMPATIBLE", "TTY_INTERACTIVE", "TERM", "COLORTERM", "TERMINAL_WIDTH", "TYPER_USE_RICH",
)  # fmt: skip
PREFIXES = ("_TYPER", "TYPER_", "FLAKEBOT_")  # typer's own switches; flakebot's settings by environment
# Settings that may hold a secret (FLAKEBOT_DATABASE_URL's password, a key or token): no help prints them, so only
# whether they are set goes into the digest, never their value (a digest of a weak password can be guessed back).
SECRET_PARTS = ("URL", "KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")


def serve(argv: list[str]) -> bool:
    """Write the stored help for `argv` to standard output; False when there is none to serve (typer prints it)."""
    if argv not in HELP_ARGV or _terminal():
        return False
    path = _cache_path()
    if path is None:
        return False
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    text = record.get(_key(argv)) if isinstance(record, dict) else None
    if not isinstance(text, str):
        return False
    sys.stdout.write(text)
    sys.stdout.flush()
    return True


@contextmanager
def recording(argv: list[str]) -> Iterator[None]:
    """Around typer's run of `argv`: what it printed, stored as `argv`'s help when it was a help request printed to
    something other than a terminal and typer exited 0."""
    if argv not in HELP_ARGV or _terminal():
        yield
        return
    real = sys.stdout
    tee = _Tee(real)
    sys.stdout = tee  # rich writes to sys.stdout as it finds it when printing
    try:
        yield
    except SystemExit as exc:
        if exc.code in (0, None):
            _store(argv, tee.copy.getvalue())
        raise
    finally:
        sys.stdout = real


class _Tee(io.TextIOBase):
    """Standard output that keeps a copy of what is written to it."""

    def __init__(self, real: Any) -> None:
        super().__init__()
        self.real, self.copy = real, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return int(self.real.write(text))

    def flush(self) -> None:
        self.real.flush()

    def isatty(self) -> bool:
        return bool(self.real.isatty())

    def fileno(self) -> int:
        return int(self.real.fileno())

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(self.real.encoding)


def _store(argv: list[str], text: str) -> None:
    path = _cache_path()
    if path is None or not text:
        return
    try:
        from flakebot.fsutil import atomic_write_text

        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({_key(argv): text}) + "\n")  # one layout kept: the last one asked
    except OSError as exc:
        logger.debug("could not store the help in %s: %s", path, exc)


def _terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return True


def _cache_path() -> Path | None:
    try:
        return config.load().path("cache_dir") / CACHE_FILE
    except FlakebotError as exc:  # a bad config file: typer's run reports it as always
        logger.debug("no help cache: %s", exc)
        return None


def _key(argv: list[str]) -> str:
    """The digest of everything the help's text depends on (the module's docstring lists it)."""
    import importlib.util

    digest = hashlib.sha256(json.dumps([__version__, argv, sys.version]).encode())
    package = Path(__file__).parent.parent
    for source in sorted(package.rglob("*.py")):
        stat = source.stat()
        digest.update(f"{source.relative_to(package)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    for name in ("typer", "rich", "click"):
        spec = importlib.util.find_spec(name)  # found, not imported
        origin = Path(spec.origin) if spec is not None and spec.origin else None
        digest.update(f"{name}:{origin}:{origin.stat().st_mtime_ns if origin else ''}\n".encode())
    for fd in (0, 1, 2):  # rich takes the first standard stream that is a terminal for its size
        try:
            digest.update(f"size:{tuple(os.get_terminal_size(fd))}\n".encode())
            break
        except (OSError, ValueError):
            continue
    layout = {
        k: "(set)" if any(part in k for part in SECRET_PARTS) else v
        for k, v in os.environ.items()
        if k in LAYOUT_VARIABLES or k.startswith(PREFIXES)
    }
    digest.update(json.dumps(sorted(layout.items())).encode())
    return digest.hexdigest()
