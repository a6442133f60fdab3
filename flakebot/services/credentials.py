"""Secrets for a service, as systemd's LoadCredential gives them: files in $CREDENTIALS_DIRECTORY, nowhere else.

`up --secret KEY=FILE` records only the file's path. At each start the supervisor reads the file and hands its
bytes to bubblewrap through a pipe (`--ro-bind-data`): bubblewrap writes them into the sandbox's own memory-backed
root, read-only, so no copy exists on disk, in the store, the environment, the catalog or status files, and none
is left behind when the sandbox (or the supervisor) dies. The values are redacted from the service's log.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from flakebot.errors import UsageError

INSIDE = Path("/run/credentials")
KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_BYTES = 60 * 1024  # written into a pipe before bubblewrap starts: it must fit the pipe's buffer (64 KiB)


def parse(specs: list[str], cwd: Path) -> dict[str, str]:
    """`KEY=FILE` pairs as {KEY: absolute FILE}; each file must be a readable regular file of at most 60 KiB."""
    found: dict[str, str] = {}
    for spec in specs:
        key, _, name = spec.partition("=")
        if not KEY.match(key) or not name or key in (".", ".."):
            raise UsageError(f"--secret '{key}=...' is not KEY=FILE", fix="pass --secret api_token=./token.txt")
        path = (cwd / name).resolve()
        if not path.is_file() or path.stat().st_size > MAX_BYTES or not os.access(path, os.R_OK):
            raise UsageError(f"--secret {key}: {name} is not a readable file of at most 60 KiB", fix="check the path")
        found[key] = str(path)
    return found


def values(secrets: dict[str, str]) -> list[str]:
    """The secrets' contents (stripped), for redaction: what the service might print."""
    found = []
    for path in secrets.values():
        try:
            text = Path(path).read_text(errors="replace").strip()
        except OSError:
            continue
        if len(text) >= 4:
            found.append(text)
    return sorted(found, key=len, reverse=True)


def bwrap_args(secrets: dict[str, str]) -> tuple[list[str], list[int]]:
    """bubblewrap arguments putting each secret at /run/credentials/KEY (read-only, memory only), and the pipe
    read ends to pass to it (the caller closes them once bubblewrap has started)."""
    if not secrets:
        return [], []
    args = ["--perms", "0755", "--dir", "/run", "--perms", "0755", "--dir", str(INSIDE)]
    fds: list[int] = []
    for key, path in sorted(secrets.items()):
        data = Path(path).read_bytes()[:MAX_BYTES]
        read_end, write_end = os.pipe()
        try:
            os.write(write_end, data)
        finally:
            os.close(write_end)
        fds.append(read_end)
        args += ["--perms", "0444", "--ro-bind-data", str(read_end), str(INSIDE / key)]
    return args, fds
