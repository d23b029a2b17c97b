"""The gRPC agent transport over real sockets on 127.0.0.1: exchanges both ways,
interop with stock grpcio peers, cancellation and teardown, dead and cut peers,
mutual TLS, and many connections at once."""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import grpc
import pytest
import trio
from google.protobuf.duration_pb2 import Duration

from llmgw.config import DeploymentProfile, TlsConfig
from llmgw.domain.fleet import Gpu, NodeInfo, ShardState
from llmgw.testing.procs import reserve_port
from llmgw.transport import certs, grpc_bridge
from llmgw.transport.base import AgentConnection, ConnectFailed, ConnectionClosed
from llmgw.transport.grpc import SERVICE_NAME, GrpcConnector, GrpcListener, Keepalive
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
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
Handler = Callable[[AgentConnection], Awaitable[None]]

REGISTERED = Registered(heartbeat_interval=5.0, server_epoch="e1")
PROFILE = DeploymentProfile(name="tp1", engine="sim", weights="w")
START = StartShard("c1", "r1", 0, 1, "m", PROFILE, (0,), 8000)


def register(node_id: str) -> Register:
    gpu = Gpu(index=0, uuid=f"GPU-{node_id}", name="NVIDIA H100", memory_total=80 * 2**30)
    return Register(NodeInfo(node_id=node_id, hostname=node_id, address="10.0.0.1", gpus=(gpu,)))


@asynccontextmanager
async def serving(
    handler: Handler, *, tls: TlsConfig | None = None, keepalive: Keepalive | None = None
) -> AsyncIterator[GrpcListener]:
    """A GrpcListener on 127.0.0.1 running `handler` until the block ends."""
    listener = GrpcListener("127.0.0.1:0", tls=tls, keepalive=keepalive or Keepalive())
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.serve, handler)
        yield listener
        nursery.cancel_scope.cancel()


def connector(
    listener: GrpcListener,
    *,
    tls: TlsConfig | None = None,
    node_id: str | None = None,
    server_name: str | None = None,
) -> GrpcConnector:
    """A connector to `listener` on 127.0.0.1."""
    assert listener.port is not None
    address = f"127.0.0.1:{listener.port}"
    return GrpcConnector(address, tls=tls, node_id=node_id, server_name=server_name)


async def echo_registration(conn: AgentConnection) -> None:
    """A minimal server: answer the registration, then take whatever comes."""
    assert isinstance(await conn.receive(), Register)
    await conn.send(REGISTERED)
    while True:
        await conn.receive()


def os_threads() -> int:
    """Threads of this process, native ones (grpc core's) included."""
    return len(os.listdir("/proc/self/task"))


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


# -- stock grpcio peers -------------------------------------------------------------------


def plain_client(port: int) -> list[pb.ConnectResponse]:
    """A stock grpcio client: the generated stub and pb messages, nothing of ours."""
    requests: queue.Queue[pb.ConnectRequest | None] = queue.Queue()

    def outgoing() -> Iterator[pb.ConnectRequest]:
        while (request := requests.get()) is not None:
            yield request

    node = pb.NodeInfo(node_id="plain-1", hostname="plain", address="10.0.0.9")
    got = []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        responses = agent_pb2_grpc.AgentServiceStub(channel).Connect(outgoing(), timeout=10)
        requests.put(pb.ConnectRequest())  # no payload: as from a newer agent; skipped
        requests.put(pb.ConnectRequest(register=pb.Register(node=node)))
        got.append(next(responses))
        requests.put(pb.ConnectRequest(heartbeat=pb.Heartbeat(seq=7)))
        got.append(next(responses))
        requests.put(None)  # half-close: the agent leaves
        got.extend(responses)  # the server ends the stream
    return got


