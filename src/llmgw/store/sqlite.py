"""The SQLite store: one file in WAL mode, for a single llmgw-server.

Threads (DESIGN §11; trio must never block on the database):

* **One writer thread** owns the only write connection. Every write is a job on
  a queue; the thread runs each in its own ``BEGIN IMMEDIATE`` … ``COMMIT`` and
  hands the result back to trio with ``TrioToken.run_sync_soon`` (which sets the
  caller's ``trio.Event``). Writes are therefore serialised in arrival order and
  never meet "database is locked" from each other. A caller cancelled while it
  waits only stops waiting: the job, already queued, still runs to commit or
  rollback, so a cancellation never leaves half a change.
* **Reads** run in ``trio.to_thread.run_sync`` worker threads, each on a
  connection of its own kept in a thread-local (a sqlite3 connection must not
  be shared between threads), at most `readers` at a time. In WAL mode they see
  the last committed state and never wait for the writer. A cancelled reader's
  query is stopped with ``Connection.interrupt()``.

``sqlite:///abs/path.db`` names an absolute path, ``sqlite://rel/path.db`` one
relative to the working directory (file-URL style). The directory must exist.
"""

from __future__ import annotations

import contextlib
import queue
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import trio

from llmgw.store.base import StoreClosed, StoreError, StoreUnavailable, UnsupportedStoreURL
from llmgw.store.migrations import Migration
from llmgw.store.migrations.sqlite import MIGRATIONS
from llmgw.store.sql.db import DB, Row
from llmgw.store.sql.threaded import Call, ThreadedStore
from llmgw.store.sql.usage import USAGE_COLUMNS

__all__ = ["SQLiteStore", "sqlite_path"]

T = TypeVar("T")

_INSERT_USAGE = (
    f"INSERT INTO usage_records ({', '.join(USAGE_COLUMNS)})"
    f" VALUES ({', '.join('?' * len(USAGE_COLUMNS))})"
)


def sqlite_path(url: str) -> str:
    """The file a ``sqlite://`` URL names."""
    if not url.lower().startswith("sqlite://"):
        raise UnsupportedStoreURL(f"not a sqlite:// URL: {url!r}")
    path = url[len("sqlite://") :]
    if not path or path in (":memory:", "/:memory:"):
        raise UnsupportedStoreURL(
            f"store URL {url!r} names no file (an in-memory database cannot be shared by the "
            "writer and reader threads): use sqlite:///path/to/llmgw.db"
        )
    if "?" in path:
        raise UnsupportedStoreURL(f"store URL {url!r}: query parameters are not supported")
    return path


class _SQLiteDB:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self.conn.execute(sql, params).fetchall()

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.conn.execute(sql, params).rowcount

    def many(self, sql: str, params: Sequence[Sequence[Any]]) -> None:
        self.conn.executemany(sql, params)

    def insert_usage(self, rows: Sequence[Row]) -> None:
        self.conn.executemany(_INSERT_USAGE, rows)

    def has_table(self, name: str) -> bool:
        sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        return self.conn.execute(sql, (name,)).fetchone() is not None

    def lock_for_migration(self) -> None:
        pass  # BEGIN IMMEDIATE already holds the database's write lock

    def lock_rate(self, key_id: str) -> None:
        pass  # likewise: one writer at a time, in every process

    def bucket_expr(self) -> str:
        # Timestamps are positive, so truncation is floor.
        return "CAST(ts / ? AS INTEGER) * ?"

    def now(self) -> float:
        return time.time()  # one host: its clock is the database's


class _Job(Generic[T]):
    """One write: run on the writer thread, its outcome handed back to trio."""

    __slots__ = ("done", "error", "fn", "result", "token")

    def __init__(self, fn: Callable[[DB], T], token: trio.lowlevel.TrioToken) -> None:
        self.fn = fn
        self.token = token
        self.done = trio.Event()
        self.result: T | None = None
        self.error: BaseException | None = None

    def finish(self) -> None:
        with contextlib.suppress(trio.RunFinishedError):  # that run is gone: nobody waits
            self.token.run_sync_soon(self.done.set)


