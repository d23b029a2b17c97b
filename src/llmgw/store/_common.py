"""What both backends share: the SQL of every operation and the Store methods around it.

Each operation is a plain synchronous function of a :class:`DB` (a thin adapter
over one DB-API connection), run by a backend on one of its threads inside a
transaction. The SQL is written once with ``?`` placeholders; the PostgreSQL
adapter turns them into ``%s``. :class:`ThreadedStore` implements every async
method of :class:`~llmgw.store.base.Store` on top of two primitives a backend
provides: ``_read(fn)`` and ``_write(fn)``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar

from llmgw.domain.catalog import ModelConfig
from llmgw.domain.keys import KeyRecord
from llmgw.store import keys
from llmgw.store.base import (
    DuplicateKeyName,
    GroupBy,
    SchemaTooNew,
    Session,
    StoredCordon,
    StoredModel,
    StoreError,
    TimedUsage,
    UsageRow,
    model_to_dict,
)
from llmgw.store.migrations import Migration, check_sequence, latest

T = TypeVar("T")
Row = tuple[Any, ...]


class DB(Protocol):
    """One connection, as the operations below use it (inside a transaction)."""

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Execute a statement without results; the number of rows it changed."""
        ...

    def many(self, sql: str, params: Sequence[Sequence[Any]]) -> None: ...

    def insert_usage(self, rows: Sequence[Row]) -> None:
        """Insert rows of :data:`USAGE_COLUMNS` into usage_records, as fast as it can."""
        ...

    def has_table(self, name: str) -> bool: ...

    def lock_for_migration(self) -> None:
        """Keep other processes from migrating until this transaction ends."""
        ...

    def bucket_expr(self) -> str:
        """SQL for ``floor(ts / ?) * ?`` (two placeholders, both the bucket size)."""
        ...

    def lock_rate(self, key_id: str) -> None:
        """Serialise rate grants of `key_id` with other transactions until this one
        ends."""
        ...


def one(db: DB, sql: str, params: Sequence[Any] = ()) -> Row | None:
    found = db.rows(sql, params)
    return found[0] if found else None


# -- migrations -------------------------------------------------------------------------


def migrate(db: DB, migrations: tuple[Migration, ...], now: float) -> int:
    check_sequence(migrations)
    db.lock_for_migration()
    db.run(
        "CREATE TABLE IF NOT EXISTS schema_version ("
        " version INTEGER PRIMARY KEY,"
        " description TEXT NOT NULL,"
        " applied_at DOUBLE PRECISION NOT NULL)"
    )
    row = one(db, "SELECT MAX(version) FROM schema_version")
    current = int(row[0]) if row and row[0] is not None else 0
    known = latest(migrations)
    if current > known:
        raise SchemaTooNew(current, known)
    for migration in migrations:
        if migration.version <= current:
            continue
        for statement in migration.statements:
            db.run(statement)
        db.run(
            "INSERT INTO schema_version (version, description, applied_at) VALUES (?, ?, ?)",
            (migration.version, migration.description, now),
        )
    return max(current, known)


def schema_version(db: DB) -> int:
    """The applied version (0 for an empty database)."""
    if not db.has_table("schema_version"):
        return 0
    row = one(db, "SELECT MAX(version) FROM schema_version")
    return int(row[0]) if row and row[0] is not None else 0


# -- keys -------------------------------------------------------------------------------

KEY_COLUMNS = "id, name, prefix, band, models, rpm, tpm, admin, created_at, expires_at, revoked_at"
_KEY_COLUMNS_K = ", ".join(f"k.{c.strip()}" for c in KEY_COLUMNS.split(","))
_USABLE = "revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?)"


def _key(row: Row) -> KeyRecord:
    models = None if row[4] is None else tuple(json.loads(row[4]))
    return KeyRecord(
        id=row[0],
        name=row[1],
        prefix=row[2],
        band=row[3],
        models=models,
        rpm=row[5],
        tpm=row[6],
        admin=bool(row[7]),
        created_at=float(row[8]),
        expires_at=None if row[9] is None else float(row[9]),
        revoked_at=None if row[10] is None else float(row[10]),
    )


def _holder(db: DB, name: str) -> str | None:
    """The id of a key not revoked that is named `name` (the oldest), if any."""
    row = one(
        db,
        "SELECT id FROM api_keys WHERE name = ? AND revoked_at IS NULL ORDER BY created_at, id",
        (name,),
    )
    return None if row is None else str(row[0])


