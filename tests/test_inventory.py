"""Node inventory: states on fed time, reconnects, fencing, rebuilding placements from
agents' reports (and adopting them in the reconciler the controller runs)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from llmgw.config import ControlConfig, Seconds
from llmgw.control.adoption import ShardReport, placement_from_reports
from llmgw.control.inventory import (
    Event,
    IdentityMismatch,
    InvalidRegistration,
    Inventory,
    NodeBecameUnreachable,
    NodeCordoned,
    NodeDisconnected,
    NodeLost,
    NodeReady,
    NodeRegistered,
    NodeRemoved,
    ReregisterRequired,
    ShardChanged,
    StaleConnection,
    UnknownNode,
)
from llmgw.control.reconciler import Reconciler
from llmgw.control.replicas import Published
from llmgw.domain.fleet import Gpu, NodeInfo, NodeState, Placement, ShardAssignment, ShardState
from llmgw.transport.limits import MAX_SHARDS
from llmgw.transport.messages import Heartbeat, Register, ShardStatus, StopShard
from tests.properties import examples

UA, LA = 15.0, 60.0
READY, UNREACHABLE, LOST = NodeState.READY, NodeState.UNREACHABLE, NodeState.LOST


def inventory() -> Inventory:
    return Inventory(ControlConfig(unreachable_after=Seconds(UA), lost_after=Seconds(LA)))


def gpu(index: int, **kw: Any) -> Gpu:
    return Gpu(index, f"GPU-{index}", "H100", 80 << 30, **kw)


def info(node_id: str = "gpu-1", **kw: Any) -> NodeInfo:
    kw.setdefault("gpus", (gpu(0), gpu(1)))
    return NodeInfo(node_id, f"{node_id}.example", "10.0.0.1", **kw)


def shard(
    replica: str = "r1",
    rank: int = 0,
    epoch: int = 1,
    state: ShardState = ShardState.READY,
    **kw: Any,
) -> ShardStatus:
    kw.setdefault("model", "llama")
    return ShardStatus(replica, rank, epoch, state, **kw)


def reg(node_id: str = "gpu-1", *shards: ShardStatus, **kw: Any) -> Register:
    return Register(info(node_id, **kw), shards)


def kinds(events: list[Event]) -> list[type]:
    return [type(e) for e in events]


def state(inv: Inventory, node_id: str = "gpu-1") -> NodeState:
    record = inv.get(node_id)
    assert record is not None
    return record.state


# -- registration ----------------------------------------------------------------------


def test_a_new_node_registers_ready_with_its_inventory_and_shards() -> None:
    inv = inventory()
    s = shard()
    events = inv.register(reg("gpu-1", s, fabrics=("ib-a",)), 100.0, identity="gpu-1")
    assert kinds(events) == [NodeRegistered, NodeReady, ShardChanged]
    registered = events[0]
    assert isinstance(registered, NodeRegistered)
    assert registered.new and registered.previous is None and not registered.replaced_connection
    assert events[1] == NodeReady("gpu-1", None)
    assert events[2] == ShardChanged("gpu-1", "r1", 0, None, s)
    record = inv.get("gpu-1")
    assert record is not None
    assert (record.state, record.since, record.last_heartbeat) == (READY, 100.0, 100.0)
    assert record.connected and not record.cordoned and record.schedulable
    assert record.info.fabrics == ("ib-a",)
    assert record.gpus == (gpu(0), gpu(1))
    assert record.shards == (s,) and record.shard("r1", 0) == s
    assert record.identity == "gpu-1" and record.session == registered.session
    assert record.seq is None
    assert inv.get("nope") is None and "gpu-1" in inv and len(inv) == 1


def test_identity_mismatch_is_refused_and_nothing_is_recorded() -> None:
    inv = inventory()
    with pytest.raises(IdentityMismatch) as e:
        inv.register(reg("gpu-1"), 0.0, identity="gpu-2")
    assert (e.value.node_id, e.value.identity) == ("gpu-1", "gpu-2")
    assert "gpu-2" in str(e.value)
    assert inv.nodes() == () and inv.next_deadline() is None
    with pytest.raises(InvalidRegistration):
        inv.register(Register(NodeInfo("", "h", "a")), 0.0)


def test_snapshots_are_frozen_values() -> None:
    inv = inventory()
    inv.register(reg(), 0.0)
    before = inv.get("gpu-1")
    assert before is not None
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        before.state = LOST  # type: ignore[misc]
    inv.expire(UA)
    assert before.state is READY and state(inv) is UNREACHABLE


# -- timer transitions -----------------------------------------------------------------


def test_ready_unreachable_lost_at_exactly_the_configured_times() -> None:
    inv = inventory()
    inv.register(reg(), 100.0)
    assert inv.next_deadline() == 100.0 + UA
    assert inv.expire(100.0 + UA - 1e-9) == []
    assert inv.expire(100.0 + UA) == [NodeBecameUnreachable("gpu-1", 115.0, 15.0)]
    record = inv.get("gpu-1")
    assert record is not None and (record.state, record.since) == (UNREACHABLE, 115.0)
    assert not record.schedulable and record.shards == ()
    assert inv.next_deadline() == 100.0 + LA
    assert inv.expire(100.0 + LA - 1e-9) == []
    assert inv.expire(100.0 + LA) == [NodeLost("gpu-1", 160.0, 60.0, ())]
    assert state(inv) is LOST and inv.next_deadline() is None
    assert inv.expire(10_000.0) == []


def test_a_late_expire_emits_every_skipped_transition_once_at_its_deadline() -> None:
    inv = inventory()
    s = shard()
    inv.register(reg("gpu-1", s), 0.0)
    inv.register(reg("gpu-2"), 10.0)
    events = inv.expire(500.0)
    assert events == [
        NodeBecameUnreachable("gpu-1", UA, 500.0),
        NodeBecameUnreachable("gpu-2", 10.0 + UA, 490.0),
        NodeLost("gpu-1", LA, 500.0, (s,)),
        NodeLost("gpu-2", 10.0 + LA, 490.0, ()),
    ]
    record = inv.get("gpu-1")
    assert record is not None and record.since == LA and record.shards == ()
    assert inv.expire(501.0) == []


def test_next_deadline_is_the_earliest_transition_of_any_node() -> None:
    inv = inventory()
    assert inv.next_deadline() is None
    inv.register(reg("a"), 0.0)
    inv.register(reg("b"), 5.0)
    assert inv.next_deadline() == UA
    inv.heartbeat("a", Heartbeat(1), 8.0)
    assert inv.next_deadline() == 5.0 + UA
    assert kinds(inv.expire(5.0 + UA)) == [NodeBecameUnreachable]
    assert inv.next_deadline() == 8.0 + UA  # a's, before b's lost deadline (65)
    inv.expire(8.0 + UA)
    assert inv.next_deadline() == 5.0 + LA
    inv.expire(5.0 + LA)
    assert inv.next_deadline() == 8.0 + LA
    inv.expire(8.0 + LA)
    assert inv.next_deadline() is None


def test_time_never_moves_backwards() -> None:
    inv = inventory()
    inv.register(reg(), 50.0)
    inv.expire(50.0 + UA)
    inv.heartbeat("gpu-1", Heartbeat(1), 10.0)  # an earlier `now` counts as the latest
    record = inv.get("gpu-1")
    assert record is not None and record.last_heartbeat == 50.0 + UA


def test_inventory_refuses_inconsistent_timeouts() -> None:
    with pytest.raises(ValueError):
        Inventory(ControlConfig(unreachable_after=Seconds(60.0), lost_after=Seconds(60.0)))


# -- blips and reconnects ----------------------------------------------------------------


def test_disconnect_changes_nothing_until_time_passes() -> None:
    inv = inventory()
    session = inv.register(reg(), 0.0)[0]
    assert isinstance(session, NodeRegistered)
    assert inv.disconnected("gpu-1", 3.0) == [NodeDisconnected("gpu-1", session.session)]
    assert inv.disconnected("gpu-1", 3.5) == []  # already
    assert inv.disconnected("ghost", 3.5) == []
    record = inv.get("gpu-1")
    assert record is not None and record.state is READY and not record.connected
    assert inv.next_deadline() == UA  # from the last contact, not from the drop
    assert inv.expire(UA - 0.001) == []
    assert kinds(inv.expire(UA)) == [NodeBecameUnreachable]


def test_a_blip_shorter_than_unreachable_after_changes_nothing() -> None:
    inv = inventory()
    s0, s1 = shard(rank=0), shard(rank=1)
    inv.register(reg("gpu-1", s0, s1), 0.0)
    inv.heartbeat("gpu-1", Heartbeat(1), 5.0)
    inv.disconnected("gpu-1", 6.0)
    assert inv.expire(12.0) == []
    events = inv.register(reg("gpu-1", s0, s1), 12.0)  # the agent is back, same shards
    assert kinds(events) == [NodeRegistered]  # no NodeReady, no ShardChanged
    registered = events[0]
    assert isinstance(registered, NodeRegistered)
    assert registered.previous is READY and not registered.new
    assert not registered.replaced_connection
    record = inv.get("gpu-1")
    assert record is not None
    assert (record.state, record.since, record.connected) == (READY, 0.0, True)
    assert record.seq is None  # a new session
    assert inv.expire(12.0 + UA - 0.001) == []


def test_a_heartbeat_returns_an_unreachable_node_to_ready_and_leaves_its_shards() -> None:
    inv = inventory()
    s0 = shard(endpoint_url="http://gpu-1:20000")
    inv.register(reg("gpu-1", s0), 0.0)
    inv.expire(30.0)
    assert state(inv) is UNREACHABLE
    events = inv.heartbeat("gpu-1", Heartbeat(7, shards=(s0,)), 40.0)
    assert events == [NodeReady("gpu-1", UNREACHABLE)]
    record = inv.get("gpu-1")
    assert record is not None
    assert (record.state, record.since, record.seq, record.shards) == (READY, 40.0, 7, (s0,))
    assert inv.next_deadline() == 40.0 + UA


def test_a_shard_status_is_contact_too() -> None:
    inv = inventory()
    inv.register(reg("gpu-1", shard(state=ShardState.STARTING)), 0.0)
    inv.expire(20.0)
    events = inv.shard_status("gpu-1", shard(), 21.0)
    assert kinds(events) == [NodeReady, ShardChanged]
    assert inv.next_deadline() == 21.0 + UA


def test_lost_node_reregisters_ready_with_a_refreshed_inventory() -> None:
    inv = inventory()
    old = shard(epoch=1)
    inv.register(reg("gpu-1", old, fabrics=("ib-a",), labels={"zone": "a"}), 0.0)
    inv.cordon("gpu-1", True)
    inv.expire(LA)
    assert state(inv) is LOST
    new_gpus = (gpu(0), gpu(1), gpu(2), gpu(3))
    running = shard(epoch=1)
    events = inv.register(
        reg("gpu-1", running, fabrics=("ib-b",), labels={"zone": "b"}, gpus=new_gpus),
        200.0,
        identity="gpu-1",
    )
    assert kinds(events) == [NodeRegistered, NodeReady, ShardChanged]
    assert events[1] == NodeReady("gpu-1", LOST)
    assert events[2] == ShardChanged("gpu-1", "r1", 0, None, running)  # lost cleared them
    record = inv.get("gpu-1")
    assert record is not None
    assert (record.state, record.since, record.last_heartbeat) == (READY, 200.0, 200.0)
    assert record.info.fabrics == ("ib-b",) and record.info.labels == {"zone": "b"}
    assert record.gpus == new_gpus and record.shards == (running,)
    assert record.cordoned  # the operator's intent survives
    assert not record.schedulable


def test_registration_replaces_the_shard_set() -> None:
    inv = inventory()
    a, b = shard("a"), shard("b")
    inv.register(reg("gpu-1", a, b), 0.0)
    b2 = shard("b", epoch=2, state=ShardState.STARTING)
    events = inv.register(reg("gpu-1", b2, shard("b", epoch=1)), 1.0)
    registered = events[0]
    assert isinstance(registered, NodeRegistered) and registered.replaced_connection
    assert events[1:] == [
        ShardChanged("gpu-1", "a", 0, a, None),
        ShardChanged("gpu-1", "b", 0, b, b2),  # the highest epoch of a key wins
    ]


def test_heartbeat_from_a_lost_or_unknown_node_asks_for_reregistration() -> None:
    inv = inventory()
    with pytest.raises(ReregisterRequired) as e:
        inv.heartbeat("gpu-1", Heartbeat(1), 0.0)
    assert e.value.reason == "unknown"
    inv.register(reg(), 0.0)
    inv.expire(LA)
    with pytest.raises(ReregisterRequired) as e:
        inv.heartbeat("gpu-1", Heartbeat(2), LA + 1)
    assert (e.value.node_id, e.value.reason) == ("gpu-1", "lost")
    with pytest.raises(ReregisterRequired) as e:
        inv.shard_status("gpu-1", shard(), LA + 1)
    assert (e.value.node_id, e.value.reason) == ("gpu-1", "lost")
    record = inv.get("gpu-1")
    assert record is not None and record.state is LOST and record.last_heartbeat == 0.0


def test_heartbeat_on_a_dropped_connection_asks_for_reregistration() -> None:
    inv = inventory()
    inv.register(reg(), 0.0)
    inv.disconnected("gpu-1", 1.0)
    with pytest.raises(ReregisterRequired) as e:
        inv.heartbeat("gpu-1", Heartbeat(1), 2.0)
    assert e.value.reason == "disconnected"


def test_the_old_connection_cannot_disturb_the_new_one() -> None:
    inv = inventory()
    first = inv.register(reg(), 0.0)[0]
    second = inv.register(reg(), 1.0)[0]
    assert isinstance(first, NodeRegistered) and isinstance(second, NodeRegistered)
    assert second.replaced_connection and second.session != first.session
    assert inv.disconnected("gpu-1", 2.0, session=first.session) == []
    record = inv.get("gpu-1")
    assert record is not None and record.connected
    with pytest.raises(StaleConnection) as e:
        inv.heartbeat("gpu-1", Heartbeat(9), 2.0, session=first.session)
    assert (e.value.session, e.value.current) == (first.session, second.session)
    assert inv.heartbeat("gpu-1", Heartbeat(1), 3.0, session=second.session) == []
    assert kinds(inv.disconnected("gpu-1", 4.0, session=second.session)) == [NodeDisconnected]


# -- readings and shards -----------------------------------------------------------------


def test_heartbeat_refreshes_gpu_readings_and_keeps_unreported_ones_absent() -> None:
    inv = inventory()
    inv.register(reg(), 0.0)
    readings = (
        gpu(0, memory_used=10 << 30, utilization=0.5, ecc_errors=0),
        gpu(1, memory_used=20 << 30),  # this driver does not report utilisation
        gpu(7, memory_used=1),  # not registered: ignored
    )
    assert inv.heartbeat("gpu-1", Heartbeat(1, gpus=readings), 1.0) == []
    record = inv.get("gpu-1")
    assert record is not None
    assert record.gpus == readings[:2]
    assert record.gpus[1].utilization is None
    later = (gpu(0, memory_used=11 << 30),)
    inv.heartbeat("gpu-1", Heartbeat(2, gpus=later), 2.0)
    record = inv.get("gpu-1")
    assert record is not None
    assert record.gpus[0].utilization is None  # unreported now: absent, not the old value
    assert record.gpus[1] == readings[1]  # not in this heartbeat: kept
    assert record.info.gpus == (gpu(0), gpu(1))  # the registration as it was


def test_shard_status_is_fenced_by_epoch() -> None:
    inv = inventory()
    inv.register(reg("gpu-1", shard(epoch=2, state=ShardState.STARTING)), 0.0)
    assert inv.shard_status("gpu-1", shard(epoch=1, state=ShardState.FAILED), 1.0) == []
    ready = shard(epoch=2, endpoint_url="http://x:1")
    assert len(inv.shard_status("gpu-1", ready, 1.0)) == 1
    assert inv.shard_status("gpu-1", ready, 2.0) == []  # no change, no event
    newer = shard(epoch=3, state=ShardState.STARTING)
    assert inv.shard_status("gpu-1", newer, 3.0) == [ShardChanged("gpu-1", "r1", 0, ready, newer)]


def test_a_heartbeat_summary_does_not_erase_a_failure_report() -> None:
    inv = inventory()
    inv.register(reg("gpu-1", shard(state=ShardState.STARTING)), 0.0)
    failed = shard(state=ShardState.FAILED, exit_code=1, output_tail=("CUDA OOM",))
    inv.shard_status("gpu-1", failed, 1.0)
    summary = shard(state=ShardState.FAILED)
    assert inv.heartbeat("gpu-1", Heartbeat(1, shards=(summary,)), 2.0) == []
    record = inv.get("gpu-1")
    assert record is not None and record.shards == (failed,)
    # a summary that shows a transition the status missed is applied
    stopped = shard(state=ShardState.STOPPED)
    assert kinds(inv.heartbeat("gpu-1", Heartbeat(2, shards=(stopped,)), 3.0)) == [ShardChanged]


def test_a_lost_node_hands_back_its_shards_once() -> None:
    inv = inventory()
    s0, s1 = shard("a"), shard("b")
    inv.register(reg("gpu-1", s1, s0), 0.0)
    lost = [e for e in inv.expire(LA) if isinstance(e, NodeLost)]
    assert lost == [NodeLost("gpu-1", LA, LA, (s0, s1))]


# -- operator ----------------------------------------------------------------------------


def test_a_stored_cordon_applies_when_the_node_registers_and_goes_with_remove() -> None:
    inv = inventory()
    assert inv.restore_cordon("gpu-1", drain=False) == []
    inv.register(reg("gpu-1"), 0.0)
    record = inv.get("gpu-1")
    assert record is not None and record.cordoned and not record.draining
    assert not record.schedulable
    # A drain given over a plain cordon changes it; an uncordon clears both.
    assert inv.cordon("gpu-1", True) == [NodeCordoned("gpu-1", True, True)]
    assert inv.get("gpu-1").draining  # type: ignore[union-attr]
    assert inv.cordon("gpu-1", False) == [NodeCordoned("gpu-1", False, False)]
    inv.restore_cordon("gpu-1", drain=True)  # known: applies at once
    inv.remove("gpu-1")
    inv.register(reg("gpu-1"), 1.0)
    assert not inv.get("gpu-1").cordoned  # type: ignore[union-attr]


def test_cordon_reports_changes_only() -> None:
    inv = inventory()
    inv.register(reg(), 0.0)
    assert inv.cordon("gpu-1", True) == [NodeCordoned("gpu-1", True)]
    assert inv.cordon("gpu-1", True) == []
    assert inv.cordon("gpu-1", False) == [NodeCordoned("gpu-1", False, False)]
    with pytest.raises(UnknownNode):
        inv.cordon("gpu-9", True)


def test_remove_forgets_a_node() -> None:
    inv = inventory()
    inv.register(reg(), 0.0)
    inv.expire(LA)
    assert inv.remove("gpu-1") == [NodeRemoved("gpu-1", LOST)]
    assert inv.get("gpu-1") is None and inv.nodes() == ()
    with pytest.raises(UnknownNode):
        inv.remove("gpu-1")
    assert kinds(inv.register(reg(), 100.0))[:2] == [NodeRegistered, NodeReady]


def test_a_node_is_registered_at_the_address_it_declares_if_its_connection_shows_it() -> None:
    inv = inventory()
    # Declared and seen alike; none declared (the peer's); loopback ones (one machine).
    for n, declared, peer, got in [
        ("a", "10.0.0.5", "10.0.0.5", "10.0.0.5"),
        ("b", "", "10.0.0.6", "10.0.0.6"),
        ("c", "127.0.0.71", "127.0.0.1", "127.0.0.71"),
        ("d", "[::1]", "127.0.0.1", "::1"),
        ("e", "10.0.0.7", None, "10.0.0.7"),  # no network to check against (the stub)
    ]:
        inv.register(Register(NodeInfo(n, n, declared)), 0.0, peer=peer)
        record = inv.get(n)
        assert record is not None and record.info.address == got, n
    # Another address: a certified node may declare one (its management network is not
    # its route to the server); a plaintext one may not, and nothing is recorded.
    inv.register(Register(NodeInfo("f", "f", "10.9.9.9")), 0.0, identity="f", peer="10.0.0.8")
    certified = inv.get("f")
    assert certified is not None and certified.info.address == "10.9.9.9"
    for declared in ("10.9.9.9", "gpu-1.example", "127.0.0.1"):
        with pytest.raises(InvalidRegistration, match=r"connects from 10\.0\.0\.8"):
            inv.register(Register(NodeInfo("g", "g", declared)), 0.0, peer="10.0.0.8")
    for declared, why in [("0.0.0.0", "not one an engine"), ("a/b", "neither an IP")]:
        with pytest.raises(InvalidRegistration, match=why):
            inv.register(Register(NodeInfo("g", "g", declared)), 0.0, identity="g")
    assert inv.get("g") is None


def test_beyond_max_lost_the_longest_lost_nodes_are_forgotten_with_their_cordons_kept() -> None:
    """Nodes that left hold no memory for good: a node id made up by each agent that came
    and went would otherwise stay (with its GPUs and labels)."""
    inv = Inventory(
        ControlConfig(unreachable_after=Seconds(UA), lost_after=Seconds(LA)), max_lost=2
    )
    for t, n in enumerate(["n-0", "n-1", "n-2", "n-3"]):
        inv.register(Register(info(n, labels={"k": "v" * 1000})), float(t))
        inv.disconnected(n, float(t))
    inv.cordon("n-1", True, drain=False)
    # n-0 and n-1 are lost first; two lost are kept, so nothing is forgotten yet.
    events = inv.expire(1.0 + LA)
    assert [type(e) for e in events if not isinstance(e, NodeBecameUnreachable)] == [NodeLost] * 2
    assert len(inv) == 4
    events = inv.expire(3.0 + LA)
    removed = [e for e in events if isinstance(e, NodeRemoved)]
    assert removed == [NodeRemoved("n-0", LOST), NodeRemoved("n-1", LOST)]
    assert [r.node_id for r in inv.nodes()] == ["n-2", "n-3"]
    # A forgotten node that comes back is new; its cordon applies again.
    assert inv.stored_cordon("n-1") is False
    inv.register(Register(info("n-1")), 100.0)
    record = inv.get("n-1")
    assert record is not None and record.cordoned and not record.draining


def test_the_shards_recorded_for_a_node_are_bounded_ended_ones_making_room() -> None:
    """Reports name any replica ids they like: a node's records stay within MAX_SHARDS."""
    inv = inventory()
    inv.register(Register(info()), 0.0)
    for i in range(MAX_SHARDS):
        inv.shard_status("gpu-1", shard(f"r{i}", state=ShardState.STOPPED), 1.0)
    events = inv.shard_status("gpu-1", shard("new"), 2.0)
    # The ended one reported longest ago made room.
    assert [(e.replica_id, e.new is None) for e in events if isinstance(e, ShardChanged)] == [
        ("r0", True),
        ("new", False),
    ]
    record = inv.get("gpu-1")
    assert record is not None and len(record.shards) == MAX_SHARDS
    assert record.shard("new", 0) is not None and record.shard("r0", 0) is None
    # With none ended, a new one is not recorded.
    for i in range(1, MAX_SHARDS):
        inv.shard_status("gpu-1", shard(f"r{i}", epoch=2), 3.0)
    assert inv.shard_status("gpu-1", shard("one-too-many"), 4.0) == []
    record = inv.get("gpu-1")
    assert record is not None and len(record.shards) == MAX_SHARDS
    assert record.shard("one-too-many", 0) is None


