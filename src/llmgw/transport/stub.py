"""The in-memory agent transport: the Protocols of :mod:`llmgw.transport.base` over
trio memory channels, with the network's faults on demand.

A :class:`StubNetwork` stands for the wire between one server and many agents::

    network = StubNetwork(latency=0.05, drop_rate=0.01, seed=7)
    await nursery.start(network.listener().serve, handler)        # the server
    async with network.connector("gpu-1").connect() as conn:      # an agent
        await conn.send(Register(...))

Each direction of a connection is an ordered stream, as gRPC's is: a message sent
at time t with latency L is received no earlier than t + L and never before the
messages sent ahead of it. Faults:

* latency: seconds, or a function of (node id, message) deciding per message;
* drops: ``drop_rate`` with ``seed`` (each message sent while the rate is above 0
  takes one draw from ``random.Random(seed)`` and is lost if the draw is below the
  rate), or a ``drop`` predicate of (node id, message) for targeted losses. A
  dropped message vanishes silently, as far as the sender can tell;
* ``disconnect(node_id)`` cuts that node's connections as a network failure would:
  in-flight messages are lost and both ends' ``receive``/``send`` raise
  ConnectionClosed at once; the agent may reconnect straight away;
* ``partition(*node_ids)`` cuts them and makes their connect attempts fail until
  ``heal``; ``refuse_connects = True`` fails every connect attempt (the server's
  port unreachable) while existing connections carry on. Connecting while no
  listener serves fails too, as a refused TCP connect would.

Messages pass as the values they are (no serialisation), which keeps a thousand
agents in one test process cheap; ``wire_check=True`` sends each through the
protobuf conversion and back, to prove that what a test sends could cross the
real wire.
"""

from __future__ import annotations

import logging
import math
import random
import typing
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Generic, TypeVar

import attrs
import trio

from llmgw.transport import convert
from llmgw.transport.base import AgentHandler, ConnectFailed, ConnectionClosed
from llmgw.transport.messages import AgentMessage, ServerMessage
from llmgw.transport.pb import agent_pb2 as pb

__all__ = [
    "Latency",
    "StubAgentConnection",
    "StubConnector",
    "StubListener",
    "StubNetwork",
    "StubServerConnection",
    "StubStats",
]

log = logging.getLogger(__name__)

Message = AgentMessage | ServerMessage
Latency = float | Callable[[str, Message], float]
"""Seconds a message takes: fixed, or decided per (node id, message)."""

In = TypeVar("In", bound=Message)
Out = TypeVar("Out", bound=Message)


@attrs.define
class StubStats:
    """Counters over the network's lifetime, for tests to assert on."""

    connects: int = 0  # connections established
    refused: int = 0  # connect attempts that failed
    sent: int = 0  # messages handed to send (dropped ones included)
    dropped: int = 0
    cuts: int = 0  # connections cut by disconnect/partition


class _Link:
    """One connection: the two directions and the two ends."""

    def __init__(self, network: StubNetwork, node_id: str, identity: str | None) -> None:
        self.node_id = node_id
        self.cut = False
        up_tx, up_rx = trio.open_memory_channel[tuple[float, AgentMessage]](network.buffer)
        down_tx, down_rx = trio.open_memory_channel[tuple[float, ServerMessage]](network.buffer)
        self.server = StubAgentConnection(network, self, down_tx, up_rx, identity)
        self.agent = StubServerConnection(network, self, up_tx, down_rx)

    def sever(self) -> None:
        """A network failure: both ends fail now, whatever was in flight is lost."""
        self.cut = True
        self.server._shut()
        self.agent._shut()