def insert_key(db: DB, record: KeyRecord, secret_hash: str) -> None:
    # The query sees legacy duplicates, which the unique index leaves out; the index
    # settles a race between two creators (on PostgreSQL the second waits for the
    # first to commit, then inserts nothing), so the rowcount decides.
    holder = _holder(db, record.name)
    if holder is not None:
        raise DuplicateKeyName(record.name, holder)
    changed = db.run(
        f"INSERT INTO api_keys ({KEY_COLUMNS}, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (name) WHERE revoked_at IS NULL AND NOT legacy_duplicate DO NOTHING",
        (
            record.id,
            record.name,
            record.prefix,
            record.band,
            None if record.models is None else json.dumps(list(record.models)),
            record.rpm,
            record.tpm,
            record.admin,
            record.created_at,
            record.expires_at,
            record.revoked_at,
            secret_hash,
        ),
    )
    if not changed:
        raise DuplicateKeyName(record.name, _holder(db, record.name) or "created just now")


def lookup_key(db: DB, secret_hash: str, now: float) -> KeyRecord | None:
    sql = f"SELECT {KEY_COLUMNS} FROM api_keys WHERE hash = ? AND {_USABLE}"
    row = one(db, sql, (secret_hash, now))
    return None if row is None else _key(row)


def get_key(db: DB, key_id: str) -> KeyRecord | None:
    row = one(db, f"SELECT {KEY_COLUMNS} FROM api_keys WHERE id = ?", (key_id,))
    return None if row is None else _key(row)


def list_keys(db: DB) -> list[KeyRecord]:
    return [_key(r) for r in db.rows(f"SELECT {KEY_COLUMNS} FROM api_keys ORDER BY created_at, id")]


def revoke_key(db: DB, key_id: str, now: float) -> bool:
    changed = db.run(
        "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (now, key_id)
    )
    if changed:
        db.run("DELETE FROM dashboard_sessions WHERE key_id = ?", (key_id,))
    return changed > 0


def count_keys(db: DB, now: float, admin: bool | None) -> int:
    sql = f"SELECT COUNT(*) FROM api_keys WHERE {_USABLE}"
    params: list[Any] = [now]
    if admin is not None:
        sql += " AND admin = ?"
        params.append(admin)
    row = one(db, sql, params)
    return int(row[0]) if row else 0


# -- usage ------------------------------------------------------------------------------

USAGE_COLUMNS = (
    "ts",
    "key_id",
    "band",
    "tenant",
    "model",
    "endpoint",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "estimated",
    "latency",
    "ttft",
    "request_id",
)


def usage_rows(batch: Sequence[TimedUsage]) -> list[Row]:
    return [
        (
            at,
            r.key_id,
            r.band,
            r.tenant,
            r.model,
            r.endpoint,
            r.status,
            r.usage.prompt_tokens,
            r.usage.completion_tokens,
            r.usage.cached_tokens,
            r.usage.estimated,
            r.latency,
            r.ttft,
            r.request_id,
        )
        for at, r in batch
    ]


def insert_usage(db: DB, rows: Sequence[Row]) -> None:
    if rows:
        db.insert_usage(rows)


_GROUP_COLUMNS: dict[str, str] = {"key": "key_id", "model": "model"}


def usage_summary(
    db: DB, group_by: GroupBy, since: float | None, until: float | None, bucket: float | None
) -> list[UsageRow]:
    column = _GROUP_COLUMNS.get(group_by)
    if column is None:
        raise ValueError(f"group_by must be 'key' or 'model', got {group_by!r}")
    if bucket is not None and not bucket > 0:
        raise ValueError(f"bucket must be a positive number of seconds, got {bucket!r}")
    params: list[Any] = []
    if bucket is not None:
        bucket_sql = db.bucket_expr()
        params += [float(bucket), float(bucket)]
        group_sql = "1, 2"  # by position: the bucket expression's placeholders appear once
    else:
        bucket_sql = "NULL"
        group_sql = "1"
    where: list[str] = []
    if since is not None:
        where.append("ts >= ?")
        params.append(since)
    if until is not None:
        where.append("ts < ?")
        params.append(until)
    sql = (
        f"SELECT {column}, {bucket_sql}, COUNT(*),"
        " CAST(SUM(prompt_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT),"
        " CAST(COALESCE(SUM(cached_tokens), 0) AS BIGINT),"
        " CAST(SUM(CASE WHEN status < 200 OR status >= 400 THEN 1 ELSE 0 END) AS BIGINT),"
        " AVG(latency), AVG(ttft)"
        " FROM usage_records"
        + (" WHERE " + " AND ".join(where) if where else "")
        + f" GROUP BY {group_sql}"
    )
    result = [
        UsageRow(
            group=r[0],
            bucket=None if r[1] is None else float(r[1]),
            requests=int(r[2]),
            prompt_tokens=int(r[3]),
            completion_tokens=int(r[4]),
            cached_tokens=int(r[5]),
            errors=int(r[6]),
            mean_latency=float(r[7]),
            mean_ttft=None if r[8] is None else float(r[8]),
        )
        for r in db.rows(sql, params)
    ]
    # Sorted here: the two databases disagree on where NULL (no key) sorts.
    result.sort(key=lambda u: (u.bucket or 0.0, u.group is not None, u.group or ""))
    return result


