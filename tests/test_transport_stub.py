"""The in-memory agent transport: delivery, latency, drops, cuts, partitions, the
listener's ownership of its connections, and a thousand agents at once."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from llmgw.config import DeploymentProfile
from llmgw.domain.fleet import Gpu, NodeInfo, ShardState
from llmgw.transport.base import AgentConnection, ConnectFailed, ConnectionClosed
from llmgw.transport.messages import (
    AgentMessage,
    Heartbeat,
    Register,
    Registered,
    ServerMessage,
    ShardStatus,
    StartShard,
)
from llmgw.transport.stub import StubNetwork


def mock_clock() -> pytest.MarkDecorator:
    """Run the test on virtual time that jumps whenever every task is blocked."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    return pytest.mark.parametrize(
        "anyio_backend", [pytest.param(("trio", {"clock": clock}), id="mock")]
    )


def register(node_id: str) -> Register:
    gpu = Gpu(index=0, uuid=f"GPU-{node_id}", name="NVIDIA H100", memory_total=80 * 2**30)
    return Register(NodeInfo(node_id=node_id, hostname=node_id, address="10.0.0.1", gpus=(gpu,)))


REGISTERED = Registered(heartbeat_interval=5.0, server_epoch="e1")
Handler = Callable[[AgentConnection], Awaitable[None]]


@asynccontextmanager
async def serving(network: StubNetwork, handler: Handler) -> AsyncIterator[trio.Nursery]:
    """The network's listener running `handler` until the block ends."""
    async with trio.open_nursery() as nursery:
        await nursery.start(network.listener().serve, handler)
        yield nursery
        nursery.cancel_scope.cancel()


async def echo_registration(conn: AgentConnection) -> None:
    """A minimal server: answer the registration, then take whatever comes."""
    assert isinstance(await conn.receive(), Register)
    await conn.send(REGISTERED)
    while True:
        await conn.receive()


# -- delivery -------------------------------------------------------------------------


async def test_register_and_messages_both_ways() -> None:
    network = StubNetwork()
    seen: list[tuple[str | None, AgentMessage]] = []
    profile = DeploymentProfile(name="tp1", engine="sim", weights="w")
    start = StartShard("c1", "r1", 0, 1, "m", profile, (0,), 8000)

    async def handler(conn: AgentConnection) -> None:
        seen.append((conn.peer_identity, await conn.receive()))
        await conn.send(REGISTERED)
        await conn.send(start)
        seen.append((conn.peer_identity, await conn.receive()))

    connector = network.connector("gpu-1", identity="gpu-1")
    async with serving(network, handler), connector.connect() as conn:
        assert network.connected("gpu-1")
        await conn.send(register("gpu-1"))
        assert await conn.receive() == REGISTERED
        assert await conn.receive() == start
        status = ShardStatus("r1", 0, 1, ShardState.STARTING, model="m")
        await conn.send(status)
        # The handler returns after the status: the stream ends.
        with pytest.raises(ConnectionClosed):
            await conn.receive()
    assert seen == [("gpu-1", register("gpu-1")), ("gpu-1", status)]
    assert not network.connected("gpu-1")


async def test_no_tls_means_no_peer_identity() -> None:
    network = StubNetwork()
    identities: list[str | None] = []

    async def handler(conn: AgentConnection) -> None:
        identities.append(conn.peer_identity)

    async with serving(network, handler), network.connector("gpu-1").connect() as conn:
        with pytest.raises(ConnectionClosed):
            await conn.receive()
    assert identities == [None]


async def test_messages_arrive_in_order() -> None:
    network = StubNetwork(buffer=4)  # smaller than the burst: send waits, order holds
    got: list[int] = []

    async def handler(conn: AgentConnection) -> None:
        while len(got) < 50:
            message = await conn.receive()
            assert isinstance(message, Heartbeat)
            got.append(message.seq)

    async with serving(network, handler), network.connector("n").connect() as conn:
        for seq in range(50):
            await conn.send(Heartbeat(seq=seq))
        with pytest.raises(ConnectionClosed):
            await conn.receive()
    assert got == list(range(50))


async def test_wire_check_sends_values_through_protobuf() -> None:
    network = StubNetwork(wire_check=True)
    async with serving(network, echo_registration), network.connector("n").connect() as conn:
        await conn.send(register("n"))
        assert await conn.receive() == REGISTERED
        # A value protobuf cannot carry fails at the sender, as it would on the real wire.
        with pytest.raises(ValueError, match="seq"):
            await conn.send(Heartbeat(seq=-1))


