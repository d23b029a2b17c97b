"""The agent over the stub transport, against a scripted server: registration with the
inventory, heartbeats, commands with real simulator processes, rejection without
launching, reconnects with backoff that keep engines running, and shutdown."""

from __future__ import annotations

import logging
import os
import random
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trio
import trio.testing

from llmgw.agent.adapters import SimAdapter, VllmAdapter
from llmgw.agent.agent import (
    ANSWER_FLOOR,
    SEARCH_BACKOFF,
    Agent,
    NodeSettings,
    _interface_problem,
    backoff_delay,
)
from llmgw.agent.discovery import DiscoveryError
from llmgw.agent.servers import Servers
from llmgw.config import DeploymentProfile
from llmgw.domain.fleet import Gpu, ShardState
from llmgw.testing.procs import reserve_port
from llmgw.transport.base import AgentConnection
from llmgw.transport.messages import (
    AgentMessage,
    CommandResult,
    DrainShard,
    Heartbeat,
    Register,
    Registered,
    ShardStatus,
    StartShard,
    StopShard,
)
from llmgw.transport.stub import StubNetwork
from tests.waiting import wait_until

M = TypeVar("M")
NODE = "n1"
GIB = 2**30


class ScriptedServer:
    """Plays the control plane: answers registrations, records everything, sends what a
    test tells it to."""

    def __init__(self, heartbeat: float = 0.1) -> None:
        self.heartbeat = heartbeat
        self.answer = True  # send Registered
        self.received: list[tuple[int, AgentMessage]] = []  # (connection number, message)
        self.connections = 0
        self.conn: AgentConnection | None = None
        self._changed = trio.Event()

    async def handle(self, conn: AgentConnection) -> None:
        self.connections += 1
        number = self.connections
        self.conn = conn
        self._add(number, await conn.receive())
        if self.answer:
            await conn.send(Registered(self.heartbeat, "server-1"))
        while True:
            self._add(number, await conn.receive())

    def _add(self, number: int, message: AgentMessage) -> None:
        self.received.append((number, message))
        self._changed.set()
        self._changed = trio.Event()

    async def send(self, message: Any) -> None:
        assert self.conn is not None
        await self.conn.send(message)

    async def wait_for(
        self,
        kind: type[M],
        predicate: Callable[[M], bool] = lambda m: True,
        *,
        connection: int | None = None,
    ) -> M:
        seen = 0
        while True:
            for number, message in self.received[seen:]:
                if (
                    isinstance(message, kind)
                    and (connection is None or number == connection)
                    and predicate(message)
                ):
                    return message
            seen = len(self.received)
            await self._changed.wait()

    async def status(self, state: ShardState, replica: str = "m-r1") -> ShardStatus:
        return await self.wait_for(
            ShardStatus, lambda s: s.state is state and s.replica_id == replica
        )

    async def result(self, command_id: str) -> CommandResult:
        return await self.wait_for(CommandResult, lambda r: r.command_id == command_id)


