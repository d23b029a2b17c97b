"""A minimal HTTP/1.1 client for the proxy's hot path: POST a body, relay the answer.

Answers are parsed (llhttp through httptools, strictly) in :mod:`llmgw.http.response`.

httpx + httpcore + h11 cost more CPU per proxied request than everything else the
router does (Request/Response objects, header normalisation, URL parsing, h11's
state machine, a pool that walks all its connections per request, and one socket
write each for the request's headers and body). This client does only what the
router needs: one write per request (headers and body together), the answer parsed
by llhttp, and keep-alive connections reused from a per-host LIFO list (O(1) per
request). Plain `http://` only: llmgw.http.engine_client sends anything else
through httpx.

:class:`Response` and :class:`Pool` do the I/O on the non-blocking sockets of
`llmgw.http.sockio`. Failures are :class:`UpstreamError`: :class:`BadResponse` for an
answer that broke the parser's rules, :class:`ConnectFailed` and
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
from collections.abc import Sequence
from urllib.parse import urlsplit

import trio

from llmgw.http import sockio
from llmgw.http.response import MAX_FRAMING as MAX_FRAMING
from llmgw.http.response import MAX_HEAD as MAX_HEAD
from llmgw.http.response import BadResponse as BadResponse
from llmgw.http.response import ResponseParser as ResponseParser
from llmgw.http.response import UpstreamError as UpstreamError

#: Request bodies up to this size are sent in one write with their head.
_JOIN_BELOW = 256 * 1024
_RECV = 65536
# A read whose bytes parsed into more body pieces than this (tiny chunks: one llhttp
# callback each) yields to other tasks before it returns: sockio yields every so many
# calls, which assumes each call is cheap.
PIECES_PER_YIELD = 64
# Idle connections older than this are closed rather than reused (httpx's default;
# servers commonly close idle keep-alive connections after 5 s or more).
KEEPALIVE_EXPIRY = 5.0
# What may not be in a request line or Host header llmgw writes.
_BAD_TARGET = re.compile(r"[\x00-\x20\x7f]")


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

    __slots__ = ("host", "key", "path", "port", "prefix", "rest")

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
        # The request line after its method, and the host line.
        self.rest = b" " + path.encode() + b" HTTP/1.1\r\nhost: " + netloc.encode() + b"\r\n"
        self.prefix = b"POST" + self.rest


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
    def complete(self) -> bool:
        """The whole body is in hand (came with the head): reading it will not wait."""
        return self._parser.complete

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
        """Release the connection: pooled when the body was read to its end, else closed.
        Never waits, so never a checkpoint: llmgw.router.proxy closes with no shield."""
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
        return await self._send(target, data)

    async def request(
        self,
        method: bytes,
        url: str,
        headers: Sequence[tuple[bytes, bytes]] = (),
        body: bytes | None = None,
    ) -> Response:
        """`method` `url` with `body` (None: no body, nor its length, as for a GET);
        return once the response's status and headers are in. No Accept-Encoding is
        sent: the body comes as the server keeps it, uncompressed."""
        target = self.target(url)
        head = [method, target.rest]
        for k, v in headers:
            head += (k, b": ", v, b"\r\n")
        if body is None:
            head.append(b"\r\n")
            return await self._send(target, (b"".join(head),))
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        data = (b"".join(head) + body,) if len(body) <= _JOIN_BELOW else (b"".join(head), body)
        return await self._send(target, data)

    async def _send(self, target: Target, data: tuple[bytes, ...]) -> Response:
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
