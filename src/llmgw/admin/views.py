"""View classes of the admin routes that predate the view modules (health, endpoints,
admission) and the envelopes of the control-plane views (:mod:`llmgw.control.views`).

The router hands its endpoint and admission views out as dicts; the admin app passes
them through these frozen classes (structured, then unstructured), so what it
answers is exactly what the OpenAPI document, generated from these classes, says.
"""

from __future__ import annotations

from typing import Literal

import attrs

from llmgw.control import views
from llmgw.jsonviews import from_dict, unstructure
from llmgw.router.breaker import BreakerState

__all__ = [
    "AdmissionView",
    "EndpointList",
    "EndpointView",
    "HealthView",
    "NodeList",
    "PlacementList",
    "ReadyView",
    "ReplicaList",
    "from_dict",
    "unstructure",
]


@attrs.frozen
class HealthView:
    """The process is up."""

    status: Literal["ok"]


@attrs.frozen
class ReadyView:
    """Ready when the gateway can accept and hold requests: an engine has been scraped,
    or a model starts on request."""

    status: Literal["ready", "not ready"]
    endpoints_scraped: int


@attrs.frozen
class EndpointView:
    """An engine replica the router sends requests to, with its live numbers and scores.

    Numbers the engine did not report (or before the first scrape) are null."""

    id: str
    name: str = attrs.field(
        metadata={
            "description": "how clients see it (x-llmgw-endpoint, error messages): the id, "
            "without the leader's fencing token in a replica's epoch"
        }
    )
    url: str
    models: tuple[str, ...]
    pool: str
    weight: float
    priority: int
    # Sequences its engine runs at once, when known, and from where: "configured"
    # (configuration or the control plane's launch flags) or "engine" (llama.cpp's
    # /props). Never guessed: unknown, its queue alone says when it is full.
    capacity: float | None
    capacity_source: Literal["configured", "engine"] | None
    draining: bool
    # Put to sleep by the router (sleep_after; the next request routed there wakes it).
    asleep: bool
    engine: str | None
    waiting: float | None
    running: float | None
    kv_usage: float | None
    prefix_hit_rate: float | None
    inflight: int
    scrape_age_seconds: float | None
    stale: bool
    scrape_error: str | None
    breaker: BreakerState
    # How full it is by its engine's account, 0..1 (1: saturated; see router.scoring).
    saturation: float
    # Routing profile name -> this endpoint's score for a request without affinity.
    scores: dict[str, float]
    source: Literal["config", "runtime", "discovery", "control_plane"] = attrs.field(
        default="config",
        metadata={
            "description": "where it comes from: the configuration file's [[endpoints]], "
            "the admin API (stored), the discovery file, or a replica the control plane "
            "placed"
        },
    )


@attrs.frozen
class EndpointList:
    endpoints: tuple[EndpointView, ...]


@attrs.frozen
class BandView:
    name: str
    priority: int
    saturation_ceiling: float


@attrs.frozen
class BandQueueView:
    """One band's queue in one pool, and its counters since the start."""

    band: str
    priority: int
    saturation_ceiling: float
    depth: int
    tenants: int
    inflight: int
    admitted_immediate: int
    admitted_queued: int
    rejected_queue_full: int
    expired: int
    abandoned: int
    open: bool  # the pool's saturation is under this band's ceiling
    oldest_wait_seconds: float | None


@attrs.frozen
class PoolView:
    pool: str
    saturation: float
    waiting: int
    admitting: tuple[str, ...]
    bands: tuple[BandQueueView, ...]
    # Its model's (llmgw.router.readiness): at zero a pool's saturation is 1 because
    # no replica exists, not because one is full.
    state: Literal["ready", "waking", "scaled_to_zero", "unavailable"]


@attrs.frozen
class AdmissionView:
    """Live admission queues per model pool and priority band."""

    enabled: bool
    default_band: str
    queue_ttl_seconds: float
    queue_capacity_per_band: int
    bands: tuple[BandView, ...]
    pools: tuple[PoolView, ...]


# -- envelopes of the control-plane views (llmgw.control.views builds the JSON) -----------


@attrs.frozen
class NodeList:
    """Every node with its GPUs, engines and shards, by id."""

    nodes: tuple[views.NodeDetail, ...]


@attrs.frozen
class ReplicaList:
    """Every replica, and per model desired against actual counts."""

    replicas: tuple[views.ReplicaView, ...]
    models: tuple[views.ModelCounts, ...]


@attrs.frozen
class PlacementList:
    """Models missing replicas that cannot be placed (or backing off), and why."""

    models: tuple[views.ModelPlacementView, ...]
