"""One connection as the operations use it (:class:`DB`), and its helpers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

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

    def now(self) -> float:
        """The database's own clock (Unix seconds): on PostgreSQL the one clock every
        instance shares; on SQLite (one host) this host's."""
        ...


def one(db: DB, sql: str, params: Sequence[Any] = ()) -> Row | None:
    found = db.rows(sql, params)
    return found[0] if found else None