async def test_concurrent_receives_are_refused() -> None:
    network = StubNetwork()
    async with (
        serving(network, echo_registration),
        network.connector("n").connect() as conn,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(conn.receive)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError):
            await conn.receive()
        nursery.cancel_scope.cancel()


# -- latency --------------------------------------------------------------------------


@mock_clock()
async def test_latency_delays_delivery() -> None:
    network = StubNetwork(latency=0.25)
    arrivals: list[float] = []

    async def handler(conn: AgentConnection) -> None:
        await conn.receive()
        arrivals.append(trio.current_time())
        await conn.send(REGISTERED)

    async with serving(network, handler), network.connector("n").connect() as conn:
        sent = trio.current_time()
        await conn.send(register("n"))
        assert await conn.receive() == REGISTERED
        # One way each: up, then down.
        assert arrivals == [pytest.approx(sent + 0.25)]
        assert trio.current_time() == pytest.approx(sent + 0.5)


@mock_clock()
async def test_latency_per_message_keeps_stream_order() -> None:
    # A slow message holds back the ones behind it, as on one TCP stream.
    def latency(node_id: str, message: AgentMessage | ServerMessage) -> float:
        return 1.0 if isinstance(message, Heartbeat) and message.seq == 0 else 0.1

    network = StubNetwork(latency=latency)
    arrivals: list[tuple[int, float]] = []

    async def handler(conn: AgentConnection) -> None:
        for _ in range(3):
            message = await conn.receive()
            assert isinstance(message, Heartbeat)
            arrivals.append((message.seq, trio.current_time()))

    async with serving(network, handler), network.connector("n").connect() as conn:
        start = trio.current_time()
        for seq in range(3):
            await conn.send(Heartbeat(seq=seq))
        with pytest.raises(ConnectionClosed):
            await conn.receive()
    assert [seq for seq, _ in arrivals] == [0, 1, 2]
    assert [t - start for _, t in arrivals] == [pytest.approx(1.0)] * 3


@mock_clock()
async def test_cancelled_receive_loses_no_message() -> None:
    network = StubNetwork(latency=1.0)
    async with serving(network, echo_registration), network.connector("n").connect() as conn:
        start = trio.current_time()
        await conn.send(register("n"))
        with trio.move_on_after(1.5):  # the reply is taken off the channel, still in flight
            await conn.receive()
        assert trio.current_time() == pytest.approx(start + 1.5)
        assert await conn.receive() == REGISTERED
        assert trio.current_time() == pytest.approx(start + 2.0)


# -- drops ----------------------------------------------------------------------------


@mock_clock()
async def test_seeded_drops_lose_exactly_the_drawn_messages() -> None:
    rate, seed, count = 0.3, 1234, 300
    draws = random.Random(seed)
    expected = [seq for seq in range(count) if not draws.random() < rate]
    assert 150 < len(expected) < count  # the seed drops some, not all

    network = StubNetwork(drop_rate=rate, seed=seed, latency=0.01)
    got: list[int] = []

    async def handler(conn: AgentConnection) -> None:
        while True:
            message = await conn.receive()
            assert isinstance(message, Heartbeat)
            got.append(message.seq)

    async with serving(network, handler), network.connector("n").connect() as conn:
        for seq in range(count):
            await conn.send(Heartbeat(seq=seq))
        await trio.sleep(1)  # virtual time: everything still on its way has landed
    assert got == expected
    assert network.stats.sent == count
    assert network.stats.dropped == count - len(expected)


@mock_clock()
async def test_drop_predicate_loses_only_matching_messages() -> None:
    network = StubNetwork(
        drop=lambda node, m: node == "a" and isinstance(m, Heartbeat) and m.seq % 2 == 1
    )
    got: dict[str, list[int]] = {"a": [], "b": []}

    async def handler(conn: AgentConnection) -> None:
        first = await conn.receive()
        assert isinstance(first, Register)
        while True:
            message = await conn.receive()
            assert isinstance(message, Heartbeat)
            got[first.node.node_id].append(message.seq)

    async with serving(network, handler):
        for node in ("a", "b"):
            async with network.connector(node).connect() as conn:
                await conn.send(register(node))
                for seq in range(6):
                    await conn.send(Heartbeat(seq=seq))
                await trio.sleep(1)  # virtual time: all of it delivered (no latency set)
    assert got == {"a": [0, 2, 4], "b": [0, 1, 2, 3, 4, 5]}


