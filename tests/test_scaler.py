"""The controller's autoscaling: a controller built without any network, its clock
and demand feed faked, driving the reconciler through the autoscaler's decisions."""

from __future__ import annotations

import attrs

from llmgw.catalog.rules import Catalog
from llmgw.config import AutoscaleConfig, ControlConfig, DeploymentProfile, ModelConfig, Seconds
from llmgw.control.autoscale import ReplicaSample, Sample
from llmgw.control.controller import Controller
from llmgw.control.scaler import Scaler
from llmgw.control.views import model_counts
from llmgw.domain.fleet import EngineInfo, Gpu, NodeInfo, ReplicaState, ShardState
from llmgw.transport.messages import Register, ShardStatus
from tests.test_fleet_metrics import Clock, Sink

SIM = DeploymentProfile("sim", "sim", "w")
SCALED = ModelConfig(
    "scaled",
    replicas=1,
    profiles=(SIM,),
    autoscale=AutoscaleConfig(
        min_replicas=0,
        max_replicas=3,
        idle_timeout=Seconds(120.0),
        target_saturation=0.7,
        scale_up_window=Seconds(10.0),
        scale_down_window=Seconds(30.0),
        cold_start_timeout=Seconds(60.0),
    ),
)
STATIC = ModelConfig("static", replicas=2, profiles=(SIM,))


@attrs.define
class Feed:
    """The router's side: what it reports of the model's demand now."""

    inflight: int = 0
    queued: int = 0
    saturation: float = 0.0
    asked: list[str] = attrs.field(factory=list)

    def __call__(self, model: str, now: float) -> Sample:
        self.asked.append(model)
        return Sample(now, self.inflight, self.queued, self.saturation)


def fleet(feed: Feed | None) -> tuple[Controller, Clock]:
    clock = Clock(0.0)
    controller = Controller(
        ControlConfig(), Catalog((SCALED, STATIC)), Sink(), clock=clock, demand=feed
    )
    gpus = tuple(Gpu(i, f"GPU-{i}", "H100", 80 * 10**9) for i in range(8))
    info = NodeInfo("n-1", "n-1", "10.0.0.1", gpus=gpus, engines=(EngineInfo("sim"),))
    controller.inventory.register(Register(info), 0.0)
    return controller, clock


def active(controller: Controller, model: str) -> list[str]:
    return sorted(
        r.replica_id
        for r in controller.reconciler.replicas.values()
        if r.model == model and r.state in (ReplicaState.STARTING, ReplicaState.READY)
    )


def bring_up(controller: Controller, now: float) -> None:
    """Every starting replica reports ready."""
    for r in list(controller.reconciler.replicas.values()):
        if r.state is ReplicaState.STARTING:
            status = ShardStatus(r.replica_id, 0, r.placement.epoch, ShardState.READY)
            controller.reconciler.shard_reported("n-1", status, now)


def run(controller: Controller, clock: Clock, until: float, step: float = 1.0) -> None:
    while clock.now < until:
        clock.now += step
        controller.reconcile()
        bring_up(controller, clock.now)


def test_an_autoscaled_model_follows_its_demand_and_a_static_one_keeps_its_count() -> None:
    feed = Feed()
    controller, clock = fleet(feed)
    controller.reconcile()
    # Its `replicas` is where it starts.
    assert len(active(controller, "scaled")) == 1
    assert len(active(controller, "static")) == 2
    assert feed.asked == ["scaled"]  # only autoscaled models are sampled
    bring_up(controller, 0.0)

    # Saturated for longer than scale_up_window: up, by as many as bring it to the target.
    feed.inflight, feed.saturation = 8, 1.0
    run(controller, clock, 9.0)
    assert len(active(controller, "scaled")) == 1
    run(controller, clock, 11.0)
    assert len(active(controller, "scaled")) == 2
    assert controller.scaler.decided("scaled") is not None
    # What the views (and `llmgw-ctl models`) show as desired is the decision.
    (counts,) = [c for c in model_counts(controller, clock.now) if c.model == "scaled"]
    assert counts.desired == 2

    # Cool for scale_down_window: one fewer (by drain), then nothing more while busy.
    feed.saturation = 0.2
    run(controller, clock, 45.0)
    assert len(active(controller, "scaled")) == 1
    run(controller, clock, 200.0)
    assert len(active(controller, "scaled")) == 1

    # No request for idle_timeout: to min_replicas (zero), drained.
    feed.inflight, feed.saturation = 0, 0.0
    run(controller, clock, 319.0)
    assert len(active(controller, "scaled")) == 1
    run(controller, clock, 322.0)
    assert active(controller, "scaled") == []
    assert len(active(controller, "static")) == 2

    # A request queued for it while at zero: one replica at once.
    feed.queued = 1
    run(controller, clock, 323.0)
    assert len(active(controller, "scaled")) == 1


def test_without_a_demand_feed_only_idleness_moves_the_count() -> None:
    controller, clock = fleet(None)
    controller.reconcile()
    bring_up(controller, 0.0)
    run(controller, clock, 119.0)
    assert len(active(controller, "scaled")) == 1
    run(controller, clock, 121.0)
    assert active(controller, "scaled") == []


def test_a_model_that_stops_being_autoscaled_is_forgotten() -> None:
    controller, clock = fleet(Feed())
    controller.reconcile()
    assert controller.scaler.decided("scaled") is not None
    controller.set_catalog(Catalog((attrs.evolve(SCALED, autoscale=None, replicas=2), STATIC)))
    clock.now = 1.0
    controller.reconcile()
    assert controller.scaler.decided("scaled") is None
    assert len(active(controller, "scaled")) == 2


def test_after_a_restart_it_starts_from_the_replicas_it_adopted() -> None:
    scaler = Scaler()
    adopted = [ReplicaSample(ReplicaState.READY, 0.0)] * 3
    drained = [ReplicaSample(ReplicaState.DRAINING, 0.0)]
    out = scaler.step(
        [SCALED, STATIC],
        10.0,
        demand=Feed(inflight=1, saturation=0.5),
        last_request=lambda _: None,
        replicas={"scaled": [*adopted, *drained]},
    )
    assert out == {"scaled": 3}  # not its `replicas` (1): that would drain two
    # Never more than max_replicas, though.
    out = Scaler().step(
        [SCALED],
        10.0,
        demand=None,
        last_request=lambda _: None,
        replicas={"scaled": adopted * 2},
    )
    assert out == {"scaled": 3}
