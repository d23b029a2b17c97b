"""The gRPC agent transport against stock grpcio peers: their client to our listener,
our connector to their server, the generated servicer helper."""

from __future__ import annotations

import queue
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import attrs
import grpc
import trio
from google.protobuf.duration_pb2 import Duration

from llmgw.domain.fleet import NodeInfo
from llmgw.transport.base import AgentConnection, ConnectionClosed
from llmgw.transport.grpc import SERVICE_NAME, GrpcConnector
from llmgw.transport.messages import (
    AgentMessage,
    CommandResult,
    Heartbeat,
    Register,
    Registered,
    ServerMessage,
)
from llmgw.transport.pb import agent_pb2 as pb
from llmgw.transport.pb import agent_pb2_grpc
from tests.grpc_peers import (
    REGISTERED,
    START,
    register,
    serving,
)

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
