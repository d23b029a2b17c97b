"""llmgw's HTTP/1.1 server: serves an ASGI app on trio.

Both listeners of `llmgw-server`, and `llmgw-sim`, run on it. It replaced hypercorn
because on the proxy's path hypercorn's layers (h11's state machine both ways, a task
per request and an idle-timer task per connection, an event object per message) were
about a third of the router's CPU per request, against a target of 0.5 ms
(benchmarks/README.md). It does what those listeners need and nothing more:

* HTTP/1.1 with keep-alive and pipelined requests (answered in order); HTTP/1.0 with
  one request per connection. Request bodies framed by Content-Length or chunked;
  ``Expect: 100-continue`` is answered when the app first reads the body.
* Responses framed by the app's Content-Length, else chunked (1.0: by closing the
  connection). A response's head is held until the app's first body message, so a
  sized answer is one write and a stream's head leaves with its first event; an app
  that wants its head out early sends an empty body message with ``more_body``.
* Deadlines: a request head must be complete within `header_timeout`, counted from
  the accept, or on a kept-alive connection from the first byte of the next request
  (a partial head then gets ``408``; a connection that sent nothing is just closed).
  A kept-alive connection idle for `keep_alive_timeout` is closed. There is no read
  or write timeout otherwise: a stream may last minutes, and the app bounds bodies.
* ``http.disconnect``: once the request body is read, the app's next `receive()`
  returns when the client closes the connection, so a proxy can cancel its upstream.
* Graceful shutdown: stop accepting, close idle connections, let requests in flight
  finish for up to `graceful_timeout`, then cancel them.
* Closing: a connection that ends with client bytes possibly unread (a refusal, a
  body the app did not read) is closed lingering (:func:`_linger`); an error on one
  connection is logged and ends that connection only.

Not here: TLS, HTTP/2, WebSocket, ASGI lifespan events (llmgw's apps hold no lifespan
state). Parsing is strict where leniency lets a front proxy and this server disagree
about where a request ends (request smuggling): bare CR or LF, NUL, whitespace before
a header's colon, folded lines, Content-Length together with Transfer-Encoding,
differing Content-Lengths, codings other than ``chunked``: all 400 (or 501), and the
connection is closed. Refusals are OpenAI-shaped errors, like the apps' own.
"""

from __future__ import annotations

import errno
import http
import logging
import math
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote

import attrs
import trio

from llmgw import sockio
from llmgw.asgi import App, error_body
from llmgw.units import Address

__all__ = ["HttpServerConfig", "serve", "serve_listeners"]

log = logging.getLogger("llmgw.http1")

_RECV = 65536
#: Largest request head (request line and headers) accepted; larger: 431.
MAX_HEAD_BYTES = 64 * 1024
#: Largest chunk-size line (with extensions) or trailer section of a chunked body.
_MAX_CHUNK_LINE = 4096
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
#: accept() errors that mean "out of resources for now": wait and retry.
_ACCEPT_RETRY = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}

_TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_HEX = b"0123456789abcdefABCDEF"
_DISCONNECT: dict[str, Any] = {"type": "http.disconnect"}
_EMPTY_REQUEST: dict[str, Any] = {"type": "http.request", "body": b"", "more_body": False}
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


