"""A file rewritten often (a run's state.json at every edit-loop step) written on a thread of its own.

Each write is atomic_write_text's (its bytes synced, its rename not): the fsync, milliseconds on a busy disk, no
longer holds up the caller's next step. Only the latest text counts: one not yet written when a newer one comes is
never written. Every write of a path goes through its one LatestWrite (`put`), and `flush()` waits for what was handed
over, so a synchronous write after it is never overwritten by an older one; the thread is not a daemon, so a process
that exits normally writes its last checkpoint first.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from flakebot.fsutil import atomic_write_text

logger = logging.getLogger(__name__)


class LatestWrite:
    """The latest text handed to `put` written to `path` on a thread, one write at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._changed = threading.Condition()
        self._pending: str | None = None
        self._writing = False
        self._error: Exception | None = None

    def put(self, text: str) -> None:
        """Write `text` soon (replacing a text handed over and not yet written); an earlier write's error is raised."""
        with self._changed:
            self._raise_error()
            self._pending = text
            if not self._writing:
                self._writing = True
                try:
                    threading.Thread(target=self._write, name="checkpoint", daemon=False).start()
                except RuntimeError:  # no thread to be had (the uid's process limit, memory): written here, at once
                    logger.warning("no thread for %s: written at once", self.path)
                    self._write()  # ends _writing (else no save nor load of the run would ever return)
                    self._raise_error()

    def flush(self) -> None:
        """Until every text handed over is written (or failed: its error is raised)."""
        with self._changed:
            while self._writing:
                self._changed.wait()
            self._raise_error()

    @property
    def busy(self) -> bool:
        return self._writing

    def _write(self) -> None:
        while True:
            with self._changed:
                text, self._pending = self._pending, None
                if text is None:
                    self._writing = False
                    self._changed.notify_all()
                    return
            try:
                # never makes the directory again: a run removed meanwhile (clean) stays removed
                atomic_write_text(self.path, text, durable=False, parents=False)
            except FileNotFoundError:
                logger.debug("%s: its directory is gone, not written", self.path)
            except Exception as exc:  # a full disk: the caller's next put or flush raises it (the thread goes on)
                logger.warning("could not write %s: %s", self.path, exc)
                with self._changed:
                    self._error = exc

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error


_WRITERS: dict[Path, LatestWrite] = {}  # the paths with a write handed over and not yet flushed
_WRITERS_LOCK = threading.Lock()


def put(path: Path, text: str) -> None:
    """Write `text` to `path` on the path's thread (LatestWrite.put): the one writer of `path` in this process."""
    key = Path(path).absolute()
    with _WRITERS_LOCK:
        writer = _WRITERS.setdefault(key, LatestWrite(key))
        writer.put(text)


def flush(path: Path) -> None:
    """Until what was handed over for `path` is written: a write after this is never overwritten by an older one."""
    key = Path(path).absolute()
    with _WRITERS_LOCK:
        writer = _WRITERS.get(key)
    if writer is None:
        return
    writer.flush()
    with _WRITERS_LOCK:
        if _WRITERS.get(key) is writer and not writer.busy:
            del _WRITERS[key]  # a run's path is not kept for the process's life (a worker runs many)
