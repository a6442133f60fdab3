"""A real PostgreSQL 15 for the team tests (benchmarks/scenarios/postgres.py): a temporary cluster on 127.0.0.1,
started once per session and removed after; each test gets a database of its own (its URL carries a password, which
no log may show)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks.scenarios.postgres import PG_BIN, Cluster, new_database, temporary_cluster

__all__ = ["Cluster", "database", "postgres"]


@pytest.fixture(scope="session")
def postgres() -> Iterator[Cluster]:
    if not (PG_BIN / "initdb").exists():
        pytest.fail(f"{PG_BIN}/initdb is missing; run 'make setup' (postgresql-15)")
    with temporary_cluster() as cluster:
        yield cluster


@pytest.fixture
def database(postgres: Cluster) -> str:
    """A fresh, empty database's URL."""
    return new_database(postgres)