class _End(Generic[In, Out]):
    """One end of a link: receives `In`, sends `Out`."""

    def __init__(
        self,
        network: StubNetwork,
        link: _Link,
        tx: trio.MemorySendChannel[tuple[float, Out]],
        rx: trio.MemoryReceiveChannel[tuple[float, In]],
    ) -> None:
        self._network = network
        self._link = link
        self._tx = tx
        self._rx = rx
        self._closed = False
        # A message taken off the channel whose delivery time has not come yet; kept
        # here so that a receive cancelled while it waits out the latency loses nothing.
        self._pending: tuple[float, In] | None = None
        self._receiving: trio.CancelScope | None = None

    @property
    def node_id(self) -> str:
        return self._link.node_id

    @property
    def closed(self) -> bool:
        return self._closed or self._link.cut

    async def receive(self) -> In:
        if self.closed:
            await trio.lowlevel.checkpoint()
            raise ConnectionClosed(self._why())
        if self._receiving is not None:
            raise trio.BusyResourceError("another task is already receiving on this connection")
        with trio.CancelScope() as self._receiving:
            try:
                if self._pending is None:
                    try:
                        self._pending = await self._rx.receive()
                    except (trio.EndOfChannel, trio.ClosedResourceError):
                        raise ConnectionClosed(self._why()) from None
                deliver_at, message = self._pending
                await trio.sleep_until(deliver_at)
                self._pending = None
                return message
            finally:
                self._receiving = None
        # Only a cut or our own close cancels that scope.
        raise ConnectionClosed(self._why())

    async def send(self, message: Out) -> None:
        if self.closed:
            await trio.lowlevel.checkpoint()
            raise ConnectionClosed(self._why())
        network = self._network
        network.stats.sent += 1
        if network._drops(self.node_id, message):
            network.stats.dropped += 1
            await trio.lowlevel.checkpoint()
            return
        if network.wire_check:
            message = _through_the_wire(message)
        latency = network.latency
        delay = latency(self.node_id, message) if callable(latency) else latency
        try:
            await self._tx.send((trio.current_time() + delay, message))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise ConnectionClosed(self._why()) from None

    async def aclose(self) -> None:
        self._close()
        await trio.lowlevel.checkpoint()

    def _close(self) -> None:
        """Close our end gracefully: the peer still receives what we sent, then the end."""
        if self._closed:
            return
        self._shut()
        self._network._forget(self._link)

    def _shut(self) -> None:
        self._closed = True
        self._tx.close()  # the peer's receive ends after what is in flight
        self._rx.close()  # the peer's send fails; our own blocked sends and receives wake
        if self._receiving is not None:
            self._receiving.cancel()  # a receive waiting out a message's latency

    def _why(self) -> str:
        if self._link.cut:
            return f"connection of {self.node_id} cut"
        if self._closed:
            return f"connection of {self.node_id} closed"
        return f"connection of {self.node_id} closed by the peer"


class StubAgentConnection(_End[AgentMessage, ServerMessage]):
    """The server's end of one agent's connection (a base.AgentConnection)."""

    def __init__(
        self,
        network: StubNetwork,
        link: _Link,
        tx: trio.MemorySendChannel[tuple[float, ServerMessage]],
        rx: trio.MemoryReceiveChannel[tuple[float, AgentMessage]],
        identity: str | None,
    ) -> None:
        super().__init__(network, link, tx, rx)
        self._identity = identity

    @property
    def peer_identity(self) -> str | None:
        return self._identity

    @property
    def peer_address(self) -> str | None:
        return None  # no network: the address a node declares is taken as it is


class StubServerConnection(_End[ServerMessage, AgentMessage]):
    """An agent's end of its connection (a base.ServerConnection)."""


def _through_the_wire(message: Out) -> Out:
    """`message` encoded to protobuf bytes and decoded again (an equal value)."""
    # Values of both directions share no class, so the type picks the direction.
    back: Message
    if isinstance(message, AgentMessage):
        request = convert.agent_message_to_proto(message).SerializeToString()
        back = convert.agent_message_from_proto(pb.ConnectRequest.FromString(request))
    else:
        response = convert.server_message_to_proto(message).SerializeToString()
        back = convert.server_message_from_proto(pb.ConnectResponse.FromString(response))
    return typing.cast(Out, back)


