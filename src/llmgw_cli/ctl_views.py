"""Readable tables for the listings of `llmgw-ctl` (nodes, replicas, placement, keys,
usage, models).

The admin API's JSON is for scripts (`--json`); an operator at a terminal wants the
few columns that answer "what runs where" and "why is this not running".
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import attrs
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from llmgw.units import format_duration


def _gib(value: Any) -> str:
    return "?" if value is None else f"{value / 2**30:.0f}"


def _age(seconds: Any) -> str:
    if seconds is None:
        return "-"
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def nodes(data: dict[str, Any]) -> RenderableType:
    table = Table(title="nodes", title_justify="left")
    for column in ("node", "state", "heartbeat", "GPUs free/total", "GPU memory GiB", "fabrics"):
        table.add_column(column)
    for node in data.get("nodes", []):
        gpus = node.get("gpus", [])
        used = [g.get("memory_used_bytes") for g in gpus]
        total = sum(g.get("memory_total_bytes") or 0 for g in gpus)
        memory = (
            f"{_gib(sum(u for u in used if u is not None))}/{_gib(total)}"
            if any(u is not None for u in used)
            else f"?/{_gib(total)}"
        )
        state = node.get("state", "?") + (" (cordoned)" if node.get("cordoned") else "")
        table.add_row(
            node.get("id", "?"),
            state,
            _age(node.get("heartbeat_age_seconds")) + " ago",
            f"{node.get('gpus_free', '?')}/{node.get('gpus_total', len(gpus))}",
            memory,
            ", ".join(node.get("fabrics", [])) or "-",
        )
    return table


def replicas(data: dict[str, Any]) -> RenderableType:
    models = Table(title="models", title_justify="left")
    for column in ("model", "desired", "ready", "starting", "draining", "unplaced", "backoff"):
        models.add_column(column)
    for m in data.get("models", []):
        backoff = m.get("backoff_seconds")
        models.add_row(
            m.get("model", "?"),
            *(str(m.get(k, 0)) for k in ("desired", "ready", "starting", "draining", "unplaced")),
            "-" if backoff is None else _age(backoff),
        )
    reps = Table(title="replicas", title_justify="left")
    for column in ("replica", "model", "state", "for", "nodes (rank: GPUs)", "url"):
        reps.add_column(column)
    for r in data.get("replicas", []):
        where = ", ".join(
            f"{n.get('node_id')} ({n.get('rank')}: {','.join(map(str, n.get('gpu_indices', [])))})"
            for n in r.get("nodes", [])
        )
        reps.add_row(
            r.get("id", "?"),
            r.get("model", "?"),
            r.get("state", "?"),
            _age(r.get("in_state_seconds")),
            where,
            r.get("url") or "-",
        )
    return Group(models, reps)


def placement(data: dict[str, Any]) -> RenderableType:
    models = data.get("models", [])
    if not models:
        return Text("every model has the replicas it wants")
    parts: list[RenderableType] = []
    for m in models:
        model = str(m.get("model"))
        summary = m.get("summary") or f"{m.get('unplaced', 0)} replica(s) not placed"
        head = Text(f"{model}: ", style="bold")
        # The API's summary starts with the model's name: not twice.
        head.append(summary.removeprefix(f"{model}: "))
        parts.append(head)
        for explanation in m.get("explanations", []):
            for attempt in explanation.get("attempts", []):
                parts.append(Text(f"  profile {attempt.get('profile')}: {attempt.get('summary')}"))
                for reason in attempt.get("nodes", []):
                    parts.append(Text(f"    {reason.get('message')}"))
                for reason in attempt.get("fabrics", []):
                    parts.append(Text(f"    {reason.get('message')}"))
            for hint in explanation.get("hints", []):
                parts.append(Text(f"  hint: {hint.get('message')}", style="green"))
    return Group(*parts)


# --------------------------------------------------------------------------- keys, usage, models


def _count(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


def _span(seconds: float) -> str:
    """A span of time for key lifetimes: like `_age`, in days from two days on."""
    seconds = max(0.0, seconds)
    return f"{seconds / 86400:.0f}d" if seconds >= 2 * 86400 else _age(seconds)


def _key_status(key: dict[str, Any], now: float) -> str:
    status = str(key.get("status", "?"))
    revoked, expires = key.get("revoked_at"), key.get("expires_at")
    if status == "revoked" and revoked is not None:
        status = f"revoked {_span(now - revoked)} ago"
    elif status == "expired" and expires is not None:
        status = f"expired {_span(now - expires)} ago"
    elif status == "active" and expires is not None:
        status = f"active, expires in {_span(expires - now)}"
    return status


def _compact(value: int) -> str:
    """1500 -> 1.5k, 2000000 -> 2M: limits at a glance."""
    for size, suffix in ((10**9, "G"), (10**6, "M"), (10**3, "k")):
        if value >= size:
            return f"{value / size:.1f}".removesuffix(".0") + suffix
    return str(value)


def _limits(key: dict[str, Any]) -> str:
    parts = [f"{_compact(key[k])} {k}" for k in ("rpm", "tpm") if key.get(k) is not None]
    return ", ".join(parts) or "-"


@attrs.frozen
class Bands:
    """What decides a key's band on the server: its admission bands and default band
    (``GET /api/v1/admission``)."""

    default: str
    names: tuple[str, ...]

    @classmethod
    def of(cls, admission: Any) -> Bands | None:
        """From the admission view; None when it lacks llmgw's shape."""
        if not isinstance(admission, dict) or not isinstance(admission.get("default_band"), str):
            return None
        listed = admission.get("bands")
        names = tuple(
            str(b["name"])
            for b in (listed if isinstance(listed, list) else [])
            if isinstance(b, dict) and "name" in b
        )
        return cls(admission["default_band"], names)