class _Reader:
    """A reader thread's own connection (held by a thread-local; closed with the thread)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.conn.close()

    def __del__(self) -> None:
        # The worker thread exited (trio retires idle ones) and took its thread-local along.
        with contextlib.suppress(Exception):
            self.close()


class SQLiteStore(ThreadedStore):
    """The embedded store. Build with :func:`llmgw.store.open_store` or ``await start()``."""

    def __init__(
        self,
        path: str,
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout: float = 5.0,
        readers: int = 4,
        migrations: tuple[Migration, ...] = MIGRATIONS,
    ) -> None:
        super().__init__(migrations=migrations, clock=clock)
        self.path = path
        self.url = f"sqlite://{path}"
        self.busy_timeout = busy_timeout
        self._jobs: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._readers_limit = readers
        self._read_limiter = trio.CapacityLimiter(readers)
        self._local = threading.local()
        self._readers: weakref.WeakSet[_Reader] = weakref.WeakSet()
        self._readers_lock = threading.Lock()
        self._closed = False

    def _connect(self, *, reader: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout,
            isolation_level=None,  # transactions are explicit
            check_same_thread=not reader,  # readers are closed by aclose from the trio thread
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            conn.execute("PRAGMA foreign_keys = ON")
            if reader:
                conn.execute("PRAGMA query_only = ON")
            else:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise sqlite3.OperationalError(f"cannot switch to WAL (journal_mode={mode})")
                # Durable at each checkpoint rather than each commit: WAL stays consistent
                # after a crash, and a power loss may lose the last commits.
                conn.execute("PRAGMA synchronous = NORMAL")
        except BaseException:
            conn.close()
            raise
        return conn

    def _error(self, exc: BaseException) -> BaseException:
        """A database error as a StoreError naming the store; anything else as it is."""
        if isinstance(exc, sqlite3.Error):
            new = StoreError(f"store {self.url}: {exc}")
            new.__cause__ = exc
            return new
        return exc

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Start the writer thread and open the database (StoreUnavailable if it cannot)."""
        if self._writer is not None:
            return
        ready: list[BaseException | None] = []
        token = trio.lowlevel.current_trio_token()
        opened = trio.Event()

        def signal() -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(opened.set)

        self._writer = threading.Thread(
            target=self._writer_main,
            args=(ready, signal),
            name=f"llmgw-sqlite-writer {self.path}",
            daemon=True,
        )
        self._writer.start()
        await opened.wait()
        if ready[0] is not None:
            self._closed = True
            raise StoreUnavailable(f"cannot open the store {self.url}: {ready[0]}") from ready[0]

    def _writer_main(self, ready: list[BaseException | None], signal: Callable[[], None]) -> None:
        try:
            conn = self._connect(reader=False)
        except Exception as exc:
            ready.append(exc)
            signal()
            return
        ready.append(None)
        signal()
        db = _SQLiteDB(conn)
        try:
            while (job := self._jobs.get()) is not None:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        job.result = job.fn(db)
                        conn.execute("COMMIT")
                    except BaseException:
                        if conn.in_transaction:
                            conn.execute("ROLLBACK")
                        raise
                except Exception as exc:
                    job.error = self._error(exc)
                job.finish()
        finally:
            conn.close()

    async def aclose(self) -> None:
        """Let queued writes finish, wait for running reads, then close every connection."""
        if self._closed:
            return
        self._closed = True
        writer = self._writer
        if writer is not None:
            self._jobs.put(None)
            await trio.to_thread.run_sync(writer.join)
        # Every running read (abandoned ones too) holds a limiter token until it returns.
        borrowers = [object() for _ in range(self._readers_limit)]
        for b in borrowers:
            await self._read_limiter.acquire_on_behalf_of(b)
        try:
            with self._readers_lock:
                readers = list(self._readers)
            for reader in readers:
                reader.close()
        finally:
            for b in borrowers:
                self._read_limiter.release_on_behalf_of(b)

    # -- the two primitives ------------------------------------------------------------

    async def _write(self, fn: Callable[[DB], T]) -> T:
        if self._closed or self._writer is None:
            raise StoreClosed(f"store {self.url} is closed")
        job = _Job(fn, trio.lowlevel.current_trio_token())
        self._jobs.put(job)
        # Cancelled here, the job still runs (it is queued); only its result is dropped.
        await job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]  # set when no error

    def _reader(self) -> _Reader:
        reader: _Reader | None = getattr(self._local, "reader", None)
        if reader is None or reader.closed:
            reader = _Reader(self._connect(reader=True))
            self._local.reader = reader
            with self._readers_lock:
                self._readers.add(reader)
        return reader

    def _run_read(self, call: Call) -> Any:
        if self._closed:
            raise StoreClosed(f"store {self.url} is closed")
        reader = self._reader()
        call.begin(reader.conn)
        try:
            return call.fn(_SQLiteDB(reader.conn))
        finally:
            call.end()

    async def _read(self, fn: Callable[[DB], T]) -> T:
        if self._closed:
            raise StoreClosed(f"store {self.url} is closed")
        call = Call(fn)
        try:
            result: T = await trio.to_thread.run_sync(
                self._run_read, call, abandon_on_cancel=True, limiter=self._read_limiter
            )
        except trio.Cancelled:
            # The thread goes on without us; stop its query (a no-op if it already ended).
            call.interrupt(lambda conn: conn.interrupt())
            raise
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        return result
