"""A minimal HTTP/1.1 client for the proxy's hot path: POST a body, relay the answer.

httpx + httpcore + h11 cost more CPU per proxied request than everything else the
router does (Request/Response objects, header normalisation, URL parsing, h11's
state machine, a pool that walks all its connections per request, and one socket
write each for the request's headers and body). This client does only what the
router needs: one write per request (headers and body together), the answer parsed
by llhttp, and keep-alive connections reused from a per-host LIFO list (O(1) per
request). Plain `http://` only; the proxy uses httpx for anything else.

Parsing and I/O are apart. :class:`ResponseParser` holds no socket: bytes go in
(:meth:`~ResponseParser.feed`, :meth:`~ResponseParser.eof`), the status, headers and
body pieces come out. It drives llhttp (`httptools.HttpResponseParser`, the parser
uvicorn uses) in its strict mode and adds llmgw's own rules, so that whatever an
engine sends, nothing it forbids reaches a client and no answer can hold the
router's thread or memory:

* refused (:class:`BadResponse`): anything RFC 9112 forbids (a status line or
  header that is not well-formed, a bare CR or LF, NUL and other control characters,
  a chunk size that is not plain hex, bad chunk extensions or trailers, two
  Content-Lengths, Content-Length together with Transfer-Encoding, a chunked coding
  applied twice), a status outside 100-599, a version other than HTTP/1.0 and 1.1, a
  transfer coding other than `chunked` (the proxy cannot undo one), a protocol
  switch nobody asked for, bytes after the response's end that came with it (an
  answer to nothing: a miscounted body, or a second response smuggled in);
* bounded: the response head, informational (1xx) heads included, is at most
  `MAX_HEAD` bytes; framing without body data between (chunk-size lines,
  extensions, trailers) at most `MAX_FRAMING` bytes in a row.

:class:`Response` and :class:`Pool` do the I/O on the non-blocking sockets of
`llmgw.http.sockio`. Failures are :class:`UpstreamError`: :class:`BadResponse` for an
answer that broke the rules above, :class:`ConnectFailed` and
:class:`ConnectTimeout` for the connect phase, the base class for a connection that
broke or ended early. Their messages never name the engine's address (they reach
clients). A response not read to its end, or that broke a rule, is closed with its
connection, never pooled; so is an idle connection found readable before reuse.
"""

from __future__ import annotations

import os
import re
import socket
import time
from urllib.parse import urlsplit

import httptools
import trio

from llmgw.http import sockio

#: The response head at most, 1xx heads before it included (bytes).
MAX_HEAD = 64 * 1024
#: Request bodies up to this size are sent in one write with their head.
_JOIN_BELOW = 256 * 1024
#: Framing bytes in a row with no body data between (chunk-size lines with their
#: extensions, trailer fields), at most: a bound on what llhttp may hold of an unending
#: field, counted per piece fed (so exceeded by up to one piece before it is seen).
MAX_FRAMING = 64 * 1024
_RECV = 65536
# A read whose bytes parsed into more body pieces than this (tiny chunks: one llhttp
# callback each) yields to other tasks before it returns: sockio yields every so many
# calls, which assumes each call is cheap.
PIECES_PER_YIELD = 64
# Idle connections older than this are closed rather than reused (httpx's default;
# servers commonly close idle keep-alive connections after 5 s or more).
KEEPALIVE_EXPIRY = 5.0
# What RFC 9112's reason-phrase excludes: controls other than HTAB.
_BAD_REASON = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# What may not be in a request line or Host header llmgw writes.
_BAD_TARGET = re.compile(r"[\x00-\x20\x7f]")


class UpstreamError(Exception):
    """The upstream connection failed, or the answer was cut short or broke the rules."""


class BadResponse(UpstreamError):
    """The engine's answer broke HTTP/1.1 (RFC 9112) or a limit llmgw sets on it."""


class BodyTooLarge(BadResponse):
    """The body is longer than the reader's limit."""


class ConnectFailed(UpstreamError):
    """No connection could be opened."""


class ConnectTimeout(UpstreamError):
    """No connection within the dial timeout."""


