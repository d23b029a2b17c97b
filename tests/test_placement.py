"""Placement: pure values in, values out (llmgw.control.placement).

The hypothesis properties replay every plan against a brute-force model of the
rules (first profile that fits, fullest node, least-leftover fabric, ports) and
check that nothing is ever over-allocated and every failure is explained.
"""

from __future__ import annotations

import json
import random
import re
import time

import attrs
import pytest
from cattrs.preconf.json import make_converter
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.config import DeploymentProfile
from llmgw.control.placement import (
    AttemptCode,
    FabricCode,
    HintCode,
    NodeCapacity,
    NodeCode,
    PlaceRequest,
    PlanResult,
    cpu_capable,
    plan,
)
from llmgw.domain.fleet import Gpu, NodeState, Placement, ShardAssignment
from tests.properties import examples

GB = 10**9
PORTS = (20000, 20999)
NOW = 1000.0
READY, UNREACHABLE, LOST = NodeState.READY, NodeState.UNREACHABLE, NodeState.LOST


def gpus(count: int, name: str = "H100", memory: int = 80 * GB) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, f"GPU-{name}-{i}", name, memory) for i in range(count))


def node(
    node_id: str,
    count: int = 8,
    *,
    name: str = "H100",
    memory: int = 80 * GB,
    state: NodeState = READY,
    since: float | None = None,
    engines: tuple[str, ...] = ("vllm", "sglang", "sim"),
    fabrics: tuple[str, ...] = (),
    used: tuple[int, ...] | range = (),
    ports: tuple[int, ...] | range = (),
    cordoned: bool = False,
    gpu_list: tuple[Gpu, ...] | None = None,
) -> NodeCapacity:
    return NodeCapacity(
        node_id=node_id,
        state=state,
        since=since,
        gpus=gpu_list if gpu_list is not None else gpus(count, name, memory),
        engines=frozenset(engines),
        fabrics=fabrics,
        used_gpus=frozenset(used),
        used_ports=frozenset(ports),
        address=f"10.0.0.{abs(hash(node_id)) % 250}",
        cordoned=cordoned,
    )


def prof(
    name: str = "p",
    *,
    engine: str = "vllm",
    tp: int = 1,
    pp: int = 1,
    per_node: int | None = None,
    memory: int | None = None,
    gpu_name: str | None = None,
) -> DeploymentProfile:
    return DeploymentProfile(
        name=name,
        engine=engine,
        weights="org/model",
        tensor_parallel=tp,
        pipeline_parallel=pp,
        gpus_per_node=per_node,
        min_gpu_memory=memory,  # type: ignore[arg-type]
        gpu_name=gpu_name,
    )


def req(replica_id: str, *profiles: DeploymentProfile, model: str = "m", epoch: int = 1):
    return PlaceRequest(model, replica_id, epoch, profiles)


def shard(node_id: str, gpu_indices: tuple[int, ...], port: int, rank: int = 0, dist=None):
    return ShardAssignment(node_id, rank, gpu_indices, port, dist)


def one(result: PlanResult):
    """The single unplaced request's explanation."""
    assert not result.placed and len(result.unplaced) == 1
    return result.unplaced[0]


def messages(result: PlanResult) -> list[str]:
    out = []
    for u in result.unplaced:
        out.append(u.summary)
        for a in u.attempts:
            out.append(a.summary)
            out += [n.message for n in a.nodes]
            out += [f.message for f in a.fabrics]
        out += [h.message for h in u.hints]
    return out


# -- single node: bin-packing, order, filters ----------------------------------------------


def test_two_small_replicas_share_a_node_and_keep_the_other_whole():
    r = plan(
        [node("gpu-b"), node("gpu-a")],
        [req("r1", prof(tp=1)), req("r2", prof(tp=1))],
        (),
        PORTS,
        NOW,
    )
    assert [p.shards for p in r.placed] == [
        (shard("gpu-a", (0,), 20000),),
        (shard("gpu-a", (1,), 20001),),
    ]
    assert not r.unplaced
    by_id = {n.node_id: n for n in r.nodes}
    assert by_id["gpu-a"].used_gpus == {0, 1} and by_id["gpu-a"].used_ports == {20000, 20001}
    assert by_id["gpu-b"].used_gpus == frozenset()
    assert [n.node_id for n in r.nodes] == ["gpu-a", "gpu-b"]


def test_fullest_node_that_fits_wins():
    nodes = [node("a"), node("b", used=range(5)), node("c", used=range(7))]
    r = plan(nodes, [req("r1", prof(tp=2))], (), PORTS, NOW)
    # c has 1 free (does not fit), b has 3 (1 left after), a has 8.
    assert r.placed[0].shards == (shard("b", (5, 6), 20000),)


def test_profiles_are_tried_in_order():
    small = [node("a", 4), node("b", 4)]
    r = plan(small, [req("r1", prof("tp8", tp=8), prof("tp4", tp=4))], (), PORTS, NOW)
    assert r.placed[0].profile == "tp4"
    big = [node("a", 8)]
    r = plan(big, [req("r1", prof("tp8", tp=8), prof("tp4", tp=4))], (), PORTS, NOW)
    assert r.placed[0].profile == "tp8"


def test_equally_constrained_requests_are_placed_in_the_order_given():
    small = prof(tp=1, gpu_name="A10")
    nodes = [node("a", 4), node("b", 1, name="A10")]
    r = plan(nodes, [req("r1", small), req("r2", small)], (), PORTS, NOW)
    assert [p.replica_id for p in r.placed] == ["r1"]
    assert [u.replica_id for u in r.unplaced] == ["r2"]


