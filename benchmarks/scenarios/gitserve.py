"""Git repositories built for tests, served by a real `git daemon` on 127.0.0.1 (git://) and by file://.

make_crate_repo      a one-crate repository with a tag per released version
make_workspace_repo  a cargo workspace (crates/core, crates/cli)
make_plain_repo      a repository without any Cargo.toml
GitDaemon            `git daemon` on a free port, push enabled
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "Upstream Author",
    "GIT_AUTHOR_EMAIL": "author@example.org",
    "GIT_COMMITTER_NAME": "Upstream Author",
    "GIT_COMMITTER_EMAIL": "author@example.org",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(*args: str, cwd: Path) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {result.stderr}")
    return result.stdout.strip()


def crate_manifest(name: str, version: str, deps: str = "") -> str:
    return f'[package]\nname = "{name}"\nversion = "{version}"\nedition = "2021"\nlicense = "MIT"\ndescription = "test crate"\n\n[dependencies]\n{deps}'


def library_source(version: str) -> str:
    return f'pub fn version() -> &\'static str {{\n    "{version}"\n}}\n\n#[test]\nfn knows_its_version() {{\n    assert_eq!(version(), "{version}");\n}}\n'


def write(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


def bare_from(work: Path, bare: Path) -> Path:
    bare.parent.mkdir(parents=True, exist_ok=True)
    git("clone", "--quiet", "--bare", str(work), str(bare), cwd=work.parent)
    return bare


def make_crate_repo(
    root: Path, name: str, versions: list[str], tag: str | None = "v{version}", head_version: str | None = None
) -> Path:
    """A bare repo (root/<name>.git) with one commit + tag per version; HEAD (branch main) may move past the last tag."""
    work = root / f"work-{name}"
    work.mkdir(parents=True)
    git("init", "--quiet", "--initial-branch=main", cwd=work)
    for version in versions:
        write(
            work,
            {
                "Cargo.toml": crate_manifest(name, version),
                "src/lib.rs": library_source(version),
                ".gitignore": "/target\nCargo.lock\n",
            },
        )
        git("add", "-A", cwd=work)
        git("commit", "--quiet", "-m", f"release {version}", cwd=work)
        if tag:
            git("tag", "-a", "-m", f"release {version}", tag.format(name=name, version=version), cwd=work)
    if head_version:
        write(work, {"Cargo.toml": crate_manifest(name, head_version), "src/lib.rs": library_source(head_version)})
        git("commit", "--quiet", "-am", "work towards the next release", cwd=work)
    return bare_from(work, root / f"{name}.git")


def make_workspace_repo(root: Path, name: str = "tools") -> Path:
    """A cargo workspace: crates/core (demo-core) and crates/cli (demo-cli, depends on demo-core), tagged demo-cli-v0.4.0."""
    work = root / f"work-{name}"
    work.mkdir(parents=True)
    write(
        work,
        {
            "Cargo.toml": '[workspace]\nmembers = ["crates/core", "crates/cli"]\nresolver = "2"\n',
            "crates/core/Cargo.toml": crate_manifest("demo-core", "0.4.0"),
            "crates/core/src/lib.rs": library_source("0.4.0"),
            "crates/cli/Cargo.toml": crate_manifest(
                "demo-cli", "0.4.0", 'demo-core = { path = "../core", version = "0.4.0" }\n'
            ),
            "crates/cli/src/main.rs": 'fn main() {\n    println!("{}", demo_core::version());\n}\n',
        },
    )
    git("init", "--quiet", "--initial-branch=main", cwd=work)
    git("add", "-A", cwd=work)
    git("commit", "--quiet", "-m", "workspace", cwd=work)
    git("tag", "demo-cli-v0.4.0", cwd=work)
    return bare_from(work, root / f"{name}.git")


def make_plain_repo(root: Path, name: str, files: dict[str, str | bytes] | None = None) -> Path:
    """A bare repo with no Cargo.toml (only a README, or `files`)."""
    work = root / f"work-{name}"
    work.mkdir(parents=True)
    write(work, files or {"README.md": "# not a crate\n"})
    git("init", "--quiet", "--initial-branch=main", cwd=work)
    git("add", "-A", cwd=work)
    git("commit", "--quiet", "-m", "initial", cwd=work)
    return bare_from(work, root / f"{name}.git")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class GitDaemon:
    """`git daemon` serving every repository under `base` at git://127.0.0.1:PORT/<path>, with push enabled."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> GitDaemon:
        for _ in range(5):  # the free port may be taken between choosing and binding it
            self.port = free_port()
            self.process = subprocess.Popen(
                ["git", "daemon", "--reuseaddr", "--export-all", "--enable=receive-pack", "--informative-errors",
                 f"--base-path={self.base}", "--listen=127.0.0.1", f"--port={self.port}", str(self.base)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            if self._wait_listening():
                return self
            self._stop()
        raise RuntimeError("git daemon did not start")

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._stop()

    def url(self, relpath: str) -> str:
        return f"git://127.0.0.1:{self.port}/{relpath}"

    def _wait_listening(self) -> bool:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return True
            except OSError:
                time.sleep(0.05)
        return False

    def _stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None
