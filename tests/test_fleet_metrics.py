"""Fleet metrics: a controller built without any network, fed registrations, heartbeats
and shard statuses directly, then scraped through prometheus-client's own renderer
and parser (what Prometheus would see)."""

from __future__ import annotations

from collections.abc import Iterable

import attrs
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.catalog.rules import Catalog
from llmgw.config import ControlConfig, DeploymentProfile, ModelConfig, Seconds
from llmgw.control.controller import Controller
from llmgw.control.fleet_metrics import FleetCollector, register_fleet_metrics
from llmgw.domain.fleet import EngineInfo, Gpu, NodeInfo, ReplicaState, ShardState
from llmgw.router.endpoints import Endpoint
from llmgw.router.metrics import RouterMetrics
from llmgw.transport.messages import Heartbeat, Register, ShardStatus

GB = 10**9
Labels = frozenset[tuple[str, str]]

LLAMA = ModelConfig(
    "llama",
    replicas=2,
    profiles=(DeploymentProfile("tp2", "vllm", "meta/llama", tensor_parallel=2),),
)
# Two nodes of 8 GPUs in one fabric: no fleet here has them.
HUGE = ModelConfig(
    "huge",
    replicas=1,
    profiles=(
        DeploymentProfile(
            "2x8", "vllm", "huge/model", tensor_parallel=8, pipeline_parallel=2, gpus_per_node=8
        ),
    ),
)
MODELS = (LLAMA, HUGE)


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@attrs.define
class Sink:
    """The router side of the controller: remembers what was published."""

    endpoints: dict[str, Endpoint] = attrs.field(factory=dict)

    def upsert(self, endpoint: Endpoint) -> None:
        self.endpoints[endpoint.id] = endpoint

    def drain(self, endpoint_id: str) -> None:
        self.endpoints.pop(endpoint_id, None)

    def remove(self, endpoint_id: str) -> None:
        self.endpoints.pop(endpoint_id, None)


def gpus(node_id: str, count: int, name: str = "NVIDIA H100 80GB HBM3") -> tuple[Gpu, ...]:
    return tuple(Gpu(i, f"GPU-{node_id}-{i}", name, 80 * GB) for i in range(count))


def node(node_id: str, count: int, *fabrics: str) -> NodeInfo:
    return NodeInfo(
        node_id,
        f"{node_id}.example",
        f"10.0.0.{int(node_id.rsplit('-', 1)[1])}",
        agent_version="0.1.0",
        labels={"zone": "a"},
        fabrics=fabrics,
        gpus=gpus(node_id, count),
        engines=(EngineInfo("vllm", "0.9.0"),),
    )


def reading(node_id: str, index: int, *, utilization: float | None, used: int | None) -> Gpu:
    return Gpu(
        index,
        f"GPU-{node_id}-{index}",
        "NVIDIA H100 80GB HBM3",
        80 * GB,
        memory_used=used,
        utilization=utilization,
        ecc_errors=None if utilization is None else 0,
    )


@attrs.define
class Scenario:
    controller: Controller
    clock: Clock
    sink: Sink


