"""What the dashboard's pages show, shaped from the admin API's answers: pure functions
of values (no I/O), so the pages' numbers can be checked without a server.

Also the Jinja filters that format numbers for people; an unknown number is shown as
missing (an en dash, or "never" for a time), not as 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llmgw.dashboard import charts
from llmgw.dashboard.traffic import TrafficPoint, TrafficSeries

__all__ = [
    "MISSING",
    "NO_CACHE_REPORTS",
    "NO_PREDICTIONS",
    "NO_SPILLS",
    "endpoint_summary",
    "fleet_summary",
    "fmt_ago",
    "fmt_num",
    "fmt_when",
    "key_request",
    "last_failures",
    "traffic_charts",
    "usage_totals",
]


def key_request(form: Mapping[str, str]) -> dict[str, Any]:
    """The admin API's key-creation body from the keys page's form; ValueError naming
    the field at fault."""
    body: dict[str, Any] = {"name": form.get("name", "").strip()}
    if form.get("band"):
        body["band"] = form["band"]
    models = [m.strip() for m in form.get("models", "").split(",") if m.strip()]
    if models:
        body["models"] = models
    for field in ("rpm", "tpm"):
        text = form.get(field, "").strip()
        if text:
            try:
                body[field] = int(text)
            except ValueError:
                raise ValueError(f"{field}: must be a whole number, got {text!r}") from None
    days = form.get("expires_days", "").strip()
    if days:
        try:
            body["expires_in_seconds"] = float(days) * 86400
        except ValueError:
            raise ValueError(f"expires_days: must be a number, got {days!r}") from None
        if not math.isfinite(body["expires_in_seconds"]):
            raise ValueError(f"expires_days: must be a finite number, got {days!r}")
    body["admin"] = form.get("admin") == "on"
    return body


def fleet_summary(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Nodes by state (each node in one state: the counts add up to ``nodes``) and, per
    state, how many of those are cordoned: cordoned is not a state of its own, and
    shown beside the states it read as more nodes than there are."""
    states: dict[str, int] = {}
    cordoned: dict[str, int] = {}
    for n in nodes:
        states[n["state"]] = states.get(n["state"], 0) + 1
        if n["cordoned"]:
            cordoned[n["state"]] = cordoned.get(n["state"], 0) + 1
    gpus = [g for n in nodes for g in n["gpus"]]
    return {
        "nodes": len(nodes),
        "states": states,
        "cordoned": sum(1 for n in nodes if n["cordoned"]),
        "cordoned_by_state": cordoned,
        "gpus": len(gpus),
        "gpus_allocated": sum(n["gpus_allocated"] for n in nodes),
        "gpus_free": sum(n["gpus_free"] for n in nodes),
    }


def endpoint_summary(endpoints: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "total": len(endpoints),
        "stale": sum(1 for e in endpoints if e["stale"]),
        "open": sum(1 for e in endpoints if e["breaker"] != "closed"),
        "draining": sum(1 for e in endpoints if e["draining"]),
    }


