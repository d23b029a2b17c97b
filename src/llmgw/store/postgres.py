"""The PostgreSQL store: keys, usage and sessions shared by several llmgw-server instances.

psycopg 3 in its blocking mode, on worker threads: its async mode runs on asyncio
only, and llmgw runs on trio, so every call is ``trio.to_thread.run_sync`` with a
connection checked out of a small pool of our own for the duration of that call
(one thread uses a connection at a time). At most `pool_size` calls run at once
(a ``trio.CapacityLimiter``), so that is also the most connections one instance
opens; idle ones are kept for the next call, broken ones dropped and reopened on
demand (a pooled connection found dead at the start of a call is replaced
transparently, so a database restart costs no failed request once it is back).

Each call is one transaction. Cancelling a caller abandons the thread (trio gets
control back at once); a read is then cancelled on the server
(``Connection.cancel_safe``), a write is left to commit, as on SQLite.
Migrations take a transaction-scoped advisory lock, so instances starting
together migrate one after the other.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import psycopg
import trio
from psycopg.pq import TransactionStatus

from llmgw.store.base import StoreClosed, StoreError, StoreUnavailable, redact_url
from llmgw.store.migrations import Migration
from llmgw.store.migrations.postgres import MIGRATIONS
from llmgw.store.sql.db import DB, Row
from llmgw.store.sql.threaded import Call, ThreadedStore
from llmgw.store.sql.usage import USAGE_COLUMNS

__all__ = ["PostgresStore"]

T = TypeVar("T")

# pg_advisory_xact_lock key of the migration runner ("llmgw-mg").
_MIGRATION_LOCK = 0x6C6C6D67772D6D67
# The class id of the rate-limit locks (pg_advisory_xact_lock(int, int)): "rate".
_RATE_LOCKS = 0x72617465
_COPY_USAGE = f"COPY usage_records ({', '.join(USAGE_COLUMNS)}) FROM STDIN"
_CANCEL_TIMEOUT = 5.0


def _q(sql: str) -> str:
    return sql.replace("?", "%s")


class _PostgresDB:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self.conn.execute(_q(sql), params or None).fetchall()

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.conn.execute(_q(sql), params or None).rowcount

    def many(self, sql: str, params: Sequence[Sequence[Any]]) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(_q(sql), params)

    def insert_usage(self, rows: Sequence[Row]) -> None:
        with self.conn.cursor() as cur, cur.copy(_COPY_USAGE) as copy:
            for row in rows:
                copy.write_row(row)

    def has_table(self, name: str) -> bool:
        found = self.conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
        return bool(found and found[0])

    def lock_for_migration(self) -> None:
        self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))

    def lock_rate(self, key_id: str) -> None:
        # The two-key form: its own space, apart from the migration lock's bigint.
        self.conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_RATE_LOCKS, key_id))

    def bucket_expr(self) -> str:
        return "floor(ts / ?) * ?"

    def now(self) -> float:
        # clock_timestamp(), not now(): the time of this statement, not of the
        # transaction's start (it may have waited on a row lock).
        found = self.conn.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())").fetchone()
        assert found is not None
        return float(found[0])


def _cancel(conn: psycopg.Connection[Any]) -> None:
    with contextlib.suppress(Exception):  # failing that, the query ends anyway, only later
        cancel_safe = getattr(conn, "cancel_safe", None)  # psycopg >= 3.2
        if cancel_safe is not None:
            cancel_safe(timeout=_CANCEL_TIMEOUT)
        else:
            conn.cancel()


class PostgresStore(ThreadedStore):
    """The shared store. Build with :func:`llmgw.store.open_store` or ``await start()``."""

    # Instances on several hosts share PostgreSQL's clock, not each other's.
    database_clock = True

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] = time.time,
        pool_size: int = 4,
        connect_timeout: float = 10.0,
        migrations: tuple[Migration, ...] = MIGRATIONS,
    ) -> None:
        super().__init__(migrations=migrations, clock=clock)
        self._conninfo = url
        self.url = redact_url(url)
        self.connect_timeout = connect_timeout
        self._pool_size = pool_size
        self._limiter = trio.CapacityLimiter(pool_size)
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._closed = False

    # -- the pool (runs on worker threads) ----------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(
                self._conninfo,
                autocommit=True,  # transactions are explicit: conn.transaction()
                connect_timeout=max(2, round(self.connect_timeout)),
            )
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"cannot connect to the store at {self.url}: {self._scrub(str(exc))}"
            ) from None

    def _scrub(self, text: str) -> str:
        """A driver message with the password taken out, should it ever quote it."""
        try:
            password = psycopg.conninfo.conninfo_to_dict(self._conninfo).get("password")
        except psycopg.Error:
            password = None
        if password:
            text = text.replace(str(password), "***")
        return " ".join(text.split())  # libpq's messages span lines

    def _checkout(self) -> tuple[psycopg.Connection[Any], bool]:
        """A connection for this thread, and whether it was idle in the pool."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._connect(), False

    def _checkin(self, conn: psycopg.Connection[Any]) -> None:
        healthy = (
            not conn.closed
            and not conn.broken
            and conn.info.transaction_status == TransactionStatus.IDLE
        )
        if healthy and not self._closed:
            with self._lock:
                self._idle.append(conn)
                return
        conn.close()

    def _run(self, call: Call) -> Any:
        if self._closed:
            raise StoreClosed(f"store {self.url} is closed")
        while True:
            conn, pooled = self._checkout()
            try:
                call.begin(conn)
                try:
                    try:
                        conn.execute("BEGIN")
                    except psycopg.OperationalError:
                        if pooled and conn.broken:
                            # An idle connection the server dropped (a restart, a failover,
                            # an idle timeout): nothing ran yet, so take another one.
                            continue
                        raise
                    try:
                        result = call.fn(_PostgresDB(conn))
                    except BaseException:
                        if not conn.broken:
                            with contextlib.suppress(psycopg.Error):
                                conn.execute("ROLLBACK")
                        raise
                    conn.execute("COMMIT")
                    return result
                finally:
                    call.end()
            except psycopg.Error as exc:
                kind = StoreUnavailable if conn.broken or conn.closed else StoreError
                raise kind(f"store {self.url}: {self._scrub(str(exc))}") from exc
            finally:
                self._checkin(conn)

    # -- the two primitives ------------------------------------------------------------

    async def _call(self, fn: Callable[[DB], T], *, interruptible: bool) -> T:
        if self._closed:
            raise StoreClosed(f"store {self.url} is closed")
        call = Call(fn)
        try:
            result: T = await trio.to_thread.run_sync(
                self._run, call, abandon_on_cancel=True, limiter=self._limiter
            )
        except trio.Cancelled:
            if interruptible:
                # A cancel request is a network round trip: send it from a thread. It runs
                # under the call's lock, so it cannot reach a later query on this connection.
                trio.lowlevel.start_thread_soon(
                    partial(call.interrupt, _cancel), lambda _: None, name="llmgw-pg-cancel"
                )
            else:
                with call.lock:
                    call.cancelled = True  # not started yet: skip it; started: let it commit
            raise
        return result

    async def _read(self, fn: Callable[[DB], T]) -> T:
        return await self._call(fn, interruptible=True)

    async def _write(self, fn: Callable[[DB], T]) -> T:
        return await self._call(fn, interruptible=False)

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Open a first connection (StoreUnavailable naming the URL, without password)."""
        await self._read(lambda db: db.rows("SELECT 1"))

    async def aclose(self) -> None:
        """Wait for running calls (abandoned ones too), then close every connection."""
        if self._closed:
            return
        self._closed = True
        borrowers = [object() for _ in range(self._pool_size)]
        for b in borrowers:
            await self._limiter.acquire_on_behalf_of(b)
        try:
            with self._lock:
                idle, self._idle = self._idle, []
            for conn in idle:
                conn.close()
        finally:
            for b in borrowers:
                self._limiter.release_on_behalf_of(b)