def describe(exc: BaseException) -> str:
    """What went wrong with a socket, in words without addresses: trio's "all attempts
    to connect to HOST:PORT failed" becomes the first cause's errno in words."""
    pending: list[BaseException] = [exc]
    while pending:
        e = pending.pop(0)
        # trio's own strerror may name the address ("error connecting to (...): ...").
        if isinstance(e, socket.gaierror) and e.strerror:
            return str(e.strerror).lower()
        if isinstance(e, OSError) and e.errno and e.errno > 0:
            return os.strerror(e.errno).lower()
        if isinstance(e, BaseExceptionGroup):
            pending.extend(e.exceptions)
        if e.__cause__ is not None:
            pending.append(e.__cause__)
    return type(exc).__name__


class Target:
    """A parsed `http://host:port/path` URL, ready to be sent."""

    __slots__ = ("host", "key", "path", "port", "prefix")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not a plain http URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.key = (self.host, self.port)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        self.path = path
        netloc = parts.netloc.rpartition("@")[2]
        if _BAD_TARGET.search(path) or _BAD_TARGET.search(netloc):
            raise ValueError(f"a URL with spaces or control characters: {url!r}")
        self.prefix = b"POST " + path.encode() + b" HTTP/1.1\r\nhost: " + netloc.encode() + b"\r\n"