def test_nodes_are_sorted_by_id() -> None:
    inv = inventory()
    for n in ("c", "a", "b"):
        inv.register(reg(n), 0.0)
    assert [r.node_id for r in inv.nodes()] == ["a", "b", "c"]


# -- rebuilding and adoption -----------------------------------------------------------
# The fencing rule for single reports (same epoch kept, others stopped) is tested on
# the reconciler in test_reconciler.py; here: rebuilding a restarted server's placements.


def two_node(replica: str = "r1", epoch: int = 3) -> Placement:
    return Placement(
        replica,
        "llama",
        "tp8-pp2",
        epoch,
        (
            ShardAssignment("gpu-1", 0, tuple(range(8)), 20000, 20001),
            ShardAssignment("gpu-2", 1, tuple(range(8)), 20000),
        ),
    )


def restarted() -> Reconciler:
    """A restarted server's reconciler: its own epochs start after the reported ones."""
    return Reconciler(ControlConfig(), first_epoch=1000)


def report(
    node_id: str, rank: int, epoch: int = 3, state: ShardState = ShardState.READY, **kw: Any
) -> ShardReport:
    kw.setdefault("profile", "tp8-pp2")
    kw.setdefault("node_count", 2)
    kw.setdefault("gpu_indices", tuple(range(8)))
    kw.setdefault("port", 20000)
    kw.setdefault("dist_port", 20001 if rank == 0 else None)
    return ShardReport(node_id, shard("r1", rank, epoch, state), **kw)


