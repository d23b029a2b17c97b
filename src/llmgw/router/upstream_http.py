"""A minimal HTTP/1.1 client for the proxy's hot path: POST a body, relay the answer.

httpx + httpcore + h11 cost more CPU per proxied request than everything else the
router does (Request/Response objects, header normalisation, URL parsing, h11's
state machine, a pool that walks all its connections per request, and one socket
write each for the request's headers and body). This client does only what the
router needs: one write per request (headers and body together), a status line and
headers parsed once, bodies framed by Content-Length, chunked transfer coding or
the connection's end, and keep-alive connections reused from a per-host LIFO list
(O(1) per request). Plain `http://` only; the proxy uses httpx for anything else.

Failures are :class:`UpstreamError` (and its subclasses for the connect phase).
A response not read to its end is closed with its connection, never pooled.
"""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import trio

from llmgw import sockio

_MAX_HEAD = 64 * 1024
_RECV = 65536
# Idle connections older than this are closed rather than reused (httpx's default;
# servers commonly close idle keep-alive connections after 5 s or more).
KEEPALIVE_EXPIRY = 5.0


class UpstreamError(Exception):
    """The upstream connection failed or broke the protocol."""


class ConnectFailed(UpstreamError):
    """No connection could be opened."""


class ConnectTimeout(UpstreamError):
    """No connection within the dial timeout."""


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
        self.prefix = b"POST " + path.encode() + b" HTTP/1.1\r\nhost: " + netloc.encode() + b"\r\n"


class _Conn:
    __slots__ = ("buf", "idle_since", "key", "sock")

    def __init__(self, sock: socket.socket, key: tuple[str, int]) -> None:
        self.sock = sock
        self.key = key
        self.buf = b""
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


