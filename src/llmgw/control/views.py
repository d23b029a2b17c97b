"""JSON views of the control plane for the admin API (DESIGN §8-§9).

Frozen view values, built from the controller's state at one moment and turned into
JSON-able dicts by the views' one converter (:mod:`llmgw.jsonviews`: enums become
their values, tuples and frozensets lists). The numbers shared with the fleet metrics
(who holds which GPU, replica counts per model) are computed here once, by small pure
functions.

Times: the controller's clock is monotonic and means nothing outside the process,
so every moment is given as wall-clock Unix seconds (`since`, `last_heartbeat`)
together with an age in seconds (`in_state_seconds`, `heartbeat_age_seconds`). A
number a driver did not report is null, never 0.

Shapes (``GET /api/v1/...``):

* ``nodes``: ``{"nodes": [node, ...]}``, sorted by id; ``nodes/{id}``: one node.
  A node: ``id, hostname, address, agent_version, state, since, in_state_seconds,
  last_heartbeat, heartbeat_age_seconds, connected, cordoned, draining, schedulable,
  labels, fabrics, gpus_total, gpus_allocated, gpus_free, gpus: [{index, uuid, name,
  memory_total_bytes, memory_used_bytes, utilization, ecc_errors, replica_id,
  model}], engines: [{name, version}], shards: [{replica_id, rank, epoch, state,
  model, message, endpoint_url, port, gpu_indices, exit_code, output_tail}]``.
* ``replicas``: ``{"replicas": [{id, model, profile, epoch, state, since,
  in_state_seconds, url, nodes: [{node_id, rank, gpu_indices, port, dist_port,
  shard_state}]}], "models": [model counts]}``; `url` only once the replica is
  ready. Model counts: ``{model, desired, starting, ready, draining, unplaced,
  backoff_seconds}``.
* ``placement``: ``{"models": [{model, desired, active, unplaced,
  backoff_seconds, summary, explanations: [{replica_ids, summary, attempts:
  [{profile, code, summary, nodes: [{node_id, code, message}], fabrics: [{fabric,
  code, message, ready_nodes, needs}], node_counts, nodes_omitted}], hints:
  [{code, message, profile, model, replica_id, nodes, fabric}]}]}]}`` for every
  model that misses replicas because they cannot be placed or because the model
  is backing off after failed starts. Replicas of one model that failed for the
  same reasons share one explanation.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from llmgw.control.inventory import NodeRecord
from llmgw.control.placement import Hint, ProfileAttempt, Unplaceable
from llmgw.control.replicas import ReplicaInfo
from llmgw.domain.fleet import NodeState, ReplicaState
from llmgw.jsonviews import unstructure

if TYPE_CHECKING:
    from llmgw.control.controller import Controller

__all__ = [
    "EngineView",
    "ExplanationView",
    "GpuHolder",
    "GpuView",
    "ModelCounts",
    "ModelPlacementView",
    "NodeDetail",
    "ReplicaNodeView",
    "ReplicaView",
    "ShardView",
    "gpu_holders",
    "model_counts",
    "node_json",
    "nodes_json",
    "placement_json",
    "replicas_json",
    "schedulable_free",
    "unstructure",
]

# -- shared numbers (also used by the fleet metrics) -------------------------------------


@attrs.frozen
class GpuHolder:
    """The replica a GPU is allocated to."""

    replica_id: str
    model: str


def gpu_holders(replicas: Iterable[ReplicaInfo]) -> dict[str, dict[int, GpuHolder]]:
    """Node id -> GPU index -> the replica whose placement holds it. Every replica the
    reconciler keeps holds its GPUs (starting, ready and draining ones alike), as it
    does for placement."""
    held: dict[str, dict[int, GpuHolder]] = {}
    for replica in replicas:
        holder = GpuHolder(replica.replica_id, replica.model)
        for shard in replica.placement.shards:
            per_node = held.setdefault(shard.node_id, {})
            for index in shard.gpu_indices:
                per_node[index] = holder
    return held


def schedulable_free(record: NodeRecord, held: Mapping[int, GpuHolder]) -> int:
    """GPUs placement could use now: not held by any replica, on a ready, uncordoned
    node (0 on any other node)."""
    if not record.schedulable:
        return 0
    return sum(1 for gpu in record.gpus if gpu.index not in held)


@attrs.frozen
class ModelCounts:
    """One model's replicas: desired against what exists."""

    model: str
    desired: int
    starting: int
    ready: int
    draining: int
    # Replicas the last reconciler pass could not place, at most as many as missing.
    unplaced: int
    backoff_seconds: float | None  # until the next attempt; None when not backing off
    # Starts that failed since a replica was last ready: a crash-looping model is one
    # between attempts (backing off) and during them (starting) alike.
    failed_starts: int = 0
    # Starting or ready replicas being moved (on a draining node, evicted): they serve
    # until their replacements are ready, but do not count towards `desired`.
    moving: int = 0
    # Traffic as the router saw it (decayed rates): a model holding GPUs that nobody
    # asks for shows here. idle_seconds is None before its first request.
    idle_seconds: float | None = None
    requests_per_second: float = 0.0
    tokens_per_second: float = 0.0

    @property
    def active(self) -> int:
        """Replicas that count towards `desired` (those being moved do not)."""
        return self.starting + self.ready - self.moving


