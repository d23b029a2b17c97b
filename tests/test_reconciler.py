"""The reconciler as a pure state machine: values and `now` in, actions out."""

from __future__ import annotations

import attrs
import pytest

from llmgw.config import ControlConfig, DeploymentProfile, ModelConfig
from llmgw.control.placement import NodeCapacity
from llmgw.control.reconciler import REFUSED_PORT_TTL, Reconciler
from llmgw.control.replicas import Actions, NodeView, Published
from llmgw.domain.fleet import (
    EngineExit,
    EngineInfo,
    Gpu,
    NodeInfo,
    NodeState,
    Placement,
    ReplicaState,
    ShardAssignment,
    ShardState,
    StartFailure,
)
from llmgw.transport.messages import DrainShard, ShardStatus, StartShard, StopShard

CONTROL = ControlConfig(base_backoff=10.0, max_backoff=40.0, start_timeout=600.0)
SIM = DeploymentProfile(name="sim", engine="sim", weights="w")
TP2X2 = DeploymentProfile(
    name="tp2x2", engine="vllm", weights="w", tensor_parallel=4, gpus_per_node=2
)


def node(
    node_id: str, gpus: int = 2, state: NodeState = NodeState.READY, fabric: str = "ib-a"
) -> NodeView:
    info = NodeInfo(
        node_id=node_id,
        hostname=node_id,
        address=f"10.0.0.{len(node_id)}",
        fabrics=(fabric,),
        gpus=tuple(Gpu(i, f"{node_id}-{i}", "H100", 80 * 10**9) for i in range(gpus)),
        engines=(EngineInfo("sim"), EngineInfo("vllm")),
    )
    return NodeView(node_id, state, NodeCapacity.from_info(info, state, since=0.0))


def model(replicas: int = 1, profile: DeploymentProfile = SIM, name: str = "m") -> ModelConfig:
    return ModelConfig(name=name, replicas=replicas, profiles=(profile,))


def starts(actions: Actions) -> list[tuple[str, StartShard]]:
    return [(c.node_id, c.message) for c in actions.commands if isinstance(c.message, StartShard)]


def stops(actions: Actions) -> list[tuple[str, str, int, int]]:
    return [
        (c.node_id, c.message.replica_id, c.message.rank, c.message.epoch)
        for c in actions.commands
        if isinstance(c.message, StopShard)
    ]


def url_of(cmd: StartShard, node_id: str = "a") -> str:
    """Where the engine of `cmd` serves on a node of node(): its address, its port."""
    return f"http://10.0.0.{len(node_id)}:{cmd.port}"


def ready(cmd: StartShard, *, url: str | None = None, capacity: int | None = None) -> ShardStatus:
    """Ready as its agent reports it, at `url` (None: naming no URL)."""
    return ShardStatus(
        cmd.replica_id,
        cmd.rank,
        cmd.epoch,
        ShardState.READY,
        endpoint_url=url if cmd.rank == 0 else None,
        capacity=capacity if cmd.rank == 0 else None,
    )


def test_places_starts_and_publishes_when_every_shard_is_ready() -> None:
    r = Reconciler(CONTROL)
    actions = r.step(0.0, [model(2)], [node("a", 1), node("b", 1)])
    started = starts(actions)
    assert sorted(n for n, _ in started) == ["a", "b"]
    assert all(r.replicas[c.replica_id].state is ReplicaState.STARTING for _, c in started)
    # Level-triggered: a second pass changes nothing while they start.
    assert r.step(1.0, [model(2)], [node("a", 1), node("b", 1)]) == Actions()
    node_id, cmd = started[0]
    assert r.shard_reported(node_id, ready(cmd), 2.0) == Actions()
    assert r.routes().serving == {cmd.replica_id: Published(cmd.replica_id, "m", url_of(cmd))}
    assert r.replicas[cmd.replica_id].state is ReplicaState.READY
    # The capacity its agent launched it with goes to the router with it.
    node_id, cmd = started[1]
    r.shard_reported(node_id, ready(cmd, capacity=48), 2.0)
    assert r.routes().serving[cmd.replica_id] == Published(cmd.replica_id, "m", url_of(cmd), 48)


