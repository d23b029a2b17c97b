"""llmgw's HTTP/1.1 server: serves an ASGI app on trio.

Requests are parsed (llhttp through httptools, strictly) in :mod:`llmgw.http.request`.

Both listeners of `llmgw-server`, and `llmgw-sim`, run on it. It replaced hypercorn
because on the proxy's path hypercorn's layers (h11's state machine both ways, a task
per request and an idle-timer task per connection, an event object per message) were
about a third of the router's CPU per request, against a target of 0.5 ms
(benchmarks/results/history-to-2026-12-07.md, "After optimisation (2026-11-30)").
This module adds the I/O, deadlines and limits around the request parser.

* HTTP/1.1 with keep-alive and pipelined requests (answered in order); HTTP/1.0 with
  one request per connection. Request bodies framed by Content-Length or chunked;
  ``Expect: 100-continue`` is answered when the app first reads the body.
* Responses framed by the app's Content-Length, else chunked (1.0: by closing the
  connection). A response's head is held until the app's first body message, so a
  sized answer is one write and a stream's head leaves with its first event; an app
  that wants its head out early sends an empty body message with ``more_body``.
  Whatever the app sends, no CR, LF or NUL reaches a head, and a status outside
  100-599 is the app's error (a 500), never bytes on the wire.
* Deadlines: a request head must be complete within `header_timeout`, counted from
  the accept, or on a kept-alive connection from the first byte of the next request
  (a partial head then gets ``408``; a connection that sent nothing is just closed).
  A body must arrive within `body_timeout` (``408``). A write that the client takes
  no byte of for `send_timeout` cuts the connection, and the app sees a disconnect.
  A kept-alive connection idle for `keep_alive_timeout` is closed. A stream may
  otherwise last as long as the app lets it.
* Limits: the parser's on a head (:data:`MAX_HEAD_BYTES`, ``431``) and on trailers,
  at most 256 KiB of pipelined requests read ahead, and `max_connections` at once
  (past it: a ``503`` in one write, and the connection closes).
* ``http.disconnect``: once the request body is read, the app's next `receive()`
  returns when the client closes the connection, so a proxy can cancel its upstream.
  A client that only half-closes its side counts as gone (as nginx's default has it).
  The scope's :data:`~llmgw.http.asgi.WATCH_DISCONNECT` extension does the same
  without a task of the app's own: one watcher task per connection, started with its
  first watched request, waits for the end while a request is watched.
* Graceful shutdown: stop accepting, close idle connections, let requests in flight
  finish for up to `graceful_timeout`, then cancel them.
* Closing: a connection that ends with client bytes possibly unread (a refusal, a
  body the app did not read) is closed lingering (:func:`_linger`); an error on one
  connection is logged and ends that connection only.

Not here: TLS, HTTP/2, WebSocket and other upgrades (a request asking for one is
answered as a plain request, then the connection closes), ASGI lifespan events
(llmgw's apps hold no lifespan state). A request the parser refuses (it is strict
against request smuggling) is answered with the parser's status (400, 431, 501, ...),
and the connection is closed. Refusals are OpenAI-shaped errors, like the apps' own.
"""

from __future__ import annotations

import contextlib
import http
import logging
import math
import re
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote

import attrs
import trio

from llmgw.http import sockio
from llmgw.http.asgi import WATCH_DISCONNECT, App, error_body
from llmgw.http.budget import Acceptor, detach, turn_away
from llmgw.http.request import MAX_HEAD_BYTES as MAX_HEAD_BYTES
from llmgw.http.request import Refusal, Request, RequestReader
from llmgw.units import Address

__all__ = ["ClientDisconnected", "HttpServerConfig", "serve", "serve_listeners"]

log = logging.getLogger("llmgw.http.server")

