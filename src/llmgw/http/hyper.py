"""Serving an ASGI app with hypercorn on sockets llmgw bound: the admin listener, and
any listener with TLS (HTTP/2 where the client offers it by ALPN, HTTP/1.1 else).

The sockets are bound by :func:`llmgw.server.serve` (port 0 in tests, so the port is
known before serving); connections are accepted here, through the listener's share of
the connection budget (:mod:`llmgw.http.budget`), and each is served by hypercorn's
HTTP/1.1 or HTTP/2 protocol, with the deadlines and limits of :class:`HyperConfig`
and :func:`limit_requests`. With TLS, the
certificate and key are read into one :class:`ReloadableTls` context, which
:meth:`ReloadableTls.reload` reads again in place: connections from then on get the
new certificate, those open keep theirs (SIGHUP, :mod:`llmgw.server`).
"""

from __future__ import annotations

import logging
import math
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import trio
from h2.errors import ErrorCodes
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, RawData
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import repr_socket_addr, wrap_app

from llmgw.http.asgi import App, Receive, Scope, Send, error_body
from llmgw.http.budget import Acceptor, detach, turn_away
from llmgw.http.request import MAX_HEADERS

__all__ = [
    "HyperConfig",
    "ReloadableTls",
    "TlsFiles",
    "cut_stalled_writes",
    "limit_requests",
    "serve_hypercorn",
]

log = logging.getLogger("llmgw.http")


@attrs.frozen
class TlsFiles:
    """A listener's certificate chain and key (PEM), and the CA its clients'
    certificates must be signed by (None: no client certificate asked for)."""

    cert: str
    key: str
    client_ca: str | None = None


class ReloadableTls:
    """One server-side TLS context for a listener, reloadable in place."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        # RFC 9113 §9.2: HTTP/2 needs TLS 1.2 or later and no compression.
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.options |= ssl.OP_NO_COMPRESSION
        context.set_alpn_protocols(["h2", "http/1.1"])
        if files.client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
        self.context = context
        self.reload()

    def reload(self) -> None:
        """Read the files again; raises (keeping the old ones) when they do not load.
        A client CA can be added or replaced this way; dropping `client_ca`
        altogether needs a restart."""
        self.context.load_cert_chain(self.files.cert, self.files.key)
        if self.files.client_ca is not None:
            self.context.load_verify_locations(self.files.client_ca)


class _Config(HypercornConfig):
    """Hypercorn's configuration with llmgw's TLS context instead of one it builds."""

    def __init__(self, tls: ReloadableTls | None) -> None:
        super().__init__()
        self._tls = tls

    @property
    def ssl_enabled(self) -> bool:
        return self._tls is not None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        return None if self._tls is None else self._tls.context


def cut_stalled_writes(sock: socket.socket | trio.socket.SocketType, stall: float) -> None:
    """Connections accepted on `sock` are reset by the kernel once the client has
    taken none of what was sent for `stall` seconds (TCP_USER_TIMEOUT covers data
    held back by a zero window; accepted sockets inherit it). Hypercorn writes with
    cancellation shielded, so a deadline in the app could not stop a write to a client
    that stopped reading; this ends it, and the app sees a disconnect."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, option, max(1, round(stall * 1000)))


@attrs.frozen
class HyperConfig:
    """How one hypercorn listener serves (as :class:`llmgw.http.server.HttpServerConfig`
    for llmgw's own server)."""

    #: Seconds from the accept, or from the last response on a kept-alive connection,
    #: to a complete request head; then the connection is closed. Hypercorn has no head
    #: deadline of its own: a connection without a complete request counts as idle.
    header_timeout: float = 10.0
    #: Seconds a request body has to arrive, from the app's first wait for it; then
    #: ``408`` and the connection closes. None: unbounded.
    body_timeout: float | None = None
    #: Seconds a response write may wait for the client to take any bytes
    #: (:func:`cut_stalled_writes`). None: unbounded.
    send_timeout: float | None = None
    #: Seconds a TLS handshake may take (hypercorn's default is 60).
    handshake_timeout: float = 5.0
    #: Connections served at once, over all of `listeners` (llmgw.http.budget); one past
    #: it is closed at once (a plain listener's with a ``503``). None: unbounded.
    max_connections: int | None = None
    #: Seconds requests in flight get to finish once shutdown begins.
    graceful_timeout: float = 3.0


