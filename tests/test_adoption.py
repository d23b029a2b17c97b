"""Adoption in the reconciler's pass: the whole replicas of an earlier server run that
nodes report (as the inventory holds their shards) are adopted; what is left is
stopped, a multi-node replica's rank only after it waited for its other ranks."""

from __future__ import annotations

from typing import Any

from llmgw.config import ControlConfig, DeploymentProfile, ModelConfig, Seconds
from llmgw.control.adoption import ShardReport, Strays
from llmgw.control.placement import NodeCapacity
from llmgw.control.reconciler import Reconciler
from llmgw.control.replicas import NodeView, Published
from llmgw.domain.fleet import NodeInfo, NodeState, Placement, ShardAssignment, ShardState
from llmgw.transport.messages import ShardStatus, StopShard

CONTROL = ControlConfig(interval=Seconds(2.0))
LLAMA = ModelConfig(
    name="llama",
    replicas=1,
    profiles=(DeploymentProfile(name="tp8-pp2", engine="sim", weights="w"),),
)


def shard(rank: int, *, replica: str = "r1", model: str = "llama", **kw: Any) -> ShardStatus:
    """A rank of a two-node replica of an earlier run (epoch 3), with the launch fields a
    restarted server rebuilds its placement from."""
    kw.setdefault("node_count", 2)
    kw.setdefault("dist_port", 20001 if rank == 0 else None)
    return ShardStatus(
        replica,
        rank,
        3,
        ShardState.READY,
        model=model,
        profile="tp8-pp2",
        gpu_indices=tuple(range(8)),
        port=20000,
        **kw,
    )


def view(node_id: str, *shards: ShardStatus, state: NodeState = NodeState.READY) -> NodeView:
    info = NodeInfo(node_id, node_id, node_id)
    capacity = NodeCapacity.from_info(info, state, since=0.0)
    return NodeView(node_id, state, capacity, address=node_id, shards=shards)


def stops(reconciler: Reconciler, now: float, nodes: list[NodeView]) -> list[tuple[str, str]]:
    actions = reconciler.step(now, [LLAMA], nodes)
    return [
        (c.node_id, c.message.replica_id)
        for c in actions.commands
        if isinstance(c.message, StopShard)
    ]


def test_the_pass_adopts_the_whole_replicas_its_nodes_report() -> None:
    r = Reconciler(CONTROL, first_epoch=1000)  # restarted: its epochs are later
    nodes = [view("gpu-1", shard(0)), view("gpu-2", shard(1))]
    assert r.step(5.0, [LLAMA], nodes).commands == ()  # nothing stopped, nothing placed
    assert r.replicas["r1"].placement == Placement(
        "r1",
        "llama",
        "tp8-pp2",
        3,
        (
            ShardAssignment("gpu-1", 0, tuple(range(8)), 20000, 20001),
            ShardAssignment("gpu-2", 1, tuple(range(8)), 20000),
        ),
    )
    # Routed at its head's registered address, as every replica is.
    assert r.routes().serving == {"r1": Published("r1", "llama", "http://gpu-1:20000")}
    # A lost node's shards are gone: nothing of them is adopted.
    again = Reconciler(CONTROL, first_epoch=1000)
    lost = [view("gpu-1", shard(0)), view("gpu-2", shard(1), state=NodeState.LOST)]
    again.adopt_reported(5.0, [LLAMA], lost)
    assert again.replicas == {}


def test_what_adoption_leaves_is_stopped_a_multi_node_rank_once_it_waited() -> None:
    r = Reconciler(CONTROL, first_epoch=1000, adopt_wait=10.0)
    # Rank 1 of r1 not reported (its agent not back yet); r2 is of a model not wanted.
    unwanted = shard(0, replica="r2", model="qwen", node_count=1, dist_port=None)
    nodes = [view("gpu-1", shard(0)), view("gpu-3", unwanted)]
    assert stops(r, 0.0, nodes) == [("gpu-3", "r2")]
    assert stops(r, 1.0, nodes) == []  # r1 waits (10 s); r2 is not told again yet (2 s)
    assert stops(r, 10.0, nodes) == [("gpu-1", "r1"), ("gpu-3", "r2")]
    assert stops(r, 11.0, nodes) == []  # sent again once per interval while reported
    assert sorted(stops(r, 12.0, nodes)) == [("gpu-1", "r1"), ("gpu-3", "r2")]
    # Its other rank back in time: adopted whole, nothing stopped.
    late = Reconciler(CONTROL, first_epoch=1000, adopt_wait=10.0)
    assert stops(late, 0.0, [view("gpu-1", shard(0))]) == []
    assert stops(late, 5.0, [view("gpu-1", shard(0)), view("gpu-2", shard(1))]) == []
    assert list(late.replicas) == ["r1"]


def test_the_strays_remembered_are_what_was_reported_last() -> None:
    """Reports may name any replica ids: what waits is remembered only while reported,
    so it holds no more than the inventory."""
    strays = Strays(wait=10.0, every=1.0)
    waiting = [ShardReport(f"n-{i}", shard(1, replica=f"x-{i}"), "p", 2, (0,), 1) for i in range(3)]
    assert strays.due(0.0, waiting) == [] and len(strays) == 3
    assert strays.due(1.0, waiting[:1]) == [] and len(strays) == 1
    assert strays.due(2.0, []) == [] and len(strays) == 0