# -- runtime models ---------------------------------------------------------------------


def put_model(db: DB, name: str, config_json: str, now: float) -> None:
    db.run(
        "INSERT INTO runtime_models (name, config, updated_at) VALUES (?, ?, ?)"
        " ON CONFLICT (name) DO UPDATE SET config = excluded.config,"
        " updated_at = excluded.updated_at",
        (name, config_json, now),
    )


def delete_model(db: DB, name: str) -> bool:
    return db.run("DELETE FROM runtime_models WHERE name = ?", (name,)) > 0


def list_models(db: DB) -> list[StoredModel]:
    return [
        StoredModel(json.loads(r[0]), float(r[1]))
        for r in db.rows("SELECT config, updated_at FROM runtime_models ORDER BY name")
    ]


# -- shared rate limits ----------------------------------------------------------------

#: The window every rate limit counts over (seconds).
RATE_WINDOW = 60.0


def take_rate(
    db: DB, key_id: str, kind: str, limit: int, amount: int, now: float
) -> tuple[int, float | None]:
    """Grant up to `amount` of `key_id`'s `kind` (requests) within `limit` per
    RATE_WINDOW, counting every grant of the window whoever took it; returns what was
    granted and when the oldest grant in the window was taken (None: none)."""
    db.lock_rate(key_id)
    used, oldest = used_rate(db, key_id, kind, now)
    granted = max(0, min(amount, limit - used))
    if granted:
        add_rate(db, [(key_id, kind, now, granted)])
    return granted, oldest


def add_rate(db: DB, rows: Sequence[tuple[str, str, float, int]]) -> None:
    """Record what was used (tokens), as (key id, kind, at, amount) rows."""
    db.many("INSERT INTO rate_grants (key_id, kind, at, amount) VALUES (?, ?, ?, ?)", rows)


def used_rate(db: DB, key_id: str, kind: str, now: float) -> tuple[int, float | None]:
    """What the window holds of `key_id`'s `kind`, and its oldest entry's time."""
    used, oldest = one(
        db,
        "SELECT COALESCE(SUM(amount), 0), MIN(at) FROM rate_grants"
        " WHERE key_id = ? AND kind = ? AND at > ?",
        (key_id, kind, now - RATE_WINDOW),
    ) or (0, None)
    return int(used), None if oldest is None else float(oldest)


def prune_rate(db: DB, now: float) -> int:
    """Forget grants older than the window (kept twice as long: clocks differ a little)."""
    return db.run("DELETE FROM rate_grants WHERE at < ?", (now - 2 * RATE_WINDOW,))


# -- several instances: leadership, published endpoints, demand --------------------------


def claim_leadership(
    db: DB, name: str, holder: str, agents: str, admin: str, ttl: float, now: float
) -> int | None:
    """Take the lease `name` when nobody holds it or its holder's has expired: the new
    fencing token (one more than the last), else None."""
    created = db.run(
        "INSERT INTO leadership (name, holder, agent_address, admin_address, token, expires_at)"
        " VALUES (?, ?, ?, ?, 1, ?) ON CONFLICT (name) DO NOTHING",
        (name, holder, agents, admin, now + ttl),
    )
    if not created:
        taken = db.run(
            "UPDATE leadership SET holder = ?, agent_address = ?, admin_address = ?,"
            " token = token + 1, expires_at = ? WHERE name = ? AND expires_at < ?",
            (holder, agents, admin, now + ttl, name, now),
        )
        if not taken:
            return None
    row = one(db, "SELECT token FROM leadership WHERE name = ?", (name,))
    return None if row is None else int(row[0])