class _Refusal(Exception):
    """The request cannot be served; answer `status` and close the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


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

    async def run(
        self,
        listeners: list[trio.SocketListener],
        shutdown_trigger: Callable[[], Awaitable[None]],
        task_status: trio.TaskStatus[list[str]],
    ) -> None:
        async with trio.open_nursery() as connections:
            async with trio.open_nursery() as accepting:
                for listener in listeners:
                    accepting.start_soon(self._accept, listener, connections)
                task_status.started([_url(listener.socket.getsockname()) for listener in listeners])
                await shutdown_trigger()
                accepting.cancel_scope.cancel()
            for listener in listeners:
                listener.socket.close()
            self.draining = True
            for connection in list(self.connections):
                if not connection.busy:
                    connection.scope.cancel()
            connections.cancel_scope.deadline = trio.current_time() + self.config.graceful_timeout

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in _ACCEPT_RETRY:
                    raise
                log.error("accept failed (%s): retrying in 100 ms", exc)
                await trio.sleep(0.1)
                continue
            # trio set TCP_NODELAY on it; from here on the socket is driven directly.
            trio_sock = stream.socket
            sock = socket.socket(trio_sock.family, trio_sock.type, fileno=trio_sock.detach())
            sock.setblocking(False)
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


class _Connection:
    """One client connection: its requests, one after the other."""

    __slots__ = (
        "bad_body",
        "body_left",
        "body_mode",
        "buf",
        "busy",
        "chunk_state",
        "client",
        "closing",
        "continue_due",
        "ended",
        "framing",
        "head",
        "head_only",
        "peer_closed",
        "request_read",
        "scope",
        "server",
        "serverside",
        "sock",
        "started",
        "unread",
        "version",
    )

    def __init__(self, server: _Server, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.scope = trio.CancelScope()
        self.buf = bytearray()
        self.busy = False
        self.peer_closed = False  # the client closed its side (or reset the connection)
        # The connection ends with client bytes possibly unread (a refused request, a
        # body the app did not read): close it lingering. Idle ones close at once.
        self.unread = False
        try:
            self.client: tuple[str, int] | None = sock.getpeername()[:2]
            self.serverside: tuple[str, int] | None = sock.getsockname()[:2]
        except OSError:
            self.client = self.serverside = None
        self._reset()

    def _reset(self) -> None:
        self.version = b"1.1"
        self.closing = False  # close the connection once this response ends
        self.body_mode = _NONE
        self.body_left = 0
        self.chunk_state = _SIZE
        self.continue_due = False
        self.request_read = False  # the app has had the last part of the request body
        self.bad_body: str | None = None
        self.started = False
        self.ended = False
        self.head: bytes | None = None  # a response head held for the first body bytes
        self.framing = _RAW
        self.head_only = False

    async def run(self) -> None:
        fresh = True
        while True:
            head = await self._read_head(fresh)
            if head is None:
                return
            fresh = False
            self._reset()
            try:
                scope = self._parse(head)
            except _Refusal as refusal:
                await self._refuse(refusal.status, str(refusal))
                return
            self.busy = True
            await self._handle(scope)
            self.busy = False
            if self.body_mode != _NONE:
                self.unread = True
                return
            if self.closing or self.server.draining:
                return
            if self.buf:
                # Pipelined: the next head is here already; let other tasks run first.
                await trio.lowlevel.checkpoint()

    # -- request head -----------------------------------------------------------

    async def _read_head(self, fresh: bool) -> bytes | None:
        """The next request head (without its final blank line), or None when the
        connection should close (the client closed it, or a deadline passed)."""
        config = self.server.config
        buf = self.buf
        timeout = config.header_timeout
        now = trio.current_time()
        if fresh:
            deadline = now + (timeout if timeout is not None else config.keep_alive_timeout)
            idle = False
        elif buf:
            deadline = now + timeout if timeout is not None else math.inf
            idle = False
        else:
            deadline = now + config.keep_alive_timeout
            idle = True  # waiting for the first byte: the keep-alive time applies
        while True:
            while buf[:2] == b"\r\n":  # tolerated blank lines before a request
                del buf[:2]
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                head = bytes(buf[:end])
                del buf[: end + 4]
                return head
            if len(buf) > MAX_HEAD_BYTES:
                await self._refuse(431, f"the request head exceeds {MAX_HEAD_BYTES} bytes")
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
                if buf:
                    await self._refuse(408, "the request head did not arrive in time")
                return None
            if not data:
                self.peer_closed = True
                return None
            buf += data
            if idle:
                idle = False
                deadline = trio.current_time() + timeout if timeout is not None else math.inf

    def _parse(self, head: bytes) -> dict[str, Any]:
        crlf = head.count(b"\r\n")
        if head.count(b"\r") != crlf or head.count(b"\n") != crlf:
            raise _Refusal(400, "bare CR or LF in the request head")
        if b"\0" in head:
            raise _Refusal(400, "NUL in the request head")
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3:
            raise _Refusal(400, "malformed request line")
        method, target, version = parts
        if version == b"HTTP/1.1":
            pass
        elif version == b"HTTP/1.0":
            self.version = b"1.0"
            self.closing = True
        elif version.startswith(b"HTTP/"):
            raise _Refusal(505, "only HTTP/1.1 and HTTP/1.0 are served")
        else:
            raise _Refusal(400, "malformed request line")
        if not method or method.translate(None, _TOKEN):
            raise _Refusal(400, "malformed method")
        headers: list[tuple[bytes, bytes]] = []
        length: bytes | None = None
        chunked = False
        hosts = 0
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name.translate(None, _TOKEN):
                raise _Refusal(400, "malformed header line")
            name = name.lower()
            value = value.strip(b" \t")
            headers.append((name, value))
            if name == b"content-length":
                if (
                    not value.isdigit()
                    or len(value) > 18
                    or (length is not None and value != length)
                ):
                    raise _Refusal(400, "invalid Content-Length")
                length = value
            elif name == b"transfer-encoding":
                if value.lower() != b"chunked" or chunked:
                    raise _Refusal(501, "only the chunked transfer coding is supported")
                chunked = True
            elif name == b"host":
                hosts += 1
            elif name == b"connection":
                if b"close" in value.lower():
                    self.closing = True
            elif name == b"expect":
                if value.lower() != b"100-continue":
                    raise _Refusal(417, "only Expect: 100-continue is supported")
                self.continue_due = self.version == b"1.1"
        if chunked:
            if length is not None:
                raise _Refusal(400, "both Content-Length and Transfer-Encoding")
            if self.version == b"1.0":
                raise _Refusal(400, "chunked bodies need HTTP/1.1")
            self.body_mode = _CHUNKED
        elif length is not None and int(length) > 0:
            self.body_mode = _LENGTH
            self.body_left = int(length)
        if self.version == b"1.1" and hosts != 1:
            raise _Refusal(400, "an HTTP/1.1 request needs exactly one Host header")
        raw_path, _, query = target.partition(b"?")
        if not raw_path.startswith(b"/"):
            if raw_path.startswith((b"http://", b"https://")):  # absolute form
                raw_path = b"/" + raw_path.split(b"/", 3)[3] if raw_path.count(b"/") >= 3 else b"/"
            elif target == b"*" and method == b"OPTIONS":
                raw_path = b"*"
            else:
                raise _Refusal(400, "malformed request target")
        try:
            path = raw_path.decode("ascii")
        except UnicodeDecodeError:
            raise _Refusal(400, "non-ASCII bytes in the request target") from None
        if "%" in path:
            path = unquote(path)
        method_name = method.decode("ascii")
        self.head_only = method_name == "HEAD"
        return {
            "type": "http",
            "asgi": _ASGI,
            "http_version": "1.1" if self.version == b"1.1" else "1.0",
            "method": method_name,
            "scheme": "http",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": headers,
            "client": self.client,
            "server": self.serverside,
        }

    # -- running the app ------------------------------------------------------------

    async def _handle(self, scope: dict[str, Any]) -> None:
        try:
            await self.server.app(scope, self.receive, self.send)
        except Exception:
            log.exception("unhandled error serving %s %s", scope["method"], scope["path"])
            if not self.started:
                await self._refuse(500, "internal server error")
            self.closing = True
            return
        if self.bad_body is not None and not self.started:
            await self._refuse(400, self.bad_body)
        elif not self.started:
            log.error("%s %s: the app sent no response", scope["method"], scope["path"])
            await self._refuse(500, "internal server error")
        elif not self.ended:
            self.closing = True  # a response cut short cannot be framed: end the connection

    async def receive(self) -> MutableMapping[str, Any]:
        if self.body_mode == _NONE:
            if self.request_read:
                return await self._wait_disconnect()
            self.request_read = True
            return _EMPTY_REQUEST
        if self.continue_due:
            self.continue_due = False
            if not self.buf and not await self._write(b"HTTP/1.1 100 Continue\r\n\r\n"):
                return _DISCONNECT
        try:
            if self.body_mode == _LENGTH:
                body = await self._length_body()
            else:
                body = await self._chunked_body()
        except _Refusal as bad:
            self.bad_body = str(bad)
            self.closing = self.request_read = True
            self.body_mode = _NONE
            return _DISCONNECT
        if body is None:
            self.closing = self.request_read = True
            self.body_mode = _NONE
            return _DISCONNECT
        more = self.body_mode != _NONE
        self.request_read = not more
        return {"type": "http.request", "body": body, "more_body": more}

    async def _fill(self) -> bool:
        """Read more of the connection into the buffer; False at its end."""
        try:
            data = await sockio.recv(self.sock, _RECV)
        except OSError:
            data = b""
        if not data:
            self.peer_closed = True
            return False
        self.buf += data
        return True

    async def _length_body(self) -> bytes | None:
        buf = self.buf
        if not buf and not await self._fill():
            return None
        take = min(self.body_left, len(buf))
        body = bytes(buf[:take])
        del buf[:take]
        self.body_left -= take
        if self.body_left == 0:
            self.body_mode = _NONE
        return body

    async def _chunked_body(self) -> bytes | None:
        """The next piece of a chunked body ("" at its end), None if the client left."""
        buf = self.buf
        out = bytearray()
        while True:
            state = self.chunk_state
            if state == _DATA:
                if not buf:
                    if out:
                        return bytes(out)
                    if not await self._fill():
                        return None
                take = min(self.body_left, len(buf))
                out += buf[:take]
                del buf[:take]
                self.body_left -= take
                if self.body_left == 0:
                    self.chunk_state = _DATA_END
                continue
            end = buf.find(b"\r\n")
            if end < 0:
                if len(buf) > _MAX_CHUNK_LINE:
                    raise _Refusal(400, "malformed chunked body")
                if out:
                    return bytes(out)
                if not await self._fill():
                    return None
                continue
            line = bytes(buf[:end])
            del buf[: end + 2]
            if state == _SIZE:
                size = line.split(b";", 1)[0].strip(b" \t")
                if not size or size.translate(None, _HEX) or len(size) > 16:
                    raise _Refusal(400, "malformed chunk size")
                self.body_left = int(size, 16)
                self.chunk_state = _DATA if self.body_left else _TRAILER
            elif state == _DATA_END:
                if line:
                    raise _Refusal(400, "malformed chunked body")
                self.chunk_state = _SIZE
            elif not line:  # _TRAILER: the blank line ends the body
                self.body_mode = _NONE
                return bytes(out)

    async def _wait_disconnect(self) -> MutableMapping[str, Any]:
        """Block until the client closes the connection (its request is read)."""
        if self.ended:
            return _DISCONNECT
        while len(self.buf) < _MAX_PIPELINED:
            if not await self._fill():
                self.closing = True
                return _DISCONNECT
        await trio.sleep_forever()  # no room to watch for the end; wait to be cancelled

    # -- the response -----------------------------------------------------------

    async def send(self, message: MutableMapping[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            self.head = self._response_head(message["status"], message.get("headers", ()))
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
        if out:
            await self._write(out)

    def _response_head(self, status: int, headers: Any) -> bytes:
        if self.body_mode == _LENGTH and len(self.buf) >= self.body_left:
            del self.buf[: self.body_left]  # the unread rest is here: skip it
            self.body_mode = _NONE
        if self.body_mode != _NONE or self.server.draining:
            self.closing = True  # an unread body cannot be skipped safely: close after
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"")), _date_line()]
        sized = False
        for name, value in headers:
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
        elif self.version == b"1.1":
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
        gone. The app learns of that from `receive()`."""
        try:
            await sockio.send_all(self.sock, data)
        except OSError:
            self.closing = self.peer_closed = True
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


# request body framing
_NONE, _LENGTH, _CHUNKED = range(3)
# chunked body parser states
_SIZE, _DATA, _DATA_END, _TRAILER = range(4)
# response framing
_RAW, _CHUNK, _NO_BODY = range(3)
