"""The gRPC agent transport: :mod:`llmgw.transport.base` over ``AgentService.Connect``.

The server listens with :class:`GrpcListener`, agents connect with
:class:`GrpcConnector`; each connection is one bidirectional ``Connect`` stream of
``ConnectRequest``/``ConnectResponse``, converted to and from the protocol's values
by :mod:`llmgw.transport.convert` at this edge. Any stock gRPC peer built from
``proto/llmgw/agent/v1/agent.proto`` interoperates.

grpcio's ``grpc.aio`` does the wire work in the process's one asyncio thread
(:mod:`llmgw.transport.grpc_bridge`, DESIGN §11); trio only ever waits on events.
Per stream the asyncio side runs a reader (messages → a bounded inbox that trio's
``receive`` takes from) and a writer (trio's ``send`` → a bounded outbox → the
stream), so:

* cancelling ``receive`` loses no message (taking one from the inbox is atomic);
* cancelling ``send`` cancels only its wait for room in the outbox, never a
  half-done write (grpc.aio cancels the whole RPC when a write is cancelled);
* ``aclose`` is graceful: what was sent is flushed, then the stream ends; a stream
  that does not finish within ``CLOSE_GRACE`` is cut. A cancelled ``aclose`` cuts
  at once.

Either end closing ends the whole connection, as with the stub: the agent's
``aclose`` half-closes the stream and the server then ends it (so the server's
``send`` fails); the server's ends it with status OK after its last message.

Liveness: both ends send HTTP/2 keepalive pings (:class:`Keepalive`), so a peer
whose host or network died (no FIN, no RST) ends ``receive`` with
ConnectionClosed within ``interval + timeout`` (15 s by default).

TLS: with a :class:`~llmgw.config.TlsConfig` the listener requires client
certificates signed by ``client_ca`` (mTLS) and reports the certificate's common
name (else its first subject alternative name) as ``peer_identity``; without TLS
the port is plaintext and the listener says so loudly at start. On the connector,
``tls.cert``/``tls.key`` are the agent's certificate and ``tls.client_ca`` is the
CA that signed the *server's* certificate (None: the system's roots).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import typing
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Generic, TypeVar

import attrs
import grpc
import grpc.aio
import trio
from google.protobuf.message import Message

from llmgw import units
from llmgw.config import TlsConfig
from llmgw.transport import convert
from llmgw.transport import grpc_bridge as bridge
from llmgw.transport.base import AgentHandler, ConnectFailed, ConnectionClosed
from llmgw.transport.grpc_bridge import Pipe, PipeClosed
from llmgw.transport.messages import AgentMessage, ServerMessage
from llmgw.transport.pb import agent_pb2 as pb

__all__ = [
    "CLOSE_GRACE",
    "METHOD",
    "SERVICE_NAME",
    "STOP_GRACE",
    "GrpcAgentConnection",
    "GrpcConnector",
    "GrpcListener",
    "GrpcServerConnection",
    "Keepalive",
]

log = logging.getLogger(__name__)


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

    def __init__(self, stream: _Stream[AgentMessage], identity: str | None) -> None:
        super().__init__(stream, convert.server_message_to_proto, f"{stream.label}: closed by us")
        self._identity = identity

    @property
    def peer_identity(self) -> str | None:
        return self._identity

    def __repr__(self) -> str:
        return f"<GrpcAgentConnection {self._stream.label}>"


class GrpcServerConnection(_End[ServerMessage, AgentMessage]):
    """The agent's end of its stream to the server (a base.ServerConnection)."""

    def __init__(self, stream: _Stream[ServerMessage]) -> None:
        super().__init__(stream, convert.agent_message_to_proto, f"{stream.label}: closed by us")

    def __repr__(self) -> str:
        return f"<GrpcServerConnection {self._stream.label}>"


# -- the server side ----------------------------------------------------------------------------


