"""A GitHub REST stand-in on 127.0.0.1 (port 0) for the fork and delete endpoints, behaving as GitHub does.

    POST   /repos/{owner}/{repo}/forks   202 + the fork's JSON; the copy happens later
    GET    /repos/{fork}/commits         409 "Git Repository is empty." for `not_ready_polls` polls, then the
                                         fork's bare repository appears on disk (served by git daemon) and 200
    DELETE /repos/{fork}                 204 (the repository is removed), or 403 without the delete_repo scope

Any other token than the configured one gets 401. Every request is recorded (method, path, auth ok).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from flakebot.loopback import LoopbackServer


@dataclass
class ForkState:
    source: Path
    path: Path
    polls: int = 0


@dataclass
class Request:
    method: str
    path: str
    authorized: bool
    headers: dict[str, str] = field(default_factory=dict)


class GitHubStub:
    """Forks of `upstream` repos (full name -> bare repo path) are created under `forks_dir`/<owner>/<repo>.git."""

    def __init__(
        self,
        upstream: dict[str, Path],
        forks_dir: Path,
        git_url: Callable[[str], str],
        token: str,
        *,
        scopes: tuple[str, ...] = ("public_repo",),
        not_ready_polls: int = 2,
        owner: str = "flakebot-user",
    ) -> None:
        self.upstream, self.forks_dir, self.git_url, self.token = upstream, forks_dir, git_url, token
        self.scopes, self.not_ready_polls, self.owner = scopes, not_ready_polls, owner
        self.forks: dict[str, ForkState] = {}
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self.httpd = LoopbackServer(_handler(self))

    @property
    def url(self) -> str:
        return self.httpd.url

    def __enter__(self) -> GitHubStub:
        self.httpd.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.close()

    def fork_path(self, full_name: str) -> Path:
        return self.forks_dir / f"{full_name}.git"

    # ------------------------------------------------------------ endpoints

    def handle(self, method: str, path: str) -> tuple[int, Any]:
        parts = path.split("?")[0].strip("/").split("/")
        if parts[:1] != ["repos"] or len(parts) < 3:
            return 404, {"message": "Not Found"}
        full_name = f"{parts[1]}/{parts[2]}"
        rest = parts[3:]
        if method == "POST" and rest == ["forks"]:
            return self._fork(full_name)
        if method == "GET" and rest == ["commits"]:
            return self._commits(full_name)
        if method == "DELETE" and not rest:
            return self._delete(full_name)
        return 404, {"message": "Not Found"}

    def _fork(self, full_name: str) -> tuple[int, Any]:
        if full_name not in self.upstream:
            return 404, {"message": "Not Found"}
        name = full_name.split("/")[1]
        fork_name = f"{self.owner}/{name}"
        self.forks.setdefault(fork_name, ForkState(self.upstream[full_name], self.fork_path(fork_name)))
        return 202, {
            "full_name": fork_name,
            "name": name,
            "fork": True,
            "owner": {"login": self.owner},
            "clone_url": self.git_url(f"forks/{fork_name}.git"),
            "html_url": f"https://github.com/{fork_name}",
        }

    def _commits(self, full_name: str) -> tuple[int, Any]:
        state = self.forks.get(full_name)
        if state is None:
            return 404, {"message": "Not Found"}
        state.polls += 1
        if state.polls <= self.not_ready_polls:
            return 409, {"message": "Git Repository is empty."}
        if not state.path.exists():  # the copy "finishes" now: before this, cloning the fork fails
            state.path.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["git", "clone", "--quiet", "--mirror", str(state.source), str(state.path)],
                check=True,
                capture_output=True,
            )
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=state.path, check=True, capture_output=True, text=True
        ).stdout.strip()
        return 200, [{"sha": head}]

    def _delete(self, full_name: str) -> tuple[int, Any]:
        if "delete_repo" not in self.scopes:
            return 403, {"message": "Must have admin rights to Repository."}
        state = self.forks.pop(full_name, None)
        if state is None:
            return 404, {"message": "Not Found"}
        shutil.rmtree(state.path, ignore_errors=True)
        return 204, None


def _handler(stub: GitHubStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            authorized = self.headers.get("Authorization") == f"Bearer {stub.token}"
            with stub.lock:
                stub.requests.append(Request(self.command, self.path, authorized, dict(self.headers)))
                status, body = (
                    stub.handle(self.command, self.path) if authorized else (401, {"message": "Bad credentials"})
                )
            payload = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