async def test_stock_grpcio_client_talks_to_our_listener() -> None:
    seen: list[AgentMessage] = []
    ended = trio.Event()

    async def handler(conn: AgentConnection) -> None:
        try:
            seen.append(await conn.receive())
            await conn.send(REGISTERED)
            seen.append(await conn.receive())
            await conn.send(START)
            await conn.receive()
        except ConnectionClosed:
            ended.set()
            raise

    with trio.fail_after(5):
        async with serving(handler) as listener:
            assert listener.port is not None
            got = await trio.to_thread.run_sync(plain_client, listener.port)
            await ended.wait()
    assert [r.WhichOneof("payload") for r in got] == ["registered", "start_shard"]
    assert got[0].registered.server_epoch == "e1"
    assert got[0].registered.heartbeat_interval.seconds == 5
    assert got[1].start_shard.profile.name == "tp1"
    assert seen == [
        Register(NodeInfo(node_id="plain-1", hostname="plain", address="10.0.0.9")),
        Heartbeat(seq=7),
    ]


@attrs.define
class PlainServicer:
    """A stock grpcio (threaded, synchronous) implementation of AgentService."""

    seen: list[pb.ConnectRequest] = attrs.Factory(list)
    ended: threading.Event = attrs.Factory(threading.Event)

    def Connect(
        self, requests: Iterator[pb.ConnectRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.ConnectResponse]:
        try:
            self.seen.append(next(requests))
            yield pb.ConnectResponse(
                registered=pb.Registered(
                    heartbeat_interval=Duration(seconds=3), server_epoch="plain"
                )
            )
            self.seen.append(next(requests))
            yield pb.ConnectResponse(
                stop_shard=pb.StopShard(
                    command_id="s1", replica_id="r1", epoch=2, grace=Duration(seconds=10)
                )
            )
            yield pb.ConnectResponse()  # no payload: as from a newer server; skipped
            yield pb.ConnectResponse(
                drain_shard=pb.DrainShard(
                    command_id="d1", replica_id="r1", epoch=2, deadline=Duration(seconds=60)
                )
            )
            self.seen.extend(requests)  # until the agent half-closes
        finally:
            self.ended.set()


@asynccontextmanager
async def plain_server(servicer: PlainServicer) -> AsyncIterator[int]:
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    # A stock grpcio server as any other project would write it: a generic handler
    # under the proto's service name, nothing of llmgw's.
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE_NAME,
                {
                    "Connect": grpc.stream_stream_rpc_method_handler(
                        servicer.Connect,
                        request_deserializer=pb.ConnectRequest.FromString,
                        response_serializer=pb.ConnectResponse.SerializeToString,
                    )
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(None)


async def test_our_connector_talks_to_a_stock_grpcio_server() -> None:
    from llmgw.transport.messages import DrainShard, StopShard

    servicer = PlainServicer()
    got: list[ServerMessage] = []
    with trio.fail_after(5):
        async with plain_server(servicer) as port:
            async with GrpcConnector(f"127.0.0.1:{port}", node_id="gpu-1").connect() as conn:
                await conn.send(register("gpu-1"))
                got.append(await conn.receive())
                await conn.send(Heartbeat(seq=1))
                got.append(await conn.receive())
                got.append(await conn.receive())
                await conn.send(CommandResult("s1", True))
            await trio.to_thread.run_sync(servicer.ended.wait, 5)
    assert got == [
        Registered(heartbeat_interval=3.0, server_epoch="plain"),
        StopShard("s1", "r1", 0, 2, grace=10.0),
        DrainShard("d1", "r1", 0, 2, deadline=60.0),
    ]
    assert [r.WhichOneof("payload") for r in servicer.seen] == [
        "register",
        "heartbeat",
        "command_result",
    ]
    assert servicer.seen[0].register.node.node_id == "gpu-1"


def test_generated_servicer_helper_serves_the_proto_service() -> None:
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    agent_pb2_grpc.add_AgentServiceServicer_to_server(PlainServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            node = pb.NodeInfo(node_id="n")
            responses = stub.Connect(iter([pb.ConnectRequest(register=pb.Register(node=node))]))
            assert next(responses).WhichOneof("payload") == "registered"
    finally:
        server.stop(None)


# -- cancellation, teardown, failures -----------------------------------------------------------


async def test_cancelling_the_client_ends_the_server_receive() -> None:
    outcome: list[str] = []
    registered = trio.Event()
    ended = trio.Event()

    async def handler(conn: AgentConnection) -> None:
        await conn.receive()
        registered.set()
        try:
            await conn.receive()
        except ConnectionClosed as exc:
            outcome.append(str(exc))
            ended.set()
            raise

    agent_scope = trio.CancelScope()

    async def agent(listener: GrpcListener) -> None:
        with agent_scope:
            async with connector(listener).connect() as conn:
                await conn.send(register("gpu-1"))
                await conn.receive()

    with trio.fail_after(5):
        async with serving(handler) as listener, trio.open_nursery() as nursery:
            nursery.start_soon(agent, listener)
            await registered.wait()
            started = trio.current_time()
            agent_scope.cancel()
            await ended.wait()
            assert trio.current_time() - started < 1.0
    assert outcome


async def test_cancelling_serve_closes_every_stream_and_leaks_nothing() -> None:
    clients = 5

    async def round_trip(ready: trio.Event | None = None) -> list[str]:
        """Serve, connect `clients` agents, cancel serve; each agent's receive result."""
        results: list[str] = []
        registered = 0
        all_registered = trio.Event()

        async def handler(conn: AgentConnection) -> None:
            nonlocal registered
            await conn.receive()
            await conn.send(REGISTERED)
            registered += 1
            if registered == clients:
                all_registered.set()
            await trio.sleep_forever()

        async def agent(listener: GrpcListener, index: int) -> None:
            async with connector(listener, node_id=f"gpu-{index}").connect() as conn:
                await conn.send(register(f"gpu-{index}"))
                assert await conn.receive() == REGISTERED
                try:
                    await conn.receive()
                except ConnectionClosed:
                    results.append("closed")

        async with trio.open_nursery() as agents, trio.open_nursery() as server:
            listener = GrpcListener("127.0.0.1:0")
            await server.start(listener.serve, handler)
            for index in range(clients):
                agents.start_soon(agent, listener, index)
            await all_registered.wait()
            server.cancel_scope.cancel()
        return results

    with trio.fail_after(10):
        await round_trip()  # warms up grpc (its threads and the asyncio thread start)
        threads, python_threads = os_threads(), threading.active_count()
        tasks = await grpc_bridge.running_task_count()
        started = trio.current_time()
        assert await round_trip() == ["closed"] * clients
        elapsed = trio.current_time() - started

        # Nothing left behind (asyncio-side cleanups finish just after).
        async def cleaned_up() -> bool:
            return (
                os_threads() <= threads
                and threading.active_count() <= python_threads
                and await grpc_bridge.running_task_count() <= tasks
            )

        await wait_until(cleaned_up, "threads and bridge tasks back to their warm counts", 5)
    assert os_threads() <= threads
    assert threading.active_count() <= python_threads
    assert await grpc_bridge.running_task_count() <= tasks == 0
    assert elapsed < 3.0
    # One asyncio thread for the whole process, however many streams there were.
    names = [t.name for t in threading.enumerate()]
    assert names.count(grpc_bridge.THREAD_NAME) == 1


async def test_connect_to_a_closed_port_fails() -> None:
    # Held (bound, not listening) while connecting: nothing else can listen there.
    with (
        reserve_port() as port,
        trio.fail_after(5),
        pytest.raises(ConnectFailed, match="connection refused"),
    ):
        async with GrpcConnector(f"127.0.0.1:{port}").connect():
            pass


async def test_a_reserved_port_can_still_be_listened_on() -> None:
    """reserve_port's promise for the agent port of a server restarted in place: gRPC
    binds with SO_REUSEADDR, so it listens on a port a test holds."""
    with reserve_port() as port, trio.fail_after(5):
        listener = GrpcListener(f"127.0.0.1:{port}")
        async with trio.open_nursery() as nursery:
            await nursery.start(listener.serve, echo_registration)
            assert listener.port == port
            assert listener.addresses == [f"127.0.0.1:{port}"]
            nursery.cancel_scope.cancel()


async def test_connect_times_out_on_a_silent_port() -> None:
    """A port that accepts TCP but never speaks HTTP/2."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with trio.fail_after(5), pytest.raises(ConnectFailed, match="timed out"):
            async with GrpcConnector(f"127.0.0.1:{port}", connect_timeout=0.5).connect():
                pass


async def test_listening_on_a_busy_port_fails() -> None:
    with trio.fail_after(5):
        async with serving(echo_registration) as listener:
            with pytest.raises(OSError):
                await GrpcListener(f"127.0.0.1:{listener.port}").serve(echo_registration)


async def test_handler_ending_closes_only_its_connection() -> None:
    """A handler that returns ends its agent's stream; others carry on."""

    async def handler(conn: AgentConnection) -> None:
        first = await conn.receive()
        assert isinstance(first, Register)
        if first.node.node_id == "leaver":
            return
        await conn.send(REGISTERED)
        while True:
            message = await conn.receive()
            if isinstance(message, Heartbeat):
                await conn.send(REGISTERED)

    with trio.fail_after(5):
        async with serving(handler) as listener, connector(listener).connect() as stayer:
            await stayer.send(register("stayer"))
            assert await stayer.receive() == REGISTERED
            async with connector(listener).connect() as leaver:
                await leaver.send(register("leaver"))
                with pytest.raises(ConnectionClosed):
                    await leaver.receive()
            await stayer.send(Heartbeat(seq=1))
            assert await stayer.receive() == REGISTERED


async def test_a_handler_error_propagates_out_of_serve_and_closes_the_stream() -> None:
    async def handler(conn: AgentConnection) -> None:
        await conn.receive()
        raise RuntimeError("handler bug")

    listener = GrpcListener("127.0.0.1:0")
    with trio.fail_after(5), pytest.RaisesGroup(RuntimeError, flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            await nursery.start(listener.serve, handler)
            async with connector(listener).connect() as conn:
                await conn.send(register("gpu-1"))
                with pytest.raises(ConnectionClosed):
                    await conn.receive()


async def test_server_send_fails_once_the_agent_left() -> None:
    outcome: list[str] = []
    done = trio.Event()

    async def handler(conn: AgentConnection) -> None:
        await conn.receive()
        with pytest.raises(ConnectionClosed):
            await conn.receive()  # the agent closes
        try:
            await conn.send(REGISTERED)
        except ConnectionClosed as exc:
            outcome.append(str(exc))
        done.set()

    with trio.fail_after(5):
        async with serving(handler) as listener:
            async with connector(listener).connect() as conn:
                await conn.send(register("gpu-1"))
            await done.wait()
    assert outcome and "closed by the agent" in outcome[0]


async def test_an_invalid_message_ends_the_stream() -> None:
    """A message that decodes but is no valid value (here an UNSPECIFIED shard state)
    is a broken peer: the stream ends with INVALID_ARGUMENT, the handler's receive
    with ConnectionClosed."""
    reasons: list[str] = []
    closed = trio.Event()

    async def handler(conn: AgentConnection) -> None:
        try:
            await conn.receive()
        except ConnectionClosed as exc:
            reasons.append(str(exc))
            closed.set()
            raise

    def stock_client(port: int) -> object:
        bad = pb.ConnectRequest(shard_status=pb.ShardStatus(replica_id="r1", state=0))
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            responses = agent_pb2_grpc.AgentServiceStub(channel).Connect(iter([bad]), timeout=5)
            with pytest.raises(grpc.RpcError) as caught:
                list(responses)
            return caught.value.code()  # an RpcError from a call is also a grpc.Call

    with trio.fail_after(5):
        async with serving(handler) as listener:
            assert listener.port is not None
            code = await trio.to_thread.run_sync(stock_client, listener.port)
            # The client may hear the refusal before the handler's receive() does:
            # leaving `serving` first would cancel the handler instead.
            await closed.wait()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert reasons and "invalid message" in reasons[0]


async def test_send_waits_while_the_peer_does_not_read() -> None:
    """Flow control: a peer that stops reading makes our send wait (bounded buffering),
    and everything sent arrives once it reads again."""
    reading = trio.Event()
    received = 0
    all_received = trio.Event()
    # About 20 KB, within the protocol's bounds (llmgw.transport.limits).
    labels = {f"k{i}": "v" * 320 for i in range(60)}
    big = Register(NodeInfo(node_id="gpu-1", hostname="h", address="10.0.0.1", labels=labels))
    sent = 0

    async def handler(conn: AgentConnection) -> None:
        nonlocal received
        await reading.wait()
        while True:
            await conn.receive()
            received += 1
            if received == sent:
                all_received.set()

    with trio.fail_after(5):
        async with serving(handler) as listener, connector(listener).connect() as conn:
            previous = -1
            for _ in range(10):  # send until a whole period passes with send waiting
                with trio.move_on_after(0.3):
                    while True:
                        await conn.send(big)
                        sent += 1
                if sent == previous:
                    break
                previous = sent
            else:
                pytest.fail(f"send never waited ({sent} messages of 20 KB sent)")
            reading.set()
            await all_received.wait()


# -- dead and cut peers ----------------------------------------------------------------------


@attrs.define
class Proxy:
    """A TCP relay to `target` that can freeze (stop relaying, keep the sockets open:
    a dead host as seen from the other end) or cut (close everything)."""

    target: int
    port: int = 0
    frozen: bool = False
    streams: list[trio.SocketStream] = attrs.Factory(list)
    _cancel: trio.CancelScope = attrs.Factory(trio.CancelScope)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._relay, listeners)

    async def _relay(self, downstream: trio.SocketStream) -> None:
        upstream = await trio.open_tcp_stream("127.0.0.1", self.target)
        self.streams += [downstream, upstream]
        with self._cancel:
            async with downstream, upstream, trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, downstream, upstream)
                nursery.start_soon(self._pump, upstream, downstream)

    async def _pump(self, source: trio.SocketStream, sink: trio.SocketStream) -> None:
        while data := await source.receive_some():
            if self.frozen:
                await trio.sleep_forever()
            await sink.send_all(data)

    def cut(self) -> None:
        self._cancel.cancel()


async def test_a_silent_peer_is_noticed_by_keepalive() -> None:
    """A peer that stops answering (host or network dead: no FIN, no RST) ends both
    ends' receive once a keepalive ping goes unanswered."""
    keepalive = Keepalive(interval=0.5, timeout=0.5, min_peer_interval=0.1)
    ended: dict[str, float] = {}
    registered = trio.Event()
    server_ended = trio.Event()

    async def handler(conn: AgentConnection) -> None:
        await conn.receive()
        registered.set()
        try:
            await conn.receive()
        except ConnectionClosed:
            ended["server"] = trio.current_time()
            server_ended.set()

    with trio.fail_after(8):
        async with serving(handler, keepalive=keepalive) as listener:
            assert listener.port is not None
            proxy = Proxy(listener.port)
            async with trio.open_nursery() as nursery:
                await nursery.start(proxy.run)
                via_proxy = GrpcConnector(f"127.0.0.1:{proxy.port}", keepalive=keepalive)
                async with via_proxy.connect() as conn:
                    await conn.send(register("gpu-1"))
                    await registered.wait()
                    proxy.frozen = True
                    frozen_at = trio.current_time()
                    with pytest.raises(ConnectionClosed):
                        await conn.receive()
                    ended["agent"] = trio.current_time()
                await server_ended.wait()
                nursery.cancel_scope.cancel()
    # interval + timeout is 1 s; allow for timer slack on a busy machine.
    assert ended["agent"] - frozen_at < 4.0
    assert ended["server"] - frozen_at < 4.0


async def test_a_cut_connection_ends_both_ends_at_once() -> None:
    registered = trio.Event()
    server_ended = trio.Event()

    async def handler(conn: AgentConnection) -> None:
        await conn.receive()
        registered.set()
        try:
            await conn.receive()
        except ConnectionClosed:
            server_ended.set()

    with trio.fail_after(5):
        async with serving(handler) as listener:
            assert listener.port is not None
            proxy = Proxy(listener.port)
            async with trio.open_nursery() as nursery:
                await nursery.start(proxy.run)
                async with GrpcConnector(f"127.0.0.1:{proxy.port}").connect() as conn:
                    await conn.send(register("gpu-1"))
                    await registered.wait()
                    cut_at = trio.current_time()
                    proxy.cut()
                    with pytest.raises(ConnectionClosed):
                        await conn.receive()
                    with pytest.raises(ConnectionClosed):
                        await conn.send(Heartbeat(seq=1))
                await server_ended.wait()
                nursery.cancel_scope.cancel()
            assert trio.current_time() - cut_at < 1.0


# -- mutual TLS ---------------------------------------------------------------------------------


@attrs.frozen
class Pki:
    server: TlsConfig  # the listener's: server cert and key, the CA of client certs
    node: TlsConfig  # gpu-1's: its cert and key, the CA that signed the server's
    rogue: TlsConfig  # a "gpu-1" certificate from another CA
    wrong_trust: TlsConfig  # gpu-1's certificate, but trusting the other CA for the server
    ca: certs.CertPair


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    out = tmp_path_factory.mktemp("pki")
    ca = certs.make_ca(out)
    other_ca = certs.make_ca(out, "other-ca", subject="someone else's CA")
    server = certs.make_server_cert(out, ca, ("localhost", "127.0.0.1"))
    node = certs.make_node_cert(out, ca, "gpu-1")
    rogue = certs.make_node_cert(out, other_ca, "gpu-1", name="rogue")
    return Pki(
        server=TlsConfig(str(server.cert), str(server.key), str(ca.cert)),
        node=TlsConfig(str(node.cert), str(node.key), str(ca.cert)),
        rogue=TlsConfig(str(rogue.cert), str(rogue.key), str(ca.cert)),
        wrong_trust=TlsConfig(str(node.cert), str(node.key), str(other_ca.cert)),
        ca=ca,
    )


async def test_mtls_accepts_the_right_certificate_and_reports_its_identity(pki: Pki) -> None:
    identities: list[str | None] = []

    async def handler(conn: AgentConnection) -> None:
        identities.append(conn.peer_identity)
        await echo_registration(conn)

    with trio.fail_after(5):
        async with serving(handler, tls=pki.server) as listener:
            async with connector(listener, tls=pki.node, node_id="gpu-1").connect() as conn:
                await conn.send(register("gpu-1"))
                assert await conn.receive() == REGISTERED
            # By name too: the server certificate names localhost as well.
            address = f"localhost:{listener.port}"
            async with GrpcConnector(address, tls=pki.node).connect() as conn:
                await conn.send(register("gpu-1"))
                assert await conn.receive() == REGISTERED
    assert identities == ["gpu-1", "gpu-1"]


async def test_mtls_identity_falls_back_to_the_san(pki: Pki, tmp_path: Path) -> None:
    """A client certificate without a common name is known by its first SAN."""
    key, csr, ext, cert = (tmp_path / name for name in ("n.key", "n.csr", "n.ext", "n.pem"))
    ext.write_text("extendedKeyUsage=clientAuth\nsubjectAltName=DNS:gpu-5.fleet\n")
    newkey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    await trio.run_process(
        ["openssl", "req", "-new", *newkey, "-keyout", key, "-out", csr, "-subj", "/O=llmgw"],
        capture_stderr=True,
    )
    await trio.run_process(
        ["openssl", "x509", "-req", "-in", csr, "-CA", pki.ca.cert, "-CAkey", pki.ca.key,
         "-set_serial", "0x1234", "-days", "2", "-extfile", ext, "-out", cert],
        capture_stderr=True,
    )  # fmt: skip
    identities: list[str | None] = []

    async def handler(conn: AgentConnection) -> None:
        identities.append(conn.peer_identity)
        await echo_registration(conn)

    san_only = TlsConfig(str(cert), str(key), pki.node.client_ca)
    with trio.fail_after(5):
        async with (
            serving(handler, tls=pki.server) as listener,
            connector(listener, tls=san_only).connect() as conn,
        ):
            await conn.send(register("gpu-5.fleet"))
            assert await conn.receive() == REGISTERED
    assert identities == ["gpu-5.fleet"]


async def test_mtls_refuses_a_client_certificate_from_another_ca(pki: Pki) -> None:
    identities: list[str | None] = []

    async def handler(conn: AgentConnection) -> None:
        identities.append(conn.peer_identity)
        await echo_registration(conn)

    with trio.fail_after(5):
        async with serving(handler, tls=pki.server) as listener:
            with pytest.raises(ConnectFailed, match="client certificate"):
                async with connector(listener, tls=pki.rogue).connect():
                    pass
            # The listener serves on: a trusted node after it gets its stream.
            async with connector(listener, tls=pki.node).connect() as conn:
                await conn.send(register("gpu-1"))
                assert await conn.receive() == REGISTERED
    # Once, for the trusted node: the rogue (also a "gpu-1") never reached the handler
    # while the listener ran.
    assert identities == ["gpu-1"]


async def test_mtls_client_refuses_a_server_it_does_not_trust(pki: Pki) -> None:
    with trio.fail_after(5):
        async with serving(echo_registration, tls=pki.server) as listener:
            with pytest.raises(ConnectFailed, match="certificate verify failed"):
                async with connector(listener, tls=pki.wrong_trust).connect():
                    pass


async def test_plaintext_client_cannot_reach_a_tls_listener(pki: Pki) -> None:
    called = False

    async def handler(conn: AgentConnection) -> None:
        nonlocal called
        called = True

    with trio.fail_after(5):
        async with serving(handler, tls=pki.server) as listener:
            with pytest.raises(ConnectFailed, match="require TLS"):
                async with connector(listener).connect():
                    pass
    assert not called


async def test_tls_client_cannot_reach_a_plaintext_listener(pki: Pki) -> None:
    with trio.fail_after(5):
        async with serving(echo_registration) as listener:
            with pytest.raises(ConnectFailed, match="TLS handshake failed"):
                async with connector(listener, tls=pki.node).connect():
                    pass


async def test_mtls_client_checks_the_server_name(pki: Pki) -> None:
    with trio.fail_after(5):
        async with serving(echo_registration, tls=pki.server) as listener:
            wrong_name = connector(listener, tls=pki.node, server_name="ctl.example.com")
            with pytest.raises(ConnectFailed, match="does not name this host"):
                async with wrong_name.connect():
                    pass
            right_name = connector(listener, tls=pki.node, server_name="localhost")
            async with right_name.connect() as conn:
                await conn.send(register("gpu-1"))
                assert await conn.receive() == REGISTERED


def test_tls_listener_requires_a_client_ca(pki: Pki) -> None:
    with pytest.raises(ValueError, match="client_ca"):
        GrpcListener(":0", tls=TlsConfig(pki.server.cert, pki.server.key))


async def test_make_certs_script_makes_a_working_pki(tmp_path: Path) -> None:
    done = await trio.run_process(
        ["bash", str(ROOT / "scripts" / "make_certs.sh"), str(tmp_path), "gpu-7"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    files = set(os.listdir(tmp_path))
    assert {"ca.pem", "ca.key", "server.pem", "server.key", "gpu-7.pem", "gpu-7.key"} <= files
    server_tls = TlsConfig(
        *(str(tmp_path / name) for name in ("server.pem", "server.key", "ca.pem"))
    )
    node_tls = TlsConfig(*(str(tmp_path / name) for name in ("gpu-7.pem", "gpu-7.key", "ca.pem")))
    identities: list[str | None] = []

    async def handler(conn: AgentConnection) -> None:
        identities.append(conn.peer_identity)
        await echo_registration(conn)

    with trio.fail_after(5):
        async with (
            serving(handler, tls=server_tls) as listener,
            connector(listener, tls=node_tls).connect() as conn,
        ):
            await conn.send(register("gpu-7"))
            assert await conn.receive() == REGISTERED
    assert identities == ["gpu-7"]


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