_SERVING = (ReplicaState.STARTING, ReplicaState.READY)


def model_counts(controller: Controller, now: float) -> list[ModelCounts]:
    """Every deployable model, and every model that still has replicas (one removed
    from the catalog and draining has `desired` 0), sorted by name."""
    reconciler = controller.reconciler
    desired = {m.name: controller.desired(m) for m in controller.deployable()}
    states: dict[str, dict[ReplicaState, int]] = {name: {} for name in desired}
    draining = {r.info.node_id for r in controller.inventory.nodes() if r.draining}
    moving: dict[str, int] = {}
    for replica in reconciler.snapshot():
        per = states.setdefault(replica.model, {})
        per[replica.state] = per.get(replica.state, 0) + 1
        if replica.state in _SERVING and reconciler.leaving(replica.placement, draining):
            moving[replica.model] = moving.get(replica.model, 0) + 1
    out = []
    for name in sorted(states):
        per = states[name]
        want = desired.get(name, 0)
        active = (
            per.get(ReplicaState.STARTING, 0) + per.get(ReplicaState.READY, 0) - moving.get(name, 0)
        )
        # The reconciler refreshes a model's unplaced list only when it tries to place
        # it: never report more unplaced replicas than are actually missing.
        unplaced = min(len(reconciler.unplaced.get(name, ())), max(0, want - active))
        until = reconciler.backoff_until(name)
        backoff = until - now if until is not None and until > now else None
        activity = controller.activity.get(name)
        out.append(
            ModelCounts(
                model=name,
                desired=want,
                starting=per.get(ReplicaState.STARTING, 0),
                ready=per.get(ReplicaState.READY, 0),
                draining=per.get(ReplicaState.DRAINING, 0),
                unplaced=unplaced,
                backoff_seconds=backoff,
                failed_starts=reconciler.failed_starts(name),
                moving=moving.get(name, 0),
                idle_seconds=activity.idle_seconds,
                requests_per_second=activity.requests_per_second,
                tokens_per_second=activity.tokens_per_second,
            )
        )
    return out


# -- nodes ---------------------------------------------------------------------------


@attrs.frozen
class GpuView:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int | None
    utilization: float | None  # 0..1
    ecc_errors: int | None
    replica_id: str | None  # the replica the GPU is allocated to
    model: str | None


@attrs.frozen
class EngineView:
    name: str
    version: str | None


@attrs.frozen
class ShardView:
    """A shard as the node's agent last reported it."""

    replica_id: str
    rank: int
    epoch: int
    state: str
    model: str
    message: str
    endpoint_url: str | None
    port: int | None
    gpu_indices: tuple[int, ...]
    exit_code: int | None
    output_tail: tuple[str, ...]


@attrs.frozen
class NodeDetail:
    id: str
    hostname: str
    address: str
    agent_version: str
    state: NodeState
    since: float  # Unix seconds
    in_state_seconds: float
    last_heartbeat: float  # Unix seconds
    heartbeat_age_seconds: float
    connected: bool
    cordoned: bool
    draining: bool  # cordoned and its replicas moving elsewhere (a drain)
    # Why a drain does not proceed (its replicas' replacements cannot be placed); None
    # when it is not draining or nothing stands in its way.
    drain_blocked: str | None
    schedulable: bool
    labels: dict[str, str]
    fabrics: tuple[str, ...]
    gpus_total: int
    gpus_allocated: int
    gpus_free: int  # what placement could use now (0 unless ready and uncordoned)
    gpus: tuple[GpuView, ...]
    engines: tuple[EngineView, ...]
    shards: tuple[ShardView, ...]


