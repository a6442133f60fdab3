"""The audit of team mode: one JSON line per call, appended, never rewritten.

A record names who called (principal, its id, tenant), what (the MCP method, the tool), a SHA-256 of the arguments
as canonical JSON (equal arguments give equal digests, so repeats can be found; the text never reaches the file: a
need may hold what its author would not log), the outcome (ok, error, refused, or cancelled: its client went away
before the answer; and a tool's exit code) and the duration. The file is the workdir's team/audit.jsonl, mode 0600;
each record is one write() of one line to a file opened with O_APPEND, so lines from concurrent calls never
interleave.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from flakebot.team.metrics import TOOL_NAME
from flakebot.team.tokens import Principal, team_dir

FORMAT = 1


def audit_path(workdir: Path) -> Path:
    return team_dir(workdir) / "audit.jsonl"


def digest(arguments: Any) -> str:
    """The arguments' SHA-256 as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def tool_named(name: str | None) -> str | None:
    """A call's tool as recorded: its name when it has a tool name's shape, else the name's SHA-256 (a caller's
    made-up name may be megabytes, and may hold what the arguments' digest keeps out of the file)."""
    if name is None or TOOL_NAME.fullmatch(name):
        return name
    return "sha256:" + hashlib.sha256(name.encode(errors="surrogatepass")).hexdigest()


class Audit:
    """Appends the records of one workdir's audit."""

    def __init__(self, workdir: Path) -> None:
        self.path = audit_path(workdir)

    def record(
        self,
        principal: Principal,
        method: str,
        *,
        tool: str | None = None,
        arguments: Any = None,
        outcome: str = "ok",
        exit_code: int | None = None,
        seconds: float = 0.0,
    ) -> None:
        line = {
            "format": FORMAT,
            "time": round(time.time(), 3),
            "principal": principal.name,
            "principal_id": principal.id,
            "tenant": principal.tenant,
            "method": method,
            "tool": tool_named(tool),
            "arguments_sha256": None if arguments is None else digest(arguments),
            "outcome": outcome,
            "exit_code": exit_code,
            "ms": round(seconds * 1000, 1),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())
        finally:
            os.close(fd)


def read(workdir: Path, principal: str | None = None, since: float | None = None) -> list[dict[str, Any]]:
    """The audit's records, oldest first, of one principal and from a time on when given. `principal`: a static
    token's name (a JWT's subject may be any text, 'alice' too: its records are not that token's), or any
    principal's id as its records show it (a JWT user's: jwt-...)."""
    from flakebot.team.idtokens import ID_PREFIX

    try:
        text = audit_path(workdir).read_text()
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line cut by a full disk: the others still count
            continue
        if principal is not None and record.get("principal_id") != principal:
            by_name = record.get("principal") == principal and not str(record.get("principal_id")).startswith(ID_PREFIX)
            if not by_name:
                continue
        if since is not None and float(record.get("time", 0)) < since:
            continue
        records.append(record)
    return records
