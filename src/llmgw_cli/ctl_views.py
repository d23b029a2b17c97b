"""Readable tables for the fleet listings of `llmgw-ctl` (nodes, replicas, placement).

The admin API's JSON is for scripts (`--json`); an operator at a terminal wants the
few columns that answer "what runs where" and "why is this not running".
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text


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
        head = Text(f"{m.get('model')}: ", style="bold")
        head.append(m.get("summary") or f"{m.get('unplaced', 0)} replica(s) not placed")
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


def _records(data: Any, key: str, *fields: str) -> bool:
    """Whether `data[key]` is a list of objects with `fields` (llmgw's own API shape)."""
    items = data.get(key) if isinstance(data, dict) else None
    return isinstance(items, list) and all(
        isinstance(i, dict) and all(f in i for f in fields) for i in items
    )


def render(collection: str, data: Any) -> RenderableType | None:
    """A readable view when `data` has llmgw's shape for `collection`; else None (the
    caller falls back to a generic table, e.g. for another tool's admin API)."""
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
    return None
