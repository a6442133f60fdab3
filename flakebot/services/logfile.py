"""A service's output as a log file: line by line, redacted, rotated at a size limit (one older file kept).

Each line is stamped with the UTC time; the service's own lines carry SERVICE_MARK after the stamp and the
supervisor's notes ("flakebot: ...") do not, so a service that prints `flakebot: stopped` never reads as the
supervisor. The file keeps what the service printed; every reader shows it through `lines_of` (split at newlines
only, each line through flakebot.modeltext.others_line: no escape, bell or carriage return reaches a terminal or an
agent)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from flakebot.modeltext import others_line
from flakebot.redact import redact_text, secret_values

MAX_LOG_BYTES = 1024 * 1024
MAX_LINE = 8192  # a line longer than this is cut: one endless line must not hold the rest back
logger = logging.getLogger(__name__)

SERVICE_MARK = "| "  # after the stamp: the line is the service's output, not the supervisor's note


class LogFile:
    """Appends complete lines to `path`, each redacted and stamped with the UTC time; past `limit` bytes the file becomes path.1."""

    def __init__(self, path: Path, limit: int = MAX_LOG_BYTES, secrets: list[str] | None = None) -> None:
        self.path = path
        self.limit = limit
        self.secrets = sorted({*(secrets or []), *secret_values()}, key=len, reverse=True)  # the service's own too
        self.pending = b""
        self.dropped = 0  # lines a full (or failing) disk took: said in the log once it takes lines again

    def feed(self, data: bytes) -> None:
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        if len(self.pending) > MAX_LINE:
            lines.append(self.pending[:MAX_LINE] + b" [line cut]")
            self.pending = b""
        for line in lines:
            self.write(SERVICE_MARK + line.decode("utf-8", "replace")[:MAX_LINE])

    def flush(self) -> None:
        if self.pending:
            self.write(SERVICE_MARK + self.pending.decode("utf-8", "replace"))
            self.pending = b""

    def write(self, line: str) -> None:
        """Append `line`; a disk that refuses it (full, over quota, read-only) costs the line, never the caller: the
        supervisor and its service outlive a full disk, and the log says how many lines it lost."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime())
        text = stamp + redact_text(line, self.secrets) + "\n"
        if self.dropped:
            text = f"{stamp}flakebot: {self.dropped} log line(s) lost: the disk refused them\n{text}"
        try:
            if self.path.exists() and self.path.stat().st_size + len(text) > self.limit:
                self.path.replace(self.path.with_name(self.path.name + ".1"))
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(text)
        except OSError as exc:
            if not self.dropped:
                logger.warning("%s refused a line (%s): lines are dropped until it takes them", self.path, exc.strerror)
            self.dropped += 1
            return
        self.dropped = 0


def tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of the log (and of its rotated part when the current one is short)."""
    older = path.with_name(path.name + ".1")
    found = lines_of(b"".join(p.read_bytes() for p in (older, path) if p.exists()))
    return found[-lines:] if lines else found


def lines_of(data: bytes) -> list[str]:
    """The log's bytes as lines to show (split at newlines only; controls out, modeltext.others_line)."""
    text = data.decode("utf-8", "replace")
    return [others_line(line) for line in text.removesuffix("\n").split("\n")] if text else []
