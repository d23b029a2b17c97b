from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

import tests.properties  # noqa: F401  (registers and loads the hypothesis profiles)
from tests.pg_cluster import PostgresNotAvailable, TempCluster


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@pytest.fixture(scope="session", autouse=True)
def _scratch_working_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Run the session in a scratch directory: a server started without a [store] table
    opens the default store, sqlite://llmgw.db, in its working directory, which must
    not be the checkout."""
    previous = Path.cwd()
    scratch = tmp_path_factory.mktemp("cwd")
    os.chdir(scratch)
    try:
        yield scratch
    finally:
        os.chdir(previous)


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
