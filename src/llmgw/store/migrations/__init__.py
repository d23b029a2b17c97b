"""Versioned schema migrations, one list per backend.

Each backend has its own numbered list (``sqlite.MIGRATIONS``,
``postgres.MIGRATIONS``) because the two dialects differ in types (REAL and
INTEGER flags vs DOUBLE PRECISION and BOOLEAN, rowid vs identity columns); a
change to the schema adds a migration with the same number to both, never edits
an applied one. The SQL lives in Python modules so that it ships with the
package like any other code.

The runner (:func:`llmgw.store.sql.schema.migrate`) keeps one row per applied migration in
``schema_version`` and applies every pending migration at start in a single
transaction; a database whose version is above the highest known number is
refused (:class:`~llmgw.store.base.SchemaTooNew`).
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Migration:
    version: int
    description: str
    # Executed in order, one statement each, inside the migration transaction.
    statements: tuple[str, ...]


def latest(migrations: tuple[Migration, ...]) -> int:
    return max((m.version for m in migrations), default=0)


def check_sequence(migrations: tuple[Migration, ...]) -> None:
    """Migrations are numbered 1, 2, 3, … without gaps (a programming error otherwise)."""
    numbers = [m.version for m in migrations]
    if numbers != list(range(1, len(numbers) + 1)):
        raise ValueError(f"migrations must be numbered 1..n in order, got {numbers}")