def test_multi_node_shards_agree_on_master_and_ranks() -> None:
    r = Reconciler(CONTROL)
    nodes = [node("a"), node("b"), node("c", fabric="ib-b")]
    started = starts(r.step(0.0, [model(1, TP2X2)], nodes))
    assert len(started) == 2
    assert {n for n, _ in started} == {"a", "b"}  # one fabric
    cmds = sorted((c for _, c in started), key=lambda c: c.rank)
    assert [c.rank for c in cmds] == [0, 1]
    assert {c.node_count for c in cmds} == {2}
    assert len({(c.master_address, c.master_port) for c in cmds}) == 1
    head = next(n for n, c in started if c.rank == 0)
    assert cmds[0].master_address == f"10.0.0.{len(head)}"
    assert cmds[0].master_port is not None
    # Published only when both shards are ready.
    r.shard_reported(head, ready(cmds[0]), 1.0)
    assert cmds[0].replica_id not in r.routes()
    other = next(n for n, c in started if c.rank == 1)
    r.shard_reported(other, ready(cmds[1]), 1.0)
    assert cmds[0].replica_id in r.routes().serving


def test_a_failed_start_backs_the_model_off_doubling() -> None:
    r = Reconciler(CONTROL)
    nodes = [node("a", 1)]
    now = 0.0
    delays = []
    for _ in range(4):
        ((node_id, cmd),) = starts(r.step(now, [model()], nodes))
        failed = ShardStatus(cmd.replica_id, 0, cmd.epoch, ShardState.FAILED, message="boom")
        r.shard_reported(node_id, failed, now)
        assert cmd.replica_id not in r.routes() and cmd.replica_id not in r.replicas
        until = r.backoff_until("m")
        assert until is not None
        delays.append(until - now)
        assert starts(r.step(until - 0.1, [model()], nodes)) == []
        now = until
    assert delays == [10.0, 20.0, 40.0, 40.0]


def test_ready_resets_the_backoff() -> None:
    r = Reconciler(CONTROL)
    ((n, cmd),) = starts(r.step(0.0, [model()], [node("a", 1)]))
    r.shard_reported(n, ShardStatus(cmd.replica_id, 0, cmd.epoch, ShardState.FAILED), 0.0)
    ((n, cmd),) = starts(r.step(10.0, [model()], [node("a", 1)]))
    r.shard_reported(n, ready(cmd), 11.0)
    assert r.backoff_until("m") is None