# -- disconnects and partitions ---------------------------------------------------------


@mock_clock()
async def test_disconnect_ends_both_receives_at_once() -> None:
    network = StubNetwork(latency=5.0)  # in flight while the cut happens: lost
    server_saw: list[BaseException] = []
    registered = trio.Event()

    async def handler(conn: AgentConnection) -> None:
        await conn.receive()
        registered.set()
        await conn.send(REGISTERED)
        try:
            await conn.receive()
        except ConnectionClosed as exc:
            server_saw.append(exc)
            raise

    async with serving(network, handler), network.connector("n").connect() as conn:
        await conn.send(register("n"))
        await registered.wait()
        cut_at = trio.current_time()
        async with trio.open_nursery() as nursery:

            async def cut_soon() -> None:
                await trio.testing.wait_all_tasks_blocked()
                assert network.disconnect("n") == 1

            nursery.start_soon(cut_soon)
            with pytest.raises(ConnectionClosed, match="cut"):
                await conn.receive()  # would have been REGISTERED at cut_at + 5
        assert trio.current_time() == cut_at
        await trio.testing.wait_all_tasks_blocked()
        assert len(server_saw) == 1
        with pytest.raises(ConnectionClosed):
            await conn.send(Heartbeat(seq=1))
    assert not network.connected("n")
    assert network.stats.cuts == 1


async def test_disconnect_wakes_a_sender_blocked_on_a_full_stream() -> None:
    network = StubNetwork(buffer=1)

    async def stalled(conn: AgentConnection) -> None:
        await trio.sleep_forever()  # never reads

    async with serving(network, stalled), network.connector("n").connect() as conn:
        await conn.send(Heartbeat(seq=0))

        async def cut() -> None:
            await trio.testing.wait_all_tasks_blocked()
            network.disconnect("n")

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cut)
                with pytest.raises(ConnectionClosed):
                    await conn.send(Heartbeat(seq=1))  # the stream holds one: this waits


async def test_agent_reconnects_after_a_disconnect() -> None:
    network = StubNetwork()
    registrations: list[str] = []

    async def handler(conn: AgentConnection) -> None:
        message = await conn.receive()
        assert isinstance(message, Register)
        registrations.append(message.node.node_id)
        await conn.send(REGISTERED)
        await trio.sleep_forever()

    connector = network.connector("n")
    async with serving(network, handler):
        for _ in range(2):
            async with connector.connect() as conn:
                await conn.send(register("n"))
                assert await conn.receive() == REGISTERED
                network.disconnect("n")
                with pytest.raises(ConnectionClosed):
                    await conn.receive()
    assert registrations == ["n", "n"]
    assert network.stats.connects == 2


async def test_partition_refuses_connects_until_healed() -> None:
    network = StubNetwork()
    async with serving(network, echo_registration):
        async with network.connector("a").connect() as a, network.connector("b").connect() as b:
            network.partition("a")
            with pytest.raises(ConnectionClosed):
                await a.receive()
            await b.send(register("b"))  # b is not affected
            assert await b.receive() == REGISTERED
        with pytest.raises(ConnectFailed, match="partitioned"):
            async with network.connector("a").connect():
                pass  # pragma: no cover
        network.heal("a")
        async with network.connector("a").connect() as a:
            await a.send(register("a"))
            assert await a.receive() == REGISTERED
    assert network.stats.refused == 1


async def test_connects_fail_without_listener_or_when_refused() -> None:
    network = StubNetwork()
    with pytest.raises(ConnectFailed, match="no listener"):
        async with network.connector("n").connect():
            pass  # pragma: no cover
    async with serving(network, echo_registration):
        async with network.connector("n").connect() as conn:
            network.refuse_connects = True
            with pytest.raises(ConnectFailed, match="refused"):
                async with network.connector("m").connect():
                    pass  # pragma: no cover
            # An established connection carries on.
            await conn.send(register("n"))
            assert await conn.receive() == REGISTERED
        network.refuse_connects = False
        async with network.connector("m").connect() as conn:
            await conn.send(register("m"))
            assert await conn.receive() == REGISTERED


async def test_one_listener_per_network() -> None:
    network = StubNetwork()
    async with serving(network, echo_registration):
        with pytest.raises(RuntimeError, match="already serving"):
            await network.listener().serve(echo_registration)
    assert not network.serving


