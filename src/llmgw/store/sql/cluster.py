"""Several instances: leadership, published endpoints, demand (leadership,
published_endpoints, instance_demand).

The lease is timed by one clock for every instance: `now` None means the database's
(``DB.now``, PostgreSQL's ``clock_timestamp()``), which the store passes on
PostgreSQL, so instances whose own clocks disagree never both hold it. SQLite is one
host's file: its callers pass their own clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.store.sql.db import DB, Row, one

# -- several instances: leadership, published endpoints, demand --------------------------


def _clock(db: DB, now: float | None) -> float:
    return db.now() if now is None else now


def claim_leadership(
    db: DB, name: str, holder: str, agents: str, admin: str, ttl: float, now: float | None
) -> int | None:
    """Take the lease `name` when nobody holds it or its holder's has expired: the new
    fencing token (one more than the last), else None."""
    now = _clock(db, now)
    created = db.run(
        "INSERT INTO leadership (name, holder, agent_address, admin_address, token, expires_at)"
        " VALUES (?, ?, ?, ?, 1, ?) ON CONFLICT (name) DO NOTHING",
        (name, holder, agents, admin, now + ttl),
    )
    if not created:
        taken = db.run(
            "UPDATE leadership SET holder = ?, agent_address = ?, admin_address = ?,"
            " token = token + 1, expires_at = ? WHERE name = ? AND expires_at < ?",
            (holder, agents, admin, now + ttl, name, now),
        )
        if not taken:
            return None
    row = one(db, "SELECT token FROM leadership WHERE name = ?", (name,))
    return None if row is None else int(row[0])


def renew_leadership(
    db: DB, name: str, holder: str, token: int, ttl: float, now: float | None
) -> bool:
    """Extend the lease while `holder` still holds it with `token`."""
    now = _clock(db, now)
    return (
        db.run(
            "UPDATE leadership SET expires_at = ? WHERE name = ? AND holder = ? AND token = ?",
            (now + ttl, name, holder, token),
        )
        == 1
    )


def resign_leadership(db: DB, name: str, holder: str, token: int) -> bool:
    """Let the lease go at once (a clean stop: another instance takes over now)."""
    return (
        db.run(
            "UPDATE leadership SET expires_at = 0 WHERE name = ? AND holder = ? AND token = ?",
            (name, holder, token),
        )
        == 1
    )


def read_leadership(db: DB, name: str, now: float | None) -> Row | None:
    """(holder, agent address, admin address, token, expires at, now) of the lease: its
    end and the time it was read, by the lease's clock."""
    found = one(
        db,
        "SELECT holder, agent_address, admin_address, token, expires_at FROM leadership"
        " WHERE name = ?",
        (name,),
    )
    return None if found is None else (*found, _clock(db, now))


def _fenced(db: DB, name: str, token: int) -> bool:
    row = one(db, "SELECT token FROM leadership WHERE name = ?", (name,))
    return row is not None and int(row[0]) == token


def publish_endpoints(
    db: DB, name: str, token: int, changes: Sequence[tuple[str, str | None, bool]], full: bool
) -> bool:
    """Apply the leader's endpoint changes, (id, body or None to remove, draining); with
    `full` they are the whole set. Refused (False) unless `token` still leads: a
    deposed leader's writes never land."""
    if not _fenced(db, name, token):
        return False
    if full:
        db.run("DELETE FROM published_endpoints")
    for ident, body, draining in changes:
        if body is None:
            db.run("DELETE FROM published_endpoints WHERE id = ?", (ident,))
        else:
            db.run(
                "INSERT INTO published_endpoints (id, body, draining, token) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET body = excluded.body,"
                " draining = excluded.draining, token = excluded.token",
                (ident, body, draining, token),
            )
    return True


def published_endpoints(db: DB) -> list[tuple[str, str, bool]]:
    return [
        (str(r[0]), str(r[1]), bool(r[2]))
        for r in db.rows("SELECT id, body, draining FROM published_endpoints ORDER BY id")
    ]


def put_demand(
    db: DB,
    instance: str,
    rows: Sequence[tuple[str, int, int, float, int, float | None]],
    now: float | None,
) -> None:
    """This instance's demand per model: (model, in flight, queued, saturation, serving,
    seconds since its last request or None), stamped by the lease's clock."""
    now = _clock(db, now)
    db.run("DELETE FROM instance_demand WHERE instance = ?", (instance,))
    db.many(
        "INSERT INTO instance_demand"
        " (instance, model, inflight, queued, saturation, serving, idle_for, at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(instance, *row, now) for row in rows],
    )


def read_demand(db: DB, fresh: float, now: float | None) -> list[Row]:
    """(instance, model, inflight, queued, saturation, serving, idle_for, age) of the
    rows written in the last `fresh` seconds, age in seconds (by the lease's clock)."""
    now = _clock(db, now)
    return [
        (*row[:7], now - float(row[7]))
        for row in db.rows(
            "SELECT instance, model, inflight, queued, saturation, serving, idle_for, at"
            " FROM instance_demand WHERE at > ?",
            (now - fresh,),
        )
    ]
