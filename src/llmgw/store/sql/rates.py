"""Rate limits shared by every instance (rate_grants)."""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.store.sql.db import DB, one

# -- shared rate limits ----------------------------------------------------------------

#: The window every rate limit counts over (seconds).
RATE_WINDOW = 60.0


def take_rate(
    db: DB, key_id: str, kind: str, limit: int, amount: int, now: float
) -> tuple[int, float | None]:
    """Grant up to `amount` of `key_id`'s `kind` (requests) within `limit` per
    RATE_WINDOW, counting every grant of the window whoever took it; returns what was
    granted and when the oldest grant in the window was taken (None: none)."""
    db.lock_rate(key_id)
    used, oldest = used_rate(db, key_id, kind, now)
    granted = max(0, min(amount, limit - used))
    if granted:
        add_rate(db, [(key_id, kind, now, granted)])
    return granted, oldest


def add_rate(db: DB, rows: Sequence[tuple[str, str, float, int]]) -> None:
    """Record what was used (tokens), as (key id, kind, at, amount) rows."""
    db.many("INSERT INTO rate_grants (key_id, kind, at, amount) VALUES (?, ?, ?, ?)", rows)


def used_rate(db: DB, key_id: str, kind: str, now: float) -> tuple[int, float | None]:
    """What the window holds of `key_id`'s `kind`, and its oldest entry's time."""
    used, oldest = one(
        db,
        "SELECT COALESCE(SUM(amount), 0), MIN(at) FROM rate_grants"
        " WHERE key_id = ? AND kind = ? AND at > ?",
        (key_id, kind, now - RATE_WINDOW),
    ) or (0, None)
    return int(used), None if oldest is None else float(oldest)


def prune_rate(db: DB, now: float) -> int:
    """Forget grants older than the window (kept twice as long: clocks differ a little)."""
    return db.run("DELETE FROM rate_grants WHERE at < ?", (now - 2 * RATE_WINDOW,))
