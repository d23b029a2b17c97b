"""The gRPC agent transport's tests' shared parts: a listener on 127.0.0.1 serving a
handler, a connector to it, the messages they exchange."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio

from llmgw.config import DeploymentProfile, TlsConfig
from llmgw.domain.fleet import Gpu, NodeInfo
from llmgw.transport.base import AgentConnection
from llmgw.transport.grpc import GrpcConnector, GrpcListener, Keepalive
from llmgw.transport.messages import (
    Register,
    Registered,
    StartShard,
)

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