def test_the_most_constrained_are_placed_first():
    """The issue's fleet: two llama replicas fit any GPU of 20 GB or more, the
    embedding model only an L4. Given first, the llamas would take both L4s (the
    fullest node wins); placed by constraint, the embedding model gets an L4."""
    l4s = node("l4", 2, name="NVIDIA L4", memory=24 * GB)
    a100 = node("a100", 4, name="NVIDIA A100", memory=80 * GB)
    llama = prof("any", memory=20 * GB)
    embed = prof("l4", gpu_name="L4")
    requests = [req("llama-1", llama), req("llama-2", llama), req("embed-1", embed)]
    r = plan([l4s, a100], requests, (), PORTS, NOW)
    assert not r.unplaced
    where = {p.replica_id: p.nodes for p in r.placed}
    assert where["embed-1"] == ("l4",)
    assert [p.replica_id for p in r.placed] == ["embed-1", "llama-1", "llama-2"]


def test_spread_puts_each_replica_on_the_emptiest_node():
    nodes = [node("a"), node("b", used=range(5)), node("c", used=range(2))]
    r = plan(nodes, [req(f"r{i}", prof(tp=2)) for i in range(3)], (), PORTS, NOW, policy="spread")
    # a has 8 free, c 6, b 3: a (6 left), then a or c at 6 (ties by id: a), then c.
    assert [p.nodes for p in r.placed] == [("a",), ("a",), ("c",)]
    packed = plan(nodes, [req(f"r{i}", prof(tp=2)) for i in range(3)], (), PORTS, NOW)
    assert [p.nodes for p in packed.placed] == [("b",), ("c",), ("c",)]


def test_spread_picks_the_fabric_with_the_most_room():
    nodes = [
        node("a1", fabrics=("ib-a",)),
        node("a2", fabrics=("ib-a",)),
        node("b1", fabrics=("ib-b",)),
        node("b2", fabrics=("ib-b",)),
        node("b3", fabrics=("ib-b",)),
    ]
    big = req("r1", prof(tp=16, per_node=8))
    assert plan(nodes, [big], (), PORTS, NOW).placed[0].nodes == ("a1", "a2")
    assert plan(nodes, [big], (), PORTS, NOW, policy="spread").placed[0].nodes == ("b1", "b2")


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="placement policy"):
        plan([node("a")], [], (), PORTS, NOW, policy="random")


def test_gpu_filters_pick_matching_gpus_on_a_mixed_node():
    mixed = gpus(2, "L4", 24 * GB) + tuple(
        Gpu(i, f"u{i}", "NVIDIA H100 80GB HBM3", 80 * GB) for i in (2, 3, 4)
    )
    r = plan(
        [node("a", gpu_list=mixed)],
        [req("r1", prof(tp=2, memory=80 * GB, gpu_name="H100|H200"))],
        (),
        PORTS,
        NOW,
    )
    assert r.placed[0].shards[0].gpu_indices == (2, 3)
    r = plan(
        [node("a", gpu_list=mixed)],
        [req("r1", prof(tp=4, gpu_name="H100"))],
        (),
        PORTS,
        NOW,
    )
    assert "a: has 3 matching GPUs (of 5), needs 4" in messages(r)


def test_existing_placements_hold_their_gpus_and_ports_even_when_unreported():
    existing = [Placement("old", "m", "p", 1, (shard("a", (0, 1, 2, 3), 20000),))]
    r = plan([node("a")], [req("r1", prof(tp=4))], existing, PORTS, NOW)
    assert r.placed[0].shards == (shard("a", (4, 5, 6, 7), 20001),)
    assert r.nodes[0].used_gpus == frozenset(range(8))
    assert r.nodes[0].used_ports == {20000, 20001}


def test_chained_calls_equal_one_call():
    """Requests given most constrained first (the order one call takes them in)."""
    nodes = [node("a", 4), node("b", 8, fabrics=("ib",)), node("c", 8, fabrics=("ib",))]
    requests = [req("r2", prof(tp=16, per_node=8)), req("r3", prof(tp=4)), req("r1", prof(tp=2))]
    together = plan(nodes, requests, (), PORTS, NOW)
    first = plan(nodes, requests[:1], (), PORTS, NOW)
    rest = plan(first.nodes, requests[1:], first.placed, PORTS, NOW)
    assert first.placed + rest.placed == together.placed
    assert rest.nodes == together.nodes
    # Same reasons; only the chained call knows r2 as an existing replica it could drain.
    assert [u.attempts for u in rest.unplaced] == [u.attempts for u in together.unplaced]
    assert together.unplaced[0].hints == ()
    assert rest.unplaced[0].hints[0].replica_id == "r2"


def test_two_nodes_with_one_id_is_an_error():
    with pytest.raises(ValueError, match="'a' appears twice"):
        plan([node("a"), node("a")], [], (), PORTS, NOW)


# -- CPU engines ---------------------------------------------------------------------------


