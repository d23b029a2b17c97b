"""The control plane through real processes: `llmgw-server` in control-plane mode,
`llmgw-agent` processes with pretended GPUs over the real gRPC transport, simulators
(`llmgw-sim`) as engines, and the official `openai` client on the client port.

The same scenarios run in one process on the stub transport in test_control_e2e.py;
here every byte crosses loopback sockets and every component is its own program, so
what is checked is the wiring a deployment gets: flags, config keys, the wire
protocol, process groups, pid records and the admin API that operators script
against. Timings are shrunk (reconcile every 200 ms, unreachable after 2 s, lost
after 5 s); every agent binds its engines to its own loopback address.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import httpx
import openai
import pytest

from llmgw.transport.pb import agent_pb2 as pb
from llmgw.transport.pb import agent_pb2_grpc
from tests.procs import (
    AgentProc,
    FleetPorts,
    FleetServer,
    agent,
    alive,
    engine_port_range,
    fleet_server,
    wait_for,
)

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")


def control_config(
    models: Sequence[str],
    *,
    unreachable: str = "2s",
    lost: str = "5s",
    base_backoff: str = "1s",
    max_backoff: str = "4s",
    extra: str = "",
) -> str:
    """A server configuration with short control timings and `models` (TOML)."""
    low, high = engine_port_range()
    return f"""
[router]
scrape_interval = "200ms"
scrape_timeout = "200ms"
drain_timeout = "20s"

[control]
interval = "200ms"
base_backoff = "{base_backoff}"
max_backoff = "{max_backoff}"
unreachable_after = "{unreachable}"
lost_after = "{lost}"
port_range = [{low}, {high}]
# Multi-node shards need the NCCL/Gloo interface on the node; loopback is everywhere.
mgmt_interface = "lo"
{extra}
{"".join(models)}
"""


def model(
    name: str = "m",
    replicas: int = 1,
    *,
    args: Sequence[str] = (),
    tensor_parallel: int = 1,
    gpus_per_node: int | None = None,
) -> str:
    """A model deployed on the simulator (TOML)."""
    per_node = f"gpus_per_node = {gpus_per_node}\n" if gpus_per_node is not None else ""
    return f"""
[[models]]
name = "{name}"
replicas = {replicas}

[[models.profiles]]
name = "sim"
engine = "sim"
weights = "sim"
tensor_parallel = {tensor_parallel}
{per_node}args = {json.dumps(list(args))}
"""


def client(srv: FleetServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base}/v1", api_key="unused", max_retries=0, timeout=30)


def complete(srv: FleetServer, model_name: str = "m", max_tokens: int = 3) -> None:
    """One completion through the server with the openai client, checked."""
    done = client(srv).completions.create(model=model_name, prompt="hello", max_tokens=max_tokens)
    assert done.model == model_name and done.choices[0].finish_reason == "length"
    assert done.usage is not None and done.usage.completion_tokens == max_tokens


def logs(*agents: AgentProc) -> list[Any]:
    return [a.proc for a in agents]


def shard(srv: FleetServer, node_id: str, replica_id: str) -> dict[str, Any] | None:
    for s in srv.nodes()[node_id]["shards"]:
        if s["replica_id"] == replica_id:
            return dict(s)
    return None


def commands(srv: FleetServer) -> dict[str, float]:
    """The commands the server issued to agents since it started, by kind."""
    kinds = ("start", "drain", "stop")
    return {kind: srv.metric("llmgw_fleet_commands_total", command=kind) for kind in kinds}


def considered_again(srv: FleetServer, node_ids: Sequence[str], passes: int = 5) -> None:
    """Wait until the server has run `passes` more reconcile passes and heard a heartbeat
    (the shard reports it acts on) from each of `node_ids` since the call: whatever it
    would decide to do about the fleet as it is now is decided, and counted, by then."""
    first = srv.metric("llmgw_fleet_reconcile_passes_total")
    since = time.time()

    def done() -> bool:
        nodes = srv.nodes()
        return srv.metric("llmgw_fleet_reconcile_passes_total") >= first + passes and all(
            nodes[n]["last_heartbeat"] > since for n in node_ids
        )

    srv.wait(done, f"{passes} more reconcile passes and a heartbeat from {', '.join(node_ids)}")


def environ(pid: int) -> dict[str, str]:
    """A process's environment (our own descendants' are readable)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


