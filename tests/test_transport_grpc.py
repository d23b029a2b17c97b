"""The gRPC agent transport over real sockets on 127.0.0.1: exchanges both ways,
bounds, graceful close, and many connections at once (stock grpcio peers, teardown
and failures, and mutual TLS are in test_transport_grpc_*.py)."""

from __future__ import annotations

import time

import grpc
import pytest
import trio

from llmgw.domain.fleet import ShardState
from llmgw.transport.base import AgentConnection, ConnectionClosed
from llmgw.transport.grpc import GrpcListener
from llmgw.transport.grpc.server import _peer_host
from llmgw.transport.messages import (
    AgentMessage,
    CommandResult,
    Heartbeat,
    Register,
    Registered,
    ServerMessage,
    ShardStatus,
    StartShard,
)
from llmgw.transport.pb import agent_pb2 as pb
from llmgw.transport.pb import agent_pb2_grpc
from tests.grpc_peers import (
    PROFILE,
    REGISTERED,
    START,
    connector,
    echo_registration,
    register,
    serving,
)

# -- exchanges ------------------------------------------------------------------------


async def test_bidi_exchange_both_ways() -> None:
    seen: list[AgentMessage] = []
    identities: list[str | None] = []
    status = ShardStatus("r1", 0, 1, ShardState.READY, model="m", endpoint_url="http://x:8000")

    async def handler(conn: AgentConnection) -> None:
        identities.append(conn.peer_identity)
        seen.append(await conn.receive())
        await conn.send(REGISTERED)
        seen.append(await conn.receive())
        await conn.send(START)
        seen.append(await conn.receive())
        seen.append(await conn.receive())

    got: list[ServerMessage] = []
    with trio.fail_after(5):
        async with serving(handler) as listener, connector(listener).connect() as conn:
            await conn.send(register("gpu-1"))
            got.append(await conn.receive())
            await conn.send(Heartbeat(seq=1))
            got.append(await conn.receive())
            await conn.send(status)
            await conn.send(CommandResult("c1", True, "started"))
            # The handler returns after the fourth message: the server ends the stream.
            with pytest.raises(ConnectionClosed):
                await conn.receive()
            with pytest.raises(ConnectionClosed):
                await conn.send(Heartbeat(seq=2))
    assert got == [REGISTERED, START]
    assert seen == [
        register("gpu-1"),
        Heartbeat(seq=1),
        status,
        CommandResult("c1", True, "started"),
    ]
    assert identities == [None]


async def test_plaintext_listener_warns_loudly(caplog: pytest.LogCaptureFixture) -> None:
    with trio.fail_after(5):
        async with serving(echo_registration):
            pass
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "PLAINTEXT" in r.message]
    assert warnings and "any node id" in warnings[0].message


async def test_the_server_end_knows_the_address_the_agent_connects_from() -> None:
    addresses: list[str | None] = []

    async def handler(conn: AgentConnection) -> None:
        addresses.append(conn.peer_address)
        await echo_registration(conn)

    with trio.fail_after(10):
        async with serving(handler) as listener, connector(listener).connect() as conn:
            await conn.send(register("gpu-1"))
            assert await conn.receive() == REGISTERED
    assert addresses == ["127.0.0.1"]


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:10.0.0.5:43210", "10.0.0.5"),
        ("ipv6:[::1]:43210", "::1"),
        ("ipv6:%5B2001:db8::1%5D:43210", "2001:db8::1"),
        ("ipv6:[::ffff:10.0.0.5]:43210", "10.0.0.5"),
        ("unix:/run/llmgw.sock", None),
        ("ipv4:nonsense", None),
    ],
)
def test_peer_strings_are_read_as_ip_addresses(peer: str, host: str | None) -> None:
    assert _peer_host(peer) == host