def _peer_identity(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The verified client certificate's CN, else its first SAN; None without TLS."""
    auth = {key: list(values) for key, values in context.auth_context().items()}
    if auth.get("transport_security_type") != [b"ssl"]:
        return None
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in auth.get(key, ()):
            if value:  # a certificate without a CN reports an empty one
                return value.decode("utf-8", "replace")
    return None


class _Servicer:
    """``AgentService.Connect`` on the asyncio thread: hands each stream to trio."""

    def __init__(self, token: trio.lowlevel.TrioToken, accept: Callable[[_Accepted], None]) -> None:
        self._token = token
        self._accept = accept

    async def connect(
        self,
        request_iterator: object,
        context: grpc.aio.ServicerContext[pb.ConnectRequest, pb.ConnectResponse],
    ) -> None:
        identity = _peer_identity(context)
        peer = context.peer()
        label = f"agent {identity} at {peer}" if identity else f"agent at {peer}"
        stream = _Stream(self._token, label, _decode_agent_message, eof_settle=EOF_SETTLE)
        # Headers now, so a client knows its stream was accepted before any message.
        await context.send_initial_metadata(())
        if not bridge.wake_trio(self._token, lambda: self._accept(_Accepted(stream, identity))):
            context.set_code(grpc.StatusCode.UNAVAILABLE)
            context.set_details("the server is stopping")
            return
        await stream.run_server(context)


@attrs.frozen
class _Accepted:
    stream: _Stream[AgentMessage]
    identity: str | None


def _bind_target(address: str) -> str:
    parsed = units.parse_address(address)
    host = parsed.host or "[::]"  # every interface, IPv6 and IPv4
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{parsed.port}"


async def _check_bindable(address: str) -> None:
    """Bind `address` as the gRPC server is about to, and let go at once, raising the
    OSError a bind meets ("cannot listen on 127.0.0.1:7443: address already in use").

    grpc's own failure says only "Failed to bind" (and its C core logs a line of its
    own to stderr), so without this the operator does not learn why. A race with
    another process in between only brings back grpc's vaguer message."""
    parsed = units.parse_address(address)
    if parsed.port == 0:
        return  # the kernel picks a free port: nothing to collide with
    try:
        infos = await trio.socket.getaddrinfo(
            parsed.bind_host, parsed.port, type=trio.socket.SOCK_STREAM
        )
        family, kind, proto, _, sockaddr = infos[0]
        with trio.socket.socket(family, kind, proto) as sock:
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)  # as grpc
            await sock.bind(sockaddr)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        reason = reason[:1].lower() + reason[1:]
        raise OSError(exc.errno, f"cannot listen on {address}: {reason}") from None