# -- 1. placed, ready, served ------------------------------------------------------------


def test_two_agents_a_model_is_placed_and_served_through_the_openai_client() -> None:
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(control_config([model("m", replicas=2)])))
        a1 = stack.enter_context(agent(srv.agent_address, "n1", address="127.0.0.11"))
        a2 = stack.enter_context(agent(srv.agent_address, "n2", address="127.0.0.12"))
        replicas = srv.wait(
            lambda: srv.ready_replicas("m", 2), "two ready replicas of m", logs=logs(a1, a2)
        )

        # One replica per node (one GPU each), each engine on its node's address.
        nodes = srv.nodes()
        assert set(nodes) == {"n1", "n2"}
        for node in nodes.values():
            assert node["state"] == "ready" and node["connected"], node
            assert node["gpus_total"] == 1 and node["gpus_allocated"] == 1, node
            # "sim" always; others (llamacpp) when this machine has them.
            assert "sim" in [e["name"] for e in node["engines"]], node
        placed = {r["nodes"][0]["node_id"]: r for r in replicas}
        assert set(placed) == {"n1", "n2"}
        for node_id, replica in placed.items():
            (where,) = replica["nodes"]
            assert replica["url"] == f"http://{nodes[node_id]['address']}:{where['port']}"
        # Each agent runs exactly the engine of its replica, as its pid records say.
        for a in (a1, a2):
            (name,) = a.engines()
            assert name.startswith(placed[a.node_id]["id"] + "-r0-")
            assert alive(a.engines()[name])
        # Both replicas are routed.
        assert {r["id"] for r in replicas} <= set(srv.endpoints())
        assert srv.metric("llmgw_fleet_nodes", state="ready") == 2

        c = client(srv)
        assert "m" in [m.id for m in c.models.list()]
        chat = c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=5
        )
        assert chat.choices[0].message.content
        assert chat.usage is not None and chat.usage.completion_tokens == 5

        stream = c.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "stream please"}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage, finish = [], None, None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        assert "".join(text) and finish == "length"
        assert usage is not None and usage.completion_tokens == 8
        complete(srv, "m", 3)
        # Agents heartbeat often enough for unreachable_after = 2 s: no node ever flapped
        # (with a fixed 5 s heartbeat every node went unreachable, then lost, in a loop).
        assert "unreachable: silent for" not in srv.proc.output()  # controller._log_expired
        assert all(n["state"] == "ready" for n in srv.nodes().values())


# -- 2. a multi-node replica in one fabric -----------------------------------------------


def test_a_two_node_replica_is_placed_inside_one_fabric_with_consistent_ranks() -> None:
    with ExitStack() as stack:
        srv = stack.enter_context(
            fleet_server(
                control_config([model("big", tensor_parallel=2, gpus_per_node=1)]),
            )
        )
        # The odd one out registers first: a placement ignoring fabrics could pick it.
        c = stack.enter_context(agent(srv.agent_address, "c", address="127.0.0.23", fabric="ib-b"))
        a = stack.enter_context(agent(srv.agent_address, "a", address="127.0.0.21", fabric="ib-a"))
        b = stack.enter_context(agent(srv.agent_address, "b", address="127.0.0.22", fabric="ib-a"))
        agents = {x.node_id: x for x in (a, b, c)}
        (replica,) = srv.wait(
            lambda: srv.ready_replicas("big", 1), "the 2-node replica ready", logs=logs(a, b, c)
        )
        nodes = srv.nodes()
        assert nodes["a"]["fabrics"] == nodes["b"]["fabrics"] == ["ib-a"]
        assert nodes["c"]["fabrics"] == ["ib-b"]

        # The controller's view: two nodes of ib-a, ranks 0 and 1, one GPU each; the
        # distributed-init port lives on rank 0's node only.
        by_rank = {n["rank"]: n for n in replica["nodes"]}
        assert sorted(by_rank) == [0, 1]
        assert {n["node_id"] for n in replica["nodes"]} == {"a", "b"}
        head, worker = by_rank[0], by_rank[1]
        assert head["gpu_indices"] == worker["gpu_indices"] == [0]
        assert head["dist_port"] is not None and worker["dist_port"] is None
        assert head["dist_port"] != head["port"]
        head_address = nodes[head["node_id"]]["address"]
        assert replica["url"] == f"http://{head_address}:{head['port']}"
        assert nodes["c"]["shards"] == [] and nodes["c"]["gpus_allocated"] == 0

        # The agents' view: each runs its rank of the same epoch; only rank 0 serves.
        for rank, where in by_rank.items():
            s = shard(srv, where["node_id"], replica["id"])
            assert s is not None, nodes[where["node_id"]]
            assert (s["rank"], s["epoch"], s["state"]) == (rank, replica["epoch"], "ready"), s
            assert s["port"] == where["port"] and s["gpu_indices"] == [0]
            assert s["endpoint_url"] == (replica["url"] if rank == 0 else None), s
            # And the engines' environment: its GPU, and NCCL/Gloo on the management
            # interface (multi-node only).
            (pid,) = agents[where["node_id"]].engines().values()
            env = environ(pid)
            assert env["CUDA_VISIBLE_DEVICES"] == "0"
            assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "lo"
        assert c.engines() == {}
        complete(srv, "big")