class ResponseParser:
    """One HTTP/1.1 response from bytes, strictly (see the module's docstring); no I/O.

    After each :meth:`feed`: :attr:`head_done` once the final status and headers are
    in (:attr:`status`, :attr:`headers`, :attr:`length` when declared),
    :attr:`body` the body pieces since the last :meth:`take`, :attr:`complete` once
    the body has ended (:attr:`keep_alive`: whether the connection may carry another
    request). Raises :class:`BadResponse`; after that the parser is of no further use.
    """

    __slots__ = (
        "_chunked",
        "_error",
        "_framing",
        "_head_room",
        "_parser",
        "body",
        "complete",
        "head_done",
        "headers",
        "keep_alive",
        "length",
        "status",
        "until_close",
    )

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._head_room = MAX_HEAD
        self._framing = 0
        self._chunked = False
        self._error: BadResponse | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.length: int | None = None
        self.body: list[bytes] = []
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.until_close = False

    # -- llhttp's callbacks ---------------------------------------------------------

    def _fail(self, message: str) -> BadResponse:
        self._error = BadResponse(message)
        return self._error

    def on_message_begin(self) -> None:
        if self.complete:
            # More bytes after the answer, an answer to nothing: an engine that
            # miscounts its body, or a second answer smuggled into the first's.
            raise self._fail("bytes after the end of the response")
        # A final head after an informational one starts afresh.
        self.headers = []
        self.length = None
        self._chunked = False

    def on_status(self, reason: bytes) -> None:
        if _BAD_REASON.search(reason):
            raise self._fail("a control character in the status line")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:  # a trailer field: checked by llhttp, not kept
            self._framing = 0
            return
        if value[-1:] in (b" ", b"\t"):  # llhttp keeps trailing whitespace, not the value's
            value = value.rstrip(b" \t")
        size = len(name)  # cheaper than lowering every name
        if size == 14 and name.lower() == b"content-length":
            self.length = int(value)  # llhttp allows digits only, and one such header
        elif size == 17 and name.lower() == b"transfer-encoding":
            if self._chunked:
                raise self._fail("two Transfer-Encoding fields (chunked may be applied once)")
            if value.strip(b" \t").lower() != b"chunked":
                raise self._fail(f"transfer coding {value[:40]!r} (only chunked is accepted)")
            self._chunked = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        if not 100 <= status <= 599:
            raise self._fail(f"status {status} is outside 100-599")
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise self._fail(f"HTTP version {version} (1.0 or 1.1 expected)")
        if status < 200:
            if status == 101:
                raise self._fail("a protocol switch nobody asked for")
            return  # informational: the final answer follows
        self.status = status
        self.head_done = True
        self._framing = 0
        self.until_close = not self._chunked and self.length is None and status not in (204, 304)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self._framing = 0

    def on_message_complete(self) -> None:
        if self.head_done:
            self.complete = True
            self.keep_alive = self._parser.should_keep_alive()

    # -- bytes in, results out -------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Parse the next bytes the engine sent."""
        if len(data) > MAX_FRAMING:  # more than one read's worth: in pieces, for the bounds
            for at in range(0, len(data), MAX_FRAMING):
                self.feed(data[at : at + MAX_FRAMING])
            return
        if not self.head_done:
            room = self._head_room
            if len(data) > room:
                self._execute(data[:room])
                if not self.head_done:
                    raise BadResponse(f"the response head exceeds {MAX_HEAD // 1024} KiB")
                data = data[room:]
            else:
                self._head_room = room - len(data)
        self._framing += len(data)
        self._execute(data)
        if self._framing > MAX_FRAMING:
            raise BadResponse(
                f"more than {MAX_FRAMING // 1024} KiB of chunk framing or trailers without data"
            )

    def _execute(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise BadResponse("a protocol switch nobody asked for") from None
        except httptools.HttpParserError as exc:
            if self._error is not None:  # raised by a callback of ours
                raise self._error from None
            reason = str(exc).strip() or type(exc).__name__
            raise BadResponse(f"malformed response: {reason[:100]}") from None

    def eof(self) -> None:
        """The engine closed the connection; raises UpstreamError if the answer was not
        complete."""
        if self.complete:
            return
        if self.head_done and self.until_close:
            self.complete = True  # a body delimited by the connection's end
            self.keep_alive = False
            return
        where = "body" if self.head_done else "head"
        raise UpstreamError(
            f"the engine closed the connection in the middle of the response {where}"
        )

    def take(self) -> bytes:
        """The body pieces parsed since the last call, as one bytes object."""
        body = self.body
        if not body:
            return b""
        self.body = []
        return body[0] if len(body) == 1 else b"".join(body)


class _Conn:
    __slots__ = ("idle_since", "key", "sock")

    def __init__(self, sock: socket.socket, key: tuple[str, int]) -> None:
        self.sock = sock
        self.key = key
        self.idle_since = 0.0

    def close(self) -> None:
        # Synchronous (no checkpoint), so it works while cancelled; wakes any waiter.
        sockio.close(self.sock)

    def readable(self) -> bool:
        """Whether the idle connection has something to read: the server closed it
        or sent bytes nobody asked for; either way it cannot be reused."""
        try:
            self.sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return False
        except OSError:
            pass
        return True


class Response:
    """A response whose body is read with :meth:`read_some` or :meth:`aread`."""

    __slots__ = ("_conn", "_parser", "_pool", "content", "headers_raw", "status_code")

    def __init__(self, pool: Pool, conn: _Conn, parser: ResponseParser) -> None:
        self._pool = pool
        self._conn: _Conn | None = conn
        self._parser = parser
        self.status_code = parser.status
        self.headers_raw = parser.headers
        self.content = b""
        if parser.complete:
            self._finished()

    @property
    def declared_length(self) -> int | None:
        """The body's Content-Length, when the engine sent one."""
        return self._parser.length

    def _finished(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._parser.keep_alive:
            self._pool.release(conn)
        else:
            conn.close()

    def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def read_some(self) -> bytes:
        """The body's next bytes, transfer coding removed: what one read from the engine
        made available; b"" at its end.

        A read that need not wait is no checkpoint (see llmgw.http.sockio), so each read
        first delivers a cancellation (a deadline) that is due: an engine sending
        faster than it is read cannot outlast its deadline."""
        parser = self._parser
        while not parser.body:
            conn = self._conn
            if conn is None:
                if parser.complete:
                    return b""
                raise UpstreamError("the response was closed before its end")
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                data = await sockio.recv(conn.sock, _RECV)
            except (trio.ClosedResourceError, OSError) as exc:
                self._discard()
                raise UpstreamError(f"the connection broke in the body: {describe(exc)}") from None
            try:
                if data:
                    parser.feed(data)
                else:
                    parser.eof()
            except UpstreamError:
                self._discard()
                raise
            if parser.complete:
                self._finished()
            if len(parser.body) > PIECES_PER_YIELD:
                await trio.lowlevel.checkpoint()
        return parser.take()

    async def aread(self, limit: int | None = None) -> bytes:
        """The whole body; BodyTooLarge once it is longer than `limit` bytes (and the
        connection is then closed)."""
        if limit is not None and self._parser.length is not None and self._parser.length > limit:
            self._discard()
            raise BodyTooLarge(f"a body of {self._parser.length} bytes, over the limit of {limit}")
        parts: list[bytes] = []
        size = 0
        while chunk := await self.read_some():
            size += len(chunk)
            if limit is not None and size > limit:
                self._discard()
                raise BodyTooLarge(f"a body over the limit of {limit} bytes")
            parts.append(chunk)
        self.content = parts[0] if len(parts) == 1 else b"".join(parts)
        return self.content

    async def aclose(self) -> None:
        """Release the connection: pooled when the body was read to its end, else closed."""
        self._discard()


class Pool:
    """Keep-alive connections per (host, port), most recently used first."""

    def __init__(self, dial_timeout: float, max_idle_per_host: int = 256) -> None:
        self.dial_timeout = dial_timeout
        self.max_idle = max_idle_per_host
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._targets: dict[str, Target] = {}
        self._closed = False

    def target(self, url: str) -> Target:
        t = self._targets.get(url)
        if t is None:
            if len(self._targets) > 4096:
                self._targets.clear()
            t = self._targets[url] = Target(url)
        return t

    def release(self, conn: _Conn) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if self._closed or len(idle) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def _take(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            # Expired, or readable while idle (the server closed it, or sent junk).
            if now - conn.idle_since > KEEPALIVE_EXPIRY or conn.readable():
                conn.close()
                continue
            return conn
        return None

    async def _connect(self, target: Target) -> _Conn:
        try:
            with trio.fail_after(self.dial_timeout):
                stream = await trio.open_tcp_stream(target.host, target.port)
        except trio.TooSlowError:
            raise ConnectTimeout(f"could not connect within {self.dial_timeout:g}s") from None
        except OSError as exc:
            raise ConnectFailed(describe(exc)) from None
        # trio set TCP_NODELAY on it; from here on the socket is driven directly.
        trio_sock = stream.socket
        sock = socket.socket(trio_sock.family, trio_sock.type, fileno=trio_sock.detach())
        sock.setblocking(False)
        return _Conn(sock, target.key)

    async def post(self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> Response:
        """Send `body` and return once the response's status and headers are in."""
        target = self.target(url)
        head = [target.prefix]
        for k, v in headers:
            head += (k, b": ", v, b"\r\n")
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        # One write for a small request; a large body is written after its head, not
        # copied behind it (three 32 MiB requests held 96 MiB more).
        data = (b"".join(head) + body,) if len(body) <= _JOIN_BELOW else (b"".join(head), body)
        # A pooled connection the server closed meanwhile fails before any byte of
        # an answer; that is retried once on a new connection.
        while True:
            conn = self._take(target.key)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(target)
            try:
                return await self._exchange(conn, data)
            except _StaleConnection:
                conn.close()
                if reused:
                    continue
                raise UpstreamError("the engine closed the connection without a response") from None
            except BaseException:
                conn.close()
                raise

    async def _exchange(self, conn: _Conn, data: tuple[bytes, ...]) -> Response:
        sock = conn.sock
        try:
            for part in data:
                await sockio.send_all(sock, part)
        except (trio.ClosedResourceError, OSError):
            raise _StaleConnection from None
        parser = ResponseParser()
        received = False
        while not parser.head_done:
            try:
                more = await sockio.recv(sock, _RECV)
            except (trio.ClosedResourceError, OSError) as exc:
                if not received:
                    raise _StaleConnection from None
                raise UpstreamError(f"the connection broke in the head: {describe(exc)}") from None
            if not more:
                if not received:
                    raise _StaleConnection
                parser.eof()  # raises: the head is not complete
            received = True
            parser.feed(more)
        return Response(self, conn, parser)

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
            idle.clear()


class _StaleConnection(Exception):
    pass
