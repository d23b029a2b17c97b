"""The store, the same tests on both backends: SQLite (a file) and PostgreSQL (a real
throwaway cluster from tests/pg_cluster.py, one per session: conftest.pg_cluster;
missing PostgreSQL fails these tests)."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import psycopg
import pytest
import trio
import trio.lowlevel

from llmgw.catalog import rules as catalog
from llmgw.config import DeploymentProfile, ModelConfig
from llmgw.domain.usage import Usage, UsageRecord
from llmgw.store import (
    DuplicateKeyName,
    SchemaTooNew,
    StoredCordon,
    StoreError,
    StoreUnavailable,
    TimedUsage,
    UnsupportedStoreURL,
    UsageBatcher,
    model_from_dict,
    open_store,
)
from llmgw.store.migrations import Migration, latest
from llmgw.store.migrations.postgres import MIGRATIONS as PG_MIGRATIONS
from llmgw.store.migrations.sqlite import MIGRATIONS as SQLITE_MIGRATIONS
from llmgw.store.postgres import PostgresStore
from llmgw.store.sql.db import DB
from llmgw.store.sql.threaded import ThreadedStore
from llmgw.store.sqlite import SQLiteStore, sqlite_path
from llmgw.testing.procs import reserve_port
from tests.pg_cluster import TempCluster
from tests.waiting import wait_until

T0 = 1_700_000_040.0  # a multiple of 60 s
# Both backends have the same numbered migrations.
LATEST = latest(SQLITE_MIGRATIONS)
assert latest(PG_MIGRATIONS) == LATEST
APPLIED = [(n,) for n in range(1, LATEST + 1)]


class WallClock:
    """A settable wall clock for expiry tests (the store takes `clock=`)."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return cast(str, request.param)


@pytest.fixture
def url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite://{tmp_path}/llmgw.db"
    cluster: TempCluster = request.getfixturevalue("pg_cluster")
    return cluster.new_database()


@pytest.fixture
def clock() -> WallClock:
    return WallClock()


@pytest.fixture
async def store(url: str, clock: WallClock) -> AsyncIterator[ThreadedStore]:
    s = cast(ThreadedStore, await open_store(url, clock=clock))
    try:
        yield s
    finally:
        await s.aclose()


def make_store(url: str, migrations: tuple[Migration, ...] | None = None) -> ThreadedStore:
    """A backend object directly (to give it other migrations); call start()."""
    if url.startswith("sqlite"):
        return SQLiteStore(sqlite_path(url), migrations=migrations or SQLITE_MIGRATIONS)
    return PostgresStore(url, migrations=migrations or PG_MIGRATIONS)


def base_migrations(url: str) -> tuple[Migration, ...]:
    return SQLITE_MIGRATIONS if url.startswith("sqlite") else PG_MIGRATIONS


