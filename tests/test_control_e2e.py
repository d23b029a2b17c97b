"""The control plane end to end in one process: controller, router, agents on the
stub transport (llmgw.testing), simulated engines on loopback. The last test runs the controller on
virtual time, with scripted agents whose shards are records instead of engines."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

from llmgw.catalog.rules import Catalog
from llmgw.config import ControlConfig, DeploymentProfile, ModelConfig, Seconds
from llmgw.control.controller import Controller
from llmgw.domain.fleet import EngineInfo, Gpu, NodeInfo, NodeState, ReplicaState, ShardState
from llmgw.router.endpoints import Endpoint
from llmgw.testing import SIM_PROFILE, Fleet, fleet, until
from llmgw.transport.base import ConnectFailed, ConnectionClosed, ServerConnection
from llmgw.transport.messages import (
    Heartbeat,
    Refused,
    Register,
    Registered,
    ShardStatus,
    StartShard,
    StopShard,
)
from llmgw.transport.stub import StubNetwork
from tests.waiting import wait_until


def state_of(f: Fleet, node_id: str) -> NodeState:
    record = f.controller.inventory.get(node_id)
    assert record is not None
    return record.state


def model(name: str = "m", replicas: int = 2, **extra: object) -> dict[str, object]:
    return {"name": name, "replicas": replicas, "profiles": [SIM_PROFILE], **extra}


async def test_a_declared_model_is_placed_started_and_served() -> None:
    async with fleet([model(replicas=2)], nodes=2, gpus="1x80GB") as f:
        with trio.fail_after(20):
            await f.wait_ready("m", 2)
        r = await f.client.post(
            "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 3}
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3
        # One replica per node: each node has one GPU.
        nodes = {rep.placement.nodes for rep in f.controller.reconciler.replicas.values()}
        assert nodes == {("node-0",), ("node-1",)}


async def test_scaling_down_drains_one_replica() -> None:
    async with fleet([model(replicas=2)], nodes=1, gpus="4x80GB") as f:
        with trio.fail_after(20):
            await f.wait_ready("m", 2)
        catalog = f.controller.catalog
        current = catalog.resolve("m")
        assert current is not None
        f.set_catalog(catalog.with_model(attrs.evolve(current, replicas=1)))
        with trio.fail_after(20):
            await f.wait_ready("m", 1)
            await until(lambda: len(f.controller.reconciler.replicas) == 1)
        assert len(f.agents[0].supervisor.live()) == 1
        r = await f.client.post(
            "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}
        )
        assert r.status_code == 200


async def test_a_lost_node_is_unreachable_first_then_its_replica_moves() -> None:
    async with fleet([model(replicas=1)], nodes=2, gpus="1x80GB") as f:
        with trio.fail_after(20):
            await f.wait_ready("m", 1)
        (replica,) = f.controller.reconciler.replicas.values()
        (victim,) = replica.placement.nodes
        f.network.partition(victim)
        # Unreachable after 1 s: still routed (its engine may be fine).
        with trio.fail_after(10):
            await until(lambda: state_of(f, victim) is NodeState.UNREACHABLE)
        assert f.ready("m") == 1
        r = await f.client.post(
            "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}
        )
        assert r.status_code == 200

        # Lost after 3 s: the replica is placed on the other node, and routed (routes
        # are derived on the pass after the report that made it ready).
        def moved() -> bool:
            replicas = list(f.controller.reconciler.replicas.values())
            return (
                len(replicas) == 1
                and replicas[0].placement.nodes != (victim,)
                and replicas[0].state is ReplicaState.READY
                and f.ready("m") == 1
            )

        with trio.fail_after(20):
            await until(moved)
        assert state_of(f, victim) is NodeState.LOST


async def test_an_unplaceable_model_is_explained() -> None:
    big = {"name": "big", "engine": "sim", "weights": "w", "tensor_parallel": 4}
    async with fleet(
        [model(replicas=1), {"name": "huge", "profiles": [big]}], nodes=1, gpus="2x80GB"
    ) as f:
        with trio.fail_after(20):
            await f.wait_ready("m", 1)
            await until(lambda: "huge" in f.controller.reconciler.unplaced)
        (why,) = f.controller.reconciler.unplaced["huge"]
        assert "fewer than 4 usable GPUs" in why.summary, why.summary
        (reason,) = why.attempts[0].nodes
        assert reason.message == "node-0: has 2 GPUs, needs 4"


async def test_draining_a_node_moves_its_replica_without_a_gap() -> None:
    async with fleet([model(replicas=1)], nodes=2, gpus="1x80GB") as f:
        with trio.fail_after(20):
            await f.wait_ready("m", 1)
        (replica,) = f.controller.reconciler.replicas.values()
        (old_node,) = replica.placement.nodes
        f.controller.drain_node(old_node)

        def moved() -> bool:
            reps = list(f.controller.reconciler.replicas.values())
            return len(reps) == 1 and reps[0].placement.nodes != (old_node,)

        async def served_until_moved() -> bool:
            # Served throughout: the old replica drains only after the new one is ready.
            r = await f.client.post(
                "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}
            )
            assert r.status_code == 200, r.text
            return moved()

        await wait_until(
            served_until_moved, f"the replica moved off {old_node}", timeout=20, transient=()
        )
        assert f.controller.activity.get("m").requests_per_second > 0
        (counts,) = (await f.admin.get("/api/v1/replicas")).json()["models"]
        assert counts["requests_per_second"] > 0 and counts["idle_seconds"] < 5
        metrics = (await f.admin.get("/metrics")).text
        assert 'llmgw_fleet_model_idle_seconds{model="m"}' in metrics


async def test_the_admin_api_shows_the_fleet_and_drains_a_node() -> None:
    big = {"name": "big", "engine": "sim", "weights": "w", "tensor_parallel": 8}
    async with fleet([model(replicas=1), {"name": "huge", "profiles": [big]}], nodes=2) as f:
        with trio.fail_after(20):
            await f.wait_ready("m", 1)
        nodes = (await f.admin.get("/api/v1/nodes")).json()["nodes"]
        assert [n["id"] for n in nodes] == ["node-0", "node-1"]
        assert all(len(n["gpus"]) == 4 and n["state"] == "ready" for n in nodes)
        # Fake GPUs report no utilisation: null in JSON, no sample in Prometheus.
        assert all(g["utilization"] is None for n in nodes for g in n["gpus"])
        metrics = (await f.admin.get("/metrics")).text
        assert 'llmgw_fleet_nodes{state="ready"} 2.0' in metrics
        assert "llmgw_fleet_gpu_memory_capacity_bytes{" in metrics
        assert "llmgw_fleet_gpu_utilization_ratio{" not in metrics

        replicas = (await f.admin.get("/api/v1/replicas")).json()
        (rep,) = replicas["replicas"]
        assert rep["model"] == "m" and rep["state"] == "ready" and rep["url"]
        with trio.fail_after(10):
            await until(lambda: "huge" in f.controller.reconciler.unplaced)
        placement = (await f.admin.get("/api/v1/placement")).json()
        (huge,) = [m for m in placement["models"] if m["model"] == "huge"]
        assert "8" in huge["summary"], huge

        node_id = rep["nodes"][0]["node_id"]
        r = await f.admin.post(f"/api/v1/nodes/{node_id}/drain")
        assert r.status_code == 202 and r.json()["cordoned"] is True
        assert (await f.admin.post("/api/v1/nodes/nope/drain")).status_code == 404

        def moved() -> bool:
            reps = list(f.controller.reconciler.replicas.values())
            return len(reps) == 1 and node_id not in reps[0].placement.nodes

        with trio.fail_after(20):
            await until(moved)


# -- on virtual time -----------------------------------------------------------------


class ScriptedAgent:
    """An agent on the stub transport whose shards are records: a start is ready at
    once, a stop of the same epoch ends it. Shards outlive connections, as a real
    agent's engines do, and it re-registers with them after every reconnect."""

    def __init__(self, network: StubNetwork, node_id: str) -> None:
        self.network = network
        self.node = NodeInfo(
            node_id=node_id,
            hostname=node_id,
            address=f"10.0.0.{len(node_id)}",
            gpus=(Gpu(0, f"GPU-{node_id}", "H100", 80 * 2**30),),
            engines=(EngineInfo("sim"),),
        )
        self.shards: dict[tuple[str, int], ShardStatus] = {}
        self.stops: list[StopShard] = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            try:
                await self._session()
            except* (ConnectionClosed, ConnectFailed):
                pass
            await trio.sleep(0.5)  # its reconnect backoff (on the test's virtual time)

    async def _session(self) -> None:
        async with self.network.connector(self.node.node_id).connect() as conn:
            await conn.send(Register(self.node, tuple(self.shards.values())))
            registered = await conn.receive()
            assert isinstance(registered, Registered)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._heartbeats, conn, registered.heartbeat_interval)
                while True:
                    command = await conn.receive()
                    if isinstance(command, StartShard):
                        status = ShardStatus(
                            command.replica_id,
                            command.rank,
                            command.epoch,
                            ShardState.READY,
                            model=command.model,
                            endpoint_url=f"http://{self.node.address}:{command.port}",
                            profile=command.profile.name,
                            node_count=command.node_count,
                            gpu_indices=command.gpu_indices,
                            port=command.port,
                        )
                        self.shards[(command.replica_id, command.rank)] = status
                        await conn.send(status)
                    elif isinstance(command, StopShard):
                        self.stops.append(command)
                        key = (command.replica_id, command.rank)
                        shard = self.shards.get(key)
                        if shard is not None and shard.epoch == command.epoch:
                            del self.shards[key]
                            stopped = attrs.evolve(
                                shard, state=ShardState.STOPPED, endpoint_url=None
                            )
                            await conn.send(stopped)

    async def _heartbeats(self, conn: ServerConnection, interval: float) -> None:
        seq = 0
        while True:
            await trio.sleep(interval)  # the heartbeat interval (virtual time)
            seq += 1
            await conn.send(Heartbeat(seq, self.node.gpus))