_RECV = 65536
#: Bytes of pipelined requests buffered while a response is in flight; past this the
#: connection is not read until the response ends (and a disconnect goes unnoticed).
_MAX_PIPELINED = 256 * 1024
#: How long a refusal (400, 408, 431, ...) may take to send: a client that does not
#: read must not hold the connection.
_REFUSAL_SEND_TIMEOUT = 1.0
#: How long, and for how many bytes, a connection we close waits for the client to
#: close its side (:func:`_linger`).
_LINGER_SECONDS = 2.0
_LINGER_BYTES = 1 << 20
#: A watched request (the WATCH_DISCONNECT extension) is watched from this many
#: seconds after it asks: one answered sooner (most unary answers) costs no watcher
#: step, cancel scope or epoll registration, about 40 us of CPU each; a client that
#: leaves sooner is noticed at this mark, so an engine works this long for it at most.
WATCH_AFTER = 0.1

_TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_FORBIDDEN = re.compile(b"[\r\n\0]")
_DISCONNECT: dict[str, Any] = {"type": "http.disconnect"}
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_NO_BODY_STATUS = frozenset({204, 304})
_REASONS = {s.value: s.phrase.encode() for s in http.HTTPStatus}


@attrs.frozen
class HttpServerConfig:
    """How one listener serves."""

    #: Seconds for a request head to arrive completely; None: unbounded.
    header_timeout: float | None = 10.0
    #: Seconds a kept-alive connection may wait for its next request: longer than
    #: clients' pool expiry (httpx: 5 s), so a client closes an idle connection first
    #: instead of racing our close with its next request.
    keep_alive_timeout: float = 75.0
    #: Seconds requests in flight get to finish once shutdown begins.
    graceful_timeout: float = 30.0
    #: Called on every head-deadline expiry (to count it); must not block.
    on_header_timeout: Callable[[], None] | None = None
    #: Seconds a request body has to arrive completely, counted from the app's first
    #: `receive()` that waits for it; then ``408`` and the connection closes. None:
    #: unbounded.
    body_timeout: float | None = None
    #: The configuration key `body_timeout` comes from, named in the 408's message.
    body_timeout_key: str = ""
    #: Called on every body-deadline expiry; must not block.
    on_body_timeout: Callable[[], None] | None = None
    #: Seconds a response write may wait for the client to take any bytes; then the
    #: connection is cut and the app sees a disconnect. None: unbounded.
    send_timeout: float | None = None
    #: Connections served at once; one past it gets a one-line ``503`` and is closed.
    #: None: unbounded.
    max_connections: int | None = None
    #: A chunk of a request body announced larger than this is refused at once
    #: (``413``); a body's total is the app's to bound. None: not looked at.
    max_body_bytes: int | None = None


class ClientDisconnected(OSError):
    """Raised by `send()` once the client has gone (ASGI 2.4: an OSError), so that an
    app writing a long stream stops at once instead of writing into nothing."""


