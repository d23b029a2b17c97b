"""Usage records (usage_records): writing batches, summing them up."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmgw.store.base import (
    GroupBy,
    TimedUsage,
    UsageRow,
)
from llmgw.store.sql.db import DB, Row

# -- usage ------------------------------------------------------------------------------

USAGE_COLUMNS = (
    "ts",
    "key_id",
    "band",
    "tenant",
    "model",
    "endpoint",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "estimated",
    "latency",
    "ttft",
    "request_id",
)


def usage_rows(batch: Sequence[TimedUsage]) -> list[Row]:
    return [
        (
            at,
            r.key_id,
            r.band,
            r.tenant,
            r.model,
            r.endpoint,
            r.status,
            r.usage.prompt_tokens,
            r.usage.completion_tokens,
            r.usage.cached_tokens,
            r.usage.estimated,
            r.latency,
            r.ttft,
            r.request_id,
        )
        for at, r in batch
    ]


def insert_usage(db: DB, rows: Sequence[Row]) -> None:
    if rows:
        db.insert_usage(rows)


_GROUP_COLUMNS: dict[str, str] = {"key": "key_id", "model": "model"}


def usage_summary(
    db: DB, group_by: GroupBy, since: float | None, until: float | None, bucket: float | None
) -> list[UsageRow]:
    column = _GROUP_COLUMNS.get(group_by)
    if column is None:
        raise ValueError(f"group_by must be 'key' or 'model', got {group_by!r}")
    if bucket is not None and not bucket > 0:
        raise ValueError(f"bucket must be a positive number of seconds, got {bucket!r}")
    params: list[Any] = []
    if bucket is not None:
        bucket_sql = db.bucket_expr()
        params += [float(bucket), float(bucket)]
        group_sql = "1, 2"  # by position: the bucket expression's placeholders appear once
    else:
        bucket_sql = "NULL"
        group_sql = "1"
    where: list[str] = []
    if since is not None:
        where.append("ts >= ?")
        params.append(since)
    if until is not None:
        where.append("ts < ?")
        params.append(until)
    sql = (
        f"SELECT {column}, {bucket_sql}, COUNT(*),"
        " CAST(SUM(prompt_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT),"
        " CAST(COALESCE(SUM(cached_tokens), 0) AS BIGINT),"
        " CAST(SUM(CASE WHEN status < 200 OR status >= 400 THEN 1 ELSE 0 END) AS BIGINT),"
        " AVG(latency), AVG(ttft)"
        " FROM usage_records"
        + (" WHERE " + " AND ".join(where) if where else "")
        + f" GROUP BY {group_sql}"
    )
    result = [
        UsageRow(
            group=r[0],
            bucket=None if r[1] is None else float(r[1]),
            requests=int(r[2]),
            prompt_tokens=int(r[3]),
            completion_tokens=int(r[4]),
            cached_tokens=int(r[5]),
            errors=int(r[6]),
            mean_latency=float(r[7]),
            mean_ttft=None if r[8] is None else float(r[8]),
        )
        for r in db.rows(sql, params)
    ]
    # Sorted here: the two databases disagree on where NULL (no key) sorts.
    result.sort(key=lambda u: (u.bucket or 0.0, u.group is not None, u.group or ""))
    return result
