"""transcript.jsonl: every model request and reply, every tool call, one versioned JSON line each."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from flakebot.redact import redact, redact_text, secret_values

TRANSCRIPT_FORMAT = 1


class Transcript:
    """Appends records to a run's transcript.jsonl, secrets redacted."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def record(self, kind: str, **data: Any) -> None:
        """Append one line: {"format", "time", "kind", **data}; keys and Authorization headers are redacted."""
        secrets = secret_values()
        entry: dict[str, Any] = {"format": TRANSCRIPT_FORMAT, "time": round(time.time(), 3), "kind": kind}
        # the header always wins
        entry.update((key, value) for key, value in redact(data, secrets).items() if key not in entry)
        # A second pass over the encoded line catches secrets split by JSON escaping of the first.
        line = redact_text(json.dumps(entry, default=str, ensure_ascii=False), secrets)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")

    def read(self) -> list[dict[str, Any]]:
        """Every record so far (an absent file is an empty transcript)."""
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]
