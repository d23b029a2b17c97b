from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from tests import procs
from tests.pg_cluster import PostgresNotAvailable, TempCluster

# Hypothesis profiles (tests/properties.py says what each is for). `ci`, the default:
# derandomized, no example database, nothing timed. `fuzz` (`make fuzz`): random
# draws, 20x the examples, failures kept and replayed from .hypothesis/.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "fuzz",
    derandomize=False,
    database=DirectoryBasedExampleDatabase(
        Path(__file__).resolve().parent.parent / ".hypothesis" / "examples"
    ),
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
    max_examples=settings.default.max_examples * 20,
)
# `pytest --hypothesis-profile=fuzz` loads the other one after this (pytest_configure).
settings.load_profile("ci")


#: What makes a test module end-to-end: it starts processes (llmgw-server, -agent,
#: -sim, llama-server, PostgreSQL, a browser) or a whole fleet in one process. Every
#: other module is `unit`: in-process; `pytest -m unit` (`make test-unit`) runs them in
#: about two minutes, against some twenty for the whole suite.
E2E_SIGNS = (
    "procs",
    "llmgw.testing",
    "subprocess",
    "pg_cluster",
    "playwright",
    "run_process",
    "open_process",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    kinds: dict[Path, pytest.MarkDecorator] = {}
    for item in items:
        path = item.path
        if path not in kinds:
            e2e = any(sign in path.read_text() for sign in E2E_SIGNS)
            kinds[path] = pytest.mark.e2e if e2e else pytest.mark.unit
        item.add_marker(kinds[path])


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


@pytest.fixture(scope="session", autouse=True)
def _one_worker() -> Iterator[None]:
    """llmgw-server runs one process per core by default; the programs the tests start
    serve from one (tests/test_workers_e2e.py starts several on purpose)."""
    saved = os.environ.get("LLMGW_WORKERS")
    os.environ["LLMGW_WORKERS"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("LLMGW_WORKERS", None)
        else:
            os.environ["LLMGW_WORKERS"] = saved


@pytest.fixture(scope="session", autouse=True)
def _private_temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's own system temp dir, and a check that llmgw leaves nothing in it.

    TMPDIR (and `tempfile`'s cached choice) point at a fresh directory for the whole
    session, so the programs the tests start use it too; at the end it must hold no
    ``llmgw*`` entry, or the run fails naming them: a test, or llmgw itself (a demo's
    throwaway store, a temporary model), left behind what it made. Being the session's
    own, it cannot see what a concurrent run on the same machine leaves in the real
    temp dir. Programs' logs and state go to the session's pytest directory instead
    (tests.procs.SCRATCH), where pytest keeps them for a post-mortem.
    """
    private = Path(tempfile.mkdtemp(prefix="pytest-tmpdir-"))
    # A PostgreSQL started as its own user (tests/pg_cluster.py, as root) must reach its
    # directory in here.
    private.chmod(0o711)
    saved_env, saved_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(private)
    procs.SCRATCH = tmp_path_factory.mktemp("procs")
    try:
        yield private
    finally:
        procs.SCRATCH = None
        tempfile.tempdir = saved_tempdir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        left = sorted(p.name for p in private.iterdir() if p.name.startswith("llmgw"))
        shutil.rmtree(private, ignore_errors=True)
    if left:
        pytest.fail(
            f"the tests left {len(left)} llmgw entries in the temp dir: {', '.join(left)}",
            pytrace=False,
        )


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
