"""Operations on nodes that can be undone, through real processes: `llmgw-server` in
control-plane mode with a store, `llmgw-agent` processes with pretended GPUs over
gRPC, simulators as engines. Cordon and uncordon (placement uses the node again),
forget (refused for a connected node, done for a lost one), and a drain that
survives a server restart because the store keeps it.
"""

from __future__ import annotations

import os
import signal
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
import trio

from llmgw.store import StoredCordon, open_store
from tests.procs import FleetPorts, FleetServer, agent, fleet_server
from tests.test_fleet_e2e import control_config, logs, model

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")

# Keeps the control plane on (it runs only with a deployable model) without placing
# anything: no node has 8 GPUs.
UNPLACEABLE = """
[[models]]
name = "huge"

[[models.profiles]]
name = "big"
engine = "sim"
weights = "sim"
tensor_parallel = 8
"""
SIM_MODEL = {
    "name": "m",
    "replicas": 1,
    "profiles": [{"name": "sim", "engine": "sim", "weights": "sim"}],
}


def store_config(url: str, **kw: Any) -> str:
    return control_config([UNPLACEABLE], extra=f'[store]\nurl = "{url}"\n', **kw)


def post(srv: FleetServer, path: str, **kw: Any) -> httpx.Response:
    return httpx.post(f"{srv.admin}{path}", timeout=10, **kw)


def delete(srv: FleetServer, path: str) -> httpx.Response:
    return httpx.delete(f"{srv.admin}{path}", timeout=10)


def cordons(url: str) -> list[StoredCordon]:
    """What the store holds, read as another server would."""

    async def read() -> list[StoredCordon]:
        store = await open_store(url)
        try:
            return await store.list_cordons()
        finally:
            await store.aclose()

    return trio.run(read)


def running(srv: FleetServer, node_id: str) -> list[str]:
    """The replicas with a shard starting or ready on the node (drained ones stay
    listed, stopped)."""
    return [
        s["replica_id"]
        for s in srv.nodes()[node_id]["shards"]
        if s["state"] in ("starting", "ready")
    ]


def unplaced_because(srv: FleetServer, model_name: str, node_id: str) -> str | None:
    """The code placement gives `node_id` for `model_name`'s missing replica, if any."""
    for m in srv.get("/api/v1/placement")["models"]:
        if m["model"] != model_name:
            continue
        for explanation in m["explanations"]:
            for attempt in explanation["attempts"]:
                for n in attempt["nodes"]:
                    if n["node_id"] == node_id:
                        return str(n["code"])
    return None


def test_an_uncordoned_node_takes_new_shards_again(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/llmgw.db"
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(store_config(url)))
        a1 = stack.enter_context(agent(srv.agent_address, "n1", address="127.0.0.71"))
        srv.wait(lambda: srv.nodes().get("n1", {}).get("state") == "ready", "n1 ready")

        r = post(srv, "/api/v1/nodes/n1/cordon")
        assert r.status_code == 200, r.text
        assert (r.json()["cordoned"], r.json()["draining"], r.json()["schedulable"]) == (
            True,
            False,
            False,
        )
        # A model added now cannot go anywhere: the only node is cordoned.
        r = post(srv, "/api/v1/models", json=SIM_MODEL)
        assert r.status_code == 201, r.text
        srv.wait(
            lambda: unplaced_because(srv, "m", "n1") == "cordoned",
            "m unplaced because n1 is cordoned",
            logs=logs(a1),
        )
        assert srv.replicas("m") == []

        r = post(srv, "/api/v1/nodes/n1/uncordon")
        assert r.status_code == 200, r.text
        assert (r.json()["cordoned"], r.json()["schedulable"]) == (False, True)
        (replica,) = srv.wait(
            lambda: srv.ready_replicas("m", 1), "m placed on n1 once uncordoned", logs=logs(a1)
        )
        assert [n["node_id"] for n in replica["nodes"]] == ["n1"]


def test_forget_refuses_a_connected_node_and_removes_a_lost_one(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/llmgw.db"
    config = store_config(url, unreachable="1s", lost="2s")
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(config))
        a1 = stack.enter_context(agent(srv.agent_address, "n1", address="127.0.0.72"))
        srv.wait(lambda: srv.nodes().get("n1", {}).get("connected"), "n1 connected")
        assert post(srv, "/api/v1/nodes/n1/drain").status_code == 202

        r = delete(srv, "/api/v1/nodes/n1")
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert error["code"] == "node_in_use"
        assert error["message"].startswith("node 'n1' is connected: stop its agent first")
        assert "n1" in srv.nodes()

        a1.proc.kill(signal.SIGKILL)  # the machine is gone
        srv.wait(lambda: srv.nodes()["n1"]["state"] == "lost", "n1 lost", logs=logs(a1))
        r = delete(srv, "/api/v1/nodes/n1")
        assert r.status_code == 200, r.text
        assert (r.json()["id"], r.json()["state"]) == ("n1", "lost")
        assert "n1" not in srv.nodes()
        assert delete(srv, "/api/v1/nodes/n1").status_code == 404