async def test_a_message_over_the_bounds_is_refused_before_it_is_converted() -> None:
    """60,000 GPUs in one Register (0.5 MB on the wire): the stream ends with
    INVALID_ARGUMENT naming the bound, and the handler never sees it. (Converted, it
    held the asyncio thread, every stream's, for 8 s.)"""
    seen: list[AgentMessage] = []

    async def handler(conn: AgentConnection) -> None:
        seen.append(await conn.receive())

    node = pb.NodeInfo(node_id="n-huge", hostname="n", address="127.0.0.1")
    for i in range(60_000):
        node.gpus.add(index=i, memory_total=1)
    request = pb.ConnectRequest(register=pb.Register(node=node))

    def call(port: int) -> grpc.RpcError:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                list(stub.Connect(iter([request]), timeout=20))
            return info.value

    with trio.fail_after(30):
        async with serving(handler) as listener:
            assert listener.port is not None
            error = await trio.to_thread.run_sync(call, listener.port)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "NodeInfo.gpus: 60000 entries, more than the 128 allowed" in error.details()  # type: ignore[attr-defined]
    assert seen == []


async def test_graceful_close_flushes_both_ways() -> None:
    """What one end sent before closing arrives before the other end's ConnectionClosed."""
    received: list[AgentMessage] = []
    done = trio.Event()

    async def handler(conn: AgentConnection) -> None:
        try:
            while True:
                received.append(await conn.receive())
        finally:
            done.set()

    with trio.fail_after(5):
        async with serving(handler) as listener:
            async with connector(listener).connect() as conn:
                for seq in range(200):
                    await conn.send(Heartbeat(seq=seq))
            await done.wait()
    assert received == [Heartbeat(seq=seq) for seq in range(200)]

    async def sender(conn: AgentConnection) -> None:
        assert isinstance(await conn.receive(), Register)
        for seq in range(200):
            await conn.send(StartShard(f"c{seq}", "r1", 0, 1, "m", PROFILE, (0,), 8000))

    got: list[ServerMessage] = []
    with trio.fail_after(5):
        async with serving(sender) as listener, connector(listener).connect() as conn:
            await conn.send(register("gpu-1"))
            with pytest.raises(ConnectionClosed):
                while True:
                    got.append(await conn.receive())
    assert [m.command_id for m in got if isinstance(m, StartShard)] == [
        f"c{seq}" for seq in range(200)
    ]


async def test_cancelled_receive_loses_no_message() -> None:
    count = 300

    async def handler(conn: AgentConnection) -> None:
        await conn.receive()
        for seq in range(count):
            await conn.send(StartShard(f"c{seq}", "r1", 0, 1, "m", PROFILE, (0,), 8000))
        await conn.receive()  # until the agent leaves

    got: list[str] = []
    cancelled = 0
    with trio.fail_after(5):
        async with serving(handler) as listener, connector(listener).connect() as conn:
            await conn.send(register("gpu-1"))
            while len(got) < count:
                with trio.move_on_after(0.0005) as scope:
                    message = await conn.receive()
                    assert isinstance(message, StartShard)
                    got.append(message.command_id)
                cancelled += scope.cancelled_caught
    assert got == [f"c{seq}" for seq in range(count)]
    assert cancelled > 0  # some receives really were cancelled while waiting


# -- many at once ---------------------------------------------------------------------------------


async def test_two_hundred_concurrent_connections() -> None:
    count = 200
    served: set[str] = set()

    async def handler(conn: AgentConnection) -> None:
        first = await conn.receive()
        assert isinstance(first, Register)
        served.add(first.node.node_id)
        await conn.send(Registered(heartbeat_interval=5.0, server_epoch=first.node.node_id))
        await conn.receive()

    answers: dict[str, str] = {}
    all_connected = trio.Event()
    connected = 0

    async def agent(listener: GrpcListener, node_id: str) -> None:
        nonlocal connected
        async with connector(listener, node_id=node_id).connect() as conn:
            await conn.send(register(node_id))
            answer = await conn.receive()
            assert isinstance(answer, Registered)
            answers[node_id] = answer.server_epoch
            connected += 1
            if connected == count:
                all_connected.set()
            await all_connected.wait()  # all streams open at once

    started = time.monotonic()
    with trio.fail_after(20):
        async with serving(handler) as listener, trio.open_nursery() as nursery:
            for index in range(count):
                nursery.start_soon(agent, listener, f"gpu-{index}")
    elapsed = time.monotonic() - started
    assert answers == {f"gpu-{index}": f"gpu-{index}" for index in range(count)}
    assert served == set(answers)
    print(f"{count} connections: {elapsed:.2f}s")
