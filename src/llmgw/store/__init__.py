"""Persistence: API keys, usage, runtime-added models and dashboard sessions (DESIGN §8).

    store = await open_store("sqlite:///var/lib/llmgw/llmgw.db")   # or postgresql://…
    try:
        record, secret = await store.create_key("ci", band="silver")
        ...
    finally:
        await store.aclose()

``open_store`` connects and applies pending migrations; :class:`UsageBatcher` is
the router's usage sink in front of :meth:`Store.record_usage`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import trio

from llmgw import extras
from llmgw.domain.keys import KeyRecord
from llmgw.store.base import (
    DuplicateKeyName,
    GroupBy,
    SchemaTooNew,
    Session,
    Store,
    StoreClosed,
    StoredCordon,
    StoredEndpoint,
    StoredModel,
    StoreError,
    StoreUnavailable,
    TimedUsage,
    UnsupportedStoreURL,
    UsageRow,
    model_from_dict,
    model_to_dict,
    redact_url,
)
from llmgw.store.usage import UsageBatcher

__all__ = [
    "DuplicateKeyName",
    "GroupBy",
    "KeyRecord",
    "SchemaTooNew",
    "Session",
    "Store",
    "StoreClosed",
    "StoreError",
    "StoreUnavailable",
    "StoredCordon",
    "StoredEndpoint",
    "StoredModel",
    "TimedUsage",
    "UnsupportedStoreURL",
    "UsageBatcher",
    "UsageRow",
    "model_from_dict",
    "model_to_dict",
    "open_store",
    "redact_url",
]


async def open_store(
    url: str, *, migrate: bool = True, clock: Callable[[], float] = time.time
) -> Store:
    """The store at `url` (``sqlite:///path`` or ``postgresql://…``), opened and migrated.

    Raises :class:`UnsupportedStoreURL` for another scheme, :class:`StoreUnavailable`
    when the database cannot be opened or reached (naming the URL without its
    password) and :class:`SchemaTooNew` when a newer llmgw migrated it.
    """
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    store: Store
    if scheme == "sqlite":
        from llmgw.store.sqlite import SQLiteStore, sqlite_path

        sqlite = SQLiteStore(sqlite_path(url), clock=clock)
        store, start = sqlite, sqlite.start
    elif scheme in ("postgresql", "postgres"):
        extras.require("a PostgreSQL store", "postgres")
        from llmgw.store.postgres import PostgresStore

        pg = PostgresStore(url, clock=clock)
        store, start = pg, pg.start
    else:
        raise UnsupportedStoreURL(
            f"unsupported store URL {redact_url(url)!r}: "
            "use sqlite:///path/to/llmgw.db or postgresql://user@host/db"
        )
    try:
        await start()
        if migrate:
            await store.migrate()
    except BaseException:
        with trio.CancelScope(shield=True):
            await store.aclose()
        raise
    return store