async def _start_server(
    servicer: _Servicer,
    target: str,
    credentials: grpc.ServerCredentials | None,
    options: list[tuple[str, int]],
) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=options)
    handler = grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "Connect": grpc.stream_stream_rpc_method_handler(
                servicer.connect,
                request_deserializer=pb.ConnectRequest.FromString,
                response_serializer=pb.ConnectResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    try:
        if credentials is None:
            port = server.add_insecure_port(target)
        else:
            port = server.add_secure_port(target, credentials)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {target}: {exc}") from None
    if port == 0:
        raise OSError(f"cannot listen on {target}")
    await server.start()
    return server, port


async def _stop_server(server: grpc.aio.Server, grace: float) -> None:
    await server.stop(grace)


class GrpcListener:
    """The server side of the gRPC transport (a base.AgentListener).

    ``address`` is ``HOST:PORT`` or ``:PORT`` (every interface); port 0 picks a free
    port, readable as ``port`` (and in ``addresses``) once ``serve`` has reported
    started.
    """

    def __init__(
        self,
        address: str,
        *,
        tls: TlsConfig | None = None,
        keepalive: Keepalive = Keepalive(),
    ) -> None:
        if tls is not None and tls.client_ca is None:
            raise ValueError(
                "agent TLS needs client_ca: the agent port requires client certificates "
                "signed by it (mTLS)"
            )
        self.address = address
        self.tls = tls
        self.keepalive = keepalive
        self.port: int | None = None
        # Referenced while serving: a grpc.aio.Server stops when garbage-collected.
        self._server: grpc.aio.Server | None = None

    @property
    def addresses(self) -> list[str]:
        """Where it listens once ``serve`` has reported started, as ``HOST:PORT`` with
        the bound port (``[::]:PORT`` for every interface); empty before."""
        if self.port is None:
            return []
        host = units.parse_address(self.address).host or "::"
        return [str(units.Address(host, self.port))]

    def _credentials(self) -> grpc.ServerCredentials | None:
        if self.tls is None:
            return None
        assert self.tls.client_ca is not None  # checked in __init__
        return grpc.ssl_server_credentials(
            [(_read(self.tls.key), _read(self.tls.cert))],
            root_certificates=_read(self.tls.client_ca),
            require_client_auth=True,
        )

    async def serve(
        self,
        handler: AgentHandler,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        token = trio.lowlevel.current_trio_token()
        accept_tx, accept_rx = trio.open_memory_channel[_Accepted](math.inf)
        streams: set[_Stream[AgentMessage]] = set()

        def accept(accepted: _Accepted) -> None:  # on the trio thread
            try:
                accept_tx.send_nowait(accepted)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                accepted.stream.shut("the server is stopping")
                return
            stream = accepted.stream
            streams.add(stream)
            stream.on_finished = lambda: streams.discard(stream)

        await _check_bindable(self.address)
        target = _bind_target(self.address)
        server, port = await bridge.run(
            _start_server,
            _Servicer(token, accept),
            target,
            self._credentials(),
            [*self.keepalive.server_options(), ("grpc.so_reuseport", 0)],
            discard=lambda started: bridge.spawn(started[0].stop(None)),
        )
        self._server, self.port = server, port
        if self.tls is None:
            log.warning(
                "agent port %s (port %d) is PLAINTEXT: no TLS, no client certificates; any "
                "host that reaches it can claim any node id. Set agent_tls (cert, key, "
                "client_ca) to require client certificates.",
                self.address,
                port,
            )
        else:
            log.info(
                "agent port %s (port %d): mTLS, client certificates required", self.address, port
            )
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                async for accepted in accept_rx:
                    nursery.start_soon(self._handle, handler, accepted)
        finally:
            accept_tx.close()
            while True:  # accepted as we stopped; never reached a handler
                try:
                    accept_rx.receive_nowait().stream.shut("the server is stopping")
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            with trio.CancelScope(shield=True):
                with trio.move_on_after(STOP_GRACE + 5.0):
                    await bridge.run(_stop_server, server, STOP_GRACE)
                # Every stream has ended by now; wait for their asyncio sides to finish.
                with trio.move_on_after(CLOSE_GRACE + 1.0):
                    for stream in list(streams):
                        await stream.finished.wait()
            self._server = None

    async def _handle(self, handler: AgentHandler, accepted: _Accepted) -> None:
        stream = accepted.stream
        try:
            await handler(GrpcAgentConnection(stream, accepted.identity))
        except* ConnectionClosed:
            pass  # the usual way an agent's stream ends; other errors are the handler's bugs
        finally:
            stream.close_soon(f"{stream.label}: closed by the server")


# -- the agent side --------------------------------------------------------------------------------


def _connect_failure(target: str, exc: grpc.aio.AioRpcError, tls: bool) -> ConnectFailed:
    details = exc.details() or ""
    text = details.lower()
    if "connection refused" in text:
        why = "connection refused"
    elif any(m in text for m in ("errors resolving", "dns resolution", "domain name not found")):
        why = "cannot resolve the host name"
    elif "certificate_verify_failed" in text or "certificate verify failed" in text:
        why = "certificate verify failed: the server's certificate is not signed by our CA"
    elif "hostname verification" in text or "not in peer certificate" in text:
        why = "certificate verify failed: the server's certificate does not name this host"
    elif "wrong_version_number" in text or "handshake failed" in text:
        why = "TLS handshake failed (does the server speak TLS?)" if tls else "handshake failed"
    elif "socket closed" in text or "connection reset" in text:
        why = (
            "the server closed the connection during the TLS handshake: it refused our "
            "client certificate (not signed by its client CA?) or does not speak TLS"
            if tls
            else "the server closed the connection: does it require TLS?"
        )
    else:
        why = exc.code().name
    return ConnectFailed(f"cannot connect to {target}: {why} [{exc.code().name}: {details}]")


class GrpcConnector:
    """The agent side of the gRPC transport (a base.AgentConnector).

    ``address`` is any gRPC target (``host:port``). Each ``connect()`` opens its
    own channel (its own TCP connection), so a reconnect never reuses a broken one.
    ``server_name`` overrides the name checked against the server's certificate.
    """

    def __init__(
        self,
        address: str,
        *,
        tls: TlsConfig | None = None,
        node_id: str | None = None,
        keepalive: Keepalive = Keepalive(),
        connect_timeout: float = CONNECT_TIMEOUT,
        server_name: str | None = None,
    ) -> None:
        self.address = address
        self.tls = tls
        self.node_id = node_id
        self.keepalive = keepalive
        self.connect_timeout = connect_timeout
        self.server_name = server_name

    def _credentials(self) -> grpc.ChannelCredentials | None:
        if self.tls is None:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.tls.client_ca) if self.tls.client_ca else None,
            private_key=_read(self.tls.key),
            certificate_chain=_read(self.tls.cert),
        )

    def _options(self) -> list[tuple[str, int | str]]:
        options: list[tuple[str, int | str]] = [
            *self.keepalive.client_options(),
            # A channel of its own: not a subchannel shared with other connectors.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if self.server_name is not None:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        return options

    async def _open(
        self, stream: _Stream[ServerMessage], credentials: grpc.ChannelCredentials | None
    ) -> None:
        target = self.address
        options = self._options()
        if credentials is None:
            channel = grpc.aio.insecure_channel(target, options=options)
        else:
            channel = grpc.aio.secure_channel(target, credentials, options=options)
        call: grpc.aio.StreamStreamCall[Any, pb.ConnectResponse] = channel.stream_stream(
            METHOD,
            request_serializer=pb.ConnectRequest.SerializeToString,
            response_deserializer=pb.ConnectResponse.FromString,
        )(wait_for_ready=False)
        try:
            async with asyncio.timeout(self.connect_timeout):
                # Returns once the stream's headers went out on a ready connection
                # (TCP and TLS, client certificate accepted); fails as the connect does.
                await call.wait_for_connection()
        except BaseException as exc:
            call.cancel()
            await channel.close()
            if isinstance(exc, grpc.aio.AioRpcError):
                raise _connect_failure(target, exc, credentials is not None) from None
            if isinstance(exc, TimeoutError):
                raise ConnectFailed(
                    f"cannot connect to {target}: timed out after {self.connect_timeout:g}s"
                ) from None
            raise
        bridge.spawn(stream.run_client(channel, call))

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[GrpcServerConnection]:
        token = trio.lowlevel.current_trio_token()
        credentials = self._credentials()
        label = f"{self.node_id or 'agent'} to {self.address}"
        stream = _Stream(token, label, _decode_server_message)
        await bridge.run(
            self._open, stream, credentials, discard=lambda _: stream.shut("connect abandoned")
        )
        connection = GrpcServerConnection(stream)
        try:
            yield connection
        finally:
            await connection.aclose()


if typing.TYPE_CHECKING:
    # mypy proves these implement the Protocols of llmgw.transport.base.
    from llmgw.transport import base

    def _conforms(
        listener: GrpcListener,
        connector: GrpcConnector,
        agent_end: GrpcAgentConnection,
        server_end: GrpcServerConnection,
    ) -> None:
        _listener: base.AgentListener = listener
        _connector: base.AgentConnector = connector
        _agent_end: base.AgentConnection = agent_end
        _server_end: base.ServerConnection = server_end