def test_cpu_capable_profiles_use_a_gpu_first_then_a_gpu_less_node():
    assert cpu_capable(prof(engine="sim")) and cpu_capable(prof(engine="llamacpp"))
    assert not cpu_capable(prof(engine="vllm"))
    assert not cpu_capable(prof(engine="sim", tp=2))
    assert not cpu_capable(prof(engine="sim", gpu_name="H100"))
    assert not cpu_capable(prof(engine="sim", memory=GB))

    fleet = [node("cpu-1", 0), node("cpu-2", 0, ports=(20000,)), node("gpu-1", 1)]
    sims = [req(f"r{i}", prof(engine="sim")) for i in range(4)]
    r = plan(fleet, sims, (), PORTS, NOW)
    # The GPU first (GPU accounting holds for sim), then the GPU-less node holding fewer ports.
    assert [p.shards for p in r.placed] == [
        (shard("gpu-1", (0,), 20000),),
        (shard("cpu-1", (), 20000),),
        (shard("cpu-1", (), 20001),),
        (shard("cpu-2", (), 20001),),
    ]
    r = plan([node("cpu-1", 0)], [req("r1", prof(engine="vllm"))], (), PORTS, NOW)
    assert "cpu-1: no GPUs, needs 1" in messages(r)


# -- node states, engines, filters: the words ----------------------------------------------


def test_each_node_reason_says_what_is_wrong():
    fleet = [
        node("gpu-3", used=range(6)),
        node("gpu-4", state=UNREACHABLE, since=NOW - 20),
        node("gpu-5", name="A100-80GB"),
        node("gpu-6", memory=40 * GB),
        node("gpu-7", state=LOST, since=NOW - 185),
        node("gpu-8", cordoned=True),
        node("gpu-9", engines=("vllm",)),
        node("gpu-10", 2),
    ]
    profile = prof("tp4", engine="sglang", tp=4, memory=80 * GB, gpu_name="H100|H200")
    u = one(plan(fleet, [req("r1", profile)], (), PORTS, NOW))
    attempt = u.attempts[0]
    assert attempt.code is AttemptCode.NO_NODE_FITS
    reasons = {n.node_id: (n.code, n.message) for n in attempt.nodes}
    assert reasons == {
        "gpu-3": (NodeCode.BUSY, "gpu-3: 2 free GPUs, needs 4"),
        "gpu-4": (NodeCode.UNREACHABLE, "gpu-4: unreachable for 20s (no heartbeat)"),
        "gpu-5": (NodeCode.GPU_NAME, "gpu-5: no GPU matches 'H100|H200' (has A100-80GB)"),
        "gpu-6": (NodeCode.GPU_MEMORY, "gpu-6: GPUs have 40 GB, needs 80 GB"),
        "gpu-7": (NodeCode.LOST, "gpu-7: lost 3m ago"),
        "gpu-8": (NodeCode.CORDONED, "gpu-8: cordoned"),
        "gpu-9": (NodeCode.NO_ENGINE, "gpu-9: engine sglang not installed (has vllm)"),
        "gpu-10": (NodeCode.TOO_FEW_GPUS, "gpu-10: has 2 GPUs, needs 4"),
    }
    assert attempt.node_counts == {code.value: 1 for code, _ in reasons.values()}
    assert attempt.nodes_omitted == 0
    # Listed closest-to-fitting first.
    assert [n.code for n in attempt.nodes][:2] == [NodeCode.BUSY, NodeCode.TOO_FEW_GPUS]
    assert u.summary.startswith("tp4 (4 GPUs): no node fits: 1 node with too few free GPUs")
    assert "(best: gpu-3 with 2 free)" in u.summary
    assert "1 node lost" in u.summary and "1 node cordoned" in u.summary
    # gpu-8 is cordoned but would fit.
    assert [h.message for h in u.hints] == ["fits on gpu-8 if it were uncordoned"]
    assert u.hints[0].code is HintCode.UNCORDON and u.hints[0].nodes == ("gpu-8",)


@pytest.mark.parametrize(
    ("elapsed", "words"),
    [(None, "lost"), (0, "lost 0s ago"), (59, "lost 59s ago"), (7300, "lost 2h ago")],
)
def test_lost_for_how_long(elapsed, words):
    since = None if elapsed is None else NOW - elapsed
    u = one(plan([node("a", state=LOST, since=since)], [req("r", prof())], (), PORTS, NOW))
    assert u.attempts[0].nodes[0].message == f"a: {words}"


def test_no_nodes_at_all():
    u = one(plan([], [req("r", prof("tp1"))], (), PORTS, NOW))
    assert u.attempts[0].code is AttemptCode.NO_NODES
    assert u.summary == "tp1 (1 GPU): no nodes registered"


def test_no_profiles_and_invalid_profiles_are_explained():
    u = one(plan([node("a")], [req("r")], (), PORTS, NOW))
    assert u.summary == "the model has no deployment profiles" and u.attempts == ()
    r = plan([node("a")], [req("r", prof("bad", gpu_name="("), prof("ok"))], (), PORTS, NOW)
    assert r.placed[0].profile == "ok"
    u = one(plan([node("a")], [req("r", prof("bad", gpu_name="("))], (), PORTS, NOW))
    assert u.attempts[0].code is AttemptCode.INVALID_PROFILE
    assert "not a valid regular expression" in u.summary


def test_node_reasons_are_capped_but_counted():
    fleet = [node(f"n{i:03d}", used=range(8)) for i in range(100)]
    fleet += [node("lost-1", state=LOST), node("off", cordoned=True)]
    u = one(plan(fleet, [req("r", prof())], (), PORTS, NOW, max_node_reasons=10))
    attempt = u.attempts[0]
    assert len(attempt.nodes) == 10 and attempt.nodes_omitted == 92
    assert attempt.node_counts == {"busy": 100, "cordoned": 1, "lost": 1}
    assert {n.code for n in attempt.nodes} == {NodeCode.BUSY, NodeCode.CORDONED, NodeCode.LOST}
    assert "100 nodes with too few free GPUs" in u.summary


