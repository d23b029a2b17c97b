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
    Migration(
        3,
        "key names are unique among keys not revoked (duplicates from before are kept)",
        (
            # Keys that already shared a name keep it (clients use them), marked so the
            # index below leaves them out; every key created from now on is in it.
            "ALTER TABLE api_keys ADD COLUMN legacy_duplicate INTEGER NOT NULL DEFAULT 0",
            """
            UPDATE api_keys SET legacy_duplicate = 1
            WHERE revoked_at IS NULL AND name IN (
                SELECT name FROM api_keys WHERE revoked_at IS NULL
                GROUP BY name HAVING COUNT(*) > 1
            )
            """,
            # Partial: a revoked key's name is free again. The predicate is spelled as
            # the INSERT's ON CONFLICT clause spells it (llmgw.store.sql.keys.insert_key).
            "CREATE UNIQUE INDEX api_keys_live_name ON api_keys (name)"
            " WHERE revoked_at IS NULL AND NOT legacy_duplicate",
        ),
    ),
    Migration(
        4,
        "usage records keep the request id (x-request-id, the client's or llmgw's)",
        ("ALTER TABLE usage_records ADD COLUMN request_id TEXT",),
    ),
    Migration(
        5,
        "rate-limit grants shared by every process and instance (llmgw.router.limits)",
        (
            """
            CREATE TABLE rate_grants (
                key_id TEXT NOT NULL,
                kind TEXT NOT NULL,
                at REAL NOT NULL,
                amount INTEGER NOT NULL
            )
            """,
            "CREATE INDEX rate_grants_key ON rate_grants (key_id, kind, at)",
        ),
    ),
    Migration(
        6,
        "several instances on one store: who leads the control plane, the endpoints it "
        "publishes, and every instance's demand (llmgw.control.leadership)",
        (
            """
            CREATE TABLE leadership (
                name TEXT PRIMARY KEY,
                holder TEXT NOT NULL,
                agent_address TEXT NOT NULL,
                admin_address TEXT NOT NULL,
                token INTEGER NOT NULL,
                expires_at REAL NOT NULL
            )
            """,
            """
            CREATE TABLE published_endpoints (
                id TEXT PRIMARY KEY,
                body TEXT NOT NULL,
                draining INTEGER NOT NULL,
                token INTEGER NOT NULL
            )
            """,
            """
            CREATE TABLE instance_demand (
                instance TEXT NOT NULL,
                model TEXT NOT NULL,
                inflight INTEGER NOT NULL,
                queued INTEGER NOT NULL,
                saturation REAL NOT NULL,
                serving INTEGER NOT NULL,
                idle_for REAL,
                at REAL NOT NULL,
                PRIMARY KEY (instance, model)
            )
            """,
        ),
    ),
    Migration(
        7,
        "endpoints added at runtime through the admin API (llmgw.endpoint_sources)",
        (
            """
            CREATE TABLE runtime_endpoints (
                id TEXT PRIMARY KEY,
                config TEXT NOT NULL,
                updated_at REAL NOT NULL
            )
            """,
        ),
    ),
)