# -- 3. an agent dies --------------------------------------------------------------------


def test_a_killed_agent_goes_unreachable_then_lost_and_its_replica_moves() -> None:
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(control_config([model("m", replicas=1)])))
        agents = {
            a.node_id: a
            for a in (
                stack.enter_context(agent(srv.agent_address, "n1", address="127.0.0.31")),
                stack.enter_context(agent(srv.agent_address, "n2", address="127.0.0.32")),
            )
        }
        (first,) = srv.wait(
            lambda: srv.ready_replicas("m", 1), "m ready", logs=logs(*agents.values())
        )
        victim_id = first["nodes"][0]["node_id"]
        victim = agents[victim_id]
        (survivor_id,) = set(agents) - {victim_id}
        (engine_pid,) = victim.engines().values()

        # SIGKILL the agent alone: its engine is in a process group of its own.
        victim.proc.kill(signal.SIGKILL)
        victim.proc.popen.wait(10)
        killed_at = time.monotonic()
        assert alive(engine_pid)

        # Unreachable first: the replica stays routed and serves (its engine lives).
        srv.wait(
            lambda: srv.nodes()[victim_id]["state"] == "unreachable",
            f"{victim_id} unreachable",
            timeout=10,
        )
        assert time.monotonic() - killed_at < 5, "unreachable only after lost_after"
        assert [r["id"] for r in srv.ready_replicas("m", 1)] == [first["id"]]
        complete(srv)

        # Then lost: the replica is placed again, on the survivor, and serves.
        srv.wait(lambda: srv.nodes()[victim_id]["state"] == "lost", f"{victim_id} lost")
        (moved,) = srv.wait(
            lambda: [
                r for r in srv.ready_replicas("m", 1) if r["nodes"][0]["node_id"] == survivor_id
            ],
            f"m ready again on {survivor_id}",
            logs=logs(*agents.values()),
        )
        assert moved["id"] != first["id"] and moved["epoch"] > first["epoch"]
        assert srv.endpoints().keys() & {first["id"], moved["id"]} == {moved["id"]}
        assert srv.nodes()[victim_id]["shards"] == []
        complete(srv)

        # Nothing supervises the old engine now. An agent started again with the same
        # state directory finds its record, adopts it (it is healthy) and reports it;
        # the server, which placed the replica elsewhere meanwhile, has it stopped.
        assert alive(engine_pid)
        again = stack.enter_context(
            agent(srv.agent_address, victim_id, address="127.0.0.31", state_dir=victim.state_dir)
        )
        wait_for(
            lambda: not alive(engine_pid),
            "the orphaned engine stopped by the restarted agent",
            15,
            context=again.proc.output,
        )
        assert "left running by a previous agent" in again.proc.output()
        srv.wait(
            lambda: srv.nodes()[victim_id]["state"] == "ready",
            f"{victim_id} registered again",
            logs=[again.proc],
        )
        # The replica stays where it moved: a returning node does not pull it back.
        assert [r["id"] for r in srv.ready_replicas("m", 1)] == [moved["id"]]


# -- 4. the server restarts under load ---------------------------------------------------


StreamOutcome = tuple[list[str], str | None] | BaseException