def test_a_drain_survives_a_server_restart(store_url: str) -> None:
    config = control_config([model("m", replicas=1)], extra=f'[store]\nurl = "{store_url}"\n')
    with ExitStack() as stack:
        ports = stack.enter_context(FleetPorts.reserved())  # kept for the new server
        srv = stack.enter_context(fleet_server(config, ports=ports))
        agents = {
            node_id: stack.enter_context(
                agent(srv.agent_address, node_id, address=address, max_backoff="500ms")
            )
            for node_id, address in (("n1", "127.0.0.73"), ("n2", "127.0.0.74"))
        }
        (first,) = srv.wait(
            lambda: srv.ready_replicas("m", 1), "m ready", logs=logs(*agents.values())
        )
        held = first["nodes"][0]["node_id"]
        other = "n2" if held == "n1" else "n1"
        assert post(srv, f"/api/v1/nodes/{held}/drain").status_code == 202
        # Make before break: a replacement on the other node, then the old one drains.
        srv.wait(
            lambda: (
                [n["node_id"] for r in srv.ready_replicas("m", 1) for n in r["nodes"]] == [other]
                and not running(srv, held)
            ),
            f"m moved from {held} to {other}",
            logs=logs(*agents.values()),
        )
        srv.wait(
            lambda: [(c.node_id, c.drain) for c in cordons(store_url)] == [(held, True)],
            f"{held}'s drain stored",
        )
        srv.proc.kill(signal.SIGTERM)
        assert srv.proc.popen.wait(30) == 0, srv.proc.output()[-3000:]

        # A new server in its place, on the same store: the agents reconnect, and the
        # drained node is still cordoned, so nothing goes back to it.
        srv2 = stack.enter_context(fleet_server(config, ports=ports))
        srv2.wait(
            lambda: all(n["connected"] for n in srv2.nodes().values()) and len(srv2.nodes()) == 2,
            "both agents reconnected",
            logs=logs(*agents.values()),
        )
        node = srv2.nodes()[held]
        assert (node["cordoned"], node["draining"], node["schedulable"]) == (True, True, False)
        (after,) = srv2.wait(
            lambda: srv2.ready_replicas("m", 1), "m adopted", logs=logs(*agents.values())
        )
        assert [n["node_id"] for n in after["nodes"]] == [other]

        r = post(srv2, f"/api/v1/nodes/{held}/uncordon")
        assert r.status_code == 200 and r.json()["schedulable"] is True, r.text
        assert cordons(store_url) == []


def test_a_drain_with_nowhere_to_go_says_so_everywhere(tmp_path: Any) -> None:
    """Issue #33: draining the only node cannot proceed; the CLI, the node, placement
    and the replicas it keeps serving all say why, instead of "moving elsewhere"."""
    import subprocess

    from tests.procs import BIN

    url = f"sqlite:///{tmp_path}/llmgw.db"
    with ExitStack() as stack:
        srv = stack.enter_context(
            fleet_server(control_config([model("m")], extra=f'[store]\nurl = "{url}"\n'))
        )
        a1 = stack.enter_context(agent(srv.agent_address, "n1", address="127.0.0.73"))
        srv.wait(lambda: srv.ready_replicas("m", 1), "m ready", logs=logs(a1))
        done = subprocess.run(
            [str(BIN / "llmgw-ctl"), "--admin", srv.admin, "drain", "n1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert "cannot move its 1 replica now: its replicas keep serving here" in done.stdout
        assert "m: " in done.stdout and "moving" not in done.stdout, done.stdout
        node = srv.nodes()["n1"]
        assert node["draining"] and node["drain_blocked"].startswith("its replicas keep"), node
        (placement,) = [m for m in srv.get("/api/v1/placement")["models"] if m["model"] == "m"]
        assert placement["active"] == 0 and placement["unplaced"] == 1, placement
        assert "1 on draining nodes keep serving" in placement["summary"], placement
        page = httpx.get(f"{srv.admin}/fleet", timeout=10).text
        assert "drain waiting: its replicas keep serving here" in page
        # It keeps serving meanwhile: nothing was drained for want of a replacement.
        assert srv.ready_replicas("m", 1)
        # Undone, the drain's explanation goes with it.
        assert post(srv, "/api/v1/nodes/n1/uncordon").status_code == 200
        assert srv.nodes()["n1"]["drain_blocked"] is None
