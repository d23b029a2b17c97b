"""The Store on a backend's worker threads: :class:`ThreadedStore` implements every
Store method over the backend's ``_read`` and ``_write``; :class:`Call` is one call
there that a cancelled caller may interrupt.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from llmgw.domain.catalog import ModelConfig
from llmgw.domain.keys import KeyRecord
from llmgw.store import keys
from llmgw.store.base import (
    GroupBy,
    Session,
    StoredCordon,
    StoredEndpoint,
    StoredModel,
    TimedUsage,
    UsageRow,
    model_to_dict,
)
from llmgw.store.migrations import Migration
from llmgw.store.sql.cluster import (
    claim_leadership,
    publish_endpoints,
    published_endpoints,
    put_demand,
    read_demand,
    read_leadership,
    renew_leadership,
    resign_leadership,
)
from llmgw.store.sql.db import DB, Row
from llmgw.store.sql.keys import (
    count_keys,
    create_session,
    delete_session,
    get_key,
    get_session,
    insert_key,
    list_keys,
    lookup_key,
    revoke_key,
)
from llmgw.store.sql.rates import add_rate, prune_rate, take_rate, used_rate
from llmgw.store.sql.runtime import (
    delete_cordon,
    delete_endpoint,
    delete_model,
    list_cordons,
    list_endpoints,
    list_models,
    put_cordon,
    put_endpoint,
    put_model,
)
from llmgw.store.sql.schema import migrate, schema_version
from llmgw.store.sql.usage import _GROUP_COLUMNS, insert_usage, usage_rows, usage_summary

T = TypeVar("T")


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

    #: Whether the lease (llmgw.control.leadership) is timed by the database's clock
    #: (PostgreSQL: the one clock instances on several hosts share) rather than `clock`.
    database_clock = False

    def __init__(
        self, *, migrations: tuple[Migration, ...], clock: Callable[[], float] = time.time
    ) -> None:
        self._migrations = migrations
        self._clock = clock

    def _lease_now(self) -> float | None:
        """The lease's time for the operations: None, the database's, or `clock`'s."""
        return None if self.database_clock else self._clock()

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

    # runtime endpoints

    async def put_endpoint(self, endpoint_id: str, config: dict[str, Any]) -> None:
        text = json.dumps(config)
        await self._write(
            partial(put_endpoint, endpoint_id=endpoint_id, config_json=text, now=self._clock())
        )

    async def delete_endpoint(self, endpoint_id: str) -> bool:
        return await self._write(partial(delete_endpoint, endpoint_id=endpoint_id))

    async def list_endpoints(self) -> list[StoredEndpoint]:
        return await self._read(list_endpoints)

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
                now=self._lease_now(),
            )
        )

    async def renew_leadership(self, name: str, holder: str, token: int, ttl: float) -> bool:
        return await self._write(
            partial(
                renew_leadership,
                name=name,
                holder=holder,
                token=token,
                ttl=ttl,
                now=self._lease_now(),
            )
        )

    async def resign_leadership(self, name: str, holder: str, token: int) -> bool:
        return await self._write(partial(resign_leadership, name=name, holder=holder, token=token))

    async def read_leadership(self, name: str) -> Row | None:
        return await self._read(partial(read_leadership, name=name, now=self._lease_now()))

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
        await self._write(partial(put_demand, instance=instance, rows=rows, now=self._lease_now()))

    async def read_demand(self, fresh: float) -> list[Row]:
        return await self._read(partial(read_demand, fresh=fresh, now=self._lease_now()))

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
