"""API keys (api_keys) and the dashboard sessions opened with them
(dashboard_sessions).
"""

from __future__ import annotations

import json
from typing import Any

from llmgw.domain.keys import KeyRecord
from llmgw.store.base import (
    DuplicateKeyName,
    Session,
    StoreError,
)
from llmgw.store.sql.db import DB, Row, one

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