def scenario(models: Iterable[ModelConfig] = MODELS) -> Scenario:
    """A fleet at t=70 (unreachable after 15s, lost after 60s):

    * gpu-1, gpu-2: ready, 4 GPUs each, fabric ib-a. gpu-1 reports utilisation for
      GPUs 0 and 1 (0.5 and 0.02) and none for 2 and 3; gpu-2 reports nothing.
    * gpu-3: unreachable since t=65 (last contact t=50), 2 GPUs, reported utilisation.
    * gpu-4: lost since t=60, 2 GPUs. gpu-5: ready and cordoned, 2 GPUs, fabric ib-b.
    """
    clock = Clock(0.0)
    sink = Sink()
    control = ControlConfig(unreachable_after=Seconds(15.0), lost_after=Seconds(60.0))
    controller = Controller(control, Catalog(tuple(models)), sink, clock=clock)
    inv = controller.inventory
    inv.register(Register(node("gpu-4", 2)), 0.0)
    inv.register(Register(node("gpu-3", 2, "ib-b")), 40.0)
    inv.heartbeat(
        "gpu-3",
        Heartbeat(1, (reading("gpu-3", 0, utilization=0.9, used=10 * GB),)),
        50.0,
    )
    inv.register(Register(node("gpu-1", 4, "ib-a")), 60.0)
    inv.register(Register(node("gpu-2", 4, "ib-a")), 60.0)
    inv.register(Register(node("gpu-5", 2, "ib-b")), 60.0)
    inv.cordon("gpu-5", True)
    inv.heartbeat(
        "gpu-1",
        Heartbeat(
            1,
            (
                reading("gpu-1", 0, utilization=0.5, used=40 * GB),
                reading("gpu-1", 1, utilization=0.02, used=70 * GB),
                reading("gpu-1", 2, utilization=None, used=1 * GB),
                reading("gpu-1", 3, utilization=None, used=None),
            ),
        ),
        70.0,
    )
    inv.heartbeat("gpu-2", Heartbeat(1), 70.0)
    inv.heartbeat("gpu-5", Heartbeat(1), 70.0)
    inv.expire(70.0)
    clock.now = 70.0
    return Scenario(controller, clock, sink)


def report(s: Scenario, replica_id: str, state: ShardState, **extra: object) -> None:
    """Every shard of the replica reports `state`, to the inventory and the reconciler
    (as the controller passes it on; the router side is not under test here)."""
    replica = s.controller.reconciler.replicas[replica_id]
    p = replica.placement
    for shard in p.shards:
        status = ShardStatus(p.replica_id, shard.rank, p.epoch, state, model=p.model, **extra)
        s.controller.inventory.shard_status(shard.node_id, status, s.clock.now)
        s.controller.reconciler.shard_reported(shard.node_id, status, s.clock.now)


def scrape(registry: CollectorRegistry) -> dict[str, dict[Labels, float]]:
    """Every sample by family and labels, parsed back from the text format."""
    text = generate_latest(registry).decode()
    out: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return out


def fleet_registry(s: Scenario) -> CollectorRegistry:
    registry = CollectorRegistry()
    register_fleet_metrics(registry, s.controller, s.clock)
    return registry


def lbl(**labels: str) -> Labels:
    return frozenset(labels.items())


def one(samples: dict[str, dict[Labels, float]], name: str) -> float:
    (value,) = samples[name].values()
    return value


# -- nodes -----------------------------------------------------------------------------


def test_nodes_by_state_connected_and_cordoned() -> None:
    s = scenario()
    m = scrape(fleet_registry(s))
    assert m["llmgw_fleet_nodes"] == {
        lbl(state="ready"): 3,
        lbl(state="unreachable"): 1,
        lbl(state="lost"): 1,
    }
    # Expiry alone does not close a stream: every agent here is still connected.
    assert one(m, "llmgw_fleet_nodes_connected") == 5
    s.controller.inventory.disconnected("gpu-4", 70.0)
    assert one(scrape(fleet_registry(s)), "llmgw_fleet_nodes_connected") == 4
    assert one(m, "llmgw_fleet_nodes_cordoned") == 1
    assert m["llmgw_fleet_node_state"][lbl(node="gpu-3", state="unreachable")] == 1
    assert m["llmgw_fleet_node_state"][lbl(node="gpu-3", state="ready")] == 0
    assert m["llmgw_fleet_node_heartbeat_age_seconds"][lbl(node="gpu-3")] == 20
    assert m["llmgw_fleet_node_heartbeat_age_seconds"][lbl(node="gpu-1")] == 0