def last_failures(nodes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model, its most recent failed shard as the agents reported it (node, message,
    exit code, output tail): why a model that keeps backing off does not start."""
    found: dict[str, dict[str, Any]] = {}
    for node in nodes:
        for shard in node["shards"]:
            if shard["state"] != "failed":
                continue
            seen = found.get(shard["model"])
            if seen is None or shard["epoch"] > seen["epoch"]:
                found[shard["model"]] = {**shard, "node": node["id"]}
    return found


def usage_totals(rows: list[dict[str, Any]]) -> dict[str, int]:
    keys = ("requests", "prompt_tokens", "completion_tokens", "errors")
    return {k: sum(int(r[k]) for r in rows) for k in keys}


#: What the retries chart says while no request recorded a retry count.
NO_RETRY_COUNTS = "No retry counts recorded: the router does not report them with requests."

#: What the prefix predictions chart says while no engine reported cached tokens.
NO_CACHE_REPORTS = (
    "No engine reported cached prompt tokens (usage.prompt_tokens_details.cached_tokens) "
    "in this window: the prefix table's predictions cannot be weighed against them."
)

#: ... and while engines reported them but the router predicted nothing.
NO_PREDICTIONS = (
    "No prefix predictions weighed in this window: prefix affinity is off, or no prompt "
    "was long enough to hash."
)

#: What the spills chart says when requests were routed and none spilled (zero, not
#: absent).
NO_SPILLS = "No spills: every request with a home was sent there."


def traffic_charts(
    series: TrafficSeries, ceilings: Sequence[tuple[str, float]] = ()
) -> list[dict[str, str]]:
    """The traffic page's charts: the whole window, empty before the server started."""

    def lines(**getters: Callable[[TrafficPoint], float | None]) -> list[charts.Line]:
        return [charts.Line(name, series.column(get)) for name, get in getters.items()]

    def by(names: tuple[str, ...], get: Callable[[TrafficPoint, str], Any]) -> list[charts.Line]:
        return [
            charts.Line(name, series.column(lambda p, n=name: get(p, n)))  # type: ignore[misc]
            for name in names
        ]

    # Absent is not zero: a chart of retries nobody counted must not read as none.
    retries_counted = any(
        v is not None for p in series.points for v in p.retries_per_second_by_model.values()
    )
    # Nor is a prediction nobody could weigh: without an engine's cached tokens the
    # prefix chart has no values, and says why.
    predicted = any(p.predictions for p in series.points)
    prediction_note = (
        {}
        if predicted
        else {"note": NO_PREDICTIONS}
        if series.cache_reports
        else {"note": NO_CACHE_REPORTS}
    )
    # Spills counted and none seen: a chart with no line, which is a zero.
    spill_note = {"note": NO_SPILLS} if series.spill_counted and not series.spills else {}
    return [
        {
            "title": "Requests per second",
            "svg": charts.line_chart(
                lines(
                    requests=lambda p: p.requests_per_second,
                    errors=lambda p: p.errors_per_second,
                ),
                unit="/s",
            ),
        },
        {
            # Refusals included: a 429 or 503 from llmgw itself is what the client saw.
            "title": "Errors per second per model",
            "svg": charts.line_chart(
                by(series.models, lambda p, m: p.errors_per_second_by_model.get(m)), unit="/s"
            ),
        },
        {
            "title": "Retries per second per model",
            "svg": charts.line_chart(
                by(series.models, lambda p, m: p.retries_per_second_by_model.get(m)),
                unit="/s",
            ),
            **({} if retries_counted else {"note": NO_RETRY_COUNTS}),
        },
        {
            "title": "Time to first token",
            "svg": charts.line_chart(
                lines(p50=lambda p: p.ttft_p50, p90=lambda p: p.ttft_p90, p99=lambda p: p.ttft_p99),
                unit="s",
            ),
        },
        {
            "title": "End-to-end latency",
            "svg": charts.line_chart(
                lines(
                    p50=lambda p: p.latency_p50,
                    p90=lambda p: p.latency_p90,
                    p99=lambda p: p.latency_p99,
                ),
                unit="s",
            ),
        },
        {
            "title": "Tokens per second",
            "svg": charts.line_chart(
                lines(
                    total=lambda p: p.tokens_per_second,
                    completion=lambda p: p.completion_tokens_per_second,
                ),
                unit="/s",
            ),
        },
        {
            "title": "Queue depth per band",
            "svg": charts.line_chart(by(series.bands, lambda p, b: p.queue_depth.get(b)), unit=""),
        },
        {
            "title": "Saturation per pool, against the bands' ceilings",
            "svg": charts.line_chart(
                by(series.pools, lambda p, pool: p.saturation.get(pool)),
                unit="",
                y_max=1.0,
                # A band is held back while its pool is at or above its ceiling.
                marks=[(f"{band} ceiling", c) for band, c in ceilings if c < 1.0],
            ),
        },
        {
            # Where the router's model of the engines is wrong. Shares, not rates: the
            # three lines add up to 1 in a slot and read on one axis whatever the
            # traffic (the requests chart has the volume); a rising "over" is the
            # engines evicting what the table thinks they hold, a rising "under" the
            # engines holding what it forgot (its table too small, its ttl too short,
            # or other routers feeding them). A slot without predictions is a gap.
            "title": "Prefix-cache predictions against the engines",
            "svg": charts.line_chart(
                lines(
                    confirmed=lambda p: p.predictions_confirmed,
                    over=lambda p: p.predictions_over,
                    under=lambda p: p.predictions_under,
                ),
                unit="%",
                y_max=1.0,
            ),
            **prediction_note,
        },
        {
            # A request with a home (its session's replica, the replicas holding its
            # prefix) sent elsewhere, per affinity and the reason it was passed over.
            "title": "Affinity spills per second by reason",
            "svg": charts.line_chart(
                by(series.spills, lambda p, k: p.spills_per_second.get(k)), unit="/s"
            ),
            **spill_note,
        },
    ]


# -- formatting filters --------------------------------------------------------------

#: What an unknown number shows as: absent, not zero.
MISSING = "\N{EN DASH}"


def fmt_ago(seconds: float | None) -> str:
    """How long ago (or how long for), as people say it: ``46s``, ``1m 46s``, ``2h 5m``,
    ``3d 4h`` (:func:`charts.duration`); under a second in tenths (heartbeats come that
    often), truncated like the rest. None is "never"."""
    if seconds is None:
        return "never"
    s = max(0.0, float(seconds))
    if not math.isfinite(s):
        return MISSING
    if s < 1:
        tenths = math.floor(s * 10)
        return f"0.{tenths}s" if tenths else "0s"
    return charts.duration(s)


def fmt_num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return MISSING
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.{digits}f}"


def fmt_when(unix: float | None) -> str:
    if unix is None:
        return MISSING
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix))