def renew_leadership(db: DB, name: str, holder: str, token: int, ttl: float, now: float) -> bool:
    """Extend the lease while `holder` still holds it with `token`."""
    return (
        db.run(
            "UPDATE leadership SET expires_at = ? WHERE name = ? AND holder = ? AND token = ?",
            (now + ttl, name, holder, token),
        )
        == 1
    )


def resign_leadership(db: DB, name: str, holder: str, token: int) -> bool:
    """Let the lease go at once (a clean stop: another instance takes over now)."""
    return (
        db.run(
            "UPDATE leadership SET expires_at = 0 WHERE name = ? AND holder = ? AND token = ?",
            (name, holder, token),
        )
        == 1
    )


def read_leadership(db: DB, name: str) -> Row | None:
    """(holder, agent address, admin address, token, expires at) of the lease."""
    return one(
        db,
        "SELECT holder, agent_address, admin_address, token, expires_at FROM leadership"
        " WHERE name = ?",
        (name,),
    )


def _fenced(db: DB, name: str, token: int) -> bool:
    row = one(db, "SELECT token FROM leadership WHERE name = ?", (name,))
    return row is not None and int(row[0]) == token


def publish_endpoints(
    db: DB, name: str, token: int, changes: Sequence[tuple[str, str | None, bool]], full: bool
) -> bool:
    """Apply the leader's endpoint changes, (id, body or None to remove, draining); with
    `full` they are the whole set. Refused (False) unless `token` still leads: a
    deposed leader's writes never land."""
    if not _fenced(db, name, token):
        return False
    if full:
        db.run("DELETE FROM published_endpoints")
    for ident, body, draining in changes:
        if body is None:
            db.run("DELETE FROM published_endpoints WHERE id = ?", (ident,))
        else:
            db.run(
                "INSERT INTO published_endpoints (id, body, draining, token) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET body = excluded.body,"
                " draining = excluded.draining, token = excluded.token",
                (ident, body, draining, token),
            )
    return True


def published_endpoints(db: DB) -> list[tuple[str, str, bool]]:
    return [
        (str(r[0]), str(r[1]), bool(r[2]))
        for r in db.rows("SELECT id, body, draining FROM published_endpoints ORDER BY id")
    ]


def put_demand(
    db: DB,
    instance: str,
    rows: Sequence[tuple[str, int, int, float, int, float | None]],
    now: float,
) -> None:
    """This instance's demand per model: (model, in flight, queued, saturation, serving,
    seconds since its last request or None)."""
    db.run("DELETE FROM instance_demand WHERE instance = ?", (instance,))
    db.many(
        "INSERT INTO instance_demand"
        " (instance, model, inflight, queued, saturation, serving, idle_for, at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(instance, *row, now) for row in rows],
    )


def read_demand(db: DB, since: float) -> list[Row]:
    """(instance, model, inflight, queued, saturation, serving, idle_for, at) of the rows
    written after `since`."""
    return db.rows(
        "SELECT instance, model, inflight, queued, saturation, serving, idle_for, at"
        " FROM instance_demand WHERE at > ?",
        (since,),
    )


# -- node cordons -----------------------------------------------------------------------


def put_cordon(db: DB, node_id: str, drain: bool, now: float) -> None:
    db.run(
        "INSERT INTO node_cordons (node_id, drain, updated_at) VALUES (?, ?, ?)"
        " ON CONFLICT (node_id) DO UPDATE SET drain = excluded.drain,"
        " updated_at = excluded.updated_at",
        (node_id, drain, now),
    )


def delete_cordon(db: DB, node_id: str) -> bool:
    return db.run("DELETE FROM node_cordons WHERE node_id = ?", (node_id,)) > 0


def list_cordons(db: DB) -> list[StoredCordon]:
    return [
        StoredCordon(str(r[0]), bool(r[1]), float(r[2]))
        for r in db.rows("SELECT node_id, drain, updated_at FROM node_cordons ORDER BY node_id")
    ]


# -- sessions ---------------------------------------------------------------------------


def create_session(db: DB, token_hash: str, key_id: str, now: float, ttl: float) -> None:
    if one(db, "SELECT 1 FROM api_keys WHERE id = ?", (key_id,)) is None:
        raise StoreError(f"no API key with id {key_id!r}")
    db.run("DELETE FROM dashboard_sessions WHERE expires_at <= ?", (now,))
    db.run(
        "INSERT INTO dashboard_sessions (token_hash, key_id, created_at, expires_at)"
        " VALUES (?, ?, ?, ?)",
        (token_hash, key_id, now, now + ttl),
    )