async def serve(
    app: App,
    bind: Address,
    config: HttpServerConfig,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `bind` (port 0 picks one) until `shutdown_trigger` returns, then
    drain. Reports the bound URLs through `task_status` once listening."""
    listeners = await trio.open_tcp_listeners(bind.port, host=bind.bind_host)
    await serve_listeners(
        app, listeners, config, shutdown_trigger=shutdown_trigger, task_status=task_status
    )


async def serve_listeners(
    app: App,
    listeners: list[trio.SocketListener],
    config: HttpServerConfig,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """:func:`serve` on listening sockets made elsewhere (closed on return)."""
    server = _Server(app, config)
    try:
        await server.run(listeners, shutdown_trigger, task_status)
    finally:
        for listener in listeners:
            listener.socket.close()


class _Server:
    def __init__(self, app: App, config: HttpServerConfig) -> None:
        self.app = app
        self.config = config
        self.draining = False
        self.connections: set[_Connection] = set()
        # Where connections (and their disconnect watchers) run; set by run().
        self.nursery: trio.Nursery | None = None
        # Watched requests not yet WATCH_AFTER old, oldest first, with when they asked.
        self.deferred: dict[_Watched, float] = {}
        self._deferring = trio.lowlevel.ParkingLot()
        self._deferring_scope = trio.CancelScope()

    async def run(
        self,
        listeners: list[trio.SocketListener],
        shutdown_trigger: Callable[[], Awaitable[None]],
        task_status: trio.TaskStatus[list[str]],
    ) -> None:
        async with trio.open_nursery() as connections:
            self.nursery = connections
            connections.start_soon(self._start_watches)
            async with trio.open_nursery() as accepting:
                for listener in listeners:
                    accepting.start_soon(self._accept, listener, connections)
                task_status.started([_url(listener.socket.getsockname()) for listener in listeners])
                await shutdown_trigger()
                accepting.cancel_scope.cancel()
            for listener in listeners:
                listener.socket.close()
            self.draining = True
            self._watches_done()
            for connection in list(self.connections):
                if not connection.busy:
                    connection.scope.cancel()
            connections.cancel_scope.deadline = trio.current_time() + self.config.graceful_timeout

    def defer(self, watched: _Watched) -> None:
        """Watch `watched` once it is WATCH_AFTER old, if it has not ended by then."""
        if not self.deferred:
            self._deferring.unpark()
        self.deferred[watched] = trio.current_time()

    def _watches_done(self) -> None:
        if self.draining and not self.connections:
            self._deferring_scope.cancel()

    async def _start_watches(self) -> None:
        """Start the deferred watches as they come of age, oldest first."""
        deferred = self.deferred
        with self._deferring_scope:
            while True:
                if not deferred:
                    await self._deferring.park()
                    continue
                await trio.sleep_until(next(iter(deferred.values())) + WATCH_AFTER)
                now = trio.current_time()
                while deferred:
                    watched, since = next(iter(deferred.items()))
                    if now - since < WATCH_AFTER:
                        break
                    del deferred[watched]
                    try:
                        watched.start()
                    except Exception:  # the app's on_gone: a bug there ends its connection
                        log.exception("watching %s failed", watched.connection.client)
                        watched.connection.scope.cancel()

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        cap = self.config.max_connections
        acceptor = Acceptor(listener)
        while True:
            # trio set TCP_NODELAY on it; from here on the socket is driven directly.
            sock = detach(await acceptor.accept())
            if cap is not None and len(self.connections) >= cap:
                turn_away(sock, cap)
                continue
            nursery.start_soon(self._connection, sock)

    async def _connection(self, sock: socket.socket) -> None:
        connection = _Connection(self, sock)
        self.connections.add(connection)
        try:
            with connection.scope:
                await connection.run()
            if connection.unread and not connection.peer_closed:
                await _linger(sock)
        except Exception:
            # A bug met on one connection must not end the others (or the server).
            log.exception("connection from %s failed", connection.client)
        finally:
            self.connections.discard(connection)
            self._watches_done()
            if connection.watcher is not None:
                connection.watcher.scope.cancel()
            sockio.close(sock)


_date: tuple[int, bytes] = (0, b"")


def _date_line() -> bytes:
    """The ``date`` header line (RFC 9110 asks an origin server with a clock for one),
    formatted once per second."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, b"date: " + formatdate(now, usegmt=True).encode() + b"\r\n")
    return _date[1]


async def _linger(sock: socket.socket) -> None:
    """Close our side first and let the client's last bytes drain before the socket
    closes: closing with unread bytes (the rest of a refused request, a body the app
    did not read) makes the kernel send a reset, which can destroy the answer just
    sent before the client has read it."""
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        return
    with trio.move_on_after(_LINGER_SECONDS):
        drained = 0
        while drained < _LINGER_BYTES:
            try:
                data = await sockio.recv(sock, _RECV)
            except OSError:
                return
            if not data:
                return
            drained += len(data)


def _url(sockname: Any) -> str:
    host, port = sockname[0], sockname[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _only_disconnects(exc: Exception) -> bool:
    """`exc` is ClientDisconnected, or a group (from the app's nurseries) of only that."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(ClientDisconnected)[1] is None
    return isinstance(exc, ClientDisconnected)


class _Connection:
    """One client connection: its requests, one after the other."""

    __slots__ = (
        "bad_body",
        "busy",
        "client",
        "closing",
        "continue_due",
        "ended",
        "framing",
        "head",
        "head_only",
        "peer_closed",
        "pipelined",
        "reader",
        "request",
        "request_read",
        "scope",
        "server",
        "serverside",
        "sock",
        "started",
        "unread",
        "watcher",
    )

    def __init__(self, server: _Server, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.scope = trio.CancelScope()
        self.reader = RequestReader(server.config.max_body_bytes)
        self.request = Request()
        self.busy = False
        self.peer_closed = False  # the client closed its side (or reset the connection)
        # The connection ends with client bytes possibly unread (a refused request, a
        # body the app did not read): close it lingering. Idle ones close at once.
        self.unread = False
        self.watcher: _Watcher | None = None  # started by the first watched request
        try:
            self.client: tuple[str, int] | None = sock.getpeername()[:2]
            self.serverside: tuple[str, int] | None = sock.getsockname()[:2]
        except OSError:
            self.client = self.serverside = None
        self._reset(self.request)

    def _reset(self, request: Request) -> None:
        self.request = request
        self.closing = not request.keep_alive  # close the connection once this response ends
        self.continue_due = request.expect_continue
        self.request_read = False  # the app has had the last part of the request body
        self.bad_body: Refusal | None = None
        self.started = False
        self.ended = False
        self.head: bytes | None = None  # a response head held for the first body bytes
        self.framing = _RAW
        self.head_only = False
        self.pipelined = 0  # bytes read past this request while its answer is under way

    async def run(self) -> None:
        fresh = True
        reader = self.reader
        while True:
            request = await self._next_head(fresh)
            if request is None:
                return
            fresh = False
            self._reset(request)
            try:
                scope = self._scope(request)
            except Refusal as refusal:
                await self._refuse(refusal.status, str(refusal))
                return
            self.busy = True
            await self._handle(scope)
            self.busy = False
            if not request.complete:  # a body the app did not read, still on its way
                self.unread = True
                return
            reader.requests.popleft()
            if self.closing or self.server.draining or (reader.stopped and not reader.requests):
                return
            if reader.requests or reader.error is not None:
                # Pipelined: the next request is here already; let other tasks run first.
                await trio.lowlevel.checkpoint()

    # -- request head -----------------------------------------------------------

    async def _next_head(self, fresh: bool) -> Request | None:
        """The next request with its head complete, or None when the connection should
        close (the client closed it, the input broke, or a deadline passed)."""
        config = self.server.config
        reader = self.reader
        timeout = config.header_timeout
        now = trio.current_time()
        if fresh:
            deadline = now + (timeout if timeout is not None else config.keep_alive_timeout)
            idle = False
        elif reader.requests:
            deadline = now + timeout if timeout is not None else math.inf
            idle = False
        else:
            deadline = now + config.keep_alive_timeout
            idle = True  # waiting for the first byte: the keep-alive time applies
        while True:
            if reader.requests and reader.requests[0].head_done:
                return reader.requests[0]
            if reader.error is not None:
                await self._refuse(reader.error.status, str(reader.error))
                return None
            if reader.stopped:
                return None
            data = b""
            with trio.CancelScope(deadline=deadline) as wait:
                try:
                    data = await sockio.recv(self.sock, _RECV)
                except OSError:
                    self.peer_closed = True
                    return None
            if wait.cancelled_caught:
                if idle:
                    return None  # the keep-alive time is over
                if config.on_header_timeout is not None:
                    config.on_header_timeout()
                if reader.requests:
                    await self._refuse(408, "the request head did not arrive in time")
                return None
            if not data:
                self.peer_closed = True
                return None
            reader.feed(data)
            if idle and (reader.requests or reader.error is not None):
                idle = False
                deadline = trio.current_time() + timeout if timeout is not None else math.inf

    def _scope(self, request: Request) -> dict[str, Any]:
        target = request.url
        method = request.method
        raw_path, _, query = target.partition(b"?")
        if not raw_path.startswith(b"/"):
            if raw_path.startswith((b"http://", b"https://")):  # absolute form
                raw_path = b"/" + raw_path.split(b"/", 3)[3] if raw_path.count(b"/") >= 3 else b"/"
            elif target == b"*" and method == b"OPTIONS":
                raw_path = b"*"
            else:
                raise Refusal(400, "malformed request target")
        # llhttp admits only visible ASCII in a target.
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        method_name = method.decode("ascii")
        self.head_only = method_name == "HEAD"
        return {
            "type": "http",
            "asgi": _ASGI,
            "http_version": request.version,
            "method": method_name,
            "scheme": "http",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": request.headers,
            "client": self.client,
            "server": self.serverside,
            "extensions": {WATCH_DISCONNECT: self.watch},
        }

    # -- running the app ------------------------------------------------------------

    async def _handle(self, scope: dict[str, Any]) -> None:
        try:
            await self.server.app(scope, self.receive, self.send)
        except Exception as exc:
            if _only_disconnects(exc):
                log.debug("%s %s: the client left mid-answer", scope["method"], scope["path"])
                self.closing = True
                return
            log.exception("unhandled error serving %s %s", scope["method"], scope["path"])
            if not self.started:
                await self._refuse(500, "internal server error")
            self.closing = True
            return
        if self.bad_body is not None and not self.started:
            await self._refuse(self.bad_body.status, str(self.bad_body))
        elif not self.started:
            if self.peer_closed:
                # The client left before the answer: nobody to send one to.
                log.debug("%s %s: the client left first", scope["method"], scope["path"])
                self.closing = True
                return
            log.error("%s %s: the app sent no response", scope["method"], scope["path"])
            await self._refuse(500, "internal server error")
        elif not self.ended:
            self.closing = True  # a response cut short cannot be framed: end the connection

    async def receive(self) -> MutableMapping[str, Any]:
        request = self.request
        if self.request_read:
            return await self._wait_disconnect()
        if not request.body and not request.complete:
            if self.continue_due:
                self.continue_due = False
                if not await self._write(b"HTTP/1.1 100 Continue\r\n\r\n"):
                    return self._body_lost()
            config = self.server.config
            timeout = config.body_timeout
            deadline = math.inf if timeout is None else trio.current_time() + timeout
            with trio.CancelScope(deadline=deadline) as wait:
                while not request.body and not request.complete:
                    if self.reader.error is not None:
                        self.bad_body = self.reader.error
                        return self._body_lost()
                    if not await self._fill():
                        return self._body_lost()
            if wait.cancelled_caught:
                if config.on_body_timeout is not None:
                    config.on_body_timeout()
                key = f" ({config.body_timeout_key})" if config.body_timeout_key else ""
                self.bad_body = Refusal(
                    408,
                    f"the request body did not arrive within {timeout:g}s{key};"
                    f" {request.received} bytes came",
                )
                return self._body_lost()
        body = bytes(request.body)
        request.body.clear()
        more = not request.complete
        self.request_read = not more
        return {"type": "http.request", "body": body, "more_body": more}

    def _body_lost(self) -> MutableMapping[str, Any]:
        self.closing = self.request_read = True
        return _DISCONNECT

    async def _fill(self) -> bool:
        """Read more of the connection into the parser; False at its end."""
        try:
            data = await sockio.recv(self.sock, _RECV)
        except OSError:
            data = b""
        if not data:
            self.peer_closed = True
            return False
        self.reader.feed(data)
        return True

    def watch(self, on_gone: Callable[[], None]) -> _Watched | None:
        """The WATCH_DISCONNECT extension: `on_gone` is called once if the client closes
        the connection while the returned context is entered. The app must not call
        `receive()` meanwhile (the watcher is the connection's reader then). None
        while the request body is not all read: the app waits on `receive()` then."""
        return _Watched(self, on_gone) if self.request_read else None

    async def _wait_disconnect(self) -> MutableMapping[str, Any]:
        """Block until the client closes the connection (its request is read)."""
        if self.ended:
            return _DISCONNECT
        reader = self.reader
        while self.pipelined < _MAX_PIPELINED and reader.error is None and not reader.stopped:
            try:
                data = await sockio.recv(self.sock, _RECV)
            except OSError:
                data = b""
            if not data:
                self.peer_closed = self.closing = True
                return _DISCONNECT
            self.pipelined += len(data)
            reader.feed(data)
        await trio.sleep_forever()  # no room to watch for the end; wait to be cancelled

    # -- the response -----------------------------------------------------------

    async def send(self, message: MutableMapping[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            # Checked before anything is sent, so that a bad head is the app's error
            # (a 500), never bytes on the wire.
            head = self._response_head(message["status"], message.get("headers", ()))
            self.started = True
            self.head = head
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unsupported ASGI message {kind!r}")
        if not self.started or self.ended:
            raise RuntimeError("http.response.body outside a response")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        out = self.head or b""
        self.head = None
        framing = self.framing
        if framing == _CHUNK:
            if body:
                out += b"%x\r\n" % len(body) + body + b"\r\n"
            if not more:
                out += b"0\r\n\r\n"
        elif framing == _RAW:
            out += body
        if not more:
            self.ended = True
        if out and not await self._write(out):
            raise ClientDisconnected("the client has gone")

    def _response_head(self, status: int, headers: Any) -> bytes:
        if type(status) is not int or not 100 <= status <= 599:
            raise RuntimeError(f"response status {status!r} is not an HTTP status")
        # The rest of a body that came with its head is skipped with it (the parser
        # has it); one still on its way cannot be skipped safely: close after.
        if not self.request.complete or self.server.draining:
            self.closing = True
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"")), _date_line()]
        sized = False
        for name, value in headers:
            if name.translate(None, _TOKEN) or not name or _FORBIDDEN.search(value):
                # Whatever the source (an engine's header relayed), CR, LF or NUL in a
                # head would let it write headers or responses of its own.
                raise RuntimeError(f"response header {name!r} has a forbidden character")
            lower = name.lower()
            if lower == b"content-length":
                sized = True
            elif lower == b"connection" and b"close" in value.lower():
                self.closing = True
                continue
            elif lower == b"transfer-encoding":
                continue  # framing is ours
            lines.append(name + b": " + value + b"\r\n")
        if self.head_only or status in _NO_BODY_STATUS or status < 200:
            self.framing = _NO_BODY
        elif sized:
            self.framing = _RAW
        elif self.request.version == "1.1":
            self.framing = _CHUNK
            lines.append(b"transfer-encoding: chunked\r\n")
        else:
            self.framing = _RAW
            self.closing = True
        if self.closing:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    async def _write(self, data: bytes) -> bool:
        """Send `data`; False (and the connection marked to close) if the client has
        gone, or has read nothing for `send_timeout`. The app learns of that from
        `receive()`: the socket is shut, which wakes a task waiting for a disconnect."""
        try:
            await sockio.send_all(self.sock, data, stall=self.server.config.send_timeout)
        except OSError:
            self.closing = self.peer_closed = True
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            return False
        except BaseException:
            self.closing = True  # cancelled mid-write: the framing is lost
            raise
        return True

    async def _refuse(self, status: int, message: str) -> None:
        """Answer an error the app never saw, then the connection closes."""
        self.closing = self.unread = True
        kind = "server_error" if status == 500 else "invalid_request_error"
        code = _REASONS.get(status, b"error").decode().lower().replace(" ", "_").replace("-", "_")
        body = error_body(message, kind, code)
        head = (
            b"HTTP/1.1 %d %s\r\n%scontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n"
            % (status, _REASONS.get(status, b""), _date_line(), len(body))
        )
        with trio.move_on_after(_REFUSAL_SEND_TIMEOUT):
            await self._write(head + body)


# response framing
_RAW, _CHUNK, _NO_BODY = range(3)


class _Watched:
    """One request's disconnect watch (:meth:`_Connection.watch`)."""

    __slots__ = ("connection", "on_gone")

    def __init__(self, connection: _Connection, on_gone: Callable[[], None]) -> None:
        self.connection = connection
        self.on_gone = on_gone

    def __enter__(self) -> _Watched:
        if self.connection.peer_closed:  # it went while the body was read
            self.on_gone()
        else:
            self.connection.server.defer(self)
        return self

    def start(self) -> None:
        """Watch from now on (the server calls it WATCH_AFTER after __enter__)."""
        connection = self.connection
        if connection.peer_closed:  # a write found it gone meanwhile
            self.on_gone()
            return
        watcher = connection.watcher
        if watcher is None:
            nursery = connection.server.nursery
            assert nursery is not None
            watcher = connection.watcher = _Watcher(connection)
            nursery.start_soon(watcher.run)
        watcher.watched = self
        watcher.lot.unpark()

    def __exit__(self, *exc: object) -> None:
        connection = self.connection
        if connection.server.deferred.pop(self, None) is not None:
            return  # never watched
        watcher = connection.watcher
        if watcher is not None and watcher.watched is self:
            watcher.watched = None
            if watcher.waiting is not None:
                # Its wait for the socket ends here (trio unregisters it at once), so
                # the connection's own reads may follow straight away.
                watcher.waiting.cancel()


class _Watcher:
    """A connection's disconnect watcher: a task that sleeps between watched requests
    and, during one, reads the connection the way `receive()` would (pipelined bytes
    go to the parser) until the client closes it. No nursery, task or cancel scope is
    made per request (benchmarks/README.md, "the floor under llmgw")."""

    __slots__ = ("connection", "lot", "scope", "waiting", "watched")

    def __init__(self, connection: _Connection) -> None:
        self.connection = connection
        self.lot = trio.lowlevel.ParkingLot()
        self.scope = trio.CancelScope()  # the task's life: the connection's
        self.waiting: trio.CancelScope | None = None
        self.watched: _Watched | None = None

    async def run(self) -> None:
        # It runs beside the connections, not in one: a bug met here must end this
        # connection only (as _Server._connection has it), never the server.
        try:
            await self._watch()
        except Exception:
            log.exception("the disconnect watcher of %s failed", self.connection.client)
            self.watched = None
            self.connection.scope.cancel()

    async def _watch(self) -> None:
        connection = self.connection
        sock = connection.sock
        reader = connection.reader
        with self.scope:
            while True:
                watched = self.watched
                if watched is None:
                    await self.lot.park()
                    continue
                with trio.CancelScope() as self.waiting:
                    await trio.lowlevel.wait_readable(sock)
                self.waiting = None
                # Woken, but no longer watching: the connection reads for itself now.
                if self.watched is not watched:
                    continue
                try:
                    data = sock.recv(_RECV)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    connection.peer_closed = connection.closing = True
                    self.watched = None
                    if not connection.ended:
                        watched.on_gone()
                    continue
                # The next request, pipelined: the parser keeps it for the connection.
                connection.pipelined += len(data)
                reader.feed(data)
                if (
                    connection.pipelined >= _MAX_PIPELINED
                    or reader.error is not None
                    or reader.stopped
                ):
                    self.watched = None  # no room to watch for the end any more
