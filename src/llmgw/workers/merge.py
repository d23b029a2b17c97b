"""Merging the workers' state into the control process's views (pure functions).

Metrics: the control process serves one ``/metrics``. Its own registry has the
families only it knows (the process's, the fleet's, the engines' as its own scrapes
see them); each worker's registry has the traffic it served. A family is taken from
the control process alone when its name says it is one of those, else the samples of
the control process and every worker are merged by label set: counters and
histograms are added up, and every gauge a worker sends says how it merges. Those
in :data:`SUMS` count things and are added up too (requests in flight, queue
depths); those in :data:`LEVELS` are levels, which take the highest value (a breaker
state any worker is in; a pool's saturation; a KV-event feed any worker routes on).
tests/test_workers_merge.py checks that every gauge a worker's router registers is
in one of the two. A worker's gauge in neither is merged as a level, with a warning
once per name: the highest of counts only undercounts, while a sum of levels is
nonsense (four workers' 1 for "up" would read as 4).

Not prometheus-client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, mmap files),
by measurement (benchmarks/metrics_merge.py; docs/operations.md, "Every core", has the
numbers): a scrape's CPU is of the same order in that mode, but every update on the
request path costs 2-3x as much (a counter's ``inc``, a histogram's ``observe``), and
it carries no custom collector, so the workers' families computed at scrape time
(breaker states, admission queues, inter-token gaps) would be lost. What it does
better, keeping a dead worker's counts in the sums (here they leave with it: a counter
reset to Prometheus) and sparing a worker its collection at each scrape, is not worth
that.

Admission: each worker queues its own requests, so queue depths, tenants and in-flight
counts add up, a pool's saturation is the highest any worker saw, and a band admits
while any worker's does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client.metrics_core import Metric

from llmgw.workers.wire import Family

__all__ = ["CONTROL_ONLY", "LEVELS", "SUMS", "admission", "families", "metrics"]

log = logging.getLogger("llmgw.workers")

#: Families by name prefix that only the control process reports.
CONTROL_ONLY = ("process_", "python_", "llmgw_build_info", "llmgw_fleet_", "llmgw_endpoint_")
#: Gauges that are levels: merged by their highest value, not added up.
LEVELS = frozenset(
    {
        "llmgw_breaker_state",
        "llmgw_admission_pool_saturation_ratio",
        # Each worker subscribes to the engines' KV-cache events itself.
        "llmgw_kv_events_up",
    }
)
#: Gauges that count things: added up over the control process and the workers.
SUMS = frozenset(
    {
        "llmgw_requests_in_flight",
        "llmgw_admission_queue_depth",
        "llmgw_admission_queue_tenants",
        "llmgw_admission_inflight_requests",
    }
)
# Undeclared gauge names already warned about (once per name per process).
_warned: set[str] = set()


#: A band's numbers that add up over workers (admission.BandStats).
_COUNTS = (
    "depth",
    "tenants",
    "inflight",
    "admitted_immediate",
    "admitted_queued",
    "rejected_queue_full",
    "expired",
    "abandoned",
)


def families(collected: Iterable[Metric]) -> list[Family]:
    """A registry's families as a worker sends them (without the control-only ones)."""
    return [
        Family(
            m.name,
            m.documentation,
            m.type,
            m.unit,
            [(s.name, dict(s.labels), float(s.value)) for s in m.samples],
        )
        for m in collected
        if not m.name.startswith(CONTROL_ONLY)
    ]


def metrics(own: Iterable[Metric], workers: Sequence[Sequence[Family]]) -> Iterator[Metric]:
    """The control process's families merged with the workers' (see the module
    docstring), in the control process's order, then families only workers have."""
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}

    def add(name: str, doc: str, kind: str, unit: str, samples: Iterable[Any]) -> None:
        if name not in merged:
            merged[name] = Metric(name, doc, kind, unit)
            values[name] = {}
        level = name in LEVELS or (kind == "gauge" and name not in SUMS)
        into = values[name]
        for sample_name, labels, value in samples:
            key = (sample_name, tuple(sorted(labels.items())))
            if key in into:
                into[key] = max(into[key], value) if level else into[key] + value
            else:
                into[key] = value

    for m in own:
        add(m.name, m.documentation, m.type, m.unit, (tuple(s[:3]) for s in m.samples))
    for worker in workers:
        for f in worker:
            if not f.name.startswith(CONTROL_ONLY):
                if f.type == "gauge":
                    _declared(f.name)
                add(f.name, f.documentation, f.type, f.unit, f.samples)
    for name, metric in merged.items():
        for (sample_name, labels), value in values[name].items():
            metric.add_sample(sample_name, dict(labels), value)
        yield metric


def _declared(gauge: str) -> None:
    """Warn, once per name, of a worker's gauge in neither LEVELS nor SUMS."""
    if gauge in LEVELS or gauge in SUMS or gauge in _warned:
        return
    _warned.add(gauge)
    log.warning(
        "workers' gauge %s is in neither merge.LEVELS nor merge.SUMS: merged by its "
        "highest value, as a level",
        gauge,
    )


#: A pool's model states (llmgw.router.readiness), the one that wins a merge first.
_STATES = ("ready", "waking", "scaled_to_zero", "unavailable")


def admission(snapshots: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The workers' admission snapshots (AdmissionController.snapshot) as one; None
    when there is none yet."""
    if not snapshots:
        return None
    first = snapshots[0]
    pools: dict[str, dict[str, Any]] = {}
    for snap in snapshots:
        for pool in snap["pools"]:
            into = pools.get(pool["pool"])
            if into is None:
                pools[pool["pool"]] = {
                    **pool,
                    "bands": [dict(b) for b in pool["bands"]],
                    "admitting": list(pool["admitting"]),
                }
                continue
            into["saturation"] = max(into["saturation"], pool["saturation"])
            # Workers see one fleet; a model one of them waits for is waking.
            into["state"] = min(into["state"], pool["state"], key=_STATES.index)
            into["waiting"] += pool["waiting"]
            into["admitting"] = sorted(
                set(into["admitting"]) | set(pool["admitting"]),
                key=[b["band"] for b in into["bands"]].index,
            )
            by_band = {b["band"]: b for b in into["bands"]}
            for band in pool["bands"]:
                mine = by_band[band["band"]]
                for key in _COUNTS:
                    mine[key] += band[key]
                mine["open"] = mine["open"] or band["open"]
                oldest = band["oldest_wait_seconds"]
                if oldest is not None:
                    mine_oldest = mine["oldest_wait_seconds"]
                    mine["oldest_wait_seconds"] = (
                        oldest if mine_oldest is None else max(mine_oldest, oldest)
                    )
    return {**first, "pools": list(pools.values())}