#: An HTTP/2 client may reset this many streams at once, and this many more per second
#: (a client cancelling its own requests resets a few); past it the connection gets a
#: GOAWAY (ENHANCE_YOUR_CALM) and closes: resets that cost the server a stream each and
#: the client nothing (CVE-2023-44487, "rapid reset"). Hypercorn bounds none.
RESET_BURST = 200
RESET_RATE = 20.0

#: Seconds a connection's close may take (a TLS close_notify to send); the socket is
#: closed then in any case (trio's aclose closes when cancelled).
_CLOSE_TIMEOUT = 1.0
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_RST_STREAM = 0x3


class _ResetWatch:
    """Counts the RST_STREAM frames in an HTTP/2 client's bytes, from the frame heads
    alone (RFC 9113 §4.1: 9 bytes, the payload's length first), against a token bucket
    of :data:`RESET_BURST` refilled at :data:`RESET_RATE` per second."""

    __slots__ = ("_head", "_skip", "_stamp", "_tokens")

    def __init__(self, skip: int) -> None:
        self._skip = skip  # bytes to pass over: the preface, then payloads
        self._head = bytearray()
        self._tokens = float(RESET_BURST)
        self._stamp = trio.current_time()

    def over(self, data: bytes | bytearray) -> bool:
        """Take `data` in; True once the client has reset more streams than allowed."""
        at, size = 0, len(data)
        while at < size:
            if self._skip:
                step = min(self._skip, size - at)
                self._skip -= step
                at += step
                continue
            step = min(9 - len(self._head), size - at)
            self._head += data[at : at + step]
            at += step
            if len(self._head) < 9:
                break
            self._skip = int.from_bytes(self._head[:3], "big")
            kind = self._head[3]
            self._head.clear()
            if kind == _RST_STREAM and self._spend():
                return True
        return False

    def _spend(self) -> bool:
        now = trio.current_time()
        self._tokens = min(RESET_BURST, self._tokens + (now - self._stamp) * RESET_RATE)
        self._stamp = now
        self._tokens -= 1
        return self._tokens < 0


class _Connection(TCPServer):
    """Hypercorn's connection, reading without its per-read timeout (the deadlines are
    :class:`HyperConfig`'s) and watching an HTTP/2 client's stream resets."""

    async def _read_data(self) -> None:
        watch: _ResetWatch | None = None
        while True:
            try:
                data = await self.stream.receive_some(MAX_RECV)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                break
            if watch is None:
                # HTTP/2 by ALPN, or by prior knowledge: hypercorn switches as the
                # preface arrives.
                preface = data.startswith(_PREFACE)
                if preface or isinstance(self.protocol.protocol, H2Protocol):
                    watch = _ResetWatch(skip=len(_PREFACE) if preface else 0)
            if watch is not None and watch.over(data):
                await self._calm_down()
                break
            await self.protocol.handle(RawData(bytes(data)))
            if data == b"":
                break
        await self.protocol.handle(Closed())

    async def _close(self) -> None:
        # Hypercorn closes from the app's task, after its last response: quart-trio
        # cancels that task as the disconnect it is then told of arrives, which left
        # the connection open until the client closed it. Shielded, and bounded: a TLS
        # close_notify to a client that does not read must not hold the close.
        with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT):
            await super()._close()

    async def _calm_down(self) -> None:
        log.warning("an HTTP/2 client reset streams faster than allowed: GOAWAY, closing")
        protocol = self.protocol.protocol
        assert isinstance(protocol, H2Protocol)
        protocol.connection.close_connection(error_code=ErrorCodes.ENHANCE_YOUR_CALM)
        await self.protocol_send(RawData(protocol.connection.data_to_send()))