@asynccontextmanager
async def running_agent(
    tmp_path: Path, *, server: ScriptedServer | None = None, **kw: Any
) -> AsyncIterator[tuple[StubNetwork, ScriptedServer, Agent]]:
    network = StubNetwork(wire_check=True)  # every message also crosses protobuf and back
    server = server or ScriptedServer()
    settings = NodeSettings(
        node_id=NODE,
        address="127.0.0.1",
        hostname="host-1",
        labels={"zone": "a"},
        fabrics=("ib-a",),
        fake_gpus="2x80GB:H100",
    )
    kw.setdefault("base_backoff", 0.05)
    kw.setdefault("max_backoff", 0.4)
    agent = Agent(
        network.connector(NODE),
        settings,
        state_dir=tmp_path / "state",
        adapters={"sim": SimAdapter(), "vllm": VllmAdapter(command=("/nonexistent/vllm",))},
        health_interval=0.05,
        shutdown_grace=5.0,
        rng=random.Random(7),
        **kw,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(network.listener().serve, server.handle)
        await nursery.start(agent.run)
        yield network, server, agent
        nursery.cancel_scope.cancel()


@pytest.fixture
def reserve() -> Iterator[Callable[[], int]]:
    """Reserves loopback ports until the test ends (llmgw.testing.procs.reserve_port): an
    engine started by a command binds its port by number, and nothing else can take
    that port first."""
    with ExitStack() as stack:
        yield lambda: stack.enter_context(reserve_port())


def start_sim(
    port: int,
    *,
    replica: str = "m-r1",
    epoch: int = 1,
    command_id: str = "c1",
    args: tuple[str, ...] = (),
    gpus: tuple[int, ...] = (0,),
    engine: str = "sim",
    **kw: Any,
) -> StartShard:
    return StartShard(
        command_id=command_id,
        replica_id=replica,
        rank=kw.pop("rank", 0),
        epoch=epoch,
        model="m",
        profile=DeploymentProfile(name="p-sim", engine=engine, weights="w", args=args),
        gpu_indices=gpus,
        port=port,
        **kw,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_registers_the_whole_inventory_and_heartbeats(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with running_agent(tmp_path) as (_network, server, agent):
            register = await server.wait_for(Register)
            beats = [await server.wait_for(Heartbeat, lambda h, n=n: h.seq == n) for n in (1, 2)]
    node = register.node
    assert (node.node_id, node.hostname, node.address) == (NODE, "host-1", "127.0.0.1")
    assert node.labels == {"zone": "a"} and node.fabrics == ("ib-a",)
    assert [(g.index, g.name) for g in node.gpus] == [(0, "H100"), (1, "H100")]
    assert [e.name for e in node.engines] == ["sim"]  # vLLM is not installed here
    assert node.agent_version
    assert register.shards == ()
    assert beats[0].gpus == node.gpus
    assert agent.heartbeat_interval == 0.1  # from Registered


def _gpu(n: int) -> Gpu:
    """The one GPU as the n-th discovery sees it: every reading different."""
    return Gpu(
        index=0,
        uuid="GPU-0",
        name="H100",
        memory_total=80 * GIB,
        memory_used=n * GIB,
        utilization=n / 10,
        ecc_errors=n,
    )


async def test_gpus_are_discovered_again_for_every_heartbeat(tmp_path: Path) -> None:
    calls = 0

    async def discover_gpus() -> tuple[Gpu, ...]:
        nonlocal calls
        calls += 1
        return (_gpu(calls),)

    with trio.fail_after(20):
        async with running_agent(tmp_path, discover_gpus=discover_gpus) as (_n, server, _a):
            register = await server.wait_for(Register)
            beats = [await server.wait_for(Heartbeat, lambda h, n=n: h.seq == n) for n in (1, 2, 3)]
    # Once at start (what registration carries), then once before each heartbeat.
    assert register.node.gpus == (_gpu(1),)
    assert [b.gpus for b in beats] == [(_gpu(2),), (_gpu(3),), (_gpu(4),)]


async def test_a_failed_or_hung_discovery_keeps_the_last_gpus_and_the_heartbeats(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmgw.agent.agent")
    calls = 0

    async def discover_gpus() -> tuple[Gpu, ...]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise DiscoveryError("nvidia-smi exited with code 9: driver gone")
        if calls == 3:
            await trio.sleep_forever()  # a GPU off the bus: bounded by half a heartbeat
        return (_gpu(calls),)

    with trio.fail_after(20):
        async with running_agent(tmp_path, discover_gpus=discover_gpus) as (_n, server, _a):
            beats = [await server.wait_for(Heartbeat, lambda h, n=n: h.seq == n) for n in (1, 2, 3)]
    assert [b.gpus for b in beats] == [(_gpu(1),), (_gpu(1),), (_gpu(4),)]
    said = [r.getMessage() for r in caplog.records if "GPU discovery" in r.getMessage()]
    assert said == [
        "GPU discovery failed (keeping the last known GPUs): "
        "nvidia-smi exited with code 9: driver gone",
        "GPU discovery failed (keeping the last known GPUs): GPU discovery took longer than 0.2s",
        "GPU discovery works again",
    ]


async def test_start_ready_serve_stop(tmp_path: Path, reserve: Callable[[], int]) -> None:
    port = reserve()
    with trio.fail_after(30):
        async with running_agent(tmp_path) as (_network, server, _agent):
            await server.wait_for(Register)
            await server.send(start_sim(port))
            assert (await server.result("c1")).ok
            ready = await server.status(ShardState.READY)
            assert ready.endpoint_url == f"http://127.0.0.1:{port}"
            pid = ready.pid
            assert pid is not None and alive(pid)
            async with httpx.AsyncClient(base_url=ready.endpoint_url, timeout=10) as client:
                r = await client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
                assert r.status_code == 200
            # Heartbeats summarise the running shard.
            beat = await server.wait_for(
                Heartbeat, lambda h: any(s.state is ShardState.READY for s in h.shards)
            )
            assert beat.shards[0].pid == pid
            await server.send(StopShard("c2", "m-r1", 0, 1, grace=5))
            assert (await server.result("c2")).ok
            stopped = await server.status(ShardState.STOPPED)
            assert stopped.exit_code == 0
            assert not alive(pid)


async def test_rejected_profiles_fail_fast_without_launching(
    tmp_path: Path, reserve: Callable[[], int]
) -> None:
    with trio.fail_after(20):
        async with running_agent(tmp_path) as (_network, server, agent):
            await server.wait_for(Register)
            # vLLM is not installed; GPU 5 does not exist; an argument the agent sets.
            await server.send(start_sim(reserve(), engine="vllm", command_id="a"))
            await server.send(start_sim(reserve(), gpus=(5,), command_id="b", replica="m-r2"))
            await server.send(
                start_sim(reserve(), args=("--port", "1"), command_id="c", replica="m-r3")
            )
            await server.send(
                start_sim(reserve(), engine="llamacpp", command_id="d", replica="m-r4")
            )
            results = [await server.result(c) for c in "abcd"]
            failed = [await server.status(ShardState.FAILED, r) for r in ("m-r1", "m-r2", "m-r3")]
            assert agent.supervisor.launched == 0
    assert not any(r.ok for r in results)
    assert "vllm is not installed on this node" in results[0].message
    assert "GPU 5 not on this node (it has GPU indices: 0, 1)" in results[1].message
    assert "argument --port is set by the agent" in results[2].message
    assert "engine 'llamacpp' is not supported by this agent" in results[3].message
    assert failed[0].message.startswith("not started: ")
    assert "vllm is not installed" in failed[0].message
    assert (failed[0].profile, failed[0].port, failed[0].pid) == ("p-sim", failed[0].port, None)
    assert not list((tmp_path / "state" / "logs").iterdir())


async def test_node_conflicts_are_rejected(tmp_path: Path, reserve: Callable[[], int]) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    port = reserve()
    try:
        with trio.fail_after(20):
            async with running_agent(tmp_path) as (_network, server, agent):
                await server.wait_for(Register)
                await server.send(start_sim(port))
                await server.status(ShardState.READY)
                await server.send(start_sim(port, replica="m-r2", command_id="c2"))
                await server.send(start_sim(taken, replica="m-r3", command_id="c3", gpus=(1,)))
                await server.send(
                    start_sim(
                        reserve(),
                        replica="m-r4",
                        command_id="c4",
                        gpus=(1,),
                        node_count=2,
                        master_address="127.0.0.1",
                        master_port=reserve(),
                        mgmt_interface="no-such-if0",
                    )
                )
                r2, r3, r4 = [await server.result(c) for c in ("c2", "c3", "c4")]
                assert agent.supervisor.launched == 1
                # Only a port another process holds is reported busy: the server
                # avoids it there. Its own shards' ports it knows already.
                r3_failed = await server.status(ShardState.FAILED, "m-r3")
                assert r3_failed.busy_ports == (taken,)
                assert (await server.status(ShardState.FAILED, "m-r2")).busy_ports == ()
    finally:
        busy.close()
    assert "GPU 0 is in use by replica m-r1 rank 0 (epoch 1)" in r2.message
    assert f"port {port} is in use by replica m-r1 rank 0 (epoch 1)" in r2.message
    assert f"port {taken} on 127.0.0.1 is in use by another process" in r3.message
    assert "network interface 'no-such-if0' (for NCCL/Gloo) is not on this node" in r4.message


async def test_repeated_stale_and_unknown_commands(
    tmp_path: Path, reserve: Callable[[], int]
) -> None:
    with trio.fail_after(30):
        async with running_agent(tmp_path) as (_network, server, _agent):
            await server.wait_for(Register)
            await server.send(start_sim(reserve(), epoch=2))
            await server.status(ShardState.READY)
            await server.send(start_sim(reserve(), epoch=2, command_id="again"))
            await server.send(start_sim(reserve(), epoch=1, command_id="stale"))
            await server.send(StopShard("old", "m-r1", 0, 1))
            await server.send(StopShard("gone", "nothing", 0, 1))
            await server.send(DrainShard("gone2", "nothing", 0, 1))
            again, stale, old, gone, gone2 = [
                await server.result(c) for c in ("again", "stale", "old", "gone", "gone2")
            ]
            # A shard it knows nothing of is reported stopped: the server, which asks
            # again while it heard nothing of the end (the report may have been
            # lost), hears it has ended.
            ended = await server.status(ShardState.STOPPED, replica="nothing")
            assert (ended.rank, ended.epoch) == (0, 1)
    assert (again.ok, again.message) == (True, "already running")
    assert (stale.ok, stale.message) == (False, "stale: this node runs epoch 2 of m-r1")
    assert (old.ok, old.message) == (False, "this node runs epoch 2, not 1")
    assert (gone.ok, gone.message) == (True, "not running on this node")
    assert gone2.ok


async def test_crash_at_start_reported_with_the_engines_error(
    tmp_path: Path, reserve: Callable[[], int]
) -> None:
    with trio.fail_after(20):
        async with running_agent(tmp_path) as (_network, server, agent):
            await server.wait_for(Register)
            await server.send(start_sim(reserve(), args=("--no-such-flag",)))
            assert (await server.result("c1")).ok  # accepted: the engine itself refuses it
            failed = await server.status(ShardState.FAILED)
            # Forgotten once a heartbeat has carried the end too.
            await wait_until(lambda: agent.supervisor.shards == {}, "the failed shard forgotten")
    assert failed.exit_code == 2
    assert any("unrecognized arguments: --no-such-flag" in line for line in failed.output_tail)


async def test_an_end_whose_report_is_lost_is_carried_by_the_next_heartbeat(
    tmp_path: Path, reserve: Callable[[], int]
) -> None:
    # The server re-derives from heartbeats: had the agent forgotten the shard when its
    # last ShardStatus was sent, a lost one would leave the server waiting forever for
    # the end of a drain (tests/test_lossy_fleet.py).
    with trio.fail_after(30):
        async with running_agent(tmp_path) as (network, server, agent):
            await server.wait_for(Register)
            await server.send(start_sim(reserve()))
            await server.status(ShardState.READY)
            network.drop = lambda _node, m: ended(m)
            await server.send(StopShard("c2", "m-r1", 0, 1, grace=5))
            beat = await server.wait_for(
                Heartbeat, lambda h: any(s.state is ShardState.STOPPED for s in h.shards)
            )
            assert [(s.replica_id, s.epoch) for s in beat.shards] == [("m-r1", 1)]
            await wait_until(lambda: agent.supervisor.shards == {}, "the stopped shard forgotten")
    assert network.stats.dropped == 1  # the STOPPED status itself never arrived
    assert not any(ended(m) for _, m in server.received)


def ended(message: object) -> bool:
    """A ShardStatus of a shard that ended (what the test above loses)."""
    return isinstance(message, ShardStatus) and message.state in (
        ShardState.STOPPED,
        ShardState.FAILED,
    )


async def test_reconnect_reregisters_running_shard_with_the_same_engine(
    tmp_path: Path, reserve: Callable[[], int]
) -> None:
    port = reserve()
    dist = reserve()
    with trio.fail_after(30):
        async with running_agent(tmp_path) as (network, server, agent):
            await server.wait_for(Register)
            # Rank 0 of a two-node (simulated) replica: its status carries the dist port.
            await server.send(
                start_sim(
                    port,
                    epoch=4,
                    node_count=2,
                    master_address="127.0.0.1",
                    master_port=dist,
                    mgmt_interface="lo",
                )
            )
            ready = await server.status(ShardState.READY)
            assert network.disconnect(NODE) == 1
            register = await server.wait_for(Register, connection=2)
            assert agent.connections == 2
            (shard,) = register.shards
            assert shard.pid == ready.pid and ready.pid is not None and alive(ready.pid)
            assert (shard.replica_id, shard.rank, shard.epoch) == ("m-r1", 0, 4)
            assert shard.state is ShardState.READY
            assert shard.endpoint_url == f"http://127.0.0.1:{port}"
            assert (shard.model, shard.profile, shard.node_count) == ("m", "p-sim", 2)
            assert (shard.gpu_indices, shard.port, shard.dist_port) == ((0,), port, dist)
            # Still served, still supervised, on the new connection.
            await server.wait_for(Heartbeat, lambda h: len(h.shards) == 1, connection=2)
            await server.send(StopShard("c9", "m-r1", 0, 4, grace=5))
            stopped = await server.wait_for(
                ShardStatus, lambda s: s.state is ShardState.STOPPED, connection=2
            )
            assert stopped.pid == ready.pid


async def test_backs_off_while_the_server_is_down_and_registers_when_it_is_back(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with running_agent(tmp_path, max_backoff=0.3) as (network, server, agent):
            # Heartbeats go out once the agent has taken the Registered.
            await server.wait_for(Heartbeat, connection=1)
            assert agent.registrations == 1
            network.refuse_connects = True
            network.disconnect(NODE)
            # It keeps trying: six connects refused (the network counts them).
            await wait_until(lambda: network.stats.refused >= 6, "six refused connects")
            assert agent.failures >= 6 and agent.registrations == 1
            network.refuse_connects = False
            await server.wait_for(Heartbeat, connection=2)  # registered again
            assert agent.registrations == 2
            assert agent.failures == 0  # reset by the Registered


async def test_reconnects_when_the_server_never_answers_the_registration(tmp_path: Path) -> None:
    server = ScriptedServer()
    server.answer = False
    with trio.fail_after(20):
        async with running_agent(tmp_path, server=server, register_timeout=0.2) as (_n, s, a):
            await s.wait_for(Register, connection=3)
            assert a.registrations == 0


async def test_a_failure_while_disconnected_is_carried_by_the_next_registration(
    tmp_path: Path,
    reserve: Callable[[], int],
) -> None:
    with trio.fail_after(30):
        async with running_agent(tmp_path) as (network, server, agent):
            await server.wait_for(Register)
            await server.send(start_sim(reserve(), args=("--fault-exit-after", "1")))
            ready = await server.status(ShardState.READY)
            network.partition(NODE)
            async with httpx.AsyncClient(base_url=str(ready.endpoint_url), timeout=5) as client:
                with suppress(httpx.HTTPError):
                    await client.post("/v1/completions", json={"model": "m", "prompt": "x"})
            shard = agent.supervisor.shards[("m-r1", 0)]
            await wait_until(lambda: not shard.live, "the engine's exit seen while cut off")
            network.heal()
            register = await server.wait_for(Register, connection=2)
            (status,) = register.shards
            assert status.state is ShardState.FAILED and status.exit_code == 1
            assert status.output_tail  # the whole story, not a summary
            # Delivered by the registration, so forgotten.
            await wait_until(lambda: agent.supervisor.shards == {}, "the failed shard forgotten")


async def test_stopping_the_agent_stops_its_engines(
    tmp_path: Path, reserve: Callable[[], int]
) -> None:
    pids = []
    with trio.fail_after(30):
        async with running_agent(tmp_path) as (_network, server, _agent):
            await server.wait_for(Register)
            await server.send(start_sim(reserve()))
            await server.send(start_sim(reserve(), replica="m-r2", gpus=(1,), command_id="c2"))
            for replica in ("m-r1", "m-r2"):
                pids.append((await server.status(ShardState.READY, replica)).pid)
    assert all(pid is not None and not alive(pid) for pid in pids)


def test_backoff_is_full_jitter_exponential_and_capped() -> None:
    rng = random.Random(3)
    for failures, ceiling in ((0, 0.5), (1, 1.0), (3, 4.0), (6, 30.0), (500, 30.0)):
        delays = [backoff_delay(failures, 0.5, 30.0, rng) for _ in range(2000)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > 0.9 * ceiling  # the whole range is used...
        assert min(delays) < 0.1 * ceiling  # ...from zero: no lockstep floor
        assert sum(delays) / len(delays) == pytest.approx(ceiling / 2, rel=0.1)


def test_interface_check_follows_nccl_syntax() -> None:
    names = ["lo", "eth0", "ib0"]
    assert _interface_problem("eth0", names) is None
    assert _interface_problem("eth", names) is None  # a prefix
    assert _interface_problem("=eth", names) is not None  # exact
    assert _interface_problem("ens,ib", names) is None  # any of a list
    assert _interface_problem("^docker", names) is None  # exclusions are NCCL's business
    assert "it has: lo, eth0, ib0" in str(_interface_problem("bond0", names))


VIRTUAL_TIME = pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param(("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}), id="mock")],
)


@VIRTUAL_TIME
async def test_among_several_servers_one_that_never_answers_is_left_within_seconds(
    tmp_path: Path,
) -> None:
    """A follower names a leader that is paused (its lease not expired yet): the agent
    gives it a few heartbeat intervals, not register_timeout, and goes on to the next
    server, so it reaches the new leader within that leader's settle period."""
    paused, leader = ScriptedServer(), ScriptedServer()
    paused.answer = False
    networks = {"paused:1": StubNetwork(), "leader:1": StubNetwork()}
    servers = Servers(list(networks), lambda address: networks[address].connector(NODE))
    agent = Agent(
        servers,
        NodeSettings(node_id=NODE, address="127.0.0.1", fake_gpus="1x80GB"),
        state_dir=tmp_path / "state",
        adapters={},
        heartbeat_interval=0.2,
        register_timeout=30.0,
        base_backoff=0.05,
        rng=random.Random(7),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(networks["paused:1"].listener().serve, paused.handle)
        await nursery.start(networks["leader:1"].listener().serve, leader.handle)
        started = trio.current_time()
        await nursery.start(agent.run)
        with trio.fail_after(60):
            await paused.wait_for(Register)
            await leader.wait_for(Register)
            assert trio.current_time() - started < ANSWER_FLOOR + SEARCH_BACKOFF + 1
            await wait_until(lambda: agent.registrations == 1, "registered with the leader")
        nursery.cancel_scope.cancel()