def test_a_full_fleet_says_so():
    u = one(
        plan(
            [node("a", used=range(8)), node("b", used=range(8))], [req("r", prof())], (), PORTS, NOW
        )
    )
    assert u.summary == "p (1 GPU): no node fits: 2 nodes with too few free GPUs (none free)"


# -- ports ---------------------------------------------------------------------------------


def test_ports_come_from_the_range_and_run_out_with_a_clear_reason():
    fleet = [node("a", ports=(20000, 20002))]
    requests = [req(f"r{i}", prof()) for i in range(3)]
    r = plan(fleet, requests, (), (20000, 20003), NOW)
    assert [p.head.port for p in r.placed] == [20001, 20003]
    u = r.unplaced[0]
    assert u.replica_id == "r2"
    assert u.attempts[0].nodes[0].message == "a: no free port in 20000-20003"
    assert u.attempts[0].nodes[0].code is NodeCode.NO_PORTS
    # Ports outside the range are not ours to count.
    r = plan([node("a", ports=(19999, 21000))], [req("r", prof())], (), (20000, 20000), NOW)
    assert r.placed[0].head.port == 20000


# -- multi node ----------------------------------------------------------------------------


def test_multi_node_replica_spans_one_fabric_with_one_shard_per_node():
    fleet = [
        node("a1", fabrics=("ib-a",)),
        node("a2", fabrics=("ib-a",)),
        node("b1", fabrics=("ib-b",)),
        node("b2", fabrics=("ib-b",)),
        node("b3", fabrics=("ib-b",)),
    ]
    r = plan(fleet, [req("r1", prof("2x8", tp=8, pp=2, per_node=8))], (), PORTS, NOW)
    # ib-a leaves 0 free GPUs, ib-b would leave 8: the tighter fabric wins.
    assert r.placed[0].shards == (
        shard("a1", tuple(range(8)), 20000, 0, 20001),
        shard("a2", tuple(range(8)), 20000, 1),
    )


def test_multi_node_bin_packs_inside_the_fabric_and_heads_need_two_ports():
    fleet = [
        node("x1", fabrics=("ib",), used=range(4), ports=range(20000, 20003)),  # 1 port left
        node("x2", fabrics=("ib",), used=range(2)),
        node("x3", fabrics=("ib",)),
        node("x4", fabrics=("ib",), used=range(4)),
    ]
    r = plan(fleet, [req("r1", prof(tp=8, per_node=4))], (), (20000, 20003), NOW)
    # x1 and x4 are fullest (4 free), but x1 has one port: x4 is the head.
    assert r.placed[0].shards == (
        shard("x4", (4, 5, 6, 7), 20000, 0, 20001),
        shard("x1", (4, 5, 6, 7), 20003, 1),
    )


def test_multi_node_without_a_head_port():
    fleet = [node(f"x{i}", fabrics=("ib",), ports=range(20000, 20003)) for i in range(2)]
    u = one(plan(fleet, [req("r1", prof(tp=16, per_node=8))], (), (20000, 20003), NOW))
    (fabric,) = u.attempts[0].fabrics
    assert fabric.code is FabricCode.NO_HEAD_PORT
    assert "none has 2 free ports" in fabric.message


def test_multi_node_explanations_per_fabric():
    fleet = [
        node("a1", fabrics=("ib-a",)),
        node("a2", fabrics=("ib-a",), used=range(4)),
        node("b1", fabrics=("ib-b",), state=LOST, since=NOW - 60),
        node("solo"),
    ]
    u = one(plan(fleet, [req("r1", prof("2x8", tp=16, per_node=8))], (), PORTS, NOW))
    attempt = u.attempts[0]
    assert attempt.code is AttemptCode.NO_FABRIC_FITS
    assert [f.message for f in attempt.fabrics] == [
        "fabric ib-a: 1 ready node with 8 free GPUs, needs 2",
        "fabric ib-b: 0 ready nodes with 8 free GPUs, needs 2",
    ]
    assert [(f.ready_nodes, f.needs) for f in attempt.fabrics] == [(1, 2), (0, 2)]
    reasons = {n.node_id: n.message for n in attempt.nodes}
    assert reasons["a1"] == "a1: 8 free GPUs: could host a shard"
    assert reasons["a2"] == "a2: 4 free GPUs, needs 8"
    assert reasons["solo"] == "solo: no fabric label: cannot join a multi-node replica"
    assert reasons["b1"] == "b1: lost 1m ago"
    assert "needs 1 more ready node in fabric ib-a (with 8 free GPUs each)" in [
        h.message for h in u.hints
    ]
    assert u.summary.startswith(
        "2x8 (2 nodes x 8 GPUs): no fabric has 2 ready nodes with 8 free GPUs (best: ib-a with 1)"
    )


def test_no_fabric_labels_anywhere():
    u = one(
        plan([node("a"), node("b")], [req("r", prof("big", tp=16, per_node=8))], (), PORTS, NOW)
    )
    assert u.attempts[0].code is AttemptCode.NO_FABRICS
    assert "no fabric labels on any node: multi-node placement impossible" in u.summary
    assert u.hints[0].code is HintCode.LABEL_FABRICS


# -- hints ---------------------------------------------------------------------------------


