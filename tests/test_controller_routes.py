"""What the controller gives the router: derived on every pass from the replicas
(Reconciler.routes), only the difference from what it last gave."""

from __future__ import annotations

import attrs

from llmgw.catalog.rules import Catalog
from llmgw.config import ControlConfig, DeploymentProfile, ModelConfig
from llmgw.control.controller import Controller
from llmgw.domain.endpoints import Endpoint
from llmgw.domain.fleet import EngineInfo, Gpu, NodeInfo, ShardState
from llmgw.transport.messages import Register, ShardStatus

SIM = DeploymentProfile(name="sim", engine="sim", weights="w")


@attrs.define
class Calls:
    """An endpoint sink that records every call made to it."""

    made: list[tuple[str, str]] = attrs.field(factory=list)
    endpoints: dict[str, Endpoint] = attrs.field(factory=dict)

    def upsert(self, endpoint: Endpoint) -> None:
        self.made.append(("upsert", endpoint.id))
        self.endpoints[endpoint.id] = endpoint

    def drain(self, endpoint_id: str) -> None:
        self.made.append(("drain", endpoint_id))

    def remove(self, endpoint_id: str) -> None:
        self.made.append(("remove", endpoint_id))
        self.endpoints.pop(endpoint_id, None)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def catalog(replicas: int) -> Catalog:
    return Catalog((ModelConfig(name="m", replicas=replicas, profiles=(SIM,)),))


def report(controller: Controller, clock: Clock, state: ShardState) -> str:
    """The one replica's shard reports `state`, as the controller passes a status on."""
    (replica,) = controller.reconciler.replicas.values()
    p = replica.placement
    status = ShardStatus(p.replica_id, 0, p.epoch, state, model=p.model)
    controller.inventory.shard_status(p.head.node_id, status, clock.now)
    controller.reconciler.shard_reported(p.head.node_id, status, clock.now)
    return p.replica_id


def test_the_router_is_given_only_what_changed_pass_after_pass() -> None:
    clock, sink = Clock(), Calls()
    controller = Controller(ControlConfig(), catalog(1), sink, clock=clock)
    info = NodeInfo(
        "gpu-1",
        "gpu-1",
        "10.0.0.1",
        gpus=(Gpu(0, "GPU-0", "H100", 80 * 10**9),),
        engines=(EngineInfo("sim"),),
    )
    controller.inventory.register(Register(info), 0.0)
    controller.reconcile()  # placed: nothing to route while it starts
    assert sink.made == []
    replica_id = report(controller, clock, ShardState.READY)
    for _ in range(3):  # ready: given once, however many passes see it so
        controller.reconcile()
    assert sink.made == [("upsert", replica_id)]
    assert sink.endpoints[replica_id].url == controller.reconciler.replicas[replica_id].url
    controller.set_catalog(catalog(0))
    for _ in range(3):  # surplus: drained once (requests in flight finish)
        controller.reconcile()
    assert sink.made[1:] == [("drain", replica_id)]
    report(controller, clock, ShardState.STOPPED)
    for _ in range(3):  # gone: removed once
        controller.reconcile()
    assert sink.made[2:] == [("remove", replica_id)]