@attrs.define
class Routes:
    """An endpoint sink that keeps what the controller tells the router."""

    log: list[tuple[str, str]] = attrs.field(factory=list)  # (upsert|drain|remove, id)
    live: dict[str, Endpoint] = attrs.field(factory=dict)

    def upsert(self, endpoint: Endpoint) -> None:
        self.log.append(("upsert", endpoint.id))
        self.live[endpoint.id] = endpoint

    def drain(self, endpoint_id: str) -> None:
        self.log.append(("drain", endpoint_id))
        self.live.pop(endpoint_id, None)

    def remove(self, endpoint_id: str) -> None:
        self.log.append(("remove", endpoint_id))
        self.live.pop(endpoint_id, None)


VIRTUAL_TIME = pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param(("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}), id="mock")],
)


@VIRTUAL_TIME
async def test_a_lost_node_returning_with_a_superseded_shard_has_it_stopped_not_routed() -> None:
    control = ControlConfig(
        interval=Seconds(1.0),
        unreachable_after=Seconds(3.0),
        lost_after=Seconds(10.0),
        port_range=(20000, 20099),
    )
    sim = DeploymentProfile(name="sim", engine="sim", weights="w")
    catalog = Catalog((ModelConfig(name="m", replicas=1, profiles=(sim,)),))
    routes = Routes()
    controller = Controller(control, catalog, routes, heartbeat_interval=1.0, settle=1.0)
    network = StubNetwork()
    agents = {n: ScriptedAgent(network, n) for n in ("a", "b")}
    async with trio.open_nursery() as nursery:
        await nursery.start(controller.run, network.listener())
        for agent in agents.values():
            await nursery.start(agent.run)
        with trio.fail_after(30):
            await until(lambda: len(routes.live) == 1)
        (old,) = controller.reconciler.replicas.values()
        (victim,) = old.placement.nodes
        (survivor,) = set(agents) - {victim}

        # The victim is cut off long enough to be lost: its replica is placed on the
        # survivor under a new epoch. Its agent still runs the old shard meanwhile.
        network.partition(victim)

        def replaced() -> bool:
            replicas = list(controller.reconciler.replicas.values())
            return (
                len(replicas) == 1
                and replicas[0].placement.nodes == (survivor,)
                and replicas[0].state is ReplicaState.READY
            )

        with trio.fail_after(60):
            await until(replaced)
        (new,) = controller.reconciler.replicas.values()
        assert new.placement.epoch > old.placement.epoch
        lost = controller.inventory.get(victim)
        assert lost is not None and lost.state is NodeState.LOST
        assert set(routes.live) == {new.replica_id}
        assert ("remove", old.replica_id) in routes.log
        assert (old.replica_id, 0) in agents[victim].shards
        seen = len(routes.log)

        # It comes back and re-registers with the superseded shard: stopped, at its epoch.
        network.heal(victim)
        with trio.fail_after(30):
            await until(lambda: not agents[victim].shards)
        assert [(s.replica_id, s.epoch) for s in agents[victim].stops] == [
            (old.replica_id, old.placement.epoch)
        ]
        record = controller.inventory.get(victim)
        assert record is not None and record.state is NodeState.READY
        # Never routed to again; the replacement serves on, alone and undisturbed.
        controller.reconcile()
        assert routes.log[seen:] == []
        assert set(routes.live) == {new.replica_id}
        assert list(controller.reconciler.replicas) == [new.replica_id]
        assert agents[survivor].stops == []
        nursery.cancel_scope.cancel()


# -- agents over the protocol's bounds (llmgw.transport.limits) ---------------------------


async def test_a_registration_over_the_bounds_is_refused_and_nothing_of_it_is_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """60,000 GPUs, or 3 MB of labels, in one Register: the agent is told why, the
    server logs it, and the inventory holds nothing of it (before or after it left)."""
    huge = [
        NodeInfo("n-gpus", "h", "127.0.0.1", gpus=tuple(Gpu(i, "", "", 1) for i in range(60_000))),
        NodeInfo("n-labels", "h", "127.0.0.1", labels={"k": "v" * 3_000_000}),
        NodeInfo("n-many", "h", "127.0.0.1", labels={f"k{i}": "v" for i in range(1_000)}),
    ]
    async with fleet([model(replicas=1)], nodes=0) as f:
        with trio.fail_after(20):
            for node in huge:
                async with f.network.connector(node.node_id).connect() as conn:
                    await conn.send(Register(node))
                    refused = await conn.receive()
                    assert isinstance(refused, Refused), refused
                    assert "over the agent protocol's bounds" in refused.reason
                    with pytest.raises(ConnectionClosed):
                        await conn.receive()
                assert f.controller.inventory.get(node.node_id) is None
        assert len(f.controller.inventory) == 0
    for what in ("NodeInfo.gpus: 60000 entries", "NodeInfo.labels['k']: 3000000 characters"):
        assert any(
            r.levelname == "WARNING" and "refused registration" in r.message and what in r.message
            for r in caplog.records
        ), what


def connected(f: Fleet, node_id: str) -> bool:
    record = f.controller.inventory.get(node_id)
    return record is not None and record.connected


async def test_a_message_over_the_bounds_ends_the_connection_and_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gpu = Gpu(0, "GPU-0", "H100", 80 << 30)
    async with fleet([model(replicas=1)], nodes=0) as f:
        with trio.fail_after(20):
            async with f.network.connector("n-1").connect() as conn:
                await conn.send(Register(NodeInfo("n-1", "h", "127.0.0.1", gpus=(gpu,))))
                assert isinstance(await conn.receive(), Registered)
                many = tuple(attrs.evolve(gpu, index=i) for i in range(1_000))
                await conn.send(Heartbeat(1, gpus=many))
                with pytest.raises(ConnectionClosed):
                    while True:  # commands may come first; the connection then ends
                        await conn.receive()
            await wait_until(lambda: not connected(f, "n-1"), "n-1 disconnected")
        record = f.controller.inventory.get("n-1")
        assert record is not None and record.gpus == (gpu,) and record.seq is None
    assert "a message over the agent protocol's bounds: Heartbeat.gpus: 1000 entries" in caplog.text


@VIRTUAL_TIME
async def test_an_agent_back_at_once_without_its_shard_has_the_replica_replaced() -> None:
    """An agent restarted with its engine gone (killed with it) registers again long
    before its node could be lost, reporting nothing: the replica it ran is unrouted at
    once and placed again, instead of staying published at a dead port."""
    control = ControlConfig(
        interval=Seconds(1.0),
        unreachable_after=Seconds(30.0),
        lost_after=Seconds(90.0),
        port_range=(20000, 20099),
    )
    sim = DeploymentProfile(name="sim", engine="sim", weights="w")
    catalog = Catalog((ModelConfig(name="m", replicas=1, profiles=(sim,)),))
    routes = Routes()
    controller = Controller(control, catalog, routes, heartbeat_interval=1.0, settle=1.0)
    network = StubNetwork()
    a = ScriptedAgent(network, "a")
    async with trio.open_nursery() as nursery:
        await nursery.start(controller.run, network.listener())
        await nursery.start(a.run)
        with trio.fail_after(30):
            await until(lambda: len(routes.live) == 1)
        (old,) = controller.reconciler.replicas.values()
        started = trio.current_time()

        # The agent dies with its engine and comes back at once with nothing.
        a.shards.clear()
        assert network.disconnect("a") == 1
        with trio.fail_after(30):
            await until(lambda: ("remove", old.replica_id) in routes.log)
        with trio.fail_after(30):
            await until(lambda: len(routes.live) == 1 and old.replica_id not in routes.live)
        # Long before the node could even be unreachable, and it never was.
        assert trio.current_time() - started < 10
        record = controller.inventory.get("a")
        assert record is not None and record.state is NodeState.READY
        (new,) = controller.reconciler.replicas.values()
        assert new.placement.epoch > old.placement.epoch
        assert new.state is ReplicaState.READY
        assert set(a.shards) == {(new.replica_id, 0)}
        nursery.cancel_scope.cancel()


@VIRTUAL_TIME
async def test_replicas_are_adopted_and_shown_as_agents_arrive_within_the_settle_period() -> None:
    """After a restart (or a takeover) the views and the router have each replica as
    soon as its agent registers, not only once the settle period is over."""
    control = ControlConfig(interval=Seconds(1.0), port_range=(20000, 20099))
    sim = DeploymentProfile(name="sim", engine="sim", weights="w")
    catalog = Catalog((ModelConfig(name="m", replicas=1, profiles=(sim,)),))
    routes = Routes()
    controller = Controller(control, catalog, routes, heartbeat_interval=1.0, settle=60.0)
    network = StubNetwork()
    a = ScriptedAgent(network, "a")
    a.shards[("m-r5", 0)] = ShardStatus(
        "m-r5",
        0,
        5,  # an earlier run's epoch
        ShardState.READY,
        model="m",
        endpoint_url="http://10.0.0.1:20000",
        profile="sim",
        node_count=1,
        gpu_indices=(0,),
        port=20000,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(controller.run, network.listener())
        started = trio.current_time()
        await nursery.start(a.run)
        with trio.fail_after(30):
            await until(lambda: "m-r5" in routes.live)
        assert trio.current_time() - started < 60 and not controller.settled
        (info,) = controller.reconciler.snapshot()
        assert (info.replica_id, info.state) == ("m-r5", ReplicaState.READY)
        # Settled: kept as it is, nothing placed beside it or stopped.
        with trio.fail_after(120):
            await until(lambda: controller.settled)
        controller.reconcile()
        assert list(controller.reconciler.replicas) == ["m-r5"]
        assert a.stops == [] and set(a.shards) == {("m-r5", 0)}
        nursery.cancel_scope.cancel()
