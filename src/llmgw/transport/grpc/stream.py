"""One ``Connect`` stream bridged between asyncio and trio (:class:`_Stream`), the two
ends trio sees of it (:class:`GrpcAgentConnection`, :class:`GrpcServerConnection`),
and what the listener and the connector share: the wire names, the timings and
:class:`Keepalive`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import typing
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import attrs
import grpc
import grpc.aio
import trio
from google.protobuf.message import Message

from llmgw.transport import convert, limits
from llmgw.transport import grpc_bridge as bridge
from llmgw.transport.base import ConnectionClosed
from llmgw.transport.grpc_bridge import Pipe, PipeClosed
from llmgw.transport.messages import AgentMessage, ServerMessage
from llmgw.transport.pb import agent_pb2 as pb

log = logging.getLogger("llmgw.transport.grpc")


def _describe(exc: BaseException) -> str:
    """``Kind: what it says``, for a log line (not the exception's repr)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# The wire names come from the proto's descriptor ("llmgw.agent.v1.AgentService"), not
# from agent_pb2_grpc's add_AgentServiceServicer_to_server, whose generated service
# name was rewritten along with the Python module names.
SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["AgentService"].full_name
METHOD = f"/{SERVICE_NAME}/Connect"

BUFFER = 64
"""Messages each direction of a stream holds on our side before the sender waits."""
CLOSE_GRACE = 2.0
"""Seconds a gracefully closed stream gets to flush and end before it is cut."""
STOP_GRACE = 1.0
"""Seconds the listener's gRPC server gives open streams when serve() ends."""
EOF_SETTLE = 0.05
"""Seconds the server waits after an agent's end of stream to tell a clean close from
a lost connection (which grpc.aio reports as EOF first, then as a cancellation)."""
CONNECT_TIMEOUT = 10.0
"""Default seconds a connect attempt may take (TCP, TLS handshake, stream start)."""

In = TypeVar("In", bound=AgentMessage | ServerMessage)
Out = TypeVar("Out", bound=AgentMessage | ServerMessage)


@attrs.frozen
class Keepalive:
    """HTTP/2 keepalive pings, so that a dead peer (no FIN, no RST) is noticed.

    Each side pings after ``interval`` seconds without a ping and gives the
    connection up if the ack takes longer than ``timeout``: a silent peer ends
    its streams within ``interval + timeout`` (15 s by default). Pings flow with
    or without streams and data. The server accepts pings from a client every
    ``min_peer_interval`` seconds at most often; a client pinging more often is
    sent GOAWAY (too_many_pings) after two strikes, gRPC's default.
    """

    interval: float = 10.0
    timeout: float = 5.0
    min_peer_interval: float = 5.0

    def _common(self) -> list[tuple[str, int]]:
        return [
            ("grpc.keepalive_time_ms", _ms(self.interval)),
            ("grpc.keepalive_timeout_ms", _ms(self.timeout)),
            ("grpc.keepalive_permit_without_calls", 1),
            # 0: keep pinging however long the stream is idle (default: stop after 2).
            ("grpc.http2.max_pings_without_data", 0),
            # grpcio 1.85 gives a keepalive ping's ack this long, not keepalive_timeout_ms
            # (default 60 s; measured: without it a silent peer went unnoticed for a minute).
            ("grpc.http2.ping_timeout_ms", _ms(self.timeout)),
        ]

    def client_options(self) -> list[tuple[str, int]]:
        return self._common()

    def server_options(self) -> list[tuple[str, int]]:
        return [
            *self._common(),
            ("grpc.http2.min_ping_interval_without_data_ms", _ms(self.min_peer_interval)),
        ]


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


# -- one stream ----------------------------------------------------------------------


class _Stream(Generic[In]):
    """One ``Connect`` stream: trio's view (inbox, outbox, ``finished``) and the
    asyncio side that pumps it (``run_server`` in the servicer, ``run_client``).

    Methods named ``_aio_*`` and the runners run on the asyncio thread; ``close_soon``
    and ``shut`` may be called from anywhere.
    """

    def __init__(
        self,
        token: trio.lowlevel.TrioToken,
        label: str,
        decode: Callable[[Any], In],
        *,
        eof_settle: float = 0.0,
    ) -> None:
        aio_loop = bridge.loop()
        self.token = token
        self.label = label
        self._decode = decode
        self.inbox: Pipe[In] = Pipe(BUFFER, token, aio_loop)
        self.outbox: Pipe[Message] = Pipe(BUFFER, token, aio_loop)
        self.finished = trio.Event()  # set (on the trio thread) once the asyncio side ended
        self.on_finished: Callable[[], None] | None = None  # called then, on the trio thread
        # asyncio side; Event binds to a loop on first wait, which is the asyncio thread's
        self._abort = asyncio.Event()
        self._abort_code = grpc.StatusCode.CANCELLED
        self._abort_reason = ""
        self._grace: asyncio.TimerHandle | None = None
        self._eof_settle = eof_settle
        self._ended = False

    # -- from trio (or anywhere) ----------------------------------------------------------

    def close_soon(self, reason: str) -> None:
        """End gracefully: what was sent is flushed, then the stream ends (within
        CLOSE_GRACE, else it is cut). Our receive fails from now on."""
        self.inbox.close(reason, discard=True)
        self.outbox.close(reason)
        bridge.call_soon(self._aio_arm_grace)

    def shut(self, reason: str) -> None:
        """End now: unsent messages are dropped and the stream is cancelled."""
        self.inbox.close(reason, discard=True)
        self.outbox.close(reason, discard=True)
        bridge.call_soon(self._aio_abort, reason, grpc.StatusCode.CANCELLED)

    async def receive(self) -> In:
        try:
            return await self.inbox.trio_get()
        except PipeClosed as exc:
            raise ConnectionClosed(exc.reason) from None

    async def send(self, message: Message) -> None:
        try:
            await self.outbox.trio_put(message)
        except PipeClosed as exc:
            raise ConnectionClosed(exc.reason) from None

    async def aclose(self, reason: str) -> None:
        self.close_soon(reason)
        try:
            with trio.move_on_after(CLOSE_GRACE + 1.0):  # the asyncio side cuts at CLOSE_GRACE
                await self.finished.wait()
        except BaseException:
            self.shut(reason)  # cancelled: no waiting for the flush
            raise
        if not self.finished.is_set():
            self.shut(reason)

    # -- asyncio side ---------------------------------------------------------------------------

    def _aio_arm_grace(self) -> None:
        if not self._ended and self._grace is None:
            self._grace = bridge.loop().call_later(
                CLOSE_GRACE,
                self._aio_abort,
                f"{self.label}: not closed within {CLOSE_GRACE:g}s, cut",
                grpc.StatusCode.CANCELLED,
            )

    def _aio_abort(self, reason: str, code: grpc.StatusCode) -> None:
        if not self._abort.is_set():
            self._abort_reason = reason
            self._abort_code = code
            self._abort.set()

    def _aio_end(self, reason: str) -> None:
        self._ended = True
        if self._grace is not None:
            self._grace.cancel()
        self.inbox.close(reason)
        self.outbox.close(reason, discard=True)
        bridge.wake_trio(self.token, self._trio_finished)

    def _trio_finished(self) -> None:
        self.finished.set()
        if self.on_finished is not None:
            self.on_finished()

    async def _read_loop(self, read: Callable[[], Awaitable[object]], eof: str) -> None:
        """The peer's messages into the inbox until the peer ends; then ends both pipes
        with the reason (``eof`` when the peer ended its side cleanly). Cancelled, it
        leaves the reason to the runner."""
        reason: str | None = None
        try:
            while True:
                raw = await read()
                if raw is grpc.aio.EOF:
                    if self._eof_settle:
                        # grpc.aio's server read says EOF both for a half-close and for
                        # a stream cancelled or a connection lost; in those, the servicer
                        # is cancelled a moment later (and so is this wait).
                        await asyncio.sleep(self._eof_settle)
                    reason = f"{self.label}: {eof}"
                    break
                try:
                    message = self._decode(raw)
                except convert.UnknownMessage as exc:
                    log.info(
                        "%s: skipping a message this version does not know (%s)", self.label, exc
                    )
                    continue
                except convert.ConversionError as exc:
                    reason = f"{self.label}: the peer sent an invalid message: {exc}"
                    log.warning("%s", reason)
                    self._aio_abort(reason, grpc.StatusCode.INVALID_ARGUMENT)
                    break
                # PipeClosed: we closed our end; drain what still comes until the peer ends.
                with contextlib.suppress(PipeClosed):
                    await self.inbox.aio_put(message)
        except grpc.aio.AioRpcError as exc:
            reason = f"{self.label}: {exc.code().name}: {exc.details()}"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # grpc.aio's other ways of saying the RPC is over
            reason = f"{self.label}: stream ended ({exc!r})"
        finally:
            if reason is not None:
                self.inbox.close(reason)  # what arrived is still received, then the reason
                self.outbox.close(reason, discard=True)  # the peer is done: nothing to send

    async def _write_loop(self, write: Callable[[Any], Awaitable[None]]) -> None:
        """The outbox onto the stream until it is closed (and drained) or a write fails."""
        while True:
            try:
                message = await self.outbox.aio_get()
            except PipeClosed:
                return
            try:
                await write(message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("%s: write failed: %s", self.label, _describe(exc))
                self.outbox.close(f"{self.label}: stream ended ({_describe(exc)})", discard=True)
                return

    async def run_server(
        self, context: grpc.aio.ServicerContext[pb.ConnectRequest, pb.ConnectResponse]
    ) -> None:
        """The servicer's body once the stream was handed to trio."""
        read = typing.cast(Callable[[], Awaitable[object]], context.read)
        reader = bridge.spawn(self._read_loop(read, "closed by the agent"))
        writer = bridge.spawn(self._write_loop(context.write))
        aborted = bridge.spawn(self._abort.wait())
        reason = f"{self.label}: stream ended"
        try:
            await asyncio.wait({writer, aborted}, return_when=asyncio.FIRST_COMPLETED)
            if self._abort.is_set():
                reason = self._abort_reason
                context.set_code(self._abort_code)
                context.set_details(self._abort_reason)
        except asyncio.CancelledError:
            reason = f"{self.label}: the agent cancelled its stream or its connection was lost"
            raise
        finally:
            await _cancel(reader, writer, aborted)
            self._aio_end(reason)

    async def run_client(
        self,
        channel: grpc.aio.Channel,
        call: grpc.aio.StreamStreamCall[Any, pb.ConnectResponse],
    ) -> None:
        """The agent's stream from connect to its end; closes the channel."""
        reader = bridge.spawn(self._read_loop(call.read, "closed by the server"))
        writer = bridge.spawn(self._write_loop(call.write))
        aborted = bridge.spawn(self._abort.wait())
        reason = f"{self.label}: stream ended"
        try:
            await asyncio.wait({writer, aborted}, return_when=asyncio.FIRST_COMPLETED)
            if not self._abort.is_set() and not reader.done():
                # Our graceful close: all sent is written. Half-close; the server ends it.
                with contextlib.suppress(Exception):
                    await call.done_writing()
                await asyncio.wait({reader, aborted}, return_when=asyncio.FIRST_COMPLETED)
            if self._abort.is_set():
                reason = self._abort_reason
        finally:
            call.cancel()  # no-op once the RPC is over
            await _cancel(reader, writer, aborted)
            await channel.close()
            self._aio_end(reason)


async def _cancel(*tasks: asyncio.Task[Any]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(BaseException):
            await task


def _decode_agent_message(raw: object) -> AgentMessage:
    # Bounds first: converting 60,000 GPUs took this thread (every stream's) 8 s.
    found = limits.problem(raw)
    if found is not None:
        raise convert.ConversionError(f"over the agent protocol's bounds: {found}")
    return convert.agent_message_from_proto(typing.cast(pb.ConnectRequest, raw))


def _decode_server_message(raw: object) -> ServerMessage:
    return convert.server_message_from_proto(typing.cast(pb.ConnectResponse, raw))


# -- the two ends as trio sees them -------------------------------------------------------------


class _End(Generic[In, Out]):
    def __init__(self, stream: _Stream[In], encode: Callable[[Out], Message], closed: str) -> None:
        self._stream: _Stream[In] = stream
        self._encode: Callable[[Out], Message] = encode
        self._closed_reason = closed

    async def receive(self) -> In:
        return await self._stream.receive()

    async def send(self, message: Out) -> None:
        # Conversion errors are the caller's (a value with no wire form), raised here.
        await self._stream.send(self._encode(message))

    async def aclose(self) -> None:
        await self._stream.aclose(self._closed_reason)


class GrpcAgentConnection(_End[AgentMessage, ServerMessage]):
    """The server's end of one agent's stream (a base.AgentConnection)."""

    def __init__(
        self, stream: _Stream[AgentMessage], identity: str | None, address: str | None = None
    ) -> None:
        super().__init__(stream, convert.server_message_to_proto, f"{stream.label}: closed by us")
        self._identity = identity
        self._address = address

    @property
    def peer_identity(self) -> str | None:
        return self._identity

    @property
    def peer_address(self) -> str | None:
        return self._address

    def __repr__(self) -> str:
        return f"<GrpcAgentConnection {self._stream.label}>"


class GrpcServerConnection(_End[ServerMessage, AgentMessage]):
    """The agent's end of its stream to the server (a base.ServerConnection)."""

    def __init__(self, stream: _Stream[ServerMessage]) -> None:
        super().__init__(stream, convert.agent_message_to_proto, f"{stream.label}: closed by us")

    def __repr__(self) -> str:
        return f"<GrpcServerConnection {self._stream.label}>"