_LENGTH, _CHUNKED, _UNTIL_CLOSE = 0, 1, 2
# chunked parser states
_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class Response:
    """A response whose body is read with :meth:`aiter_raw` or :meth:`aread`."""

    __slots__ = (
        "_conn",
        "_keep",
        "_left",
        "_mode",
        "_pool",
        "_state",
        "content",
        "headers_raw",
        "status_code",
    )

    def __init__(
        self,
        pool: Pool,
        conn: _Conn,
        status: int,
        headers: list[tuple[bytes, bytes]],
        mode: int,
        length: int,
        keep: bool,
    ) -> None:
        self._pool = pool
        self._conn: _Conn | None = conn
        self.status_code = status
        self.headers_raw = headers
        self._mode = mode
        self._left = length
        self._keep = keep
        self._state = _SIZE
        self.content = b""

    def _finished(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._keep and not conn.buf:
            self._pool.release(conn)
        else:
            conn.close()

    async def _recv(self, conn: _Conn) -> bytes:
        try:
            data = await sockio.recv(conn.sock, _RECV)
        except (trio.ClosedResourceError, OSError) as exc:
            raise UpstreamError(f"connection broke while reading the body: {exc!r}") from None
        return data

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body, transfer coding removed, as it arrives (all that one read
        made available at a time)."""
        conn = self._conn
        if conn is None:
            return
        mode = self._mode
        if mode == _LENGTH:
            while self._left > 0:
                data = conn.buf
                conn.buf = b""
                if not data:
                    data = await self._recv(conn)
                    if not data:
                        raise UpstreamError("peer closed connection without sending complete body")
                if len(data) > self._left:
                    data, conn.buf = data[: self._left], data[self._left :]
                self._left -= len(data)
                yield data
            self._finished()
        elif mode == _CHUNKED:
            while True:
                out = self._parse_chunks(conn)
                if out:
                    yield out
                if self._state == _DONE:
                    self._finished()
                    return
                data = await self._recv(conn)
                if not data:
                    raise UpstreamError("peer closed connection without sending complete body")
                conn.buf = conn.buf + data if conn.buf else data
        else:
            if conn.buf:
                data, conn.buf = conn.buf, b""
                yield data
            while data := await self._recv(conn):
                yield data
            self._keep = False
            self._finished()

    def _parse_chunks(self, conn: _Conn) -> bytes:
        buf = conn.buf
        n = len(buf)
        pos = 0
        out: list[bytes] = []
        state = self._state
        left = self._left
        while True:
            if state == _DATA:
                if pos >= n:
                    break
                take = min(left, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                left -= take
                if left == 0:
                    state = _DATA_END
            elif state == _SIZE:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > 1024:
                        raise UpstreamError("chunk size line too long")
                    break
                try:
                    size = int(buf[pos:eol].split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise UpstreamError("malformed chunk size") from None
                pos = eol + 2
                if size:
                    left, state = size, _DATA
                else:
                    state = _TRAILER
            elif state == _DATA_END:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise UpstreamError("malformed chunk end")
                pos += 2
                state = _SIZE
            elif state == _TRAILER:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                empty = eol == pos
                pos = eol + 2
                if empty:  # an empty line ends the trailer section
                    state = _DONE
                    break
            else:  # _DONE
                break
        conn.buf = buf[pos:] if pos < n else b""
        self._state = state
        self._left = left
        if not out:
            return b""
        return out[0] if len(out) == 1 else b"".join(out)

    async def aread(self) -> bytes:
        parts = [chunk async for chunk in self.aiter_raw()]
        self.content = b"".join(parts)
        return self.content

    async def aclose(self) -> None:
        """Release the connection: pooled when the body was read to its end, else closed."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


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
            raise ConnectFailed(str(exc) or repr(exc)) from None
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
        data = b"".join(head) + body
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
                raise UpstreamError("server disconnected without sending a response") from None
            except BaseException:
                conn.close()
                raise

    async def _exchange(self, conn: _Conn, data: bytes) -> Response:
        sock = conn.sock
        try:
            await sockio.send_all(sock, data)
        except (trio.ClosedResourceError, OSError):
            raise _StaleConnection from None
        buf = b""
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                status, headers, mode, length, keep = _parse_head(buf[:end])
                conn.buf = buf[end + 4 :]
                if 100 <= status < 200:  # informational: the real answer follows
                    buf, conn.buf = conn.buf, b""
                    continue
                response = Response(self, conn, status, headers, mode, length, keep)
                if mode == _LENGTH and length == 0:
                    response._finished()
                return response
            if len(buf) > _MAX_HEAD:
                raise UpstreamError("response headers too large")
            try:
                more = await sockio.recv(sock, _RECV)
            except (trio.ClosedResourceError, OSError) as exc:
                if not buf:
                    raise _StaleConnection from None
                raise UpstreamError(f"connection broke while reading headers: {exc!r}") from None
            if not more:
                if not buf:
                    raise _StaleConnection
                raise UpstreamError("server disconnected in the middle of the response headers")
            buf += more

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
            idle.clear()


class _StaleConnection(Exception):
    pass


def _parse_head(head: bytes) -> tuple[int, list[tuple[bytes, bytes]], int, int, bool]:
    lines = head.split(b"\r\n")
    status_line = lines[0].split(b" ", 2)
    try:
        version = status_line[0]
        status = int(status_line[1])
    except (IndexError, ValueError):
        raise UpstreamError(f"malformed status line {lines[0][:100]!r}") from None
    if not version.startswith(b"HTTP/1."):
        raise UpstreamError(f"unsupported protocol {version[:20]!r}")
    headers: list[tuple[bytes, bytes]] = []
    length = -1
    chunked = False
    keep = version == b"HTTP/1.1"
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise UpstreamError("malformed header line")
        name = name.strip()
        value = value.strip()
        headers.append((name, value))
        lname = name.lower()
        if lname == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise UpstreamError("malformed content-length") from None
        elif lname == b"transfer-encoding":
            chunked = value.lower().endswith(b"chunked")
        elif lname == b"connection":
            v = value.lower()
            if b"close" in v:
                keep = False
            elif b"keep-alive" in v:
                keep = True
    if chunked:
        return status, headers, _CHUNKED, 0, keep
    if status in (204, 304):
        return status, headers, _LENGTH, 0, keep
    if length >= 0:
        return status, headers, _LENGTH, length, keep
    return status, headers, _UNTIL_CLOSE, 0, False