def with_model(r: ShardReport, model: str) -> ShardReport:
    return attrs.evolve(r, status=attrs.evolve(r.status, model=model))


def test_placement_from_reports_rebuilds_a_two_node_replica() -> None:
    rebuilt = placement_from_reports([report("gpu-2", 1), report("gpu-1", 0)])
    assert rebuilt.refused == ()
    assert rebuilt.placements == (two_node(epoch=3),)
    # and the reconciler adopts what both agents run: published, nothing stopped
    (placement,) = rebuilt.placements
    head = shard("r1", 0, 3, endpoint_url="http://gpu-1:20000")
    reconciler = restarted()
    actions = reconciler.adopt(placement, [head, shard("r1", 1, 3)], 5.0, address="gpu-1")
    assert actions.commands == ()
    assert reconciler.routes().serving == {"r1": Published("r1", "llama", "http://gpu-1:20000")}


def test_placement_from_reports_refuses_a_partial_replica() -> None:
    rebuilt = placement_from_reports([report("gpu-1", 0)])
    assert rebuilt.placements == ()
    [refused] = rebuilt.refused
    assert (refused.replica_id, refused.epoch) == ("r1", 3)
    assert "rank 1 of 2 not reported" in refused.reason
    # so nothing is adopted, and the reconciler stops the running rank
    reconciler = restarted()
    actions = reconciler.shard_reported("gpu-1", shard("r1", 0, 3), 5.0)
    (stop,) = actions.commands
    assert stop.node_id == "gpu-1" and isinstance(stop.message, StopShard)
    assert (stop.message.replica_id, stop.message.rank, stop.message.epoch) == ("r1", 0, 3)
    assert "r1" not in reconciler.routes()


