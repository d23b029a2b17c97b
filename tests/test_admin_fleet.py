"""The control plane's JSON views and their admin routes (`/api/v1/nodes`, `nodes/{id}`,
`replicas`, `placement`), the views called directly and the routes through the ASGI
app, in-process (no sockets)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from llmgw.admin.api import ROUTER_ONLY, AdminApp
from llmgw.config import Config, DeploymentProfile, ModelConfig
from llmgw.control import views
from llmgw.domain.fleet import ShardState
from llmgw.router.core import Router
from tests.test_fleet_metrics import HUGE, LLAMA, Scenario, report, scenario

WALL = 1_700_000_000.0  # the Unix time matching the scenario's t=70

NODE_KEYS = {
    "id",
    "hostname",
    "address",
    "agent_version",
    "state",
    "since",
    "in_state_seconds",
    "last_heartbeat",
    "heartbeat_age_seconds",
    "connected",
    "cordoned",
    "draining",
    "drain_blocked",
    "schedulable",
    "labels",
    "fabrics",
    "gpus_total",
    "gpus_allocated",
    "gpus_free",
    "gpus",
    "engines",
    "shards",
}
GPU_KEYS = {
    "index",
    "uuid",
    "name",
    "memory_total_bytes",
    "memory_used_bytes",
    "utilization",
    "ecc_errors",
    "replica_id",
    "model",
}
# Two nodes of 2 GPUs each, in one fabric.
WIDE = ModelConfig(
    "wide",
    replicas=1,
    profiles=(
        DeploymentProfile(
            "2x2", "vllm", "wide/model", tensor_parallel=2, pipeline_parallel=2, gpus_per_node=2
        ),
    ),
)


def roundtrip(data: Any) -> Any:
    """What a client gets: the view must be plain JSON."""
    return json.loads(json.dumps(data))


@asynccontextmanager
async def admin(s: Scenario | None) -> AsyncIterator[httpx.AsyncClient]:
    app = AdminApp(Router(Config()), controller=None if s is None else s.controller)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        yield client


# -- views ---------------------------------------------------------------------------


def test_nodes_view_shape() -> None:
    s = scenario()
    s.controller.reconcile()
    body = roundtrip(views.nodes_json(s.controller, now=70.0, wall=WALL))
    assert list(body) == ["nodes"]
    nodes = {n["id"]: n for n in body["nodes"]}
    assert list(nodes) == ["gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"]
    for n in nodes.values():
        assert set(n) == NODE_KEYS
        for gpu in n["gpus"]:
            assert set(gpu) == GPU_KEYS

    one = nodes["gpu-1"]
    assert one["hostname"] == "gpu-1.example"
    assert one["address"] == "10.0.0.1"
    assert one["state"] == "ready"
    assert one["connected"] is True
    assert one["schedulable"] is True
    assert one["labels"] == {"zone": "a"}
    assert one["fabrics"] == ["ib-a"]
    assert one["engines"] == [{"name": "vllm", "version": "0.9.0"}]
    assert one["heartbeat_age_seconds"] == 0
    assert one["last_heartbeat"] == WALL
    # Utilisation and memory: the reported number, or null when unreported (never 0).
    gpus = one["gpus"]
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    assert [g["utilization"] for g in gpus] == [0.5, 0.02, None, None]
    assert [g["memory_used_bytes"] for g in gpus] == [40e9, 70e9, 1e9, None]
    assert [g["ecc_errors"] for g in gpus] == [0, 0, None, None]
    assert gpus[0]["memory_total_bytes"] == 80e9
    assert gpus[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert gpus[0]["uuid"] == "GPU-gpu-1-0"
    # The llama replicas were bin-packed onto gpu-1: every GPU names its replica.
    assert one["gpus_total"] == 4
    assert one["gpus_allocated"] == 4
    assert one["gpus_free"] == 0
    assert {g["model"] for g in gpus} == {"llama"}
    assert {g["replica_id"] for g in gpus} == set(s.controller.reconciler.replicas)

    unreachable = nodes["gpu-3"]
    assert unreachable["state"] == "unreachable"
    assert unreachable["in_state_seconds"] == 5.0  # unreachable since t=65
    assert unreachable["since"] == WALL - 5.0
    assert unreachable["heartbeat_age_seconds"] == 20.0
    assert unreachable["gpus_free"] == 0
    assert nodes["gpu-4"]["state"] == "lost"
    assert nodes["gpu-5"]["cordoned"] is True
    assert nodes["gpu-5"]["schedulable"] is False
    assert nodes["gpu-2"]["gpus_free"] == 4
    assert all(g["replica_id"] is None for g in nodes["gpu-2"]["gpus"])


def test_node_view_lists_shards_as_reported() -> None:
    s = scenario()
    s.controller.reconcile()
    rid = sorted(s.controller.reconciler.replicas)[0]
    report(s, rid, ShardState.READY, endpoint_url="http://10.0.0.1:20000", port=20000)
    node = roundtrip(views.node_json(s.controller, "gpu-1", now=70.0, wall=WALL))
    assert node["id"] == "gpu-1"
    (shard,) = node["shards"]
    assert shard == {
        "replica_id": rid,
        "rank": 0,
        "epoch": s.controller.reconciler.replicas[rid].placement.epoch,
        "state": "ready",
        "model": "llama",
        "message": "",
        "endpoint_url": "http://10.0.0.1:20000",
        "port": 20000,
        "gpu_indices": [],
        "exit_code": None,
        "output_tail": [],
    }
    assert views.node_json(s.controller, "nope") is None


def test_replicas_view_shape_and_model_counts() -> None:
    s = scenario()
    s.controller.reconcile()
    first, second = sorted(s.controller.reconciler.replicas)
    s.clock.now = 75.0
    report(s, first, ShardState.READY, endpoint_url="http://10.0.0.1:20000")
    body = roundtrip(views.replicas_json(s.controller, now=80.0, wall=WALL + 10))
    assert set(body) == {"replicas", "models"}
    by_id = {r["id"]: r for r in body["replicas"]}
    assert list(by_id) == [first, second]
    ready = by_id[first]
    assert set(ready) == {
        "id",
        "model",
        "profile",
        "epoch",
        "state",
        "since",
        "in_state_seconds",
        "url",
        "nodes",
    }
    assert ready["model"] == "llama"
    assert ready["profile"] == "tp2"
    assert ready["state"] == "ready"
    assert ready["url"] == "http://10.0.0.1:20000"
    assert ready["in_state_seconds"] == 5.0
    assert ready["since"] == WALL + 5.0
    (placed,) = ready["nodes"]
    assert placed["node_id"] == "gpu-1"
    assert placed["rank"] == 0
    assert len(placed["gpu_indices"]) == 2
    assert 20000 <= placed["port"] <= 20999
    assert placed["dist_port"] is None
    assert placed["shard_state"] == "ready"
    starting = by_id[second]
    assert starting["state"] == "starting"
    assert starting["url"] is None  # only once ready
    assert starting["nodes"][0]["shard_state"] is None  # no report yet
    assert body["models"] == [
        {
            "model": "huge",
            "desired": 1,
            "starting": 0,
            "ready": 0,
            "draining": 0,
            "unplaced": 1,
            "backoff_seconds": None,
            "failed_starts": 0,
            "moving": 0,
            "idle_seconds": None,
            "requests_per_second": 0.0,
            "tokens_per_second": 0.0,
        },
        {
            "model": "llama",
            "desired": 2,
            "starting": 1,
            "ready": 1,
            "draining": 0,
            "unplaced": 0,
            "backoff_seconds": None,
            "failed_starts": 0,
            "moving": 0,
            "idle_seconds": None,
            "requests_per_second": 0.0,
            "tokens_per_second": 0.0,
        },
    ]


def test_a_multi_node_replica_lists_its_ranks() -> None:
    s = scenario(models=(WIDE,))
    s.controller.reconcile()
    body = roundtrip(views.replicas_json(s.controller, now=70.0, wall=WALL))
    (replica,) = body["replicas"]
    ranks = replica["nodes"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert {r["node_id"] for r in ranks} == {"gpu-1", "gpu-2"}
    assert all(len(r["gpu_indices"]) == 2 for r in ranks)
    assert ranks[0]["dist_port"] is not None  # the head hosts distributed init
    assert ranks[1]["dist_port"] is None


def test_placement_view_explains_per_profile_node_and_fabric() -> None:
    s = scenario()
    s.controller.reconcile()
    body = roundtrip(views.placement_json(s.controller, now=70.0))
    (huge,) = body["models"]  # llama is fully placed: not listed
    assert huge["model"] == "huge"
    assert (huge["desired"], huge["active"], huge["unplaced"]) == (1, 0, 1)
    assert huge["backoff_seconds"] is None
    assert huge["summary"].startswith("huge: 0 of 1 replicas placed; 1 cannot be placed: ")
    (explanation,) = huge["explanations"]
    assert explanation["replica_ids"] == [s.controller.reconciler.unplaced["huge"][0].replica_id]
    assert "no fabric has 2 ready nodes" in explanation["summary"]
    (attempt,) = explanation["attempts"]
    assert attempt["profile"] == "2x8"
    assert attempt["code"] == "no_fabric_fits"
    reasons = {n["node_id"]: n for n in attempt["nodes"]}
    assert reasons["gpu-1"]["code"] == "too_few_gpus"
    assert reasons["gpu-1"]["message"] == "gpu-1: has 4 GPUs, needs 8"
    assert reasons["gpu-4"]["code"] == "lost"
    assert reasons["gpu-5"]["code"] == "cordoned"
    assert attempt["node_counts"] == {"too_few_gpus": 2, "cordoned": 1, "unreachable": 1, "lost": 1}
    fabrics = {f["fabric"]: f for f in attempt["fabrics"]}
    assert fabrics["ib-a"] == {
        "fabric": "ib-a",
        "code": "too_few_nodes",
        "message": "fabric ib-a: 0 ready nodes with 8 free GPUs, needs 2",
        "ready_nodes": 0,
        "needs": 2,
    }
    (hint,) = explanation["hints"]
    assert hint["code"] == "more_nodes"
    assert hint["fabric"] == "ib-a"
    assert hint["message"].startswith("needs 2 more ready nodes in fabric ib-a")


def test_placement_view_lists_a_model_backing_off() -> None:
    s = scenario(models=(LLAMA,))
    s.controller.reconcile()
    assert roundtrip(views.placement_json(s.controller, now=70.0)) == {"models": []}
    victim = sorted(s.controller.reconciler.replicas)[0]
    report(s, victim, ShardState.FAILED, message="CUDA out of memory")
    (llama,) = views.placement_json(s.controller, now=72.0)["models"]
    assert llama["model"] == "llama"
    assert (llama["active"], llama["unplaced"]) == (1, 0)
    assert llama["backoff_seconds"] == 8.0
    assert llama["failed_starts"] == 1
    assert "backing off after 1 failed start, next try in 8s" in llama["summary"]
    assert llama["explanations"] == []
    # The next attempt is under way: the model is still failing to start, and says so
    # (it is not a problem only between attempts).
    s.clock.now = 80.0
    s.controller.reconcile()
    (llama,) = views.placement_json(s.controller, now=80.0)["models"]
    assert (llama["active"], llama["backoff_seconds"]) == (2, None)
    assert "starting again after 1 failed start" in llama["summary"]
    # A replica reaching ready ends it.
    for rid in sorted(s.controller.reconciler.replicas):
        report(s, rid, ShardState.READY, endpoint_url="http://10.0.0.1:20000")
    assert views.placement_json(s.controller, now=81.0) == {"models": []}


# -- routes --------------------------------------------------------------------------


async def test_routes_serve_the_views() -> None:
    s = scenario(models=(LLAMA, HUGE))
    s.controller.reconcile()
    async with admin(s) as client:
        r = await client.get("/api/v1/nodes")
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/json"
        assert [n["id"] for n in r.json()["nodes"]] == ["gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"]
        assert (await client.get("/api/v1/nodes/")).status_code == 200

        r = await client.get("/api/v1/nodes/gpu-3")
        assert r.status_code == 200
        assert r.json()["id"] == "gpu-3"
        assert r.json()["state"] == "unreachable"

        r = await client.get("/api/v1/replicas")
        assert r.status_code == 200
        assert len(r.json()["replicas"]) == 2
        assert {m["model"] for m in r.json()["models"]} == {"huge", "llama"}

        r = await client.get("/api/v1/placement")
        assert r.status_code == 200
        assert [m["model"] for m in r.json()["models"]] == ["huge"]


async def test_an_unknown_node_is_a_404_with_an_openai_error() -> None:
    async with admin(scenario()) as client:
        r = await client.get("/api/v1/nodes/gpu-99")
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": "no node 'gpu-99'",
            "type": "not_found_error",
            "param": None,
            "code": "node_not_found",
        }
    }


@pytest.mark.parametrize(
    "path", ["/api/v1/nodes", "/api/v1/nodes/gpu-1", "/api/v1/replicas", "/api/v1/placement"]
)
async def test_router_only_mode_answers_404_with_a_reason(path: str) -> None:
    async with admin(None) as client:
        r = await client.get(path)
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["message"] == ROUTER_ONLY
    assert error["message"] == "no control plane: this server runs in router-only mode"
    assert error["code"] == "no_control_plane"


async def test_existing_routes_and_unknown_paths() -> None:
    async with admin(scenario()) as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        assert (await client.get("/api/v1/endpoints")).json() == {"endpoints": []}
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        for method, path in (
            ("GET", "/api/v1/nope"),
            ("GET", "/api/v1/nodes/gpu-1/extra"),  # a template matches whole segments only
        ):
            r = await client.request(method, path)
            assert r.status_code == 404, (method, path)
            assert r.json()["error"]["code"] == "not_found"
            assert r.json()["error"]["message"] == f"no route {method} {path}"
        # A known path with the wrong method: 405 naming what is allowed.
        for method, path, allow in (
            ("PUT", "/api/v1/nodes/gpu-1", "DELETE, GET, HEAD"),
            ("POST", "/api/v1/replicas", "GET, HEAD"),
        ):
            r = await client.request(method, path)
            assert r.status_code == 405, (method, path)
            assert r.headers["allow"] == allow
            assert r.json()["error"]["code"] == "method_not_allowed"
