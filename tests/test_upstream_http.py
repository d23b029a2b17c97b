"""The router's own HTTP/1.1 upstream client against a scripted server on loopback:
framing (length, chunked, until close), keep-alive reuse, stale connections, and
malformed answers."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import pytest
import trio

from llmgw.router.upstream_http import Pool, UpstreamError
from llmgw.testing_procs import reserve_port
from tests.waiting import wait_until

Script = Callable[[int], Sequence[bytes]]  # connection number -> pieces to send per request


class Counts(list[int]):
    """Requests served per connection (the port first, until the test pops it), and how
    many of its connections the server has closed."""

    closed = 0


@asynccontextmanager
async def scripted(script: Script, *, close_after: bool = False) -> AsyncIterator[Counts]:
    """A server answering each request with `script(connection)`'s pieces, sent one
    write at a time (so the client sees them split). Yields the per-connection request
    counts."""
    counts = Counts()

    async def handle(stream: trio.SocketStream) -> None:
        index = len(counts)
        counts.append(0)
        buf = b""
        async with stream:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buf += data
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":")[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                )
                while len(rest) < length:
                    rest += await stream.receive_some(65536)
                buf = rest[length:]
                counts[index] += 1
                for piece in script(index):
                    await stream.send_all(piece)
                    await trio.sleep(0.001)  # a slow server: each piece a write of its own
                if close_after:
                    return

    async def handle_and_count(stream: trio.SocketStream) -> None:
        try:
            await handle(stream)
        finally:
            counts.closed += 1  # the stream is closed by now

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(
            functools.partial(trio.serve_tcp, handle_and_count, 0, host="127.0.0.1")
        )
        port = listener.socket.getsockname()[1]
        counts.insert(0, port)  # the caller reads the port from the front
        yield counts
        nursery.cancel_scope.cancel()


async def post(pool: Pool, port: int) -> tuple[int, bytes]:
    response = await pool.post(f"http://127.0.0.1:{port}/v1/x", b'{"a": 1}', [])
    return response.status_code, await response.aread()


async def test_content_length_split_across_writes_and_reused() -> None:
    body = b'{"ok": true}'
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    async with scripted(lambda _: [head % len(body), body[:4], body[4:]]) as counts:
        port = counts.pop(0)
        pool = Pool(dial_timeout=2)
        for _ in range(3):
            assert await post(pool, port) == (200, body)
        assert counts == [3]  # one connection, kept alive


async def test_chunked_with_extensions_split_lines_and_trailers() -> None:
    pieces = [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
        b"5;ext=1\r",
        b"\nhel",
        b"lo\r\n6\r\n world\r",
        b"\n0\r\nx-trailer: 1\r\n",
        b"\r\n",
    ]
    async with scripted(lambda _: pieces) as counts:
        port = counts.pop(0)
        pool = Pool(dial_timeout=2)
        assert await post(pool, port) == (200, b"hello world")
        assert await post(pool, port) == (200, b"hello world")
        assert counts == [2]


async def test_body_until_close_is_not_reused() -> None:
    async with scripted(
        lambda _: [b"HTTP/1.1 200 OK\r\n\r\nall", b" of it"], close_after=True
    ) as c:
        port = c.pop(0)
        pool = Pool(dial_timeout=2)
        assert await post(pool, port) == (200, b"all of it")
        assert await post(pool, port) == (200, b"all of it")
        assert c == [1, 1]


async def test_a_pooled_connection_closed_by_the_server_is_retried_once() -> None:
    ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    async with scripted(lambda _: [ok], close_after=True) as counts:
        port = counts.pop(0)
        pool = Pool(dial_timeout=2)
        assert await post(pool, port) == (200, b"ok")
        # The server closed after answering while the client kept the connection:
        # the next request notices and uses a new one.
        await wait_until(lambda: counts.closed == 1, "the server's close of its connection")
        assert await post(pool, port) == (200, b"ok")
        assert counts == [1, 1]


async def test_a_body_left_unread_closes_the_connection() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n"
    async with scripted(lambda _: [head, b"0123456789"]) as counts:
        port = counts.pop(0)
        pool = Pool(dial_timeout=2)
        response = await pool.post(f"http://127.0.0.1:{port}/", b"{}", [])
        await response.aclose()  # never read
        assert await post(pool, port) == (200, b"0123456789")
        assert counts == [1, 1]


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b"garbage\r\n\r\n", "malformed status line"),
        (b"SPDY/3 200 OK\r\n\r\n", "unsupported protocol"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n", "malformed content-length"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "malformed chunk size"),
    ],
)
async def test_malformed_answers_are_upstream_errors(answer: bytes, message: str) -> None:
    async with scripted(lambda _: [answer], close_after=True) as counts:
        port = counts.pop(0)
        with pytest.raises(UpstreamError, match=message):
            await post(Pool(dial_timeout=2), port)


async def test_a_body_cut_short_is_an_upstream_error() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n"
    async with scripted(lambda _: [head, b"short"], close_after=True) as counts:
        port = counts.pop(0)
        with pytest.raises(UpstreamError, match="without sending complete body"):
            await post(Pool(dial_timeout=2), port)


async def test_nothing_listening_is_a_connect_error() -> None:
    from llmgw.router.upstream_http import ConnectFailed

    with reserve_port() as port, pytest.raises(ConnectFailed):  # held: nothing listens
        await post(Pool(dial_timeout=2), port)