def test_an_empty_fleet_exports_zero_counts_not_nothing() -> None:
    controller = Controller(ControlConfig(), Catalog(()), Sink(), clock=Clock())
    registry = CollectorRegistry()
    register_fleet_metrics(registry, controller, Clock())
    m = scrape(registry)
    assert set(m["llmgw_fleet_nodes"].values()) == {0}
    assert len(m["llmgw_fleet_nodes"]) == 3
    assert one(m, "llmgw_fleet_gpus") == 0
    assert one(m, "llmgw_fleet_gpus_free") == 0
    assert "llmgw_fleet_replicas" not in m
    assert "llmgw_fleet_gpu_utilization_ratio" not in m


# -- GPUs ------------------------------------------------------------------------------


def test_gpus_allocated_and_free_after_placement() -> None:
    s = scenario()
    m = scrape(fleet_registry(s))
    assert one(m, "llmgw_fleet_gpus") == 14
    assert one(m, "llmgw_fleet_gpus_allocated") == 0
    # Only ready, uncordoned nodes offer free GPUs: gpu-1 and gpu-2.
    assert one(m, "llmgw_fleet_gpus_free") == 8
    assert m["llmgw_fleet_node_gpus_free"][lbl(node="gpu-5")] == 0  # cordoned

    s.controller.reconcile()
    replicas = s.controller.reconciler.replicas
    assert len(replicas) == 2  # llama x2; huge fits nowhere
    expected: dict[str, int] = {}
    for replica in replicas.values():
        for shard in replica.placement.shards:
            expected[shard.node_id] = expected.get(shard.node_id, 0) + len(shard.gpu_indices)

    m = scrape(fleet_registry(s))
    assert one(m, "llmgw_fleet_gpus_allocated") == 4
    assert one(m, "llmgw_fleet_gpus_free") == 4
    assert one(m, "llmgw_fleet_gpus") == 14
    per_node = {dict(k)["node"]: v for k, v in m["llmgw_fleet_node_gpus_allocated"].items()}
    assert per_node == {
        n: expected.get(n, 0) for n in ("gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5")
    }
    free = {dict(k)["node"]: v for k, v in m["llmgw_fleet_node_gpus_free"].items()}
    for n in ("gpu-1", "gpu-2"):
        assert free[n] == 4 - expected.get(n, 0)
    # Each allocated GPU names its model and replica.
    info = m["llmgw_fleet_gpu_replica_info"]
    assert len(info) == 4
    assert {dict(k)["model"] for k in info} == {"llama"}
    assert {dict(k)["replica"] for k in info} == set(replicas)


def test_utilisation_is_absent_when_unreported_never_zero() -> None:
    m = scrape(fleet_registry(scenario()))
    util = m["llmgw_fleet_gpu_utilization_ratio"]
    name = "NVIDIA H100 80GB HBM3"
    assert util == {
        lbl(node="gpu-1", gpu="0", gpu_name=name): 0.5,
        lbl(node="gpu-1", gpu="1", gpu_name=name): 0.02,
    }
    # GPUs 2 and 3 of gpu-1 and all of gpu-2 reported no utilisation: no sample at all.
    for gpu in ("2", "3"):
        assert lbl(node="gpu-1", gpu=gpu, gpu_name=name) not in util
    assert not any(dict(k)["node"] == "gpu-2" for k in util)
    # gpu-3 reported 0.9 before it went silent: a stale reading is left out too.
    assert not any(dict(k)["node"] == "gpu-3" for k in util)
    # Memory used follows the same rule; capacity is known for every GPU.
    used = m["llmgw_fleet_gpu_memory_used_bytes"]
    assert used == {
        lbl(node="gpu-1", gpu="0", gpu_name=name): 40 * GB,
        lbl(node="gpu-1", gpu="1", gpu_name=name): 70 * GB,
        lbl(node="gpu-1", gpu="2", gpu_name=name): 1 * GB,
    }
    capacity = m["llmgw_fleet_gpu_memory_capacity_bytes"]
    assert len(capacity) == 14
    assert set(capacity.values()) == {80 * GB}
    ecc = m["llmgw_fleet_gpu_ecc_errors"]
    assert ecc == {
        lbl(node="gpu-1", gpu="0", gpu_name=name): 0,
        lbl(node="gpu-1", gpu="1", gpu_name=name): 0,
    }


