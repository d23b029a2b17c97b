"""``GET /api/v1/usage``: tokens, requests and latency per API key or model over time.

Query parameters:

* ``group_by``: ``key`` (default) or ``model``.
* ``since``, ``until``: Unix seconds (``1700000000``) or a duration meaning that long
  ago (``1h``, ``30m``, ``7d``); the window is ``[since, until)``, open-ended when one
  is left out.
* ``bucket``: a duration (``1h``, or seconds): totals per bucket instead of one per
  group; buckets start at whole multiples of their size since the epoch (UTC).

Answer: ``{"group_by", "since", "until", "bucket_seconds", "usage": [row, ...]}``,
rows ordered by bucket, then group (requests made without a key first), each
``{group, name, bucket, requests, prompt_tokens, completion_tokens, cached_tokens,
errors, mean_latency, mean_ttft}``; `name` is the key's name when grouping by key.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Literal

import attrs
from quart import Response

from llmgw.admin.bounds import MIN_BUCKET, MOMENT, MOMENT_RE
from llmgw.admin.contract import ApiError, Param, json_reply
from llmgw.admin.inputs import query
from llmgw.admin.keys import require_store
from llmgw.admin.views import unstructure
from llmgw.units import parse_duration

if TYPE_CHECKING:
    from llmgw.admin.context import AdminContext

__all__ = ["QUERY", "UsageReport", "UsageRowView", "parse_moment"]

_MOMENT = {"type": "string", "pattern": f"^({MOMENT})$"}

QUERY = (
    Param(
        "group_by",
        {"type": "string", "enum": ["key", "model"], "default": "key"},
        "what a row totals: one API key or one model",
    ),
    Param(
        "since",
        _MOMENT,
        "start of the window (inclusive): Unix seconds, or a duration meaning that long ago "
        "(e.g. 1h, 7d)",
    ),
    Param(
        "until",
        _MOMENT,
        "end of the window (exclusive): Unix seconds, or a duration meaning that long ago",
    ),
    Param(
        "bucket",
        _MOMENT,
        f"totals per bucket of this size (a duration, at least {MIN_BUCKET:g}s) instead of "
        "one total per group",
    ),
)


@attrs.frozen
class UsageRowView:
    """One key or model in one time bucket."""

    group: str | None = attrs.field(
        metadata={"description": "the key id or model name; null for requests without a key"}
    )
    name: str | None = attrs.field(
        metadata={"description": "the key's name (grouping by key); null otherwise"}
    )
    bucket: float | None = attrs.field(
        metadata={"description": "the bucket's start, Unix seconds; null when not bucketed"}
    )
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    errors: int = attrs.field(metadata={"description": "requests answered outside 2xx/3xx"})
    mean_latency: float = attrs.field(metadata={"description": "seconds"})
    mean_ttft: float | None = attrs.field(
        metadata={"description": "seconds to the first token; null when none was measured"}
    )


@attrs.frozen
class UsageReport:
    """Usage totals over a window, per key or model (and per bucket if asked)."""

    group_by: Literal["key", "model"]
    since: float | None = attrs.field(metadata={"description": "Unix seconds, as resolved"})
    until: float | None = attrs.field(metadata={"description": "Unix seconds, as resolved"})
    bucket_seconds: float | None
    usage: tuple[UsageRowView, ...]


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", "invalid_parameter", param=param)


def _seconds(text: str, param: str) -> tuple[float, bool]:
    """The number in `text` and whether it was a duration (with a unit)."""
    if MOMENT_RE.fullmatch(text) is None:
        raise _bad(param, f"expected Unix seconds or a duration such as '1h', got {text!r}")
    try:
        value = float(text)
        duration = False
    except ValueError:
        value, duration = parse_duration(text), True
    if not math.isfinite(value):
        raise _bad(param, f"out of range: {text!r}")
    return value, duration


def parse_moment(text: str, param: str, now: float) -> float:
    """Unix seconds from ``1700000000``, or `now` less a duration (``1h``); 400 naming
    `param` for anything else."""
    value, ago = _seconds(text, param)
    return max(0.0, now - value) if ago else value


def parse_bucket(text: str) -> float:
    seconds, _ = _seconds(text, "bucket")
    if seconds < MIN_BUCKET:
        raise _bad("bucket", f"must be at least {MIN_BUCKET:g}s, got {text!r}")
    return seconds


async def usage(app: AdminContext) -> Response:
    store = require_store(app)
    params = query()
    group_by = params.get("group_by", "key")
    if group_by not in ("key", "model"):
        raise _bad("group_by", f"must be 'key' or 'model', got {group_by!r}")
    now = time.time()
    since = parse_moment(params["since"], "since", now) if "since" in params else None
    until = parse_moment(params["until"], "until", now) if "until" in params else None
    if since is not None and until is not None and since >= until:
        raise _bad("since", f"must be before until ({since:.3f} >= {until:.3f})")
    bucket = parse_bucket(params["bucket"]) if "bucket" in params else None
    rows = await store.usage_summary(
        "key" if group_by == "key" else "model", since=since, until=until, bucket=bucket
    )
    names: dict[str, str] = {}
    if group_by == "key" and any(r.group is not None for r in rows):
        names = {k.id: k.name for k in await store.list_keys()}
    report = UsageReport(
        group_by="key" if group_by == "key" else "model",
        since=since,
        until=until,
        bucket_seconds=bucket,
        usage=tuple(
            UsageRowView(
                group=r.group,
                name=names.get(r.group) if r.group is not None else None,
                bucket=r.bucket,
                requests=r.requests,
                prompt_tokens=r.prompt_tokens,
                completion_tokens=r.completion_tokens,
                cached_tokens=r.cached_tokens,
                errors=r.errors,
                mean_latency=r.mean_latency,
                mean_ttft=r.mean_ttft,
            )
            for r in rows
        ),
    )
    data: dict[str, Any] = unstructure(report)
    return json_reply(200, data)