def test_drain_hint_names_the_smallest_replica_that_would_make_room():
    existing = [
        Placement("llama-3-r1", "llama-3", "tp4", 1, (shard("gpu-3", (0, 1, 2, 3), 20000),)),
        Placement("tiny-r1", "tiny", "tp1", 1, (shard("gpu-2", (0,), 20000),)),
        Placement("big-r1", "big", "tp8", 1, (shard("gpu-1", tuple(range(8)), 20000),)),
    ]
    # gpu-3: 4 GPUs held by llama-3-r1, 2 by something the agent reports; 2 free.
    fleet = [node("gpu-1"), node("gpu-2", used=range(1, 8)), node("gpu-3", used=(4, 5))]
    u = one(plan(fleet, [req("r1", prof(tp=4))], existing, PORTS, NOW))
    assert u.hints[0].code is HintCode.DRAIN
    assert u.hints[0].message == (
        "fits if replica llama-3-r1 of model llama-3 were drained (frees 4 GPUs on gpu-3)"
    )
    assert (u.hints[0].model, u.hints[0].replica_id) == ("llama-3", "llama-3-r1")
    assert u.summary.endswith(
        "; fits if replica llama-3-r1 of model llama-3 were drained (frees 4 GPUs on gpu-3)"
    )


def test_drain_hint_for_a_multi_node_replica():
    existing = [Placement("x", "m", "p", 1, (shard("a2", tuple(range(8)), 20000),))]
    fleet = [node("a1", fabrics=("ib",)), node("a2", fabrics=("ib",))]
    u = one(plan(fleet, [req("r", prof(tp=16, per_node=8))], existing, PORTS, NOW))
    assert u.hints[0].message == "fits if replica x of model m were drained (frees 8 GPUs on a2)"


def test_no_drain_hint_when_draining_one_replica_is_not_enough():
    existing = [
        Placement(f"r{i}", "m", "p", 1, (shard("a", (2 * i, 2 * i + 1), 20000 + i),))
        for i in range(4)
    ]
    u = one(plan([node("a")], [req("r", prof(tp=8))], existing, PORTS, NOW))
    assert [h.code for h in u.hints] == []


def test_explanations_serialise_with_cattrs():
    fleet = [node("a", used=range(6), fabrics=("ib",)), node("b", state=LOST, since=1.0)]
    existing = [Placement("x", "m", "p", 1, (shard("a", (0, 1), 20000),))]
    r = plan(
        fleet,
        [req("r1", prof(tp=4), prof("mn", tp=16, per_node=8)), req("r2", prof())],
        existing,
        PORTS,
        NOW,
    )
    assert r.unplaced and r.placed
    conv = make_converter()
    text = conv.dumps(r)
    assert conv.loads(text, PlanResult) == r
    data = json.loads(text)
    assert data["unplaced"][0]["attempts"][0]["nodes"][0]["code"] == "busy"
    assert data["unplaced"][0]["attempts"][0]["node_counts"] == {"busy": 1, "lost": 1}


# -- properties ----------------------------------------------------------------------------

H_PORTS = (20000, 20005)
ENGINES = ("vllm", "sglang", "sim", "llamacpp")
KINDS = [("H100", 80 * GB), ("A100-80GB", 80 * GB), ("A100-40GB", 40 * GB), ("L4", 24 * GB)]
FABRICS = ("ib-a", "ib-b", "ib-c")


@st.composite
def fleets(draw) -> list[NodeCapacity]:
    names = [f"n{i}" for i in range(10)]
    ids = draw(st.lists(st.sampled_from(names), min_size=1, max_size=8, unique=True))
    out = []
    for node_id in ids:
        count = draw(st.sampled_from([0, 1, 2, 4, 8, 8, 8]))
        if draw(st.sampled_from([True, True, True, False])):
            kinds = [draw(st.sampled_from(KINDS))] * count
        else:
            kinds = [draw(st.sampled_from(KINDS)) for _ in range(count)]
        gpu_list = tuple(Gpu(i, f"u{i}", n, m) for i, (n, m) in enumerate(kinds))
        engines = draw(
            st.sampled_from([frozenset(ENGINES)] * 3) | st.frozensets(st.sampled_from(ENGINES))
        )
        fabrics = draw(
            st.sampled_from([("ib-a",), ("ib-a",), ("ib-b",), ("ib-a", "ib-b"), ()])
            | st.lists(st.sampled_from(FABRICS), max_size=2, unique=True).map(tuple)
        )
        out.append(
            NodeCapacity(
                node_id=node_id,
                state=draw(st.sampled_from([READY] * 6 + [UNREACHABLE, LOST])),
                since=draw(st.none() | st.floats(0, NOW)),
                gpus=gpu_list,
                engines=engines,
                fabrics=fabrics,
                used_gpus=draw(st.frozensets(st.integers(0, 9), max_size=3)),
                used_ports=draw(
                    st.frozensets(st.integers(H_PORTS[0] - 1, H_PORTS[1] + 1), max_size=5)
                ),
                address="10.0.0.1",
                cordoned=draw(st.sampled_from([False] * 7 + [True])),
            )
        )
    return out


@st.composite
def profiles(draw, name: str) -> DeploymentProfile:
    tp = draw(st.sampled_from([1, 1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 1, 2]))
    total = tp * pp
    divisors = [d for d in (1, 2, 4, 8) if total % d == 0]
    per_node = draw(st.sampled_from([None, *divisors]))
    return prof(
        name,
        engine=draw(st.sampled_from(["vllm", "vllm", *ENGINES])),
        tp=tp,
        pp=pp,
        per_node=per_node,
        memory=draw(st.sampled_from([None, None, None, 40 * GB, 80 * GB])),
        gpu_name=draw(st.sampled_from([None, None, None, "H100", "A100", "H100|L4"])),
    )