def test_fabric_capacity() -> None:
    s = scenario()
    s.controller.reconcile()
    m = scrape(fleet_registry(s))
    # ib-a: gpu-1 and gpu-2 ready; ib-b: gpu-3 unreachable, gpu-5 cordoned.
    assert m["llmgw_fleet_fabric_nodes_ready"] == {lbl(fabric="ib-a"): 2, lbl(fabric="ib-b"): 0}
    assert m["llmgw_fleet_fabric_gpus_free"] == {lbl(fabric="ib-a"): 4, lbl(fabric="ib-b"): 0}


# -- replicas --------------------------------------------------------------------------


def test_replicas_by_state_desired_and_unplaced() -> None:
    s = scenario()
    m = scrape(fleet_registry(s))
    # Before any pass: desired is known, nothing exists, nothing is explained yet.
    assert m["llmgw_fleet_replicas_desired"] == {lbl(model="huge"): 1, lbl(model="llama"): 2}
    assert m["llmgw_fleet_replicas"][lbl(model="llama", state="starting")] == 0
    assert m["llmgw_fleet_replicas_unplaced"] == {lbl(model="huge"): 0, lbl(model="llama"): 0}

    s.controller.reconcile()
    first = sorted(s.controller.reconciler.replicas)[0]
    report(s, first, ShardState.READY, endpoint_url="http://10.0.0.1:20000")
    m = scrape(fleet_registry(s))
    assert m["llmgw_fleet_replicas"] == {
        lbl(model="llama", state="starting"): 1,
        lbl(model="llama", state="ready"): 1,
        lbl(model="llama", state="draining"): 0,
        lbl(model="huge", state="starting"): 0,
        lbl(model="huge", state="ready"): 0,
        lbl(model="huge", state="draining"): 0,
    }
    assert m["llmgw_fleet_replicas_unplaced"] == {lbl(model="huge"): 1, lbl(model="llama"): 0}
    assert "llmgw_fleet_model_backoff_seconds" not in m
    assert s.controller.reconciler.replicas[first].state is ReplicaState.READY


def test_unplaced_never_exceeds_missing_replicas() -> None:
    s = scenario()
    s.controller.reconcile()
    assert len(s.controller.reconciler.unplaced["huge"]) == 1
    # The model is scaled to 0: the reconciler stops trying it, its list may linger.
    s.controller.set_catalog(Catalog((LLAMA, attrs.evolve(HUGE, replicas=0))))
    s.controller.reconcile()
    m = scrape(fleet_registry(s))
    assert m["llmgw_fleet_replicas_unplaced"][lbl(model="huge")] == 0
    assert m["llmgw_fleet_replicas_desired"][lbl(model="huge")] == 0


def test_backoff_only_for_models_backing_off() -> None:
    s = scenario(models=(LLAMA,))
    s.controller.reconcile()
    victim = sorted(s.controller.reconciler.replicas)[0]
    report(s, victim, ShardState.FAILED, message="CUDA out of memory")
    m = scrape(fleet_registry(s))
    base = ControlConfig().base_backoff
    assert m["llmgw_fleet_model_backoff_seconds"] == {lbl(model="llama"): base}
    assert m["llmgw_fleet_replicas"][lbl(model="llama", state="starting")] == 1
    s.clock.now += 4.0
    m = scrape(fleet_registry(s))
    assert m["llmgw_fleet_model_backoff_seconds"] == {lbl(model="llama"): base - 4.0}
    s.clock.now += base
    assert "llmgw_fleet_model_backoff_seconds" not in scrape(fleet_registry(s))