class StubListener:
    """The server side of a :class:`StubNetwork` (a base.AgentListener)."""

    def __init__(self, network: StubNetwork) -> None:
        self._network = network

    async def serve(
        self,
        handler: AgentHandler,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        accept_tx, accept_rx = trio.open_memory_channel[StubAgentConnection](math.inf)
        self._network._listen(accept_tx)
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                async for connection in accept_rx:
                    nursery.start_soon(self._handle, handler, connection)
        finally:
            self._network._unlisten(accept_tx)
            accept_tx.close()
            # Connections that arrived as we stopped never reached a handler: end them.
            while True:
                try:
                    accept_rx.receive_nowait()._close()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            accept_rx.close()

    async def _handle(self, handler: AgentHandler, connection: StubAgentConnection) -> None:
        try:
            await handler(connection)
        except* ConnectionClosed:
            pass  # the usual way an agent's stream ends; other errors are the handler's bugs
        finally:
            connection._close()


class StubConnector:
    """An agent's way to its server over a :class:`StubNetwork` (a base.AgentConnector)."""

    def __init__(self, network: StubNetwork, node_id: str, identity: str | None) -> None:
        self._network = network
        self.node_id = node_id
        self.identity = identity

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[StubServerConnection]:
        await trio.lowlevel.checkpoint()
        link = self._network._connect(self.node_id, self.identity)
        try:
            yield link.agent
        finally:
            link.agent._close()


class StubNetwork:
    """The wire between one server and its agents, with faults on demand.

    ``latency``, ``drop_rate``, ``drop`` and ``refuse_connects`` may be changed at any
    time; a message's latency and fate are decided when it is sent. ``buffer`` is how
    many messages a direction holds before ``send`` waits (flow control).
    """

    def __init__(
        self,
        *,
        latency: Latency = 0.0,
        drop_rate: float = 0.0,
        drop: Callable[[str, Message], bool] | None = None,
        seed: int = 0,
        buffer: int = 128,
        wire_check: bool = False,
    ) -> None:
        self.latency = latency
        self.drop_rate = drop_rate
        self.drop = drop
        self.refuse_connects = False
        self.buffer = buffer
        self.wire_check = wire_check
        self.stats = StubStats()
        self._rng = random.Random(seed)
        self._accept: trio.MemorySendChannel[StubAgentConnection] | None = None
        self._links: dict[str, set[_Link]] = {}
        self._partitioned: set[str] = set()

    # -- building ------------------------------------------------------------------

    def listener(self) -> StubListener:
        return StubListener(self)

    def connector(self, node_id: str, *, identity: str | None = None) -> StubConnector:
        """The connector of the agent on `node_id`. `identity` plays its client
        certificate: the server sees it as ``peer_identity`` (None: no TLS)."""
        return StubConnector(self, node_id, identity)

    # -- faults ----------------------------------------------------------------------

    def disconnect(self, node_id: str) -> int:
        """Cut every connection of `node_id`; returns how many there were."""
        links = self._links.pop(node_id, set())
        for link in links:
            link.sever()
        self.stats.cuts += len(links)
        return len(links)

    def partition(self, *node_ids: str) -> None:
        """Cut these nodes off: their connections now, their connect attempts until healed."""
        self._partitioned.update(node_ids)
        for node_id in node_ids:
            self.disconnect(node_id)

    def heal(self, *node_ids: str) -> None:
        """End the partition of these nodes, or of every node if none is named."""
        if node_ids:
            self._partitioned.difference_update(node_ids)
        else:
            self._partitioned.clear()

    # -- looking -------------------------------------------------------------------------

    def connected(self, node_id: str) -> bool:
        return bool(self._links.get(node_id))

    @property
    def connection_count(self) -> int:
        return sum(len(links) for links in self._links.values())

    @property
    def serving(self) -> bool:
        return self._accept is not None

    # -- internals -----------------------------------------------------------------------

    def _drops(self, node_id: str, message: Message) -> bool:
        if self.drop is not None and self.drop(node_id, message):
            return True
        return self.drop_rate > 0 and self._rng.random() < self.drop_rate

    def _listen(self, accept: trio.MemorySendChannel[StubAgentConnection]) -> None:
        if self._accept is not None:
            raise RuntimeError("a listener is already serving on this network")
        self._accept = accept

    def _unlisten(self, accept: trio.MemorySendChannel[StubAgentConnection]) -> None:
        if self._accept is accept:
            self._accept = None

    def _connect(self, node_id: str, identity: str | None) -> _Link:
        why = (
            (self._accept is None and "no listener is serving")
            or (node_id in self._partitioned and "partitioned")
            or (self.refuse_connects and "connections refused")
        )
        if why or self._accept is None:
            self.stats.refused += 1
            raise ConnectFailed(f"{node_id} cannot reach the server: {why}")
        link = _Link(self, node_id, identity)
        self._accept.send_nowait(link.server)  # unbounded: a connect never waits for accept
        self._links.setdefault(node_id, set()).add(link)
        self.stats.connects += 1
        return link

    def _forget(self, link: _Link) -> None:
        links = self._links.get(link.node_id)
        if links is not None:
            links.discard(link)
            if not links:
                del self._links[link.node_id]


if typing.TYPE_CHECKING:
    # mypy proves the stub implements the Protocols the real transport does.
    from llmgw.transport import base

    def _conforms(network: StubNetwork, link: _Link) -> None:
        _listener: base.AgentListener = network.listener()
        _connector: base.AgentConnector = network.connector("n")
        _server_end: base.AgentConnection = link.server
        _agent_end: base.ServerConnection = link.agent