@st.composite
def request_lists(draw, prefix: str) -> list[PlaceRequest]:
    out = []
    for i in range(draw(st.integers(0, 8))):
        count = draw(st.sampled_from([1, 1, 2, 3, 0]))
        profs = tuple(draw(profiles(f"p{j}")) for j in range(count))
        out.append(PlaceRequest(f"model-{i % 3}", f"{prefix}{i}", i + 1, profs))
    return out


@st.composite
def fabric_fleets(draw) -> list[NodeCapacity]:
    """Uniform nodes in a few fabrics, where multi-node replicas often fit."""
    out = []
    count = draw(st.sampled_from([4, 8]))
    for i in range(draw(st.integers(2, 8))):
        out.append(
            node(
                f"f{i}",
                count,
                state=draw(st.sampled_from([READY] * 8 + [UNREACHABLE, LOST])),
                fabrics=draw(st.sampled_from([("ib-a",), ("ib-b",), ("ib-a", "ib-b"), ()])),
                used=tuple(draw(st.frozensets(st.integers(0, count - 1), max_size=3))),
                ports=tuple(draw(st.frozensets(st.integers(*H_PORTS), max_size=5))),
                cordoned=draw(st.sampled_from([False] * 9 + [True])),
            )
        )
    return out


@st.composite
def multi_request_lists(draw, prefix: str) -> list[PlaceRequest]:
    out = []
    for i in range(draw(st.integers(1, 6))):
        profs = []
        for j in range(draw(st.integers(1, 2))):
            tp, pp = draw(st.sampled_from([(4, 1), (8, 1), (8, 2), (2, 2), (1, 1), (2, 1)]))
            divisors = [d for d in (1, 2, 4, 8) if (tp * pp) % d == 0]
            profs.append(
                prof(f"p{j}", engine="sim", tp=tp, pp=pp, per_node=draw(st.sampled_from(divisors)))
            )
        out.append(PlaceRequest("m", f"{prefix}{i}", i + 1, tuple(profs)))
    return out