def _stream(srv: FleetServer, out: queue.Queue[StreamOutcome], first: threading.Event) -> None:
    """A long streamed completion; puts (text pieces, finish reason) or the error."""
    try:
        pieces: list[str] = []
        finish: str | None = None
        stream = client(srv).completions.create(
            model="m", prompt="tell me a long story", max_tokens=160, stream=True
        )
        for chunk in stream:
            for choice in chunk.choices:
                pieces.append(choice.text)
                finish = choice.finish_reason or finish
            first.set()
        out.put((pieces, finish))
    except Exception as exc:
        out.put(exc)
    finally:
        first.set()


def test_a_server_restart_drains_streams_and_adopts_running_replicas() -> None:
    # Every decode step takes 25 ms: a 160-token answer streams for about 4 s.
    config = control_config(
        [model("m", replicas=2, args=["--decode-step-ms", "25"])], unreachable="3s", lost="8s"
    )
    with ExitStack() as stack:
        ports = stack.enter_context(FleetPorts.reserved())  # kept for the new server
        srv = stack.enter_context(fleet_server(config, ports=ports))
        a1 = stack.enter_context(
            agent(srv.agent_address, "n1", address="127.0.0.41", max_backoff="500ms")
        )
        a2 = stack.enter_context(
            agent(srv.agent_address, "n2", address="127.0.0.42", max_backoff="500ms")
        )
        before = srv.wait(lambda: srv.ready_replicas("m", 2), "m ready twice", logs=logs(a1, a2))
        pids = {a.node_id: a.engines() for a in (a1, a2)}
        assert all(len(p) == 1 for p in pids.values()), pids

        # A client streams; the server is told to stop in the middle of it.
        results: queue.Queue[StreamOutcome] = queue.Queue()
        first = threading.Event()
        streamer = threading.Thread(target=_stream, args=(srv, results, first), daemon=True)
        streamer.start()
        assert first.wait(15)
        srv.proc.kill(signal.SIGTERM)
        # It drains: the stream in flight ends normally, then the server exits.
        outcome = results.get(timeout=30)
        assert not isinstance(outcome, BaseException), outcome
        pieces, finish = outcome
        assert finish == "length" and len(pieces) >= 100, (finish, len(pieces))
        assert srv.proc.popen.wait(30) == 0, srv.proc.output()[-3000:]
        assert "draining" in srv.proc.output()

        # No control plane now: the engines still serve, straight from their URLs.
        for replica in before:
            r = httpx.post(
                f"{replica['url']}/v1/completions",
                json={"model": "m", "prompt": "x", "max_tokens": 2},
                timeout=10,
            )
            assert r.status_code == 200, r.text

        # A new server in its place: the agents reconnect and it adopts their replicas.
        srv2 = stack.enter_context(fleet_server(config, ports=ports))
        after = srv2.wait(
            lambda: srv2.ready_replicas("m", 2),
            "both replicas adopted",
            logs=logs(a1, a2),
        )
        assert sorted((r["id"], r["epoch"], r["url"]) for r in after) == sorted(
            (r["id"], r["epoch"], r["url"]) for r in before
        )
        assert "adopting replica" in srv2.proc.output()
        assert all(n["connected"] for n in srv2.nodes().values())
        # Not restarted: the same engine processes, and no second launch.
        for a in (a1, a2):
            assert a.engines() == pids[a.node_id]
            assert all(alive(pid) for pid in pids[a.node_id].values())
            assert len(a.engine_logs()) == 1
            # The agent logs the restart as it re-registers, which may come a moment
            # after the server shows the replica adopted.
            wait_for(
                lambda a=a: "the server restarted" in a.proc.output(),
                f"{a.node_id} logs that the server restarted",
                context=a.proc.output,
            )
        complete(srv2)
        # And nothing is stopped after the fact: the server looked again and decided
        # nothing, in its whole run (adopting needs no command).
        considered_again(srv2, ["n1", "n2"])
        assert commands(srv2) == {"start": 0, "drain": 0, "stop": 0}
        assert [a.engines() for a in (a1, a2)] == [pids["n1"], pids["n2"]]
        assert len(srv2.ready_replicas("m", 2)) == 2