async def serve_hypercorn(
    app: App,
    listeners: Sequence[trio.SocketListener],
    config: HyperConfig,
    *,
    tls: ReloadableTls | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `listeners` with hypercorn's protocols (HTTP/1.1; HTTP/2 by ALPN
    with `tls`) until `shutdown_trigger` returns; requests in flight then get
    `config.graceful_timeout`. Hypercorn's own worker is replaced by this accept loop, so
    that connections go through the listener's share of the budget
    (:mod:`llmgw.http.budget`). The listening sockets are closed once shutdown begins."""
    settings = _Config(tls)
    settings.keep_alive_timeout = config.header_timeout
    settings.read_timeout = None  # see _Connection
    settings.ssl_handshake_timeout = config.handshake_timeout
    settings.graceful_timeout = config.graceful_timeout
    settings.include_server_header = False
    settings.accesslog = None
    settings.errorlog = logging.getLogger("llmgw.http.hypercorn")
    # Without a lifespan protocol to speak, hypercorn's startup wait would be 60 s.
    settings.startup_timeout = 10.0
    if config.send_timeout is not None:
        for listener in listeners:
            cut_stalled_writes(listener.socket, config.send_timeout)
    guarded = limit_requests(app, config.body_timeout)
    wrapped: Any = wrap_app(guarded, settings.wsgi_max_body_size, "asgi")  # type: ignore[arg-type]
    state: dict[str, Any] = {}
    lifespan = Lifespan(wrapped, settings, state)
    context = WorkerContext(None)
    cap = config.max_connections
    served = 0

    async def connection(stream: trio.SocketStream) -> None:
        nonlocal served
        try:
            conn: Any = stream
            if tls is not None:
                conn = trio.SSLStream(stream, tls.context, server_side=True, https_compatible=True)
            # Closed here too: hypercorn leaves a stream whose handshake failed open.
            async with conn:
                await _Connection(wrapped, settings, context, ConnectionState(state.copy()), conn)
        except Exception:
            # A bug met on one connection must not end the others (or the listener).
            log.exception("a connection failed")
        finally:
            served -= 1

    async def accept(listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        nonlocal served
        acceptor = Acceptor(listener)
        while True:
            stream = await acceptor.accept()
            if cap is not None and served >= cap:
                turn_away(detach(stream), cap, plain=tls is None)
                continue
            served += 1
            nursery.start_soon(connection, stream)

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            async with trio.open_nursery() as accepting:
                for listener in listeners:
                    accepting.start_soon(accept, listener, connections)
                task_status.started([_url(listener, tls is not None) for listener in listeners])
                await shutdown_trigger()
                accepting.cancel_scope.cancel()
            # New clients are refused from now on, not left waiting in the backlog.
            for listener in listeners:
                listener.socket.close()
            # Idle connections close now, busy ones after their request.
            await context.terminated.set()
            connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


def _url(listener: trio.SocketListener, secure: bool) -> str:
    sock = listener.socket
    return f"{'https' if secure else 'http'}://{repr_socket_addr(sock.family, sock.getsockname())}"


def limit_requests(app: App, body_timeout: float | None) -> App:
    """`app` behind the limits llmgw's own server keeps in its parser and I/O, which
    hypercorn lacks: at most :data:`~llmgw.http.request.MAX_HEADERS` header fields
    (``431``), and a body that arrives within `body_timeout` from the app's first wait
    for it (``408``; the connection then closes)."""

    async def limited(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if len(scope["headers"]) > MAX_HEADERS:
            await _refuse(send, 431, f"the request head has more than {MAX_HEADERS} header fields")
            return
        if body_timeout is None:
            await app(scope, receive, send)
            return
        deadline = math.inf
        read = started = refused = False

        async def timed_receive() -> Any:
            nonlocal deadline, read, refused
            if read:
                return await receive()
            if deadline == math.inf:
                deadline = trio.current_time() + body_timeout
            with trio.move_on_at(deadline):
                message = await receive()
                read = message["type"] != "http.request" or not message.get("more_body", False)
                return message
            read = True
            if not started:
                refused = True
                await _refuse(
                    send, 408, f"the request body did not arrive within {body_timeout:g}s"
                )
            return {"type": "http.disconnect"}

        async def guarded_send(message: Any) -> None:
            nonlocal started
            if refused:
                return  # the 408 was the answer
            started = True
            await send(message)

        await app(scope, timed_receive, guarded_send)

    return limited


async def _refuse(send: Send, status: int, message: str) -> None:
    kind = "request_timeout" if status == 408 else "request_header_fields_too_large"
    body = error_body(message, "invalid_request_error", kind)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                # The rest of the request may still be coming: it is not read.
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