class Model:
    """A brute-force statement of the rules, replayed request by request."""

    def __init__(
        self,
        nodes: list[NodeCapacity],
        existing: tuple[Placement, ...],
        ports,
        policy: str = "binpack",
    ):
        self.spread = policy == "spread"
        self.nodes = {n.node_id: n for n in nodes}
        self.lo, self.hi = ports
        self.gpus = {n.node_id: set(n.used_gpus) for n in nodes}
        self.ports = {n.node_id: set(n.used_ports) for n in nodes}
        for p in existing:
            self.apply(p)

    def apply(self, p: Placement) -> None:
        for s in p.shards:
            if s.node_id in self.nodes:
                self.gpus[s.node_id].update(s.gpu_indices)
                self.ports[s.node_id].add(s.port)
                if s.dist_port is not None:
                    self.ports[s.node_id].add(s.dist_port)

    def usable(self, n: NodeCapacity) -> bool:
        return n.state is READY and not n.cordoned

    def free(self, n: NodeCapacity) -> list[int]:
        return sorted(g.index for g in n.gpus if g.index not in self.gpus[n.node_id])

    def free_ports(self, n: NodeCapacity) -> int:
        return sum(1 for p in range(self.lo, self.hi + 1) if p not in self.ports[n.node_id])

    def usable_free(self, n: NodeCapacity, p: DeploymentProfile) -> list[int]:
        return sorted(
            g.index
            for g in n.gpus
            if g.index not in self.gpus[n.node_id]
            and (p.min_gpu_memory is None or g.memory_total >= p.min_gpu_memory)
            and (p.gpu_name is None or re.search(p.gpu_name, g.name))
        )

    def eligible(self, n: NodeCapacity, p: DeploymentProfile, need: int) -> bool:
        return (
            self.usable(n)
            and p.engine in n.engines
            and bool(n.gpus)
            and len(self.usable_free(n, p)) >= need
            and self.free_ports(n) >= 1
        )

    def matching(self, n: NodeCapacity, p: DeploymentProfile) -> int:
        """GPUs of `n` that `p` could use were they all free."""
        return sum(
            1
            for g in n.gpus
            if (p.min_gpu_memory is None or g.memory_total >= p.min_gpu_memory)
            and (p.gpu_name is None or re.search(p.gpu_name, g.name))
        )

    def room(self, r: PlaceRequest) -> int:
        """Replicas of `r` the usable nodes could hold if empty, over its profiles."""
        total = 0
        for p in r.profiles:
            size = p.tensor_parallel * p.pipeline_parallel
            per_node = p.gpus_per_node or size
            if size % per_node:
                continue  # an invalid profile has no room
            nodes = [n for n in self.nodes.values() if self.usable(n) and p.engine in n.engines]
            if size == per_node:
                total += sum(self.matching(n, p) // per_node for n in nodes)
                if cpu_capable(p):
                    total += sum(1 for n in nodes if not n.gpus)
                continue
            for f in sorted({f for n in self.nodes.values() for f in n.fabrics if f}):
                fits = [n for n in nodes if f in n.fabrics and self.matching(n, p) >= per_node]
                total += len(fits) // (size // per_node)
        return total

    def choose(self, p: DeploymentProfile) -> list[str] | None:
        """Node ids, rank order, that the rules pick for `p` now; None: it does not fit."""
        total = p.tensor_parallel * p.pipeline_parallel
        per_node = p.gpus_per_node or total
        count = total // per_node
        sign = -1 if self.spread else 1
        ordered = sorted(self.nodes.values(), key=lambda n: (sign * len(self.free(n)), n.node_id))
        if count == 1:
            for n in ordered:
                if self.eligible(n, p, total):
                    return [n.node_id]
            if cpu_capable(p):
                cpus = [
                    n
                    for n in self.nodes.values()
                    if self.usable(n)
                    and not n.gpus
                    and p.engine in n.engines
                    and self.free_ports(n) >= 1
                ]
                if cpus:
                    best = min(cpus, key=lambda n: (-self.free_ports(n), n.node_id))
                    return [best.node_id]
            return None
        best: tuple[int, str, list[str]] | None = None
        fabrics = sorted({f for n in self.nodes.values() for f in n.fabrics})
        for f in fabrics:
            members = [n for n in ordered if f in n.fabrics]
            ok = [n for n in members if self.eligible(n, p, per_node)]
            heads = [n for n in ok if self.free_ports(n) >= 2]
            if len(ok) < count or not heads:
                continue
            chosen = ok[:count]
            head = next((n for n in chosen if self.free_ports(n) >= 2), None)
            if head is None:
                head = heads[0]
                chosen[-1] = head
            leftover = sum(len(self.free(n)) for n in members if self.usable(n))
            leftover -= count * per_node
            ids = [head.node_id] + [n.node_id for n in chosen if n is not head]
            if best is None or (sign * leftover, f) < best[:2]:
                best = (sign * leftover, f, ids)
        return best[2] if best else None


def check(nodes, existing, requests, result: PlanResult, policy: str = "binpack") -> None:
    model = Model(nodes, existing, H_PORTS, policy)
    placed = {p.replica_id: p for p in result.placed}
    unplaced = {u.replica_id: u for u in result.unplaced}
    assert len(placed) + len(unplaced) == len(requests)
    # The most constrained first, the order given among equals.
    requests = sorted(requests, key=model.room)
    assert [p.replica_id for p in result.placed] == [
        r.replica_id for r in requests if r.replica_id in placed
    ]
    for r in requests:
        if r.replica_id in placed:
            p = placed[r.replica_id]
            assert (p.model, p.epoch) == (r.model, r.epoch)
            names = [q.name for q in r.profiles]
            index = names.index(p.profile)
            # Every earlier profile did not fit; this one is exactly the rules' choice.
            for earlier in r.profiles[:index]:
                assert model.choose(earlier) is None
            profile = r.profiles[index]
            assert list(p.nodes) == model.choose(profile)
            check_shards(model, profile, p)
            model.apply(p)
        else:
            u = unplaced[r.replica_id]
            for q in r.profiles:
                assert model.choose(q) is None
            check_explanation(nodes, r, u)
    final = {n.node_id: n for n in result.nodes}
    assert sorted(final) == sorted(model.nodes)
    for node_id, n in final.items():
        assert n.used_gpus == model.gpus[node_id]
        assert n.used_ports == model.ports[node_id]
    for u in result.unplaced:
        check_drain_hints(result.nodes, existing, u)
        check_uncordon_hints(result.nodes, u)


def without(nodes: tuple[NodeCapacity, ...], p: Placement) -> list[NodeCapacity]:
    """The capacities with `p`'s GPUs and ports given back."""
    held = {s.node_id: s for s in p.shards}
    out = []
    for n in nodes:
        s = held.get(n.node_id)
        if s is not None:
            n = attrs.evolve(
                n,
                used_gpus=n.used_gpus - set(s.gpu_indices),
                used_ports=n.used_ports - {s.port, s.dist_port},
            )
        out.append(n)
    return out


def check_uncordon_hints(final, u) -> None:
    """Single-node profiles: the hint names the first cordoned node (by id) that would
    take the replica if it were uncordoned, and is absent when there is none."""
    hints = {h.profile: h for h in u.hints if h.code is HintCode.UNCORDON}
    for q in u.request.profiles:
        total = q.tensor_parallel * q.pipeline_parallel
        if (q.gpus_per_node or total) != total:  # multi-node: no uncordon hint
            assert q.name not in hints
            continue
        would = [
            n.node_id
            for n in final
            if n.cordoned
            and n.state is READY
            and Model([attrs.evolve(n, cordoned=False)], (), H_PORTS).choose(q) is not None
        ]
        if would:
            assert hints[q.name].nodes == (min(would),)
        else:
            assert q.name not in hints


def check_drain_hints(final, existing, u) -> None:
    """A drain hint names the least disruptive existing replica whose removal alone makes
    the profile fit; no hint means no single removal would."""
    drains = {h.profile: h for h in u.hints if h.code is HintCode.DRAIN}
    for q in u.request.profiles:
        helps = [x for x in existing if Model(without(final, x), (), H_PORTS).choose(q) is not None]
        if not helps:
            assert q.name not in drains
            continue
        best = min(
            helps,
            key=lambda x: (sum(len(s.gpu_indices) for s in x.shards), x.replica_id, x.model),
        )
        assert drains[q.name].replica_id == best.replica_id


def check_shards(model: Model, profile: DeploymentProfile, p: Placement) -> None:
    total = profile.tensor_parallel * profile.pipeline_parallel
    per_node = profile.gpus_per_node or total
    multi = total // per_node > 1
    assert [s.rank for s in p.shards] == list(range(len(p.shards)))
    assert len(set(p.nodes)) == len(p.nodes)
    if multi:
        common = set.intersection(*(set(model.nodes[n].fabrics) for n in p.nodes))
        assert common
    for s in p.shards:
        n = model.nodes[s.node_id]
        assert model.usable(n) and profile.engine in n.engines
        # Never a busy or missing GPU, never one twice, filters respected.
        usable = model.usable_free(n, profile)
        assert set(s.gpu_indices) <= set(usable)
        assert len(set(s.gpu_indices)) == len(s.gpu_indices)
        if n.gpus:
            assert len(s.gpu_indices) == per_node
        else:
            assert s.gpu_indices == () and cpu_capable(profile)
        ports = [s.port] + ([s.dist_port] if s.dist_port is not None else [])
        assert (s.dist_port is not None) == (multi and s.rank == 0)
        assert len(set(ports)) == len(ports)
        for port in ports:
            assert H_PORTS[0] <= port <= H_PORTS[1]
            assert port not in model.ports[s.node_id]


def check_explanation(nodes, r: PlaceRequest, u) -> None:
    assert u.request == r
    assert u.summary
    assert len(u.attempts) == len(r.profiles)
    for attempt, q in zip(u.attempts, r.profiles, strict=True):
        assert attempt.profile == q.name
        assert attempt.summary.startswith(q.name)
        if attempt.code in (AttemptCode.NO_NODE_FITS, AttemptCode.NO_FABRICS):
            assert sum(attempt.node_counts.values()) == len(nodes)
            assert attempt.nodes
            assert NodeCode.FITS.value not in attempt.node_counts or attempt.code in (
                AttemptCode.NO_FABRICS,
            )
        if attempt.code is AttemptCode.NO_FABRIC_FITS:
            assert attempt.fabrics
            assert all(f.code is not FabricCode.FITS for f in attempt.fabrics)
        for n in attempt.nodes:
            assert n.message.startswith(f"{n.node_id}: ")


POLICIES = st.sampled_from(["binpack", "spread"])


@settings(max_examples=examples(300))
@given(
    fleets(), request_lists("a"), request_lists("b"), POLICIES, st.randoms(use_true_random=False)
)
def test_plans_follow_the_rules(nodes, first, second, policy, rnd):
    r1 = plan(nodes, first, (), H_PORTS, NOW, policy=policy)
    check(nodes, (), first, r1, policy)
    r2 = plan(r1.nodes, second, r1.placed, H_PORTS, NOW, policy=policy)
    check(r1.nodes, r1.placed, second, r2, policy)

    # Existing placements hold their GPUs whether or not the capacities say so.
    assert plan(nodes, second, r1.placed, H_PORTS, NOW, policy=policy) == r2
    # Deterministic, and independent of the order nodes and placements come in.
    shuffled = list(r1.nodes)
    rnd.shuffle(shuffled)
    held = list(r1.placed)
    rnd.shuffle(held)
    assert plan(shuffled, second, held, H_PORTS, NOW, policy=policy) == r2
    assert plan(r1.nodes, second, r1.placed, H_PORTS, NOW, policy=policy) == r2


@settings(max_examples=examples(200))
@given(fabric_fleets(), multi_request_lists("a"), multi_request_lists("b"), POLICIES)
def test_multi_node_plans_follow_the_rules(nodes, first, second, policy):
    r1 = plan(nodes, first, (), H_PORTS, NOW, policy=policy)
    check(nodes, (), first, r1, policy)
    r2 = plan(r1.nodes, second, r1.placed, H_PORTS, NOW, policy=policy)
    check(r1.nodes, r1.placed, second, r2, policy)
    reordered = plan(list(reversed(r1.nodes)), second, r1.placed[::-1], H_PORTS, NOW, policy=policy)
    assert reordered == r2


@settings(max_examples=examples(50))
@given(fleets(), request_lists("a"))
def test_plans_serialise(nodes, requests):
    result = plan(nodes, requests, (), H_PORTS, NOW)
    conv = make_converter()
    assert conv.loads(conv.dumps(result), PlanResult) == result


# -- scale ---------------------------------------------------------------------------------


def test_plan_at_fleet_scale_prints_its_time():
    """1,000 nodes x 8 GPUs in 16 fabrics, 200 models (benchmarks/placement_scale.py
    has more scenarios). Prints the time; asserts only correctness."""
    rng = random.Random(7)
    fleet = [
        node(f"gpu-{i:04d}", fabrics=(f"ib-{i % 16:02d}",), name="NVIDIA H100 80GB HBM3")
        for i in range(1000)
    ]
    shapes = [
        (prof("tp1"),),
        (prof("tp2", tp=2), prof("tp1")),
        (prof("tp4", tp=4, memory=80 * GB, gpu_name="H100"), prof("tp2", tp=2)),
        (prof("tp8", tp=8), prof("2x4", tp=8, per_node=4)),
        (prof("2x8", tp=16, per_node=8), prof("tp8", tp=8)),
    ]
    requests = []
    for m in range(200):
        profs = rng.choice(shapes)
        for k in range(rng.randint(1, 3)):
            requests.append(req(f"model-{m}-r{k}", *profs, model=f"model-{m}"))
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        result = plan(fleet, requests, (), PORTS, NOW)
        best = min(best, time.perf_counter() - start)
    print(
        f"\nplan(): {len(requests)} replicas on 1000 nodes x 8 GPUs: {best * 1000:.1f} ms "
        f"(best of 3)"
    )
    assert len(result.placed) == len(requests)
    used = sum(len(n.used_gpus) for n in result.nodes)
    assert used == sum(len(s.gpu_indices) for p in result.placed for s in p.shards)
