from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from tests.pg_cluster import PostgresNotAvailable, TempCluster


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[TempCluster]:
    """One throwaway PostgreSQL cluster for the whole session (each test takes a fresh
    database in it), started only when a test asks for PostgreSQL."""
    try:
        cluster = TempCluster().start()
    except PostgresNotAvailable as exc:
        pytest.fail(f"PostgreSQL is required for the store tests: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """`store.url` of an empty store on each backend: a SQLite file, or a new database
    in the session's PostgreSQL cluster."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/llmgw.db"
    cluster = cast(TempCluster, request.getfixturevalue("pg_cluster"))
    return cluster.new_database()