def node_detail(
    record: NodeRecord,
    held: Mapping[int, GpuHolder],
    now: float,
    wall: float,
    drain_blocked: str | None = None,
) -> NodeDetail:
    info = record.info
    gpus = tuple(
        GpuView(
            index=g.index,
            uuid=g.uuid,
            name=g.name,
            memory_total_bytes=g.memory_total,
            memory_used_bytes=g.memory_used,
            utilization=g.utilization,
            ecc_errors=g.ecc_errors,
            replica_id=held[g.index].replica_id if g.index in held else None,
            model=held[g.index].model if g.index in held else None,
        )
        for g in sorted(record.gpus, key=lambda g: g.index)
    )
    shards = tuple(
        ShardView(
            replica_id=s.replica_id,
            rank=s.rank,
            epoch=s.epoch,
            state=s.state.value,
            model=s.model,
            message=s.message,
            endpoint_url=s.endpoint_url,
            port=s.port,
            gpu_indices=s.gpu_indices,
            exit_code=s.exit_code,
            output_tail=s.output_tail,
        )
        for s in record.shards
    )
    in_state = max(0.0, now - record.since)
    silent = record.silent_for(now)
    return NodeDetail(
        id=info.node_id,
        hostname=info.hostname,
        address=info.address,
        agent_version=info.agent_version,
        state=record.state,
        since=wall - in_state,
        in_state_seconds=in_state,
        last_heartbeat=wall - silent,
        heartbeat_age_seconds=silent,
        connected=record.connected,
        cordoned=record.cordoned,
        draining=record.draining,
        drain_blocked=drain_blocked,
        schedulable=record.schedulable,
        labels=dict(info.labels),
        fabrics=info.fabrics,
        gpus_total=len(gpus),
        gpus_allocated=sum(1 for g in gpus if g.replica_id is not None),
        gpus_free=schedulable_free(record, held),
        gpus=gpus,
        engines=tuple(EngineView(e.name, e.version) for e in info.engines),
        shards=shards,
    )


def _clocks(controller: Controller, now: float | None, wall: float | None) -> tuple[float, float]:
    return (controller.clock() if now is None else now, time.time() if wall is None else wall)


def nodes_json(
    controller: Controller, *, now: float | None = None, wall: float | None = None
) -> dict[str, Any]:
    """``GET /api/v1/nodes``. `now` is on the controller's clock (default: its
    current time), `wall` the matching Unix time (default: ``time.time()``)."""
    now, wall = _clocks(controller, now, wall)
    replicas = controller.reconciler.snapshot()
    held = gpu_holders(replicas)
    nodes = [
        node_detail(r, held.get(r.node_id, {}), now, wall, _drain_blocked(controller, r, replicas))
        for r in controller.inventory.nodes()
    ]
    return {"nodes": unstructure(nodes)}


def node_json(
    controller: Controller, node_id: str, *, now: float | None = None, wall: float | None = None
) -> dict[str, Any] | None:
    """``GET /api/v1/nodes/{id}``: the node, or None when the inventory has no such node."""
    record = controller.inventory.get(node_id)
    if record is None:
        return None
    now, wall = _clocks(controller, now, wall)
    replicas = controller.reconciler.snapshot()
    held = gpu_holders(replicas)
    blocked = _drain_blocked(controller, record, replicas)
    detail = node_detail(record, held.get(node_id, {}), now, wall, blocked)
    result: dict[str, Any] = unstructure(detail)
    return result


def _drain_blocked(
    controller: Controller, record: NodeRecord, replicas: Sequence[ReplicaInfo]
) -> str | None:
    """Why a draining node's replicas stay: the models whose replacements the last pass
    could not place, each with its first reason (`replicas`: the view's snapshot)."""
    if not record.draining:
        return None
    node_id = record.info.node_id
    models = sorted(
        {r.model for r in replicas if r.state in _SERVING and node_id in r.placement.nodes}
    )
    reasons = []
    for model in models:
        explanations = _explanations(controller.reconciler.unplaced.get(model, ())[:1])
        if explanations:
            reasons.append(f"{model}: {explanations[0].summary}")
    if not reasons:
        return None
    return (
        "its replicas keep serving here: no replacement can be placed (" + "; ".join(reasons) + ")"
    )


# -- replicas ------------------------------------------------------------------------


@attrs.frozen
class ReplicaNodeView:
    node_id: str
    rank: int
    gpu_indices: tuple[int, ...]
    port: int
    dist_port: int | None
    shard_state: str | None  # as the shard's agent last reported it; None before any report


@attrs.frozen
class ReplicaView:
    id: str
    model: str
    profile: str
    epoch: int
    state: ReplicaState
    since: float  # Unix seconds
    in_state_seconds: float
    url: str | None  # only once ready
    nodes: tuple[ReplicaNodeView, ...]