def test_a_node_back_after_the_settle_window_does_not_pass_for_a_new_replica() -> None:
    """A node that still runs a replica of the old server's and comes back after the new
    server placed a replacement elsewhere: the old engine is adopted as surplus and
    drained away, and the replacement keeps serving (never the wrong engine published,
    never the healthy replica dropped)."""
    config = control_config([model("m")], unreachable="3s", lost="8s")
    with ExitStack() as stack:
        ports = stack.enter_context(FleetPorts.reserved())  # kept for the new server
        srv = stack.enter_context(fleet_server(config, ports=ports))
        agents = {
            a.node_id: a
            for a in (
                stack.enter_context(
                    agent(srv.agent_address, "n1", address="127.0.0.45", max_backoff="500ms")
                ),
                stack.enter_context(
                    agent(srv.agent_address, "n2", address="127.0.0.46", max_backoff="500ms")
                ),
            )
        }
        (old,) = srv.wait(
            lambda: srv.ready_replicas("m", 1), "m ready", logs=logs(*agents.values())
        )
        late_id = old["nodes"][0]["node_id"]
        late = agents[late_id]
        (other_id,) = set(agents) - {late_id}
        (stray_pid,) = late.engines().values()

        # The node holding m-r1 freezes (its engine serves on) while the server restarts.
        os.kill(late.proc.pid, signal.SIGSTOP)
        stack.callback(os.kill, late.proc.pid, signal.SIGCONT)  # never leave it stopped
        srv.proc.kill(signal.SIGKILL)
        srv.proc.popen.wait(10)
        srv2 = stack.enter_context(fleet_server(config, ports=ports))
        (new,) = srv2.wait(
            lambda: srv2.ready_replicas("m", 1), "m placed again", logs=logs(*agents.values())
        )
        assert new["nodes"][0]["node_id"] == other_id
        # Epochs start from the wall clock: the new run's replica cannot collide with the
        # old one's (it did when both started counting at 1).
        assert new["id"] != old["id"] and new["epoch"] > old["epoch"]
        (new_pid,) = agents[other_id].engines().values()

        # The frozen node comes back: its engine of the old run is stopped.
        os.kill(late.proc.pid, signal.SIGCONT)
        wait_for(lambda: not alive(stray_pid), "the stray engine stopped", context=late.proc.output)
        srv2.wait(lambda: srv2.nodes()[late_id]["connected"], f"{late_id} registered")
        (still,) = srv2.ready_replicas("m", 1)
        assert still["url"] == new["url"] and still["nodes"][0]["node_id"] == other_id
        assert srv2.endpoints()[new["id"]]["url"] == new["url"]
        assert agents[other_id].engines() == {f"{new['id']}-r0-e{new['epoch']}": new_pid}
        assert alive(new_pid)
        complete(srv2)


def test_a_node_back_after_the_settle_window_with_no_replacement_has_its_replica_adopted() -> None:
    """The server restarts while the only node's agent is away (frozen); the new server's
    settle window passes without it, and with no other node nothing replaces its
    replica. When the agent comes back, that replica is adopted as it runs: the same
    id, epoch, URL and engine process (not stopped as a stranger, not restarted), and
    the server routes to it again."""
    config = control_config([model("m")], unreachable="2s", lost="5s")
    with ExitStack() as stack:
        ports = stack.enter_context(FleetPorts.reserved())  # kept for the new server
        srv = stack.enter_context(fleet_server(config, ports=ports))
        a = stack.enter_context(
            agent(srv.agent_address, "n1", address="127.0.0.47", max_backoff="500ms")
        )
        (old,) = srv.wait(lambda: srv.ready_replicas("m", 1), "m ready", logs=[a.proc])
        engines = a.engines()
        (engine_pid,) = engines.values()

        os.kill(a.proc.pid, signal.SIGSTOP)
        stack.callback(os.kill, a.proc.pid, signal.SIGCONT)  # never leave it stopped
        srv.proc.kill(signal.SIGKILL)
        srv.proc.popen.wait(10)
        srv2 = stack.enter_context(fleet_server(config, ports=ports))
        # The controller places nothing before its settle window ends; a model it could
        # not place means the window is over, with the node still away.
        srv2.wait(
            lambda: (srv2.model_counts("m") or {}).get("unplaced") == 1,
            "m unplaceable after the settle window",
            timeout=15,
        )
        assert srv2.nodes() == {} and srv2.replicas("m") == []
        assert alive(engine_pid)

        os.kill(a.proc.pid, signal.SIGCONT)
        (back,) = srv2.wait(lambda: srv2.ready_replicas("m", 1), "m adopted", logs=[a.proc])
        assert (back["id"], back["epoch"], back["url"]) == (old["id"], old["epoch"], old["url"])
        assert f"adopting replica {old['id']}" in srv2.proc.output()
        wait_for(
            lambda: "the server restarted" in a.proc.output(),
            "the agent logs that the server restarted",
            context=a.proc.output,
        )
        complete(srv2)
        # Adopted for good: the server looked again and decided nothing, in its whole
        # run (no stop, and no launch: there was no other node to place it on).
        considered_again(srv2, ["n1"])
        assert commands(srv2) == {"start": 0, "drain": 0, "stop": 0}
        assert a.engines() == engines and alive(engine_pid)
        assert len(a.engine_logs()) == 1
        assert [r["id"] for r in srv2.ready_replicas("m", 1)] == [old["id"]]
        assert srv2.endpoints()[old["id"]]["url"] == old["url"]
        complete(srv2)


