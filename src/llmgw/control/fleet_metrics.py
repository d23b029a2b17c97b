"""Fleet metrics (DESIGN §5): the control plane's state on the router's `/metrics`.

:class:`FleetCollector` is a prometheus-client custom collector that reads the
:class:`~llmgw.control.controller.Controller` at scrape time: there is no ticker and
no gauge anyone must remember to update. Register it on the router's registry::

    register_fleet_metrics(router.metrics.registry, controller, controller.clock)

and render with ``generate_latest()`` inside the admin route, on the trio thread, so
it reads trio-owned state without locks (DESIGN §11).

Families (gauges, but for the ``_total`` counters; base units; ``_ratio`` is 0..1):

* ``llmgw_fleet_nodes{state}``: nodes by state (ready, unreachable, lost; every
  state always present); ``llmgw_fleet_nodes_connected`` (agent stream open) and
  ``llmgw_fleet_nodes_cordoned``.
* ``llmgw_fleet_node_state{node,state}``: 1 for each node's current state, 0 for
  the others; ``llmgw_fleet_node_heartbeat_age_seconds{node}``: since its last
  contact.
* ``llmgw_fleet_gpus``, ``llmgw_fleet_gpus_allocated``, ``llmgw_fleet_gpus_free``:
  fleet-wide; the same per node with label ``node``: ``llmgw_fleet_node_gpus``,
  ``llmgw_fleet_node_gpus_allocated``, ``llmgw_fleet_node_gpus_free``.
* Per GPU, labels ``node``, ``gpu`` (index), ``gpu_name``:
  ``llmgw_fleet_gpu_memory_capacity_bytes``, ``llmgw_fleet_gpu_memory_used_bytes``,
  ``llmgw_fleet_gpu_utilization_ratio``, ``llmgw_fleet_gpu_ecc_errors`` (as the
  driver counts them).
* ``llmgw_fleet_gpu_replica_info{node,gpu,model,replica}``: 1 per allocated GPU;
  join it with the utilisation to see what each model's GPUs do.
* ``llmgw_fleet_replicas{model,state}``: replicas by model and state (starting,
  ready, draining: the states the reconciler keeps, always present per model);
  ``llmgw_fleet_replicas_desired{model}``; ``llmgw_fleet_replicas_unplaced{model}``:
  missing replicas the last reconcile pass could not place (why:
  ``/api/v1/placement``); ``llmgw_fleet_model_backoff_seconds{model}``: until the
  next start attempt, only for models backing off after failed starts.
* ``llmgw_fleet_fabric_nodes_ready{fabric}``: ready, uncordoned nodes of the
  fabric; ``llmgw_fleet_fabric_gpus_free{fabric}``: free GPUs on them.
* Counters of the controller's decisions since it started:
  ``llmgw_fleet_reconcile_passes_total`` (reconcile passes run) and
  ``llmgw_fleet_commands_total{command}`` (start, drain, stop: commands issued to
  agents, every kind always present). A steady fleet's passes climb while its
  commands stay put; commands that keep climbing mean replicas flapping.
  ``llmgw_fleet_commands_resent_total``: those sent again because the agent's reports
  still disagreed with them an interval later (lost in a disconnect, or unheard).
* Counters of what went wrong, by ``model`` and a bounded ``reason``:
  ``llmgw_fleet_replica_start_failures_total`` (replicas that never became ready:
  ``not_launched``, ``exited``, ``timed_out``) and ``llmgw_fleet_engine_exits_total``
  (engines of ready or draining replicas that ended unasked: ``signal``, ``error``,
  ``clean``, ``unknown``), every reason always present per model.
* ``llmgw_fleet_replica_start_seconds{model,cold}``: a histogram of the seconds from
  placement to ready of the replicas that got there; ``cold="true"`` when no other
  replica of the model was ready meanwhile (a cold start: the model was unserved).
* ``llmgw_fleet_scale_events_total{model,direction,cause}``: the autoscaler's count
  changes (``up``, ``down``; ``wake``, ``load``, ``cool``, ``idle``, ``bounds``).
* ``llmgw_fleet_replica_moves_total``: replicas moved to make room for one that could
  not be placed.

Definitions:

* *Allocated*: the GPU is in the placement of a replica the reconciler keeps
  (starting, ready or draining), whatever state its node is in.
* *Free*: not allocated, on a node placement may use now (ready and not cordoned).
  Allocated + free is the total only when every node is ready and uncordoned.
* Readings (memory used, utilisation, ECC errors) are exported only for ready
  nodes and only when the driver reported them: an unreported or stale reading is
  an *absent sample*, never 0. A fleet at 90% occupancy and 2% utilisation holds
  models nobody asks for, and a 0 meaning "unknown" would hide exactly that.
  Memory capacity is exported for every GPU of every known node.
* A model removed from the catalog keeps its replica series (with `desired` 0)
  until its replicas are gone.

Cardinality: the per-node series scale with the node count, and the per-GPU series
(`node` x `gpu`, about 5 families) with the GPU count: 1000 nodes of 8 GPUs give
~40k per-GPU samples per scrape. That is expected and wanted for a GPU fleet (it
is what DCGM exporters emit too); every other family is bounded by the number of
models, fabrics or states. Node and GPU series of a node disappear when the node
is removed from the inventory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from llmgw.control.views import ModelCounts, gpu_holders, model_counts, schedulable_free
from llmgw.domain.fleet import EngineExit, NodeState, ReplicaState, StartFailure

if TYPE_CHECKING:
    from llmgw.control.controller import Controller

__all__ = ["FleetCollector", "register_fleet_metrics"]

_NODE_STATES = tuple(NodeState)


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels or [])


class FleetCollector(Collector):
    """The fleet's gauges, computed from `controller` at every collection. `clock` is
    the controller's clock (the one its inventory and reconciler times are on)."""

    def __init__(self, controller: Controller, clock: Callable[[], float]) -> None:
        self._controller = controller
        self._clock = clock

    def describe(self) -> list[Metric]:
        return []  # computed at collection; nothing to pre-declare

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        yield from self._fleet(now)
        counts = model_counts(self._controller, now)
        yield from self._models(counts)
        yield from self._decisions()
        yield from self._failures(counts)
        yield from self._scaling()
        yield from self._leadership()

    def _leadership(self) -> tuple[Metric, ...]:
        """Instances on one store: whether this one leads, and the lease's token."""
        leadership = self._controller.leadership
        leading = GaugeMetricFamily(
            "llmgw_fleet_leading",
            "1 while this instance leads the control plane (always 1 for a server alone "
            "on its store; instances on one PostgreSQL take turns).",
        )
        leading.add_metric([], 1.0 if leadership is None or leadership.leading() else 0.0)
        terms = CounterMetricFamily(
            "llmgw_fleet_leader_terms",
            "Times this instance became the leader (a takeover counts one).",
        )
        terms.add_metric([], 0 if leadership is None else leadership.terms)
        out: list[Metric] = [leading, terms]
        if leadership is not None and leadership.leader is not None:
            token = GaugeMetricFamily(
                "llmgw_fleet_leader_token",
                "The fencing token of the lease on the control plane, as last read.",
            )
            token.add_metric([], leadership.leader.token)
            out.append(token)
        return tuple(out)

    def _scaling(self) -> tuple[Metric, ...]:
        """Replica start durations (cold starts among them) and autoscaler changes."""
        controller = self._controller
        starts = HistogramMetricFamily(
            "llmgw_fleet_replica_start_seconds",
            "Seconds from placement to ready of replicas that became ready, by model; "
            "cold: no other replica of the model was ready meanwhile (a cold start, "
            "e.g. a wake from zero).",
            labels=["model", "cold"],
        )
        for (model, cold), durations in sorted(controller.reconciler.starts.items()):
            starts.add_metric(
                [model, "true" if cold else "false"],
                list(durations.cumulative()),
                durations.total,
            )
        events = CounterMetricFamily(
            "llmgw_fleet_scale_events",
            "Replica count changes the autoscaler made, by model, direction (up, down) "
            "and cause (wake, load, cool, idle, bounds).",
            labels=["model", "direction", "cause"],
        )
        for (model, direction, cause), count in sorted(controller.scaler.events.items()):
            events.add_metric([model, direction, cause], count)
        moves = CounterMetricFamily(
            "llmgw_fleet_replica_moves",
            "Replicas moved to make room for one that could not be placed (a replacement "
            "started elsewhere, then the original drained).",
        )
        moves.add_metric([], controller.reconciler.moves)
        return (starts, events, moves)

    def _failures(self, counts: list[ModelCounts]) -> tuple[CounterMetricFamily, ...]:
        """Failed starts and engine exits by model and reason; every reason of every
        current model is exported, 0 included, so a first failure shows up in rate()."""
        reconciler = self._controller.reconciler
        models = {c.model for c in counts}
        models.update(model for model, _ in reconciler.start_failures)
        models.update(model for model, _ in reconciler.engine_exits)
        starts = CounterMetricFamily(
            "llmgw_fleet_replica_start_failures",
            "Replicas that never became ready, by model and reason (not_launched: the "
            "agent refused or could not exec the engine; exited: an engine exited "
            "before ready; timed_out: not ready within control.start_timeout).",
            labels=["model", "reason"],
        )
        exits = CounterMetricFamily(
            "llmgw_fleet_engine_exits",
            "Engine processes of ready or draining replicas that ended unasked, by model "
            "and reason (signal, error: non-zero status, clean: status 0, unknown).",
            labels=["model", "reason"],
        )
        for model in sorted(models):
            for start in StartFailure:
                starts.add_metric([model, start.value], reconciler.start_failures[model, start])
            for end in EngineExit:
                exits.add_metric([model, end.value], reconciler.engine_exits[model, end])
        return (starts, exits)

    def _decisions(self) -> tuple[CounterMetricFamily, ...]:
        """What the controller decided: passes run, commands issued by kind."""
        controller = self._controller
        passes = CounterMetricFamily(
            "llmgw_fleet_reconcile_passes",
            "Reconcile passes the controller ran (each compares the catalog with the "
            "fleet and decides what to start, drain or stop).",
        )
        passes.add_metric([], controller.passes)
        commands = CounterMetricFamily(
            "llmgw_fleet_commands",
            "Commands the controller issued to agents, by kind.",
            labels=["command"],
        )
        for kind, count in controller.commands.items():
            commands.add_metric([kind], count)
        resent = CounterMetricFamily(
            "llmgw_fleet_commands_resent",
            "Commands sent again because the agent's reports still disagreed with them "
            "an interval later (lost in a disconnect, or unheard).",
        )
        resent.add_metric([], controller.reconciler.resent)
        return (passes, commands, resent)

    def _fleet(self, now: float) -> tuple[GaugeMetricFamily, ...]:
        """Nodes, GPUs and fabrics."""
        controller = self._controller
        records = controller.inventory.nodes()
        held = gpu_holders(controller.reconciler.snapshot())

        nodes = _gauge(
            "llmgw_fleet_nodes", "Nodes known to the control plane, by state.", ["state"]
        )
        connected = _gauge("llmgw_fleet_nodes_connected", "Nodes whose agent has its stream open.")
        cordoned = _gauge(
            "llmgw_fleet_nodes_cordoned", "Nodes cordoned by an operator (no new shards)."
        )
        node_state = _gauge(
            "llmgw_fleet_node_state", "1 for the current state of each node.", ["node", "state"]
        )
        heartbeat_age = _gauge(
            "llmgw_fleet_node_heartbeat_age_seconds",
            "Seconds since the node's last contact (registration, heartbeat, shard status).",
            ["node"],
        )
        gpus = _gauge("llmgw_fleet_gpus", "GPUs of every node the control plane knows.")
        allocated = _gauge("llmgw_fleet_gpus_allocated", "GPUs held by the placements of replicas.")
        free = _gauge(
            "llmgw_fleet_gpus_free",
            "GPUs placement could use now: unallocated, on ready uncordoned nodes.",
        )
        node_gpus = _gauge("llmgw_fleet_node_gpus", "GPUs of the node.", ["node"])
        node_allocated = _gauge(
            "llmgw_fleet_node_gpus_allocated",
            "GPUs of the node held by the placements of replicas.",
            ["node"],
        )
        node_free = _gauge(
            "llmgw_fleet_node_gpus_free",
            "GPUs of the node placement could use now (0 unless ready and uncordoned).",
            ["node"],
        )
        gpu_labels = ["node", "gpu", "gpu_name"]
        mem_capacity = _gauge(
            "llmgw_fleet_gpu_memory_capacity_bytes", "GPU memory size.", gpu_labels
        )
        mem_used = _gauge(
            "llmgw_fleet_gpu_memory_used_bytes",
            "GPU memory in use, as last reported (absent when unreported or the node is "
            "not ready).",
            gpu_labels,
        )
        utilization = _gauge(
            "llmgw_fleet_gpu_utilization_ratio",
            "GPU utilisation 0..1, as last reported (absent when the driver does not "
            "report it or the node is not ready; never 0 for unknown).",
            gpu_labels,
        )
        ecc = _gauge(
            "llmgw_fleet_gpu_ecc_errors",
            "ECC errors the driver counts for the GPU (absent when unknown).",
            gpu_labels,
        )
        gpu_replica = _gauge(
            "llmgw_fleet_gpu_replica_info",
            "1 for each GPU allocated to a replica, naming the model and replica.",
            ["node", "gpu", "model", "replica"],
        )
        fabric_ready = _gauge(
            "llmgw_fleet_fabric_nodes_ready",
            "Ready, uncordoned nodes in the fabric (multi-node replicas stay in one fabric).",
            ["fabric"],
        )
        fabric_free = _gauge(
            "llmgw_fleet_fabric_gpus_free",
            "GPUs placement could use now on the fabric's nodes.",
            ["fabric"],
        )

        by_state = dict.fromkeys(_NODE_STATES, 0)
        total_gpus = total_allocated = total_free = 0
        fabrics: dict[str, list[int]] = {}  # fabric -> [ready nodes, free GPUs]
        for record in records:
            node = record.node_id
            by_state[record.state] += 1
            for state in _NODE_STATES:
                node_state.add_metric([node, state.value], 1.0 if state is record.state else 0.0)
            heartbeat_age.add_metric([node], record.silent_for(now))
            node_held = held.get(node, {})
            known = {g.index for g in record.gpus}
            n_allocated = len(known.intersection(node_held))
            n_free = schedulable_free(record, node_held)
            node_gpus.add_metric([node], len(record.gpus))
            node_allocated.add_metric([node], n_allocated)
            node_free.add_metric([node], n_free)
            total_gpus += len(record.gpus)
            total_allocated += n_allocated
            total_free += n_free
            if record.schedulable:
                for fabric in record.info.fabrics:
                    counts = fabrics.setdefault(fabric, [0, 0])
                    counts[0] += 1
                    counts[1] += n_free
            else:
                for fabric in record.info.fabrics:
                    fabrics.setdefault(fabric, [0, 0])
            fresh = record.state is NodeState.READY
            for gpu in sorted(record.gpus, key=lambda g: g.index):
                ident = [node, str(gpu.index), gpu.name]
                mem_capacity.add_metric(ident, gpu.memory_total)
                if fresh:
                    if gpu.memory_used is not None:
                        mem_used.add_metric(ident, gpu.memory_used)
                    if gpu.utilization is not None:
                        utilization.add_metric(ident, gpu.utilization)
                    if gpu.ecc_errors is not None:
                        ecc.add_metric(ident, gpu.ecc_errors)
                holder = node_held.get(gpu.index)
                if holder is not None:
                    gpu_replica.add_metric(
                        [node, str(gpu.index), holder.model, holder.replica_id], 1.0
                    )

        for state, count in by_state.items():
            nodes.add_metric([state.value], count)
        connected.add_metric([], sum(1 for r in records if r.connected))
        cordoned.add_metric([], sum(1 for r in records if r.cordoned))
        gpus.add_metric([], total_gpus)
        allocated.add_metric([], total_allocated)
        free.add_metric([], total_free)
        for fabric in sorted(fabrics):
            ready_nodes, free_gpus = fabrics[fabric]
            fabric_ready.add_metric([fabric], ready_nodes)
            fabric_free.add_metric([fabric], free_gpus)

        return (
            nodes,
            connected,
            cordoned,
            node_state,
            heartbeat_age,
            gpus,
            allocated,
            free,
            node_gpus,
            node_allocated,
            node_free,
            mem_capacity,
            mem_used,
            utilization,
            ecc,
            gpu_replica,
            fabric_ready,
            fabric_free,
        )

    def _models(self, counts: list[ModelCounts]) -> tuple[GaugeMetricFamily, ...]:
        """Replicas per model: by state, desired, unplaced, backoff."""
        replicas = _gauge(
            "llmgw_fleet_replicas", "Replicas by model and state.", ["model", "state"]
        )
        desired = _gauge(
            "llmgw_fleet_replicas_desired",
            "Replicas the catalog asks for, per model (0 for a removed model still draining).",
            ["model"],
        )
        unplaced = _gauge(
            "llmgw_fleet_replicas_unplaced",
            "Missing replicas of the model that the last reconcile pass could not place "
            "(see /api/v1/placement for why).",
            ["model"],
        )
        backoff = _gauge(
            "llmgw_fleet_model_backoff_seconds",
            "Seconds until the model's next start attempt after failed starts; only "
            "models backing off.",
            ["model"],
        )
        idle = _gauge(
            "llmgw_fleet_model_idle_seconds",
            "Seconds since the model last served a request through this router; absent "
            "before its first one. With replicas ready, a long idle time means GPUs held "
            "for a model nobody asks for.",
            ["model"],
        )
        rate = _gauge(
            "llmgw_fleet_model_requests_per_second",
            "The model's recent request rate through this router (decayed over a minute).",
            ["model"],
        )
        for c in counts:
            if c.idle_seconds is not None:
                idle.add_metric([c.model], c.idle_seconds)
            rate.add_metric([c.model], c.requests_per_second)
            # The states a kept replica can be in, always exported (0 is a real count).
            for state, value in (
                (ReplicaState.STARTING, c.starting),
                (ReplicaState.READY, c.ready),
                (ReplicaState.DRAINING, c.draining),
            ):
                replicas.add_metric([c.model, state.value], value)
            desired.add_metric([c.model], c.desired)
            unplaced.add_metric([c.model], c.unplaced)
            if c.backoff_seconds is not None:
                backoff.add_metric([c.model], c.backoff_seconds)

        return (replicas, desired, unplaced, backoff, idle, rate)


def register_fleet_metrics(
    registry: CollectorRegistry, controller: Controller, clock: Callable[[], float]
) -> FleetCollector:
    """Export the fleet on `registry` (the router's); returns the collector so a caller
    can unregister it."""
    collector = FleetCollector(controller, clock)
    registry.register(collector)
    return collector