def test_the_url_published_is_the_servers_and_a_report_naming_another_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The router is given the head node's registered address and the port the server
    assigned, never what an agent says; a ready report naming another port or host is
    refused (logged), the replica stopped and placed again after the backoff."""
    r = Reconciler(CONTROL)
    ((n, cmd),) = starts(r.step(0.0, [model()], [node("a", 1)]))
    for url in (
        f"http://10.0.0.1:{cmd.port + 1}",  # another port
        f"http://10.0.0.9:{cmd.port}",  # another host
        f"http://10.0.0.1:{cmd.port}@evil:{cmd.port}",  # the same, seemingly
        f"https://10.0.0.1:{cmd.port}",
    ):
        out = r.shard_reported(n, ready(cmd, url=url), 1.0)
        assert cmd.replica_id not in r.routes(), url
        assert stops(out) == [(n, cmd.replica_id, 0, cmd.epoch)]
        assert cmd.replica_id not in r.replicas
        assert "not the URL it was assigned" in caplog.text and url in caplog.text
        assert r.backoff_until("m") is not None
        caplog.clear()
        ((n, cmd),) = starts(r.step(r.backoff_until("m") or 0.0, [model()], [node("a", 1)]))
    assert r.refused_urls == 4
    # The same URL spelled otherwise, or none reported: the server's URL is published.
    r.shard_reported(n, ready(cmd, url=f"HTTP://10.0.0.1:{cmd.port}/"), 100.0)
    assert r.routes().serving == {cmd.replica_id: Published(cmd.replica_id, "m", url_of(cmd))}
    # An adopted replica is published at its head's address as the controller knows it.
    adopter = Reconciler(CONTROL, first_epoch=cmd.epoch + 1)
    placement = r.replicas[cmd.replica_id].placement
    adopter.adopt(placement, [ready(cmd)], 101.0, address="10.0.0.1")
    assert adopter.routes().serving == {cmd.replica_id: Published(cmd.replica_id, "m", url_of(cmd))}


def test_surplus_replicas_drain_then_stop() -> None:
    r = Reconciler(CONTROL)
    nodes = [node("a", 2)]
    started = starts(r.step(0.0, [model(2)], nodes))
    for n, cmd in started:
        r.shard_reported(n, ready(cmd), 1.0)
    out = r.step(2.0, [model(1)], nodes)
    (drain,) = [c.message for c in out.commands]
    assert isinstance(drain, DrainShard)
    assert r.routes().draining == {drain.replica_id}  # no new requests; in flight finish
    assert drain.replica_id not in r.routes().serving
    assert r.replicas[drain.replica_id].state is ReplicaState.DRAINING
    # Draining does not count: no replacement is placed meanwhile.
    assert starts(r.step(3.0, [model(1)], nodes)) == []
    stopped = ShardStatus(drain.replica_id, 0, drain.epoch, ShardState.STOPPED)
    r.shard_reported("a", stopped, 4.0)
    assert drain.replica_id not in r.replicas and drain.replica_id not in r.routes()


def test_a_removed_model_is_drained() -> None:
    r = Reconciler(CONTROL)
    ((n, cmd),) = starts(r.step(0.0, [model()], [node("a", 1)]))
    r.shard_reported(n, ready(cmd), 1.0)
    out = r.step(2.0, [], [node("a", 1)])
    assert [type(c.message) for c in out.commands] == [DrainShard]


def test_a_shard_of_a_superseded_placement_is_stopped() -> None:
    r = Reconciler(CONTROL)
    ((_, cmd),) = starts(r.step(0.0, [model()], [node("a", 1), node("b", 1)]))
    stale = ShardStatus(cmd.replica_id, 0, cmd.epoch + 1, ShardState.READY)
    out = r.shard_reported("b", stale, 1.0)
    (stop,) = [c for c in out.commands]
    assert stop.node_id == "b" and isinstance(stop.message, StopShard)
    assert stop.message.epoch == stale.epoch
    # An unknown replica is stopped too; a stopped one is left alone.
    ghost = ShardStatus("ghost-r1", 0, 5, ShardState.READY)
    assert len(r.shard_reported("b", ghost, 1.0).commands) == 1
    gone = ShardStatus("ghost-r1", 0, 5, ShardState.STOPPED)
    assert r.shard_reported("b", gone, 1.0) == Actions()


def test_a_lost_node_loses_its_replica_which_is_placed_again() -> None:
    r = Reconciler(CONTROL)
    ((n, cmd),) = starts(r.step(0.0, [model()], [node("a", 1), node("b", 1)]))
    r.shard_reported(n, ready(cmd), 1.0)
    other = "b" if n == "a" else "a"
    # Unreachable: nothing happens, the replica keeps serving.
    views = [node(n, 1, NodeState.UNREACHABLE), node(other, 1)]
    assert r.step(20.0, [model()], views) == Actions()
    assert cmd.replica_id in r.routes().serving
    views = [node(n, 1, NodeState.LOST), node(other, 1)]
    out = r.step(70.0, [model()], views)
    assert cmd.replica_id not in r.routes()
    ((placed_on, new),) = starts(out)
    assert placed_on == other and new.epoch > cmd.epoch


def test_a_shard_its_node_no_longer_reports_is_lost_and_placed_again_at_once() -> None:
    """An agent killed with its engine registers again with no shards: the replica is
    unrouted and replaced by the next pass, though the node itself was never lost."""
    r = Reconciler(CONTROL)
    ((n, cmd),) = starts(r.step(0.0, [model()], [node("a", 1)]))
    r.shard_reported(n, ready(cmd), 1.0)
    # Reported (in any state): nothing lost; the status itself is shard_reported's.
    assert r.node_reported(n, [ready(cmd)], 2.0) == Actions()
    failed = attrs.evolve(ready(cmd), state=ShardState.FAILED)
    assert r.node_reported(n, [failed], 2.0) == Actions()
    # Another node's report, or the same replica and rank at another epoch, is no
    # report of this shard's.
    assert r.node_reported("b", [], 2.0) == Actions()
    other_epoch = attrs.evolve(ready(cmd), epoch=cmd.epoch + 1)
    assert cmd.replica_id in r.routes().serving
    out = r.node_reported(n, [other_epoch], 3.0)
    assert cmd.replica_id not in r.routes()
    # The stop tells the agent to make sure (it answers that nothing runs).
    assert stops(out) == [(n, cmd.replica_id, 0, cmd.epoch)]
    assert cmd.replica_id not in r.replicas
    # Not the model's failure: no backoff, and the next pass places it again.
    assert r.backoff_until("m") is None
    ((again_on, again),) = starts(r.step(3.1, [model()], [node("a", 1)]))
    assert again_on == n and again.epoch > cmd.epoch


def test_a_shard_never_heard_of_or_already_ended_is_not_lost_by_its_absence() -> None:
    r = Reconciler(CONTROL)
    ((n, cmd),) = starts(r.step(0.0, [model()], [node("a", 1)]))
    # Started but not reported yet (the start may still be on its way, or lost: the
    # reconciler sends it again while nothing is reported): not lost.
    assert r.node_reported(n, [], 1.0) == Actions()
    assert r.replicas[cmd.replica_id].state is ReplicaState.STARTING
    # Starting, then missing: lost like a ready one.
    r.shard_reported(n, attrs.evolve(ready(cmd), state=ShardState.STARTING), 2.0)
    assert stops(r.node_reported(n, [], 3.0)) == [(n, cmd.replica_id, 0, cmd.epoch)]
    assert cmd.replica_id not in r.replicas and cmd.replica_id not in r.routes()


def test_a_multi_node_replica_missing_one_rank_is_lost_whole() -> None:
    r = two_node(epoch=3)
    r.shard_reported("gpu-1", status("r1", 0, 3), 1.0)
    r.shard_reported("gpu-2", status("r1", 1, 3), 1.0)
    # gpu-1 still runs rank 0; gpu-2 came back without rank 1.
    assert r.node_reported("gpu-1", [status("r1", 0, 3)], 2.0) == Actions()
    out = r.node_reported("gpu-2", [], 2.0)
    assert "r1" not in r.replicas and "r1" not in r.routes()
    # Rank 0, which still runs, is stopped; rank 1 is asked to stop too, in case.
    assert sorted(stops(out)) == [("gpu-1", "r1", 0, 3), ("gpu-2", "r1", 1, 3)]


def test_a_replica_that_never_starts_times_out() -> None:
    r = Reconciler(CONTROL)
    ((_, cmd),) = starts(r.step(0.0, [model()], [node("a", 1)]))
    r.shard_reported("a", ShardStatus(cmd.replica_id, 0, cmd.epoch, ShardState.STARTING), 1.0)
    assert r.step(599.0, [model()], [node("a", 1)]) == Actions()
    out = r.step(601.0, [model()], [node("a", 1)])
    assert stops(out) == [("a", cmd.replica_id, 0, cmd.epoch)]
    assert cmd.replica_id not in r.replicas and cmd.replica_id not in r.routes()
    assert r.backoff_until("m") == 611.0


def test_failed_starts_are_counted_by_model_and_reason() -> None:
    r = Reconciler(CONTROL)
    nodes = [node("a", 1)]
    ((n, cmd),) = starts(r.step(0.0, [model()], nodes))
    refused = ShardStatus(cmd.replica_id, 0, cmd.epoch, ShardState.FAILED, message="not started")
    r.shard_reported(n, refused, 1.0)
    ((n, cmd),) = starts(r.step(20.0, [model()], nodes))
    crashed = attrs.evolve(refused, replica_id=cmd.replica_id, epoch=cmd.epoch, exit_code=1)
    r.shard_reported(n, crashed, 21.0)
    r.shard_reported(n, crashed, 22.0)  # the same failure again (a heartbeat): once
    starts(r.step(100.0, [model()], nodes))
    r.step(701.0, [model()], nodes)
    assert r.start_failures == {
        ("m", StartFailure.NOT_LAUNCHED): 1,
        ("m", StartFailure.EXITED): 1,
        ("m", StartFailure.TIMED_OUT): 1,
    }
    assert not r.engine_exits


def test_engine_exits_of_serving_replicas_are_counted_by_how_they_ended() -> None:
    r = Reconciler(CONTROL)
    nodes = [node("a", 2)]
    (n, killed), (_, other) = starts(r.step(0.0, [model(2)], nodes))
    for cmd in (killed, other):
        r.shard_reported(n, ready(cmd), 1.0)
    gone = ShardStatus(killed.replica_id, 0, killed.epoch, ShardState.FAILED, exit_code=-9)
    r.shard_reported(n, gone, 2.0)
    # A draining replica's engine that ends on its own is an exit too, counted once.
    r.step(3.0, [], nodes)
    assert r.replicas[other.replica_id].state is ReplicaState.DRAINING
    ended = ShardStatus(other.replica_id, 0, other.epoch, ShardState.FAILED, exit_code=0)
    r.shard_reported(n, ended, 4.0)
    r.shard_reported(n, ended, 5.0)
    assert r.engine_exits == {("m", EngineExit.SIGNAL): 1, ("m", EngineExit.CLEAN): 1}
    assert not r.start_failures


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (None, EngineExit.UNKNOWN),
        (-11, EngineExit.SIGNAL),
        (0, EngineExit.CLEAN),
        (3, EngineExit.ERROR),
    ],
)
def test_an_exit_code_names_how_the_engine_ended(code: int | None, reason: EngineExit) -> None:
    assert EngineExit.of(code) is reason


def test_unplaceable_replicas_are_explained_and_cleared_when_placed() -> None:
    r = Reconciler(CONTROL)
    r.step(0.0, [model(1, TP2X2)], [node("a", 2)])
    (why,) = r.unplaced["m"]
    assert why.summary
    r.step(1.0, [model(1, TP2X2)], [node("a", 2), node("b", 2)])
    assert "m" not in r.unplaced


def test_adopted_replicas_are_kept_and_new_epochs_are_higher() -> None:
    first = Reconciler(CONTROL)
    ((n, cmd),) = starts(first.step(0.0, [model()], [node("a", 1), node("b", 1)]))
    first.shard_reported(n, ready(cmd), 1.0)
    placement = first.replicas[cmd.replica_id].placement
    # A restarted server (its epochs start later, as the controller's wall clock ones
    # do) adopts what the agent still runs.
    second = Reconciler(CONTROL, first_epoch=1000)
    assert second.adopt(placement, [ready(cmd)], 5.0, address="10.0.0.1") == Actions()
    assert second.routes().serving == {cmd.replica_id: Published(cmd.replica_id, "m", url_of(cmd))}
    assert starts(second.step(6.0, [model()], [node("a", 1), node("b", 1)])) == []
    more = starts(second.step(7.0, [model(2)], [node("a", 1), node("b", 1)]))
    assert len(more) == 1 and more[0][1].epoch > placement.epoch
    # The first server cannot take its own replica back: that epoch is its own.
    with pytest.raises(ValueError, match="not from an earlier run"):
        first.adopt(placement, [ready(cmd)], 5.0)


def test_a_lost_nodes_replica_is_stopped_not_taken_back_when_the_node_returns() -> None:
    r = Reconciler(CONTROL, first_epoch=100)
    ((n, old),) = starts(r.step(0.0, [model()], [node("a", 1), node("b", 1)]))
    r.shard_reported(n, ready(old), 1.0)
    other = "b" if n == "a" else "a"
    ((_, new),) = starts(r.step(70.0, [model()], [node(n, 1, NodeState.LOST), node(other, 1)]))
    r.shard_reported(other, ready(new), 71.0)
    # The node registers again, still running the old epoch's shard: ours once, not now.
    assert r.minted(old.epoch) and old.replica_id not in r.replicas
    out = r.shard_reported(n, ready(old), 80.0)
    assert stops(out) == [(n, old.replica_id, 0, old.epoch)]
    assert list(r.routes().serving) == [new.replica_id]
    # The replacement serves on alone: no second replica, nothing drained.
    assert r.step(81.0, [model()], [node(n, 1), node(other, 1)]) == Actions()
    assert list(r.replicas) == [new.replica_id]


# -- fencing: which reported shards are this reconciler's ------------------------------


def two_node(epoch: int = 3) -> Reconciler:
    """A reconciler holding replica r1 of llama at `epoch`: rank 0 on gpu-1, rank 1 on
    gpu-2 (adopted, as after a restart)."""
    r = Reconciler(CONTROL, first_epoch=100)
    shards = (
        ShardAssignment("gpu-1", 0, tuple(range(8)), 20000, 20001),
        ShardAssignment("gpu-2", 1, tuple(range(8)), 20000),
    )
    r.adopt(Placement("r1", "llama", "tp8-pp2", epoch, shards), [], 0.0)
    return r


def status(
    replica: str = "r1", rank: int = 0, epoch: int = 3, state: ShardState = ShardState.READY
) -> ShardStatus:
    return ShardStatus(replica, rank, epoch, state, model="llama")


def test_fencing_keeps_the_exact_epoch_and_stops_an_older_one_and_an_unknown_replica() -> None:
    r = two_node(epoch=3)
    same = status("r1", 0, 3)
    assert r.shard_reported("gpu-1", same, 1.0) == Actions()
    assert r.replicas["r1"].shards == {0: same}
    for stale in (status("r1", 0, 2), status("r9", 0, 1)):
        out = r.shard_reported("gpu-1", stale, 1.0)
        assert stops(out) == [("gpu-1", stale.replica_id, 0, stale.epoch)]
        assert not r.routes().serving
    assert r.replicas["r1"].shards == {0: same}


def test_fencing_checks_the_node_rank_and_model_and_trusts_no_newer_epoch() -> None:
    r = two_node(epoch=3)
    wrong_node = status("r1", 1, 3)  # rank 1 belongs on gpu-2
    no_rank = status("r1", 5, 3)
    newer = status("r1", 0, 4)
    wrong_model = attrs.evolve(status("r1", 0, 3), model="qwen")
    for s in (wrong_node, no_rank, newer, wrong_model):
        assert stops(r.shard_reported("gpu-1", s, 1.0)) == [("gpu-1", "r1", s.rank, s.epoch)]
    assert r.replicas["r1"].shards == {}
    # rank 1 on gpu-2 is fine
    assert r.shard_reported("gpu-2", wrong_node, 1.0) == Actions()
    assert r.replicas["r1"].shards == {1: wrong_node}


def test_fencing_ignores_exited_stale_shards_and_takes_a_failed_current_one() -> None:
    r = two_node(epoch=3)
    for exited in (status("r1", 0, 1, ShardState.FAILED), status("r9", 0, 1, ShardState.STOPPED)):
        assert r.shard_reported("gpu-1", exited, 1.0) == Actions()
    draining = status("r8", 0, 1, ShardState.DRAINING)
    assert stops(r.shard_reported("gpu-1", draining, 1.0)) == [("gpu-1", "r8", 0, 1)]
    # The current epoch's failure is this replica's: it fails, and its rank that still
    # runs is stopped (the failed one has nothing left to stop).
    out = r.shard_reported("gpu-1", status("r1", 0, 3, ShardState.FAILED), 2.0)
    assert "r1" not in r.replicas and "r1" not in r.routes()
    assert stops(out) == [("gpu-2", "r1", 1, 3)]
    assert r.backoff_until("llama") is not None


def cordoned(view: NodeView) -> NodeView:
    return NodeView(view.node_id, view.state, attrs.evolve(view.capacity, cordoned=True))


def test_a_cordoned_node_is_emptied_make_before_break() -> None:
    r = Reconciler(CONTROL)
    ((old_node, old),) = starts(r.step(0.0, [model()], [node("a", 1), node("b", 1)]))
    r.shard_reported(old_node, ready(old), 1.0)
    other = "b" if old_node == "a" else "a"
    views = [cordoned(node(old_node, 1)), node(other, 1)]
    out = r.step(2.0, [model()], views)
    # A replacement starts elsewhere; the old replica still serves meanwhile.
    ((new_node, new),) = starts(out)
    assert new_node == other
    assert not any(isinstance(c.message, DrainShard) for c in out.commands)
    assert r.replicas[old.replica_id].state is ReplicaState.READY
    r.shard_reported(new_node, ready(new), 3.0)
    out = r.step(4.0, [model()], views)
    assert [(c.node_id, type(c.message)) for c in out.commands] == [(old_node, DrainShard)]
    assert old.replica_id in r.routes().draining


def test_a_plain_cordon_keeps_the_replicas_where_they_are() -> None:
    r = Reconciler(CONTROL)
    ((old_node, old),) = starts(r.step(0.0, [model()], [node("a", 1), node("b", 1)]))
    r.shard_reported(old_node, ready(old), 1.0)
    other = "b" if old_node == "a" else "a"
    held = cordoned(node(old_node, 1))
    out = r.step(2.0, [model()], [NodeView(held.node_id, held.state, held.capacity, drain=False)])
    assert out == Actions()
    assert r.replicas[old.replica_id].state is ReplicaState.READY
    # Wanting one more places it on the other node, never on the cordoned one.
    ((new_node, _),) = starts(
        r.step(
            3.0,
            [model(2)],
            [NodeView(held.node_id, held.state, held.capacity, drain=False), node(other, 1)],
        )
    )
    assert new_node == other


def test_an_explanation_goes_away_when_fewer_replicas_are_wanted() -> None:
    r = Reconciler(CONTROL)
    r.step(0.0, [model(1, TP2X2)], [node("a", 2)])
    assert "m" in r.unplaced
    r.step(1.0, [model(0, TP2X2)], [node("a", 2)])
    assert "m" not in r.unplaced


def test_a_desired_count_given_for_a_model_replaces_its_replicas() -> None:
    r = Reconciler(CONTROL)
    nodes = [node("a", 6)]
    static = model(1, name="static")
    scaled = model(1, name="scaled")
    started = starts(r.step(0.0, [static, scaled], nodes, {"scaled": 3}))
    assert sorted(c.model for _, c in started) == ["scaled", "scaled", "scaled", "static"]
    for n, cmd in started:
        r.shard_reported(n, ready(cmd), 1.0)
    # Scaled down by drain (no stream cut), one replica; the static model is untouched.
    out = r.step(2.0, [static, scaled], nodes, {"scaled": 2})
    (drain,) = [c.message for c in out.commands]
    assert isinstance(drain, DrainShard)
    assert r.replicas[drain.replica_id].model == "scaled"
    assert r.routes().draining == {drain.replica_id}
    # Down to zero: every replica of it drains; without an entry, `replicas` again.
    out = r.step(3.0, [static, scaled], nodes, {"scaled": 0})
    assert len([c for c in out.commands if isinstance(c.message, DrainShard)]) == 2
    assert len(starts(r.step(4.0, [static, scaled], nodes))) == 1


# -- moves that make room ----------------------------------------------------------------


def gpu_node(node_id: str, gpu_name: str, memory_gb: int) -> NodeView:
    info = NodeInfo(
        node_id=node_id,
        hostname=node_id,
        address=f"10.0.1.{len(node_id)}",
        gpus=(Gpu(0, f"{node_id}-0", gpu_name, memory_gb * 10**9),),
        engines=(EngineInfo("sim"),),
    )
    return NodeView(
        node_id, NodeState.READY, NodeCapacity.from_info(info, NodeState.READY, since=0.0)
    )


# Fits any GPU of 20 GB or more; the other only on an L4.
ANY_20GB = DeploymentProfile(name="any", engine="sim", weights="w", min_gpu_memory=20 * 10**9)
L4_ONLY = DeploymentProfile(name="l4", engine="sim", weights="w", gpu_name="L4")


def test_a_replica_in_the_way_is_moved_make_before_break_and_the_stuck_one_placed() -> None:
    """The issue's case: llama (any 20 GB+ GPU) sits on the only L4; the embedding model
    (L4 only) has nowhere to go until llama moves to the A100."""
    r = Reconciler(CONTROL)
    llama, embed = model(1, ANY_20GB, "llama"), model(1, L4_ONLY, "embed")
    l4, a100 = gpu_node("l4", "NVIDIA L4", 24), gpu_node("a100", "NVIDIA A100", 80)
    ((_, first),) = starts(r.step(0.0, [llama], [l4]))  # only the L4 there yet
    r.shard_reported("l4", ready(first), 1.0)
    # The A100 joins and the embedding model is added: it cannot be placed, the
    # explanation says draining llama would make room, and llama fits on the A100.
    out = r.step(2.0, [llama, embed], [l4, a100])
    assert starts(out) == [] and "embed" in r.unplaced
    assert r.evicting == {first.replica_id: "embed"} and r.moves == 1
    # Make before break: the replacement first; the old one serves meanwhile.
    ((where, second),) = starts(r.step(3.0, [llama, embed], [l4, a100]))
    assert where == "a100" and second.model == "llama"
    assert r.replicas[first.replica_id].state is ReplicaState.READY
    r.shard_reported("a100", ready(second), 4.0)
    out = r.step(5.0, [llama, embed], [l4, a100])
    assert [(c.node_id, type(c.message)) for c in out.commands] == [("l4", DrainShard)]
    stopped = ShardStatus(first.replica_id, 0, first.epoch, ShardState.STOPPED)
    r.shard_reported("l4", stopped, 6.0)
    ((where, placed),) = starts(r.step(7.0, [llama, embed], [l4, a100]))
    assert (where, placed.model) == ("l4", "embed")
    assert r.evicting == {} and r.moves == 1


def test_no_move_when_the_replica_in_the_way_fits_nowhere_else() -> None:
    r = Reconciler(CONTROL)
    llama, embed = model(1, ANY_20GB, "llama"), model(1, L4_ONLY, "embed")
    l4 = gpu_node("l4", "NVIDIA L4", 24)
    ((_, first),) = starts(r.step(0.0, [llama], [l4]))
    r.shard_reported("l4", ready(first), 1.0)
    small = gpu_node("t4", "NVIDIA T4", 16)  # too small for llama
    for t in (2.0, 3.0, 4.0):
        out = r.step(t, [llama, embed], [l4, small])
        assert starts(out) == [] and out.commands == ()
    assert r.evicting == {} and r.moves == 0
    assert r.replicas[first.replica_id].state is ReplicaState.READY


def test_a_move_whose_replacement_finds_no_place_is_called_off() -> None:
    r = Reconciler(CONTROL)
    llama, embed = model(1, ANY_20GB, "llama"), model(1, L4_ONLY, "embed")
    l4, a100 = gpu_node("l4", "NVIDIA L4", 24), gpu_node("a100", "NVIDIA A100", 80)
    ((_, first),) = starts(r.step(0.0, [llama], [l4]))
    r.shard_reported("l4", ready(first), 1.0)
    r.step(2.0, [llama, embed], [l4, a100])
    assert r.evicting == {first.replica_id: "embed"}
    # The A100 leaves before the replacement is placed: llama has nowhere to go, so
    # the move is off and llama counts (and serves) on the L4 again.
    out = r.step(3.0, [llama, embed], [l4])
    assert starts(out) == [] and r.evicting == {}
    assert "llama" in r.unplaced and "embed" in r.unplaced
    out = r.step(4.0, [llama, embed], [l4])
    assert out.commands == () and "llama" not in r.unplaced
    assert r.replicas[first.replica_id].state is ReplicaState.READY


# -- level-triggered commands ------------------------------------------------------------


def test_a_start_no_agent_confirms_is_sent_again_each_interval_until_it_does() -> None:
    """A StartShard lost on the way (outbox full, a reconnect) costs an interval, not
    start_timeout: the shard is told again while no report says it is starting."""
    r = Reconciler(CONTROL)  # interval 5 s
    ((n, cmd),) = starts(r.step(0.0, [model()], [node("a", 1)]))
    assert r.step(4.0, [model()], [node("a", 1)]) == Actions()  # its answer may be coming
    assert starts(r.step(5.0, [model()], [node("a", 1)])) == [(n, cmd)]  # the same command
    # Not to a node that cannot be reached; again once it can.
    assert r.step(11.0, [model()], [node("a", 1, NodeState.UNREACHABLE)]) == Actions()
    assert starts(r.step(11.5, [model()], [node("a", 1)])) == [(n, cmd)]
    r.shard_reported(n, ShardStatus(cmd.replica_id, 0, cmd.epoch, ShardState.STARTING), 12.0)
    assert r.step(30.0, [model()], [node("a", 1)]) == Actions()
    assert r.resent == 2


def test_a_drain_the_agent_missed_is_sent_again_while_it_reports_the_shard_ready() -> None:
    """A scale-down during a brief disconnect: the agent comes back still running the
    shard as ready, and is told to drain it again (once per interval)."""
    r = Reconciler(CONTROL)
    ((n, cmd),) = starts(r.step(0.0, [model()], [node("a", 1)]))
    r.shard_reported(n, ready(cmd), 1.0)
    out = r.step(2.0, [model(0)], [node("a", 1)])
    (drain,) = [c.message for c in out.commands]
    assert isinstance(drain, DrainShard)
    r.shard_reported(n, ready(cmd), 3.0)  # it never got it
    assert r.step(6.0, [model(0)], [node("a", 1)]) == Actions()
    out = r.step(7.0, [model(0)], [node("a", 1)])
    assert [c.message for c in out.commands] == [drain]
    draining = ShardStatus(cmd.replica_id, 0, cmd.epoch, ShardState.DRAINING)
    r.shard_reported(n, draining, 7.5)
    assert r.step(20.0, [model(0)], [node("a", 1)]) == Actions()


def test_a_start_refused_for_a_busy_port_is_placed_again_on_another_port_at_once() -> None:
    r = Reconciler(CONTROL)
    nodes = [node("a", 1)]
    ((n, cmd),) = starts(r.step(0.0, [model()], nodes))
    refused = ShardStatus(
        cmd.replica_id,
        0,
        cmd.epoch,
        ShardState.FAILED,
        message=f"not started: port {cmd.port} on 10.0.0.1 is in use by another process",
        busy_ports=(cmd.port,),
    )
    r.shard_reported(n, refused, 1.0)
    assert r.backoff_until("m") is None  # not the model's fault
    ((again_on, again),) = starts(r.step(1.0, [model()], nodes))
    assert again_on == "a" and again.port != cmd.port
    # Once the refusal is old, the port may be given out again.
    r.shard_reported(n, ready(again), 2.0)
    r.step(3.0 + REFUSED_PORT_TTL, [model(2)], [node("a", 2)])
    (later,) = [s for s in r.replicas.values() if s.replica_id != again.replica_id]
    assert later.placement.shards[0].port == cmd.port
