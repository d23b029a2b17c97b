"""The SQLite schema, as numbered migrations."""

from __future__ import annotations

from llmgw.store.migrations import Migration

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "api keys, usage records, runtime models, dashboard sessions",
        (
            """
            CREATE TABLE api_keys (
                id TEXT PRIMARY KEY,
                name TEXT NOT NULL,
                prefix TEXT NOT NULL,
                hash TEXT NOT NULL UNIQUE,
                band TEXT,
                models TEXT,
                rpm INTEGER,
                tpm INTEGER,
                admin INTEGER NOT NULL DEFAULT 0,
                created_at REAL NOT NULL,
                expires_at REAL,
                revoked_at REAL
            )
            """,
            """
            CREATE TABLE usage_records (
                id INTEGER PRIMARY KEY,
                ts REAL NOT NULL,
                key_id TEXT,
                band TEXT,
                tenant TEXT,
                model TEXT NOT NULL,
                endpoint TEXT,
                status INTEGER NOT NULL,
                prompt_tokens INTEGER NOT NULL,
                completion_tokens INTEGER NOT NULL,
                cached_tokens INTEGER,
                estimated INTEGER NOT NULL,
                latency REAL NOT NULL,
                ttft REAL
            )
            """,
            "CREATE INDEX usage_records_ts ON usage_records (ts)",
            """
            CREATE TABLE runtime_models (
                name TEXT PRIMARY KEY,
                config TEXT NOT NULL,
                updated_at REAL NOT NULL
            )
            """,
            """
            CREATE TABLE dashboard_sessions (
                token_hash TEXT PRIMARY KEY,
                key_id TEXT NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
                created_at REAL NOT NULL,
                expires_at REAL NOT NULL
            )
            """,
            "CREATE INDEX dashboard_sessions_expires ON dashboard_sessions (expires_at)",
        ),
    ),
    Migration(
        2,
        "node cordons (the operator's, kept across server restarts)",
        (
            """
            CREATE TABLE node_cordons (
                node_id TEXT PRIMARY KEY,
                drain INTEGER NOT NULL,
                updated_at REAL NOT NULL
            )
            """,
        ),
    ),
)
