"""Migrations: the schema_version table and applying what is pending."""

from __future__ import annotations

from llmgw.store.base import (
    SchemaTooNew,
)
from llmgw.store.migrations import Migration, check_sequence, latest
from llmgw.store.sql.db import DB, one

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