def replica_view(replica: ReplicaInfo, now: float, wall: float) -> ReplicaView:
    p = replica.placement
    in_state = max(0.0, now - replica.since)
    nodes = tuple(
        ReplicaNodeView(
            node_id=s.node_id,
            rank=s.rank,
            gpu_indices=s.gpu_indices,
            port=s.port,
            dist_port=s.dist_port,
            shard_state=None if (state := replica.shard_state(s.rank)) is None else state.value,
        )
        for s in p.shards
    )
    return ReplicaView(
        id=p.replica_id,
        model=p.model,
        profile=p.profile,
        epoch=p.epoch,
        state=replica.state,
        since=wall - in_state,
        in_state_seconds=in_state,
        url=replica.url if replica.state is ReplicaState.READY else None,
        nodes=nodes,
    )


def replicas_json(
    controller: Controller, *, now: float | None = None, wall: float | None = None
) -> dict[str, Any]:
    """``GET /api/v1/replicas``: every replica (by model, then id) and, per model,
    desired against actual counts."""
    now, wall = _clocks(controller, now, wall)
    replicas = sorted(controller.reconciler.snapshot(), key=lambda r: (r.model, r.replica_id))
    return {
        "replicas": unstructure([replica_view(r, now, wall) for r in replicas]),
        "models": unstructure(model_counts(controller, now)),
    }


# -- placement -----------------------------------------------------------------------


@attrs.frozen
class ExplanationView:
    """Why some replicas of a model could not be placed (the same reasons for all)."""

    replica_ids: tuple[str, ...]
    summary: str
    attempts: tuple[ProfileAttempt, ...]
    hints: tuple[Hint, ...]


@attrs.frozen
class ModelPlacementView:
    model: str
    desired: int
    active: int
    unplaced: int
    backoff_seconds: float | None
    failed_starts: int
    summary: str  # one line for the model
    explanations: tuple[ExplanationView, ...]


def _explanations(unplaced: Iterable[Unplaceable]) -> tuple[ExplanationView, ...]:
    groups: list[list[Unplaceable]] = []  # attempts hold dicts: compared, not hashed
    for u in unplaced:
        for same in groups:
            first = same[0]
            if (u.summary, u.attempts, u.hints) == (first.summary, first.attempts, first.hints):
                same.append(u)
                break
        else:
            groups.append([u])
    return tuple(
        ExplanationView(
            replica_ids=tuple(u.replica_id for u in same),
            summary=same[0].summary,
            attempts=same[0].attempts,
            hints=same[0].hints,
        )
        for same in groups
    )


def _starts(n: int) -> str:
    return "1 failed start" if n == 1 else f"{n} failed starts in a row"


def _model_summary(counts: ModelCounts, explanations: tuple[ExplanationView, ...]) -> str:
    missing = max(0, counts.desired - counts.active)
    parts = [f"{counts.model}: {counts.active} of {counts.desired} replicas placed"]
    if counts.moving:
        parts.append(f"{counts.moving} on draining nodes keep serving until replacements are ready")
    if counts.unplaced:
        parts.append(f"{counts.unplaced} cannot be placed")
    if counts.backoff_seconds is not None:
        parts.append(
            f"backing off after {_starts(counts.failed_starts)}, "
            f"next try in {counts.backoff_seconds:.0f}s"
        )
    elif counts.failed_starts:
        parts.append(f"starting again after {_starts(counts.failed_starts)}")
    elif missing and not counts.unplaced:
        parts.append(f"{missing} waiting for the next reconcile pass")
    line = "; ".join(parts)
    if explanations:
        line += f": {explanations[0].summary}"
    return line


def placement_json(controller: Controller, *, now: float | None = None) -> dict[str, Any]:
    """``GET /api/v1/placement``: every model missing replicas that cannot be placed,
    and every model short of ready replicas whose starts keep failing (backing off or
    trying again), with the reasons per profile, node and fabric."""
    now = controller.clock() if now is None else now
    views = []
    for counts in model_counts(controller, now):
        failing = counts.failed_starts > 0 and counts.ready < counts.desired
        if not failing and (not counts.unplaced or counts.active >= counts.desired):
            continue
        unplaced = controller.reconciler.unplaced.get(counts.model, ())[: counts.unplaced]
        explanations = _explanations(unplaced)
        views.append(
            ModelPlacementView(
                model=counts.model,
                desired=counts.desired,
                active=counts.active,
                unplaced=counts.unplaced,
                backoff_seconds=counts.backoff_seconds,
                failed_starts=counts.failed_starts,
                summary=_model_summary(counts, explanations),
                explanations=explanations,
            )
        )
    return {"models": unstructure(views)}