def key_band(key: dict[str, Any], bands: Bands | None) -> str:
    """The band a key's requests get, as the router picks it
    (``AdmissionController.select_band``): its own, else the default band; "default"
    only when the server's is not known."""
    own = (key.get("band") or "").strip()
    if not own:
        return f"{bands.default} (default)" if bands is not None else "default"
    if bands is None or own in bands.names:
        return own
    folded = {name.casefold(): name for name in bands.names}
    # The configuration changed since the key was made: the router answers 400 for it.
    return folded.get(own.casefold(), f"{own} (no such band: requests get 400)")


def keys(
    data: dict[str, Any], now: float | None = None, bands: Bands | None = None
) -> RenderableType:
    records = data.get("keys", [])
    if not records:
        return Text("no API keys (create one: llmgw-ctl keys create --name NAME)")
    now = time.time() if now is None else now
    table = Table(title=f"keys ({len(records)})", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("name", "id", "prefix", "band", "models", "limits", "admin", "status"):
        # ids and prefixes are copied from here: never folded
        table.add_column(column, no_wrap=column in ("id", "prefix"), overflow="fold")
    for key in records:
        models = key.get("models")
        status = _key_status(key, now)
        table.add_row(
            Text(str(key.get("name", "?"))),
            key.get("id", "?"),
            f"{key.get('prefix', '')}…",
            key_band(key, bands),
            Text("all" if models is None else ", ".join(models) or "none"),
            _limits(key),
            "yes" if key.get("admin") else "",
            Text(status, style="" if status.startswith("active") else "dim"),
        )
    return table


def _seconds(value: Any) -> str:
    if value is None:
        return "-"
    value = float(value)
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _utc(seconds: Any) -> str:
    moment = datetime.datetime.fromtimestamp(float(seconds), datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S").removesuffix(":00") + " UTC"


def usage(data: dict[str, Any]) -> RenderableType:
    by = data.get("group_by", "key")
    rows = data.get("usage", [])
    since, until = data.get("since"), data.get("until")
    window = (
        (f" since {_utc(since)}" if since is not None else "")
        + (f" until {_utc(until)}" if until is not None else "")
    ) or " (all recorded)"
    if not rows:
        return Text(f"no usage{window}")
    bucketed = data.get("bucket_seconds") is not None
    title = f"usage by {by}{window}"
    if bucketed:
        title += f", per {format_duration(data['bucket_seconds'])}"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    columns = ["bucket (UTC)"] if bucketed else []
    columns += [
        by,
        "requests",
        "prompt tok",
        "completion tok",
        "cached tok",
        "errors",
        "mean latency",
        "mean TTFT",
    ]
    for i, column in enumerate(columns):
        table.add_column(column, justify="right" if i >= len(columns) - 7 else "left")
    for row in rows:
        group = row.get("group")
        if group is None:
            label = "(no key)" if by == "key" else "-"
        elif by == "key":
            label = f"{row['name']} ({group})" if row.get("name") else str(group)
        else:
            label = str(group)
        cells = [_utc(row["bucket"]).removesuffix(" UTC")] if bucketed else []
        cells += [
            label,
            _count(row.get("requests")),
            _count(row.get("prompt_tokens")),
            _count(row.get("completion_tokens")),
            _count(row.get("cached_tokens")),
            _count(row.get("errors")),
            _seconds(row.get("mean_latency")),
            _seconds(row.get("mean_ttft")),
        ]
        table.add_row(*(Text(c) for c in cells))
    if len(rows) > 1:
        requests = sum(r.get("requests") or 0 for r in rows)
        latency = (
            sum((r.get("mean_latency") or 0.0) * (r.get("requests") or 0) for r in rows) / requests
            if requests
            else None
        )
        totals = ["", "total"] if bucketed else ["total"]
        totals += [_count(requests)]
        totals += [
            _count(sum(r.get(k) or 0 for r in rows))
            for k in ("prompt_tokens", "completion_tokens", "cached_tokens", "errors")
        ]
        totals += [_seconds(latency), ""]
        table.add_section()
        table.add_row(*totals, style="bold")
    return table


def models(data: dict[str, Any]) -> RenderableType:
    records = data.get("models", [])
    if not records:
        return Text("no models")
    table = Table(title=f"models ({len(records)})", title_justify="left", box=box.SIMPLE_HEAD)
    columns = ("model", "source", "aliases", "fallbacks", "ready/desired", "autoscale", "endpoints")
    for column in columns:
        table.add_column(column, overflow="fold")
    for m in records:
        status = m.get("status")
        replicas = "-" if not status else f"{status.get('ready', 0)}/{status.get('desired', 0)}"
        routing = m.get("routing") or {}
        if routing.get("waiting"):  # requests waiting for a replica to start
            replicas += f" ({routing['waiting']} waiting)"
        bounds = m.get("autoscale")
        autoscale = (
            f"{bounds.get('min_replicas')}-{bounds.get('max_replicas')}"
            if isinstance(bounds, dict)
            else "-"
        )
        serving = routing.get("endpoints") or []
        endpoints = (
            f"{routing.get('available', 0)}/{len(serving)} available: {', '.join(serving)}"
            if serving
            else "none"
        )
        table.add_row(
            Text(str(m.get("name", "?"))),
            m.get("source", "?"),
            Text(", ".join(m.get("aliases") or []) or "-"),
            Text(", ".join(m.get("fallbacks") or []) or "-"),
            replicas,
            autoscale,
            Text(endpoints),
        )
    return table


def _records(data: Any, key: str, *fields: str) -> bool:
    """Whether `data[key]` is a list of objects with `fields` (llmgw's own API shape)."""
    items = data.get(key) if isinstance(data, dict) else None
    return isinstance(items, list) and all(
        isinstance(i, dict) and all(f in i for f in fields) for i in items
    )


def render(collection: str, data: Any, bands: Bands | None = None) -> RenderableType | None:
    """A readable view when `data` has llmgw's shape for `collection`; else None (the
    caller falls back to a generic table, e.g. for another tool's admin API). `bands`
    names the band of keys that have none of their own."""
    if collection == "nodes" and _records(data, "nodes", "id", "gpus_total", "state"):
        return nodes(data)
    if (
        collection == "replicas"
        and _records(data, "replicas", "id", "model", "state", "nodes")
        and _records(data, "models", "model", "desired")
    ):
        return replicas(data)
    if collection == "placement" and _records(data, "models", "model", "explanations"):
        return placement(data)
    if collection == "keys" and _records(data, "keys", "id", "name", "prefix", "status"):
        return keys(data, bands=bands)
    if (
        collection == "usage"
        and isinstance(data, dict)
        and "group_by" in data
        and _records(data, "usage", "group", "requests", "prompt_tokens")
    ):
        return usage(data)
    if collection == "models" and _records(data, "models", "name", "source", "routing"):
        return models(data)
    return None


# -- node operations (drain, cordon, uncordon, forget) ----------------------------------

#: Shard states of a replica that still runs on a node (what a drain moves).
_RUNNING = ("starting", "ready")


def _node_replicas(node: dict[str, Any]) -> list[tuple[str, str]]:
    """(replica id, model) of the replicas on the node, once each: those placed there
    (holding its GPUs, even before the agent reports them) and those it runs."""
    seen: dict[str, str] = {}
    for gpu in node.get("gpus", []):
        if gpu.get("replica_id") is not None:
            seen.setdefault(str(gpu["replica_id"]), str(gpu.get("model") or "?"))
    for shard in node.get("shards", []):
        if shard.get("state") in _RUNNING:
            seen.setdefault(str(shard.get("replica_id")), str(shard.get("model") or "?"))
    return sorted(seen.items())


def _node_line(node: dict[str, Any]) -> str:
    """``node gpu-1: ready, connected, draining``: where the node stands."""
    parts = [str(node.get("state", "?")), "connected" if node.get("connected") else "disconnected"]
    if node.get("draining"):
        parts.append("draining (cordoned: no new shards, its replicas move elsewhere)")
    elif node.get("cordoned"):
        parts.append("cordoned (no new shards, its replicas stay)")
    else:
        parts.append("not cordoned" + ("" if node.get("schedulable") else ", but not ready"))
    return f"node {node.get('id', '?')}: {', '.join(parts)}"


def _replica_lines(replicas: list[tuple[str, str]]) -> list[str]:
    return [f"  {replica_id} (model {model})" for replica_id, model in replicas]


def node_change(verb: str, node: dict[str, Any]) -> str:
    """What `llmgw-ctl drain|cordon|uncordon|forget` prints: the node, what the change
    does to its replicas, and how to undo it."""
    node_id = node.get("id", "?")
    running = _node_replicas(node)
    n = len(running)
    lines = [_node_line(node) if verb != "forget" else f"forgot node {node_id}"]
    if verb == "drain":
        blocked = node.get("drain_blocked")
        if running and blocked:
            lines.append(f"cannot move its {n} replica{'s' if n != 1 else ''} now: {blocked}")
            lines += _replica_lines(running)
            lines.append("the drain goes on by itself once replacements fit elsewhere")
        elif running:
            lines.append(
                f"moving {n} replica{'s' if n != 1 else ''} elsewhere, each drained once its "
                "replacement is ready:"
            )
            lines += _replica_lines(running)
        else:
            lines.append("nothing to move: no replica runs on it")
        lines.append(f"undo: llmgw-ctl nodes uncordon {node_id}")
    elif verb == "cordon":
        if running:
            lines.append(f"{n} replica{'s' if n != 1 else ''} stay{'s' if n == 1 else ''} on it:")
            lines += _replica_lines(running)
        lines.append(f"undo: llmgw-ctl nodes uncordon {node_id}")
    elif verb == "uncordon":
        lines.append(
            "placement may put new shards on it again"
            if node.get("schedulable")
            else "placement may use it again once it is ready"
        )
    else:
        lines.append(
            f"it was {node.get('state', '?')}; if its agent comes back it registers as a new node"
        )
    return "\n".join(lines)