def get_session(db: DB, token_hash: str, now: float) -> Session | None:
    row = one(
        db,
        f"SELECT {_KEY_COLUMNS_K}, s.created_at, s.expires_at"
        " FROM dashboard_sessions s JOIN api_keys k ON k.id = s.key_id"
        " WHERE s.token_hash = ? AND s.expires_at > ?"
        " AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > ?)",
        (token_hash, now, now),
    )
    if row is None:
        return None
    return Session(key=_key(row[:11]), created_at=float(row[11]), expires_at=float(row[12]))


def delete_session(db: DB, token_hash: str) -> bool:
    return db.run("DELETE FROM dashboard_sessions WHERE token_hash = ?", (token_hash,)) > 0


# -- calls that a cancelled caller may interrupt ----------------------------------------


class Abandoned(Exception):
    """A call whose caller was cancelled before it started; it did nothing."""


class Call:
    """One call of `fn` on a worker thread, which the trio side may ask to stop.

    The worker sets `conn` while `fn` runs on that connection and clears it
    before the connection serves anyone else, both under `lock`; the canceller
    interrupts under the same lock only while `conn` is set, so it can never
    interrupt another caller's query that later runs on the same connection.
    """

    __slots__ = ("cancelled", "conn", "fn", "lock")

    def __init__(self, fn: Callable[[DB], Any]) -> None:
        self.fn = fn
        self.lock = threading.Lock()
        self.cancelled = False
        self.conn: Any = None

    def begin(self, conn: Any) -> None:
        with self.lock:
            if self.cancelled:
                raise Abandoned
            self.conn = conn

    def end(self) -> None:
        with self.lock:
            self.conn = None

    def interrupt(self, how: Callable[[Any], object]) -> None:
        """Mark cancelled; if running, call ``how(conn)`` (under the lock)."""
        with self.lock:
            self.cancelled = True
            if self.conn is not None:
                how(self.conn)


# -- the Store methods ------------------------------------------------------------------