def test_decisions_are_counted_passes_and_commands_by_kind() -> None:
    s = scenario(models=(LLAMA,))
    registry = fleet_registry(s)

    def decisions() -> tuple[float, dict[str, float]]:
        m = scrape(registry)
        commands = {
            dict(labels)["command"]: v for labels, v in m["llmgw_fleet_commands_total"].items()
        }
        return one(m, "llmgw_fleet_reconcile_passes_total"), commands

    assert decisions() == (0, {"start": 0, "drain": 0, "stop": 0})  # every kind, from 0
    s.controller.reconcile()
    assert decisions() == (1, {"start": 2, "drain": 0, "stop": 0})
    ready, _starting = sorted(s.controller.reconciler.replicas)
    report(s, ready, ShardState.READY)
    s.controller.reconcile()  # nothing to do: the pass counts, no command does
    assert decisions() == (2, {"start": 2, "drain": 0, "stop": 0})
    # The model leaves the catalog: the ready replica drains, the starting one stops.
    s.controller.catalog = Catalog(())
    s.controller.reconcile()
    assert decisions() == (3, {"start": 2, "drain": 1, "stop": 1})


def test_failed_starts_and_engine_exits_by_model_and_every_reason() -> None:
    s = scenario(models=(LLAMA,))
    registry = fleet_registry(s)

    def failures(family: str) -> dict[str, float]:
        samples = scrape(registry)[family]
        assert {dict(labels)["model"] for labels in samples} == {"llama"}
        return {dict(labels)["reason"]: v for labels, v in samples.items()}

    none = {"not_launched": 0, "exited": 0, "timed_out": 0}
    assert failures("llmgw_fleet_replica_start_failures_total") == none  # from 0
    s.controller.reconcile()
    serving, starting = sorted(s.controller.reconciler.replicas)
    report(s, serving, ShardState.READY)
    report(s, starting, ShardState.FAILED, message="exited with status 1", exit_code=1)
    report(s, serving, ShardState.FAILED, message="killed by SIGKILL", exit_code=-9)
    assert failures("llmgw_fleet_replica_start_failures_total") == {**none, "exited": 1}
    assert failures("llmgw_fleet_engine_exits_total") == {
        "signal": 1,
        "error": 0,
        "clean": 0,
        "unknown": 0,
    }


def test_registers_on_the_routers_registry_beside_its_families() -> None:
    s = scenario()
    metrics = RouterMetrics()
    collector = register_fleet_metrics(metrics.registry, s.controller, s.clock)
    assert isinstance(collector, FleetCollector)
    m = scrape(metrics.registry)
    assert "llmgw_fleet_nodes" in m
    assert "llmgw_router_overhead_seconds_count" in m  # the router's own families stay
    metrics.registry.unregister(collector)
    assert "llmgw_fleet_nodes" not in scrape(metrics.registry)


def test_metric_names_follow_prometheus_conventions() -> None:
    s = scenario()
    s.controller.reconcile()
    registry = fleet_registry(s)
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    assert families
    counters = {
        "llmgw_fleet_reconcile_passes",
        "llmgw_fleet_commands",
        "llmgw_fleet_replica_start_failures",
        "llmgw_fleet_engine_exits",
        "llmgw_fleet_scale_events",
        "llmgw_fleet_replica_moves",
        "llmgw_fleet_commands_resent",
        "llmgw_fleet_leader_terms",
    }
    histograms = {"llmgw_fleet_replica_start_seconds"}
    assert counters | histograms <= {family.name for family in families}
    for family in families:
        assert family.name.startswith("llmgw_fleet_")
        kind = (
            "counter"
            if family.name in counters
            else "histogram"
            if family.name in histograms
            else "gauge"
        )
        assert family.type == kind, family.name
        assert not family.name.endswith("_total")  # only counters have it (parsed off here)
        assert family.documentation