@pytest.mark.parametrize(
    ("reports", "reason"),
    [
        ([report("gpu-1", 0), report("gpu-2", 1, state=ShardState.FAILED)], "is failed"),
        ([report("gpu-1", 0), report("gpu-2", 0)], "reported by both"),
        ([report("gpu-1", 0), report("gpu-1", 1)], "same node"),
        ([report("gpu-1", 0), report("gpu-2", 1, profile="other")], "disagree on the profile"),
        ([report("gpu-1", 0), report("gpu-2", 1, node_count=3)], "node count"),
        ([report("gpu-1", 0), report("gpu-2", 2)], "outside 0..1"),
        ([report("gpu-1", 0), with_model(report("gpu-2", 1), "qwen")], "disagree on the model"),
    ],
)
def test_placement_from_reports_refuses_inconsistent_reports(
    reports: list[ShardReport], reason: str
) -> None:
    rebuilt = placement_from_reports(reports)
    assert rebuilt.placements == ()
    assert reason in rebuilt.refused[0].reason


def test_placement_from_reports_uses_the_highest_epoch_only() -> None:
    reports = [report("gpu-1", 0, epoch=2), report("gpu-2", 1, epoch=2), report("gpu-3", 0)]
    rebuilt = placement_from_reports(reports)
    assert rebuilt.placements == ()
    assert rebuilt.refused[0].epoch == 3  # epoch 3 is partial; epoch 2 was superseded
    single = placement_from_reports([report("gpu-1", 0, node_count=1, dist_port=None)])
    [p] = single.placements
    assert p.nodes == ("gpu-1",) and p.head.port == 20000 and p.head.dist_port is None
    unnamed = with_model(report("gpu-1", 0, node_count=1), "")
    assert "do not name their model" in placement_from_reports([unnamed]).refused[0].reason