# -- 5. an engine that crashes at start ----------------------------------------------------


def test_an_engine_crashing_at_start_is_reported_with_its_output_and_retried_with_backoff() -> None:
    config = control_config([model("m", args=["--no-such-flag"])])
    with fleet_server(config) as srv, agent(srv.agent_address, "n1", address="127.0.0.51") as a:

        def failed() -> list[dict[str, Any]]:
            return [
                s for s in srv.nodes().get("n1", {}).get("shards", []) if s["state"] == "failed"
            ]

        (crash, *_) = srv.wait(failed, "a failed shard on n1", logs=[a.proc])
        assert crash["exit_code"] == 2, crash
        assert "before it was ready" in crash["message"], crash
        assert "unrecognized arguments: --no-such-flag" in crash["message"], crash
        assert any("--no-such-flag" in line for line in crash["output_tail"]), crash

        # The model backs off, doubling: seen in /api/v1/replicas and /api/v1/placement.
        seen: list[float] = []

        def backoff() -> float | None:
            counts = srv.model_counts("m")
            value = counts["backoff_seconds"] if counts else None
            if value:
                seen.append(value)
            return value

        srv.wait(backoff, "m backing off", timeout=10)
        placement = {m["model"]: m for m in srv.get("/api/v1/placement")["models"]}
        # Listed while it keeps failing, backing off or trying again alike.
        assert placement["m"]["failed_starts"] >= 1, placement
        summary = placement["m"]["summary"]
        assert "backing off after" in summary or "starting again after" in summary, summary
        # It retries: a second, then a third launch (new epochs), each crashing.
        srv.wait(lambda: len(a.engine_logs()) >= 3, "three attempts", timeout=25, logs=[a.proc])

        def doubled() -> bool:  # the second backoff is 2 s
            backoff()
            return max(seen) > 1.0

        srv.wait(doubled, "m's backoff doubled past 1 s", timeout=10)
        assert max(seen) <= 4.0, seen
        assert srv.ready_replicas("m") == []
        assert a.engines() == {}  # every crashed engine was reaped and forgotten
        epochs = {s["epoch"] for s in failed()}
        assert len(epochs) >= 2, failed()


# -- 6. a profile the adapter rejects ------------------------------------------------------


def test_a_profile_the_adapter_rejects_fails_fast_without_launching() -> None:
    config = control_config([model("m", args=["--port", "1234"])])
    with fleet_server(config) as srv, agent(srv.agent_address, "n1", address="127.0.0.61") as a:

        def rejected() -> list[dict[str, Any]]:
            return [
                s for s in srv.nodes().get("n1", {}).get("shards", []) if s["state"] == "failed"
            ]

        (reject, *_) = srv.wait(rejected, "a rejected shard on n1", logs=[a.proc])
        assert reject["message"].startswith("not started: "), reject
        assert "argument --port is set by the agent for sim" in reject["message"], reject
        assert reject["exit_code"] is None and reject["output_tail"] == [], reject
        srv.wait(
            lambda: (srv.model_counts("m") or {}).get("backoff_seconds"),
            "m backing off",
            timeout=10,
        )
        # Nothing was ever launched: no engine log, no pid record, no process.
        assert a.engine_logs() == [] and a.engines() == {}
        assert "command c" in srv.proc.output() and "failed: argument --port" in (srv.proc.output())
        assert not any(
            "llmgw_cli.sim" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
            for pid in _children(a.proc.pid)
        )


