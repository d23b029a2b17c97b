"""The gRPC agent transport's cancellation and teardown, failures to connect or listen,
handler errors, and dead and cut peers (keepalive, a proxy that goes silent or cuts)."""

from __future__ import annotations

import socket
import threading

import attrs
import grpc
import pytest
import trio

from llmgw.domain.fleet import NodeInfo
from llmgw.testing.procs import reserve_port
from llmgw.transport import grpc_bridge
from llmgw.transport.base import AgentConnection, ConnectFailed, ConnectionClosed
from llmgw.transport.grpc import GrpcConnector, GrpcListener, Keepalive
from llmgw.transport.messages import (
    Heartbeat,
    Register,
)
from llmgw.transport.pb import agent_pb2 as pb
from llmgw.transport.pb import agent_pb2_grpc
from tests.grpc_peers import (
    REGISTERED,
    connector,
    echo_registration,
    os_threads,
    register,
    serving,
)
from tests.waiting import wait_until

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