async def rows(store: ThreadedStore, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    return await store._read(lambda db: db.rows(sql, params))


async def execute(store: ThreadedStore, sql: str, params: Sequence[Any] = ()) -> int:
    return await store._write(lambda db: db.run(sql, params))


def rec(
    model: str = "m",
    key_id: str | None = None,
    status: int = 200,
    prompt: int = 10,
    completion: int = 5,
    latency: float = 0.5,
    ttft: float | None = None,
    cached: int | None = None,
) -> UsageRecord:
    return UsageRecord(
        model=model,
        endpoint="e1",
        status=status,
        usage=Usage(prompt, completion, cached),
        latency=latency,
        ttft=ttft,
        key_id=key_id,
        band="gold",
    )


async def usage_count(store: ThreadedStore) -> int:
    return int((await rows(store, "SELECT COUNT(*) FROM usage_records"))[0][0])


# -- migrations ---------------------------------------------------------------------------


async def test_migrations_from_empty_and_rerun_is_a_noop(url: str) -> None:
    s = cast(ThreadedStore, await open_store(url, migrate=False))
    try:
        assert await s.schema_version() == 0
        assert await s.migrate() == LATEST
        assert await s.schema_version() == LATEST
        tables = {"api_keys", "usage_records", "runtime_models", "dashboard_sessions"}
        for table in tables | {"node_cordons"}:
            assert await rows(s, f"SELECT COUNT(*) FROM {table}") == [(0,)]
        assert await s.migrate() == LATEST
        assert await rows(s, "SELECT version FROM schema_version ORDER BY version") == APPLIED
    finally:
        await s.aclose()
    # Opening again (which migrates) changes nothing either.
    s = cast(ThreadedStore, await open_store(url))
    try:
        assert await rows(s, "SELECT version FROM schema_version ORDER BY version") == APPLIED
    finally:
        await s.aclose()


async def test_a_later_migration_applies_only_what_is_pending(url: str) -> None:
    first = base_migrations(url)
    extra = Migration(LATEST + 1, "extra", ("CREATE TABLE extra (id INTEGER PRIMARY KEY)",))
    second = (*first, extra)
    s = make_store(url, first)
    await s.start()  # type: ignore[attr-defined]
    assert await s.migrate() == LATEST
    await s.create_key("survives")
    await s.aclose()
    s = make_store(url, second)
    await s.start()  # type: ignore[attr-defined]
    try:
        assert await s.migrate() == LATEST + 1
        assert await s.migrate() == LATEST + 1
        assert [k.name for k in await s.list_keys()] == ["survives"]
        assert await rows(s, "SELECT version FROM schema_version ORDER BY version") == [
            *APPLIED,
            (LATEST + 1,),
        ]
        assert await rows(s, "SELECT COUNT(*) FROM extra") == [(0,)]
    finally:
        await s.aclose()


async def test_a_failing_migration_leaves_the_database_as_it_was(url: str) -> None:
    broken = (
        *base_migrations(url),
        Migration(LATEST + 1, "half", ("CREATE TABLE half (id INTEGER)", "THIS IS NOT SQL")),
    )
    s = make_store(url, broken)
    await s.start()  # type: ignore[attr-defined]
    try:
        with pytest.raises(StoreError):
            await s.migrate()
        assert await s.schema_version() == 0  # not even migration 1: one transaction
    finally:
        await s.aclose()
    s = cast(ThreadedStore, await open_store(url))
    try:
        assert await s.schema_version() == LATEST
        with pytest.raises(StoreError):
            await rows(s, "SELECT COUNT(*) FROM half")
    finally:
        await s.aclose()


async def test_a_newer_schema_is_refused_with_a_clear_error(url: str) -> None:
    s = cast(ThreadedStore, await open_store(url))
    await execute(
        s,
        "INSERT INTO schema_version (version, description, applied_at) VALUES (?, ?, ?)",
        (LATEST + 1, "from the future", time.time()),
    )
    await s.aclose()
    with pytest.raises(SchemaTooNew) as info:
        await open_store(url)
    assert str(info.value) == (
        f"database schema version {LATEST + 1} is newer than this llmgw (knows up to {LATEST}):"
        " upgrade llmgw"
    )


async def test_two_instances_migrating_at_once_both_succeed(url: str) -> None:
    a = cast(ThreadedStore, await open_store(url, migrate=False))
    b = cast(ThreadedStore, await open_store(url, migrate=False))
    try:
        results: list[int] = []

        async def migrate(s: ThreadedStore) -> None:
            results.append(await s.migrate())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(migrate, a)
            nursery.start_soon(migrate, b)
        assert results == [LATEST, LATEST]
        assert await rows(a, "SELECT version FROM schema_version ORDER BY version") == APPLIED
    finally:
        await a.aclose()
        await b.aclose()


# -- keys ----------------------------------------------------------------------------------


async def test_keys_create_lookup_list_revoke(store: ThreadedStore, clock: WallClock) -> None:
    record, secret = await store.create_key(
        "ci", band="silver", models=("llama", "qwen"), rpm=60, tpm=10_000
    )
    admin, admin_secret = await store.create_key("root", admin=True)
    assert secret.startswith("llmgw-") and len(secret) == len("llmgw-") + 43
    assert record.prefix == secret[:14] and record.prefix.startswith("llmgw-")
    assert (record.band, record.models, record.rpm, record.tpm) == (
        "silver",
        ("llama", "qwen"),
        60,
        10_000,
    )
    assert record.admin is False and admin.admin is True
    assert record.created_at == clock.now

    assert await store.lookup_key(secret) == record
    assert await store.lookup_key(admin_secret) == admin
    assert await store.lookup_key(secret + "x") is None
    assert await store.lookup_key("not-a-key") is None
    assert await store.get_key(record.id) == record
    # Oldest first; these two were made at the same (fake) instant, so by id.
    assert await store.list_keys() == sorted([record, admin], key=lambda k: k.id)
    assert await store.count_keys() == 2
    assert await store.count_keys(admin=True) == 1
    assert await store.count_keys(admin=False) == 1

    clock.now += 5
    assert await store.revoke_key(record.id) is True
    assert await store.revoke_key(record.id) is False  # already revoked
    assert await store.revoke_key("key_nope") is False
    assert await store.lookup_key(secret) is None
    revoked = await store.get_key(record.id)
    assert revoked is not None and revoked.revoked_at == clock.now
    assert not revoked.usable(clock.now)
    assert len(await store.list_keys()) == 2  # listings keep revoked keys
    assert await store.count_keys() == 1
    assert await store.lookup_key(admin_secret) == admin


async def test_a_name_belongs_to_one_key_until_it_is_revoked(
    store: ThreadedStore, clock: WallClock
) -> None:
    first, _ = await store.create_key("ci")
    with pytest.raises(DuplicateKeyName) as info:
        await store.create_key("ci", band="gold")
    assert (info.value.name, info.value.existing) == ("ci", first.id)
    assert str(info.value) == (
        f"a key named 'ci' exists ({first.id}) and is not revoked: "
        "choose another name, or revoke that key first"
    )
    # An expired key still holds its name (expiry is a time, not a state an index sees).
    temp, _ = await store.create_key("temp", expires_at=clock.now + 1)
    clock.now += 2
    with pytest.raises(DuplicateKeyName):
        await store.create_key("temp")
    # Revoked, the name is free again, as often as needed.
    assert await store.revoke_key(first.id)
    second, secret = await store.create_key("ci")
    assert await store.lookup_key(secret) == second
    assert await store.revoke_key(second.id)
    await store.create_key("ci")
    assert await store.revoke_key(temp.id)
    await store.create_key("temp")
    names = [(k.name, k.revoked_at is not None) for k in await store.list_keys()]
    assert sorted(names) == [("ci", False), ("ci", True), ("ci", True), ("temp", False),
                             ("temp", True)]  # fmt: skip
    assert await store.count_keys() == 2
    # Names are compared exactly: case and spaces make another name.
    await store.create_key("CI")
    await store.create_key("ci ")


async def test_concurrent_creators_of_one_name_get_one_key(store: ThreadedStore) -> None:
    """The database decides, not a check before the insert: of 20 creators started at
    once (on PostgreSQL, up to its pool size truly in parallel), exactly one wins."""
    won: list[str] = []
    refused: list[str] = []

    async def create() -> None:
        try:
            record, _ = await store.create_key("race")
        except DuplicateKeyName as exc:
            refused.append(exc.existing)
        else:
            won.append(record.id)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(create)
    assert len(won) == 1 and len(refused) == 19
    assert set(refused) == set(won)  # each refusal names the winner
    assert [k.id for k in await store.list_keys()] == won


async def test_the_database_itself_refuses_a_second_live_name(store: ThreadedStore) -> None:
    """Not only the check in insert_key: a plain INSERT that skips it is refused by the
    unique index, so no writer (another llmgw version, a race) gets past it."""
    sql = "INSERT INTO api_keys (id, name, prefix, hash, created_at) VALUES (?, ?, ?, ?, ?)"
    await execute(store, sql, ("key_a", "dup", "llmgw-a", "hash-a", T0))
    with pytest.raises(StoreError, match=r"(?i)unique"):
        await execute(store, sql, ("key_b", "dup", "llmgw-b", "hash-b", T0))
    assert await store.revoke_key("key_a")
    await execute(store, sql, ("key_b", "dup", "llmgw-b", "hash-b", T0))
    assert [k.id for k in await store.list_keys() if k.revoked_at is None] == ["key_b"]


async def test_the_migration_keeps_keys_that_already_shared_a_name(url: str) -> None:
    """Keys made before names were unique keep working, duplicates and all; the name
    they share is taken until every one of them is revoked."""
    old = make_store(url, base_migrations(url)[:1])
    await old.start()  # type: ignore[attr-defined]
    assert await old.migrate() == 1
    for i, name in enumerate(["twin", "twin", "solo", "gone", "gone"]):
        await execute(
            old,
            "INSERT INTO api_keys (id, name, prefix, hash, created_at, revoked_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (f"key_{i}", name, "llmgw-old", f"hash{i}", T0 + i, T0 if i == 4 else None),
        )
    await old.aclose()
    s = cast(ThreadedStore, await open_store(url))
    try:
        assert await s.schema_version() == LATEST
        live = sorted((k.name, k.id) for k in await s.list_keys() if k.revoked_at is None)
        assert live == [("gone", "key_3"), ("solo", "key_2"), ("twin", "key_0"),
                        ("twin", "key_1")]  # fmt: skip
        for name, holder in (("twin", "key_0"), ("solo", "key_2"), ("gone", "key_3")):
            with pytest.raises(DuplicateKeyName) as info:
                await s.create_key(name)
            assert info.value.existing == holder
        assert await s.revoke_key("key_0")
        with pytest.raises(DuplicateKeyName):  # key_1 still holds it
            await s.create_key("twin")
        assert await s.revoke_key("key_1")
        await s.create_key("twin")
        with pytest.raises(DuplicateKeyName):
            await s.create_key("twin")
    finally:
        await s.aclose()


async def test_keys_without_models_allow_all_and_secrets_differ(store: ThreadedStore) -> None:
    a, sa = await store.create_key("a")
    b, sb = await store.create_key("b", models=())
    assert a.models is None and b.models == ()
    assert sa != sb and a.id != b.id
    assert (await store.lookup_key(sb)) == b


async def test_keys_expire(store: ThreadedStore, clock: WallClock) -> None:
    record, secret = await store.create_key("temp", expires_at=clock.now + 60)
    assert await store.lookup_key(secret) == record
    assert await store.count_keys() == 1
    clock.now += 59.9
    assert await store.lookup_key(secret) == record
    clock.now += 0.1
    assert await store.lookup_key(secret) is None
    assert await store.count_keys() == 0
    assert [k.id for k in await store.list_keys()] == [record.id]


async def test_only_the_hash_of_a_secret_is_stored(store: ThreadedStore, backend: str) -> None:
    secrets_ = []
    for i in range(3):
        record, secret = await store.create_key(f"k{i}", admin=True)
        secrets_.append(secret)
    token = await store.create_session(record.id, 3600)
    assert await store.get_session(token) is not None
    if backend == "sqlite":
        path = Path(cast(SQLiteStore, store).path)
        await store.aclose()  # checkpoint nothing away: read every file as it is
        blob = b"".join(
            p.read_bytes() for p in path.parent.iterdir() if p.name.startswith(path.name)
        )
        # Whatever SQLite left in the main file or its WAL.
        assert hashlib.sha256(secrets_[0].encode()).hexdigest().encode() in blob
        dump = blob.decode("latin-1")
    else:
        tables = [
            r[0]
            for r in await rows(
                store,
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'",
            )
        ]
        assert "api_keys" in tables and "dashboard_sessions" in tables
        parts = []
        for table in tables:
            parts += [r[0] for r in await rows(store, f"SELECT t::text FROM {table} t")]
        dump = "\n".join(parts)
        assert hashlib.sha256(secrets_[0].encode()).hexdigest() in dump
    for secret in secrets_:
        assert secret not in dump
        assert secret[14:] not in dump  # nothing beyond the display prefix
        assert secret[:14] in dump  # the display prefix is kept
    assert token not in dump


# -- usage ------------------------------------------------------------------------------


async def test_usage_summary_by_model_and_key_with_buckets(store: ThreadedStore) -> None:
    a, _ = await store.create_key("a")
    b, _ = await store.create_key("b")
    batch: list[TimedUsage] = [
        (T0 + 1, rec("x", a.id, prompt=100, completion=10, latency=1.0, ttft=0.1, cached=40)),
        (T0 + 30, rec("x", a.id, status=500, prompt=50, completion=0, latency=3.0)),
        (T0 + 59.5, rec("y", b.id, prompt=7, completion=3, latency=2.0, ttft=0.3)),
        (T0 + 61, rec("x", None, prompt=1, completion=1, latency=0.5)),
        (T0 + 125, rec("y", a.id, status=429, prompt=2, completion=0, latency=0.25)),
    ]
    await store.record_usage(batch)
    await store.record_usage([])  # nothing to do

    by_model = await store.usage_summary("model")
    assert [(r.group, r.bucket, r.requests) for r in by_model] == [("x", None, 3), ("y", None, 2)]
    x = by_model[0]
    assert (x.prompt_tokens, x.completion_tokens, x.cached_tokens, x.errors) == (151, 11, 40, 1)
    assert x.mean_latency == pytest.approx(1.5)
    assert x.mean_ttft == pytest.approx(0.1)

    by_key = await store.usage_summary("key")
    assert [(r.group, r.requests, r.errors) for r in by_key] == [
        (None, 1, 0),
        *sorted([(a.id, 3, 2), (b.id, 1, 0)]),
    ]

    minute = await store.usage_summary("model", bucket=60)
    assert [(r.bucket, r.group, r.requests, r.prompt_tokens) for r in minute] == [
        (T0, "x", 2, 150),
        (T0, "y", 1, 7),
        (T0 + 60, "x", 1, 1),
        (T0 + 120, "y", 1, 2),
    ]
    assert minute[0].mean_ttft == pytest.approx(0.1)
    assert minute[2].mean_ttft is None

    window = await store.usage_summary("key", since=T0 + 30, until=T0 + 61, bucket=3600)
    hour = (T0 // 3600) * 3600
    assert [(r.bucket, r.group, r.requests) for r in window] == sorted(
        [(hour, a.id, 1), (hour, b.id, 1)]
    )
    assert await store.usage_summary("model", since=T0 + 200) == []
    with pytest.raises(ValueError):
        await store.usage_summary("tenant")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await store.usage_summary("model", bucket=0)


async def test_batcher_writes_in_batches_and_flushes_the_rest_at_shutdown(
    store: ThreadedStore,
) -> None:
    sizes: list[int] = []

    class Spy:
        async def record_usage(self, batch: Sequence[TimedUsage]) -> None:
            sizes.append(len(batch))
            await store.record_usage(batch)

    batcher = UsageBatcher(Spy(), max_batch=10, flush_interval=3600)
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        for i in range(25):
            batcher.record(rec(f"m{i % 3}"))
        # Full batches go at once, not at the (1 h) interval.
        await wait_until(lambda: batcher.written >= 20, "two full batches written")
        assert max(sizes) <= 10
        assert await usage_count(store) == batcher.written
        for _ in range(3):
            batcher.record(rec("late"))
        nursery.cancel_scope.cancel()  # graceful shutdown: flush what is left
    assert sum(sizes) == 28 and max(sizes) <= 10
    assert batcher.written == 28 and batcher.pending == 0
    assert (batcher.dropped, batcher.lost) == (0, 0)
    assert await usage_count(store) == 28


async def test_batcher_flushes_every_interval(store: ThreadedStore) -> None:
    batcher = UsageBatcher(store, max_batch=500, flush_interval=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        batcher.record(rec())
        await wait_until(lambda: batcher.written >= 1, "the record written at the interval")
        assert await usage_count(store) == 1
        nursery.cancel_scope.cancel()
    assert batcher.batches == 1


async def test_a_full_buffer_drops_the_oldest_and_counts(store: ThreadedStore) -> None:
    batcher = UsageBatcher(store, max_batch=2, max_buffer=5, flush_interval=3600)
    for i in range(8):
        batcher.record(rec(f"m{i}"))
    assert (batcher.pending, batcher.dropped, batcher.recorded) == (5, 3, 8)
    assert await batcher.flush()
    assert batcher.batches == 3
    assert [r.group for r in await store.usage_summary("model")] == [f"m{i}" for i in range(3, 8)]


# -- runtime models ----------------------------------------------------------------------


async def test_runtime_models_round_trip(store: ThreadedStore, clock: WallClock) -> None:
    big = ModelConfig(
        name="llama-70b",
        aliases=("llama",),
        fallbacks=("tiny",),
        routing_profile="batch",
        replicas=2,
        profiles=(
            DeploymentProfile(
                name="tp4",
                engine="vllm",
                weights="meta/llama-70b",
                tensor_parallel=4,
                min_gpu_memory=80 * 2**30,  # type: ignore[arg-type]
                gpu_name="H100",
                args=("--max-model-len", "8192"),
                env={"VLLM_X": "1"},
            ),
        ),
    )
    tiny = ModelConfig(name="tiny")
    await store.put_model(tiny)
    clock.now += 1
    await store.put_model(big)
    stored = await store.list_models()
    assert [m.config["name"] for m in stored] == ["llama-70b", "tiny"]
    assert stored[0].updated_at == clock.now and stored[1].updated_at == clock.now - 1
    # In the config's own shape (sizes as strings), and back to the same value.
    assert stored[0].config["profiles"][0]["min_gpu_memory"] == "80GiB"
    models = [model_from_dict(m.config) for m in stored]
    assert models == [big, tiny]
    assert catalog.check_models(models, {"chat", "batch"}) == []

    clock.now += 1
    await store.put_model(ModelConfig(name="tiny", replicas=3))  # replace
    config, updated_at = (await store.list_models())[1]
    assert config["replicas"] == 3 and updated_at == clock.now
    assert await store.delete_model("tiny") is True
    assert await store.delete_model("tiny") is False
    assert [m.config["name"] for m in await store.list_models()] == ["llama-70b"]


# -- sessions --------------------------------------------------------------------------------


async def test_cordons_round_trip(store: ThreadedStore, clock: WallClock) -> None:
    assert await store.list_cordons() == []
    await store.put_cordon("gpu-2", drain=True)
    clock.now += 5
    await store.put_cordon("gpu-1", drain=False)
    assert await store.list_cordons() == [
        StoredCordon("gpu-1", False, T0 + 5),
        StoredCordon("gpu-2", True, T0),
    ]
    clock.now += 5
    await store.put_cordon("gpu-2", drain=False)  # a drain turned into a plain cordon
    assert await store.delete_cordon("gpu-1") is True
    assert await store.delete_cordon("gpu-1") is False
    assert await store.list_cordons() == [StoredCordon("gpu-2", False, T0 + 10)]


async def test_sessions_expire_and_end(store: ThreadedStore, clock: WallClock) -> None:
    key, _ = await store.create_key("admin", admin=True)
    token = await store.create_session(key.id, ttl=600)
    session = await store.get_session(token)
    assert session is not None
    assert session.key == key and session.expires_at == clock.now + 600
    assert await store.get_session("bogus") is None
    clock.now += 599
    assert await store.get_session(token) is not None
    clock.now += 1
    assert await store.get_session(token) is None  # expired

    other = await store.create_session(key.id, ttl=600)
    assert await store.delete_session(other) is True
    assert await store.delete_session(other) is False
    assert await store.get_session(other) is None

    third = await store.create_session(key.id, ttl=600)
    await store.revoke_key(key.id)
    assert await store.get_session(third) is None  # its key is gone

    with pytest.raises(StoreError, match="no API key"):
        await store.create_session("key_nope", ttl=60)
    with pytest.raises(ValueError):
        await store.create_session(key.id, ttl=0)


async def test_a_session_ends_with_its_keys_expiry(store: ThreadedStore, clock: WallClock) -> None:
    key, _ = await store.create_key("short", admin=True, expires_at=clock.now + 10)
    token = await store.create_session(key.id, ttl=3600)
    assert await store.get_session(token) is not None
    clock.now += 10
    assert await store.get_session(token) is None


# -- concurrency and cancellation --------------------------------------------------------------


async def test_two_hundred_concurrent_writers(store: ThreadedStore) -> None:
    errors: list[BaseException] = []

    async def writer(i: int) -> None:
        try:
            record, secret = await store.create_key(f"k{i}")
            await store.record_usage([(T0 + i, rec("m", record.id))])
            assert await store.lookup_key(secret) == record
        except BaseException as exc:  # collected, not raised: count them all
            errors.append(exc)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(writer, i)
    assert errors == []
    assert await store.count_keys() == 200
    assert await usage_count(store) == 200
    assert sum(r.requests for r in await store.usage_summary("key")) == 200


async def test_cancelled_writers_leave_consistent_state(store: ThreadedStore, backend: str) -> None:
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(store.create_key, f"k{i}")
            for i in range(50):
                nursery.start_soon(store.record_usage, [(T0, rec(f"u{i}"))] * 20)
            await trio.lowlevel.checkpoint()
            scope.cancel()
    # The store goes on working; every key is whole and every batch all or nothing.
    record, secret = await store.create_key("after")
    assert await store.lookup_key(secret) == record
    keys = await store.list_keys()
    assert all(k.prefix.startswith("llmgw-") and k.name.startswith(("k", "after")) for k in keys)
    counts = {r.group: r.requests for r in await store.usage_summary("model")}
    assert all(n == 20 for n in counts.values())
    if backend == "sqlite":
        # Queued before the cancellation, so written (after) them all.
        assert len(keys) == 51 and len(counts) == 50
        assert await rows(store, "PRAGMA integrity_check") == [("ok",)]


async def test_a_cancelled_long_read_is_interrupted(url: str) -> None:
    s = cast(ThreadedStore, await open_store(url))
    slow = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000000000)"
        " SELECT COUNT(*) FROM c"
    )
    try:
        started = trio.current_time()
        with trio.move_on_after(0.3):
            await rows(s, slow)
            pytest.fail("the slow query finished")
        assert trio.current_time() - started < 2
        # The connection is usable again, and the abandoned query really stopped:
        # closing waits for it, which would take minutes otherwise.
        assert await s.count_keys() == 0
        await s.create_key("after")
        assert await s.count_keys() == 1
    finally:
        with trio.fail_after(10):
            await s.aclose()


async def test_two_instances_share_keys_and_usage(url: str) -> None:
    a = cast(ThreadedStore, await open_store(url))
    b = cast(ThreadedStore, await open_store(url))
    try:
        record, secret = await a.create_key("shared")
        assert await b.lookup_key(secret) == record
        await a.record_usage([(T0, rec("m", record.id))])
        await b.record_usage([(T0, rec("m", record.id))])
        assert [(r.group, r.requests) for r in await a.usage_summary("key")] == [(record.id, 2)]
        assert await b.revoke_key(record.id)
        assert await a.lookup_key(secret) is None
    finally:
        await a.aclose()
        await b.aclose()


async def test_closed_store_refuses(url: str) -> None:
    s = await open_store(url)
    await s.aclose()
    await s.aclose()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        await s.list_keys()
    with pytest.raises(StoreError, match="closed"):
        await s.create_key("x")


# -- opening ------------------------------------------------------------------------------------


async def test_unsupported_scheme_is_named_without_password() -> None:
    with pytest.raises(UnsupportedStoreURL) as info:
        await open_store("mysql://bob:hunter2@db/llmgw")
    assert "mysql://bob:***@db/llmgw" in str(info.value)
    assert "hunter2" not in str(info.value)
    with pytest.raises(UnsupportedStoreURL):
        await open_store("sqlite://:memory:")


async def test_sqlite_in_a_missing_directory_is_unavailable(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/missing/llmgw.db"
    with pytest.raises(StoreUnavailable) as info:
        await open_store(url)
    assert url in str(info.value)


async def test_unreachable_postgres_is_named_without_password() -> None:
    # The port is held, so nothing listens there.
    with reserve_port() as port, trio.fail_after(30), pytest.raises(StoreUnavailable) as info:
        await open_store(f"postgresql://bob:hunter2@127.0.0.1:{port}/llmgw")
    message = str(info.value)
    assert f"postgresql://bob:***@127.0.0.1:{port}/llmgw" in message
    assert "hunter2" not in message


async def test_postgres_through_a_unix_socket_directory(
    pg_cluster: TempCluster, tmp_path: Path
) -> None:
    """libpq's URL form for a unix socket (no TCP port: the test cluster has none) opens
    the store, and names it without the password when the socket is not there."""
    url = pg_cluster.new_database()
    assert url.startswith("postgresql://postgres@/") and "?host=/" in url
    s = await open_store(url)
    try:
        await s.create_key("via-socket")
        assert [k.name for k in await s.list_keys()] == ["via-socket"]
    finally:
        await s.aclose()
    missing = f"postgresql://bob:hunter2@/llmgw?host={tmp_path}"
    with trio.fail_after(30), pytest.raises(StoreUnavailable) as info:
        await open_store(missing)
    message = str(info.value)
    assert f"postgresql://bob:***@/llmgw?host={tmp_path}" in message
    assert "hunter2" not in message


def test_sqlite_urls() -> None:
    assert sqlite_path("sqlite:///var/lib/llmgw.db") == "/var/lib/llmgw.db"
    assert sqlite_path("sqlite://data/llmgw.db") == "data/llmgw.db"
    with pytest.raises(UnsupportedStoreURL):
        sqlite_path("sqlite://")


async def test_postgres_replaces_connections_the_server_dropped(pg_cluster: TempCluster) -> None:
    url = pg_cluster.new_database()
    s = cast(ThreadedStore, await open_store(url))
    try:
        await s.create_key("a")
        # Four calls that each hold their connection until all four have one: four
        # connections into the pool.
        together = threading.Barrier(4, timeout=10)

        def hold(db: DB) -> list[Any]:
            together.wait()
            return db.rows("SELECT 1")

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(s._read, hold)

        def terminate_all() -> int:
            with psycopg.connect(pg_cluster.url(), autocommit=True) as admin:
                found = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    (urlsplit(url).path.lstrip("/"),),
                ).fetchall()
            return len(found)

        assert await trio.to_thread.run_sync(terminate_all) == 4
        # Every pooled connection is dead now; calls go on without an error.
        assert await s.count_keys() == 1
        await s.create_key("b")
        assert await s.count_keys() == 2
    finally:
        await s.aclose()