def _children(pid: int) -> Iterator[int]:
    """Processes whose parent is `pid`."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(b") ", 1)[-1].split()[1]) == pid:
                yield int(entry.name)


# -- 8. a stock grpcio agent ---------------------------------------------------------------


def test_a_grpcio_only_client_registers_with_the_server_and_gets_commands() -> None:
    """Nothing of llmgw on the client side but the generated code: a plain channel, the
    generated stub and protobuf messages, as an agent written in another language."""
    with fleet_server(control_config([model("m")])) as srv:
        requests: queue.Queue[pb.ConnectRequest | None] = queue.Queue()

        def outgoing() -> Iterator[pb.ConnectRequest]:
            while (request := requests.get()) is not None:
                yield request

        node = pb.NodeInfo(
            node_id="plain-1",
            hostname="plain",
            address="127.0.0.81",
            agent_version="0.0-plain",
            fabrics=["ib-x"],
            gpus=[pb.Gpu(index=0, uuid="GPU-plain-0", name="NVIDIA H100", memory_total=80 << 30)],
            engines=[pb.EngineInfo(name="sim", version="1")],
        )
        with grpc.insecure_channel(srv.agent_address) as channel:
            responses = agent_pb2_grpc.AgentServiceStub(channel).Connect(outgoing(), timeout=30)
            requests.put(pb.ConnectRequest(register=pb.Register(node=node)))
            first = next(responses)
            assert first.WhichOneof("payload") == "registered"
            interval = first.registered.heartbeat_interval
            # At least three heartbeats per unreachable_after (2 s here).
            assert 0 < interval.seconds + interval.nanos / 1e9 <= 2 / 3 + 1e-6
            assert first.registered.server_epoch

            # Heartbeats as often as the server asked, from another thread.
            leaving = threading.Event()

            def heartbeats() -> None:
                seq = 0
                while not leaving.wait(interval.seconds + interval.nanos / 1e9):
                    seq += 1
                    requests.put(pb.ConnectRequest(heartbeat=pb.Heartbeat(seq=seq)))

            beating = threading.Thread(target=heartbeats, daemon=True)
            beating.start()
            seen = srv.wait(lambda: srv.nodes().get("plain-1"), "plain-1 in the inventory")
            assert seen["state"] == "ready" and seen["connected"], seen
            assert seen["agent_version"] == "0.0-plain" and seen["fabrics"] == ["ib-x"]
            assert seen["gpus"][0]["uuid"] == "GPU-plain-0"

            # The controller places m on it: a StartShard arrives over the stream.
            start = next(responses)
            assert start.WhichOneof("payload") == "start_shard", start
            cmd = start.start_shard
            assert (cmd.model, cmd.rank, cmd.node_count) == ("m", 0, 1)
            assert cmd.profile.engine == "sim" and list(cmd.gpu_indices) == [0]
            # Answer as an agent would: accepted, then ready at a URL.
            requests.put(
                pb.ConnectRequest(
                    command_result=pb.CommandResult(command_id=cmd.command_id, ok=True)
                )
            )
            requests.put(
                pb.ConnectRequest(
                    shard_status=pb.ShardStatus(
                        replica_id=cmd.replica_id,
                        rank=0,
                        epoch=cmd.epoch,
                        state=pb.SHARD_STATE_READY,
                        model="m",
                        endpoint_url=f"http://127.0.0.81:{cmd.port}",
                        port=cmd.port,
                    )
                )
            )
            (ready,) = srv.wait(lambda: srv.ready_replicas("m", 1), "m ready on plain-1")
            assert ready["id"] == cmd.replica_id and ready["url"].endswith(f":{cmd.port}")
            leaving.set()
            beating.join()
            requests.put(None)  # half-close: the agent leaves
            for _ in responses:  # the server ends the stream
                pass
        srv.wait(lambda: not srv.nodes()["plain-1"]["connected"], "plain-1 disconnected")
