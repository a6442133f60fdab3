"""A real PostgreSQL 15 for the team tests and benchmarks: a temporary cluster on 127.0.0.1 (a free port, password
authentication, run as the postgres user when run as root), removed after. Its URL carries a password no log may show.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

PG_BIN = Path("/usr/lib/postgresql/15/bin")  # Debian's postgresql-15 (scripts/setup.sh installs it)
USER = "flakebot"


@dataclass
class Cluster:
    """The running cluster: where it lives, its port and its superuser's password."""

    base: Path
    port: int
    password: str
    owner: str | None  # the user its programs run as (root may not run them), None: ourselves

    @property
    def data(self) -> Path:
        return self.base / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def ctl(self, *args: str) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.base} -c fsync=off"
        self.as_owner(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.base / "log"), "-o", options, "-w", *args
        )

    def as_owner(self, *argv: str) -> None:
        prefix = ["runuser", "-u", self.owner, "--"] if self.owner else []
        subprocess.run([*prefix, *argv], check=True, capture_output=True, timeout=120, cwd=self.base)

    def postmaster(self) -> int:
        """The server's pid (its backends are its children)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def restart(self) -> None:
        self.ctl("-m", "fast", "restart")


def _owner() -> str | None:
    """Root cannot run initdb or postgres: the postgres user (Debian's package makes it), else nobody."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("no postgres or nobody user to run PostgreSQL as")


def _scratch() -> str | None:
    """Where a cluster lives: memory when the machine has it (a test session leaves hundreds of databases, whose
    removal from disk took 22 s of its end; 1.4 s from tmpfs), else the usual temporary directory."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def temporary_cluster() -> Iterator[Cluster]:
    """A started cluster until the block ends (then stopped and removed)."""
    if not (PG_BIN / "initdb").exists():
        raise RuntimeError(f"{PG_BIN}/initdb is missing; run 'make setup' (postgresql-15)")
    base = Path(tempfile.mkdtemp(prefix="flakebot-pg-", dir=_scratch()))
    cluster = Cluster(base, _free_port(), secrets.token_hex(12), _owner())
    if cluster.owner:
        shutil.chown(base, cluster.owner)
    pwfile = base / "pw"
    pwfile.write_text(cluster.password + "\n")
    if cluster.owner:
        shutil.chown(pwfile, cluster.owner)
    try:
        cluster.as_owner(
            str(PG_BIN / "initdb"), "-D", str(cluster.data), "-U", USER, "--auth=scram-sha-256",
            f"--pwfile={pwfile}", "-E", "UTF8", "--no-sync",
        )  # fmt: skip
        pwfile.unlink()
        cluster.ctl("start")
        yield cluster
    finally:
        if (cluster.data / "postmaster.pid").exists():
            cluster.ctl("-m", "immediate", "stop")
        shutil.rmtree(base, ignore_errors=True)


def new_database(cluster: Cluster) -> str:
    """A fresh, empty database's URL."""
    name = f"t{uuid.uuid4().hex[:16]}"
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return cluster.url(name)