class ThreadedStore:
    """Every :class:`~llmgw.store.base.Store` method, over a backend's `_read` and `_write`."""

    def __init__(
        self, *, migrations: tuple[Migration, ...], clock: Callable[[], float] = time.time
    ) -> None:
        self._migrations = migrations
        self._clock = clock

    async def _read(self, fn: Callable[[DB], T]) -> T:
        raise NotImplementedError

    async def _write(self, fn: Callable[[DB], T]) -> T:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> ThreadedStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def migrate(self) -> int:
        return await self._write(partial(migrate, migrations=self._migrations, now=self._clock()))

    async def schema_version(self) -> int:
        return await self._read(schema_version)

    # keys

    async def create_key(
        self,
        name: str,
        *,
        band: str | None = None,
        models: tuple[str, ...] | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        admin: bool = False,
        expires_at: float | None = None,
    ) -> tuple[KeyRecord, str]:
        secret = keys.generate_secret()
        record = KeyRecord(
            id=keys.new_key_id(),
            name=name,
            prefix=keys.display_prefix(secret),
            band=band,
            models=None if models is None else tuple(models),
            rpm=rpm,
            tpm=tpm,
            admin=admin,
            created_at=self._clock(),
            expires_at=expires_at,
        )
        await self._write(partial(insert_key, record=record, secret_hash=keys.hash_secret(secret)))
        return record, secret

    async def lookup_key(self, secret: str) -> KeyRecord | None:
        if not secret.startswith(keys.SECRET_PREFIX):
            return None
        digest = keys.hash_secret(secret)
        return await self._read(partial(lookup_key, secret_hash=digest, now=self._clock()))

    async def get_key(self, key_id: str) -> KeyRecord | None:
        return await self._read(partial(get_key, key_id=key_id))

    async def list_keys(self) -> list[KeyRecord]:
        return await self._read(list_keys)

    async def revoke_key(self, key_id: str) -> bool:
        return await self._write(partial(revoke_key, key_id=key_id, now=self._clock()))

    async def count_keys(self, *, admin: bool | None = None) -> int:
        return await self._read(partial(count_keys, now=self._clock(), admin=admin))

    # usage

    async def record_usage(self, batch: Sequence[TimedUsage]) -> None:
        rows = usage_rows(batch)  # built here: the writer thread does only SQL
        if rows:
            await self._write(partial(insert_usage, rows=rows))

    async def usage_summary(
        self,
        group_by: GroupBy,
        *,
        since: float | None = None,
        until: float | None = None,
        bucket: float | None = None,
    ) -> list[UsageRow]:
        if group_by not in _GROUP_COLUMNS:
            raise ValueError(f"group_by must be 'key' or 'model', got {group_by!r}")
        return await self._read(
            partial(usage_summary, group_by=group_by, since=since, until=until, bucket=bucket)
        )

    # runtime models

    async def put_model(self, model: ModelConfig) -> None:
        text = json.dumps(model_to_dict(model))
        await self._write(partial(put_model, name=model.name, config_json=text, now=self._clock()))

    async def delete_model(self, name: str) -> bool:
        return await self._write(partial(delete_model, name=name))

    async def list_models(self) -> list[StoredModel]:
        return await self._read(list_models)

    # node cordons

    async def put_cordon(self, node_id: str, *, drain: bool) -> None:
        await self._write(partial(put_cordon, node_id=node_id, drain=drain, now=self._clock()))

    async def delete_cordon(self, node_id: str) -> bool:
        return await self._write(partial(delete_cordon, node_id=node_id))

    async def list_cordons(self) -> list[StoredCordon]:
        return await self._read(list_cordons)

    # shared rate limits

    async def take_rate(
        self, key_id: str, kind: str, limit: int, amount: int
    ) -> tuple[int, float | None]:
        return await self._write(
            partial(
                take_rate, key_id=key_id, kind=kind, limit=limit, amount=amount, now=self._clock()
            )
        )

    async def add_rate(self, rows: Sequence[tuple[str, str, float, int]]) -> None:
        await self._write(partial(add_rate, rows=rows))

    async def used_rate(self, key_id: str, kind: str) -> tuple[int, float | None]:
        return await self._read(partial(used_rate, key_id=key_id, kind=kind, now=self._clock()))

    async def prune_rate(self) -> int:
        return await self._write(partial(prune_rate, now=self._clock()))

    def wall_clock(self) -> float:
        """The clock grants are timed by (Unix seconds)."""
        return self._clock()

    # several instances

    async def claim_leadership(
        self, name: str, holder: str, agents: str, admin: str, ttl: float
    ) -> int | None:
        return await self._write(
            partial(
                claim_leadership,
                name=name,
                holder=holder,
                agents=agents,
                admin=admin,
                ttl=ttl,
                now=self._clock(),
            )
        )

    async def renew_leadership(self, name: str, holder: str, token: int, ttl: float) -> bool:
        return await self._write(
            partial(
                renew_leadership, name=name, holder=holder, token=token, ttl=ttl, now=self._clock()
            )
        )

    async def resign_leadership(self, name: str, holder: str, token: int) -> bool:
        return await self._write(partial(resign_leadership, name=name, holder=holder, token=token))

    async def read_leadership(self, name: str) -> Row | None:
        return await self._read(partial(read_leadership, name=name))

    async def publish_endpoints(
        self,
        name: str,
        token: int,
        changes: Sequence[tuple[str, str | None, bool]],
        *,
        full: bool = False,
    ) -> bool:
        return await self._write(
            partial(publish_endpoints, name=name, token=token, changes=changes, full=full)
        )

    async def published_endpoints(self) -> list[tuple[str, str, bool]]:
        return await self._read(published_endpoints)

    async def put_demand(
        self, instance: str, rows: Sequence[tuple[str, int, int, float, int, float | None]]
    ) -> None:
        await self._write(partial(put_demand, instance=instance, rows=rows, now=self._clock()))

    async def read_demand(self, since: float) -> list[Row]:
        return await self._read(partial(read_demand, since=since))

    # sessions

    async def create_session(self, key_id: str, ttl: float) -> str:
        if not ttl > 0:
            raise ValueError(f"ttl must be positive, got {ttl!r}")
        token = keys.new_session_token()
        await self._write(
            partial(
                create_session,
                token_hash=keys.hash_secret(token),
                key_id=key_id,
                now=self._clock(),
                ttl=ttl,
            )
        )
        return token

    async def get_session(self, token: str) -> Session | None:
        digest = keys.hash_secret(token)
        return await self._read(partial(get_session, token_hash=digest, now=self._clock()))

    async def delete_session(self, token: str) -> bool:
        return await self._write(partial(delete_session, token_hash=keys.hash_secret(token)))
