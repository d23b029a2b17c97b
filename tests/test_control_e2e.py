"""The control plane end to end in one process: controller, router, fake agents on the
stub transport, simulated engines on loopback."""

from __future__ import annotations

import attrs
import trio

from llmgw.control.fleet import NodeState, ReplicaState
from llmgw.testing import SIM_PROFILE, Fleet, fleet, until


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
        assert len(f.agents[0].shards) == 1
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

        # Lost after 3 s: the replica is placed on the other node.
        def moved() -> bool:
            replicas = list(f.controller.reconciler.replicas.values())
            return (
                len(replicas) == 1
                and replicas[0].placement.nodes != (victim,)
                and replicas[0].state is ReplicaState.READY
            )

        with trio.fail_after(20):
            await until(moved)
        assert state_of(f, victim) is NodeState.LOST
        assert f.ready("m") == 1


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

        with trio.fail_after(20):
            while not moved():
                # Served throughout: the old replica drains only after the new one is ready.
                r = await f.client.post(
                    "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}
                )
                assert r.status_code == 200, r.text
                await trio.sleep(0.05)
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