# -- random sequences ------------------------------------------------------------------

NODES = ("a", "b", "c")
TRANSITIONS = (NodeReady, NodeBecameUnreachable, NodeLost)


class InventoryMachine(RuleBasedStateMachine):
    """Random registrations, heartbeats, statuses, drops and expiries on monotone time,
    against a reference model of what each node's state must be."""

    @initialize()
    def start(self) -> None:
        self.inv = inventory()
        self.now = 0.0
        self.expired_at = -1.0  # the latest `now` passed to expire
        # reference model: node -> [last contact, state, connected]
        self.model: dict[str, list[Any]] = {}

    # -- helpers

    def check_transitions(self, events: list[Event], expected: dict[str, list[NodeState]]) -> None:
        """The transition events of each node are exactly the state changes it went
        through: one event per transition, none without one."""
        seen: dict[str, list[NodeState]] = {}
        for e in events:
            if isinstance(e, NodeReady):
                seen.setdefault(e.node_id, []).append(READY)
            elif isinstance(e, NodeBecameUnreachable):
                seen.setdefault(e.node_id, []).append(UNREACHABLE)
            elif isinstance(e, NodeLost):
                seen.setdefault(e.node_id, []).append(LOST)
        assert seen == {k: v for k, v in expected.items() if v}

    def contact(self, node: str, call: Any) -> None:
        m = self.model.get(node)
        if m is None or m[1] is LOST or not m[2]:
            with pytest.raises(ReregisterRequired):
                call()
            return
        events = call()
        expected = [READY] if m[1] is UNREACHABLE else []
        m[0], m[1] = self.now, READY
        self.check_transitions(events, {node: expected})

    # -- rules

    @rule(dt=st.sampled_from([0.0, 0.5, 5.0, UA - 0.5, UA, UA + 0.5, LA - UA, LA, 2 * LA]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(node=st.sampled_from(NODES), epoch=st.integers(1, 3))
    def register(self, node: str, epoch: int) -> None:
        previous = self.model.get(node)
        events = self.inv.register(reg(node, shard(epoch=epoch)), self.now, identity=node)
        assert sum(isinstance(e, NodeRegistered) for e in events) == 1
        assert isinstance(events[0], NodeRegistered)
        assert events[0].previous is (previous[1] if previous else None)
        self.model[node] = [self.now, READY, True]
        changed = previous is None or previous[1] is not READY
        self.check_transitions(events, {node: [READY] if changed else []})

    @rule(node=st.sampled_from(NODES), seq=st.integers(0, 100))
    def heartbeat(self, node: str, seq: int) -> None:
        self.contact(node, lambda: self.inv.heartbeat(node, Heartbeat(seq), self.now))

    @rule(node=st.sampled_from(NODES), epoch=st.integers(1, 3), s=st.sampled_from(ShardState))
    def status(self, node: str, epoch: int, s: ShardState) -> None:
        self.contact(
            node, lambda: self.inv.shard_status(node, shard(epoch=epoch, state=s), self.now)
        )

    @rule(node=st.sampled_from(NODES))
    def disconnect(self, node: str) -> None:
        events = self.inv.disconnected(node, self.now)
        m = self.model.get(node)
        assert len(events) == (1 if m is not None and m[2] else 0)
        if m is not None:
            m[2] = False

    @precondition(lambda self: self.model)
    @rule()
    def expire_at_next_deadline(self) -> None:
        deadline = self.inv.next_deadline()
        if deadline is not None and deadline > self.now:
            self.now = deadline
        self.expire()

    @rule()
    def expire(self) -> None:
        events = self.inv.expire(self.now)
        self.expired_at = self.now
        expected: dict[str, list[NodeState]] = {}
        for node, m in self.model.items():
            path = expected.setdefault(node, [])
            age = self.now - m[0]
            if m[1] is READY and age >= UA:
                m[1] = UNREACHABLE
                path.append(UNREACHABLE)
            if m[1] is UNREACHABLE and age >= LA:
                m[1] = LOST
                path.append(LOST)
        self.check_transitions(events, expected)
        assert [e for e in events if not isinstance(e, TRANSITIONS)] == []
        ats = [e.at for e in events if isinstance(e, NodeBecameUnreachable | NodeLost)]
        assert ats == sorted(ats)

    # -- invariants

    @invariant()
    def matches_the_model(self) -> None:
        records = {r.node_id: r for r in self.inv.nodes()}
        assert records.keys() == self.model.keys()
        for node, (last, s, connected) in self.model.items():
            r = records[node]
            assert (r.last_heartbeat, r.state, r.connected) == (last, s, connected)

    @invariant()
    def state_is_consistent_with_the_last_contact(self) -> None:
        t = self.expired_at
        for r in self.inv.nodes():
            if r.state is READY:
                assert t - r.last_heartbeat < UA
                assert r.since <= r.last_heartbeat
            elif r.state is UNREACHABLE:
                assert r.since == r.last_heartbeat + UA <= t
                assert t - r.last_heartbeat < LA
            else:
                assert r.since == r.last_heartbeat + LA <= t
                assert r.shards == ()

    @invariant()
    def nothing_is_due_at_the_last_expire(self) -> None:
        deadline = self.inv.next_deadline()
        assert deadline is None or deadline > self.expired_at


InventoryMachine.TestCase.settings = settings(max_examples=examples(200), stateful_step_count=40)
test_inventory_state_machine = InventoryMachine.TestCase