# -- the listener owns its connections ---------------------------------------------------


async def test_closing_our_end_ends_the_peers_receive() -> None:
    network = StubNetwork()
    closed = trio.Event()

    async def handler(conn: AgentConnection) -> None:
        with pytest.raises(ConnectionClosed, match="by the peer"):
            await conn.receive()
        closed.set()

    async with serving(network, handler):
        async with network.connector("n").connect() as conn:
            await conn.aclose()
            await conn.aclose()  # idempotent
            with pytest.raises(ConnectionClosed):
                await conn.send(Heartbeat(seq=0))
        with trio.fail_after(5):
            await closed.wait()


async def test_cancelling_the_listener_closes_every_connection_and_leaks_no_task() -> None:
    network = StubNetwork()
    agents, running, finished = 20, 0, 0
    closed_agents = 0

    async def handler(conn: AgentConnection) -> None:
        nonlocal running, finished
        running += 1
        try:
            while True:
                await conn.receive()
        finally:
            finished += 1

    async def agent(node_id: str, task_status: trio.TaskStatus[None]) -> None:
        nonlocal closed_agents
        async with network.connector(node_id).connect() as conn:
            await conn.send(register(node_id))
            task_status.started()
            with pytest.raises(ConnectionClosed):
                await conn.receive()
            closed_agents += 1

    with trio.fail_after(5):
        async with trio.open_nursery() as agents_nursery:
            async with trio.open_nursery() as server:
                await server.start(network.listener().serve, handler)
                for i in range(agents):
                    await agents_nursery.start(agent, f"n{i}")
                await trio.testing.wait_all_tasks_blocked()
                assert running == agents
                assert network.connection_count == agents
                server.cancel_scope.cancel()
            # serve() has returned, so every handler task it owned has finished.
            assert finished == agents
            assert not server.child_tasks
            assert not network.serving
    assert closed_agents == agents
    assert network.connection_count == 0


async def test_a_closed_connection_in_a_handlers_nursery_ends_only_that_connection() -> None:
    network = StubNetwork()
    done = trio.Event()

    async def handler(conn: AgentConnection) -> None:
        async def pump() -> None:
            while True:
                await conn.receive()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump)
        finally:
            done.set()

    async with serving(network, handler) as nursery:
        async with network.connector("n").connect():
            pass
        with trio.fail_after(5):
            await done.wait()
        assert network.serving and nursery.child_tasks


async def test_a_handler_bug_propagates_out_of_serve() -> None:
    network = StubNetwork()

    async def buggy(conn: AgentConnection) -> None:
        await conn.receive()
        raise KeyError("bug")

    with pytest.raises(ExceptionGroup) as raised:
        async with serving(network, buggy), network.connector("n").connect() as conn:
            await conn.send(register("n"))
            await trio.sleep_forever()
    assert raised.group_contains(KeyError, depth=None)


# -- scale --------------------------------------------------------------------------------


async def test_a_thousand_agents_register_and_heartbeat() -> None:
    agents = 1000
    network = StubNetwork()
    heartbeats: dict[str, int] = {}
    all_in = trio.Event()

    async def handler(conn: AgentConnection) -> None:
        message = await conn.receive()
        assert isinstance(message, Register)
        node_id = message.node.node_id
        await conn.send(REGISTERED)
        beat = await conn.receive()
        assert isinstance(beat, Heartbeat)
        heartbeats[node_id] = beat.seq
        if len(heartbeats) == agents:
            all_in.set()
        await conn.receive()  # until the agent goes

    async def agent(node_id: str) -> None:
        async with network.connector(node_id).connect() as conn:
            await conn.send(register(node_id))
            assert await conn.receive() == REGISTERED
            await conn.send(Heartbeat(seq=1))
            await all_in.wait()

    started = time.perf_counter()
    with trio.fail_after(10):
        async with serving(network, handler), trio.open_nursery() as nursery:
            for i in range(agents):
                nursery.start_soon(agent, f"gpu-{i:04d}")
    elapsed = time.perf_counter() - started
    assert heartbeats == {f"gpu-{i:04d}": 1 for i in range(agents)}
    assert network.stats.connects == agents
    assert network.connection_count == 0
    print(f"{agents} agents connected, registered and heartbeat in {elapsed:.3f}s")
    assert elapsed < 10
