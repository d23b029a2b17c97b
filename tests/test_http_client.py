"""The router's own HTTP/1.1 upstream client against a scripted server on loopback:
framing (length, chunked, until close), keep-alive reuse, stale connections, and
malformed answers."""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import pytest
import trio

from llmgw.http.client import (
    MAX_FRAMING,
    MAX_HEAD,
    BadResponse,
    BodyTooLarge,
    ConnectFailed,
    Pool,
    ResponseParser,
    Target,
    UpstreamError,
    describe,
)
from llmgw.testing.procs import reserve_port
from tests.waiting import wait_until

Script = Callable[[int], Sequence[bytes]]  # connection number -> pieces to send per request


class Counts(list[int]):
    """Requests served per connection (the port first, until the test pops it), and how
    many of its connections the server has closed."""

    closed = 0


async def read_request(stream: trio.SocketStream, buf: bytes) -> tuple[bytes | None, bytes]:
    """For the test servers: the next request (head and Content-Length body) from
    `stream` after `buf`, and the bytes past it; None when the client closed first."""
    while b"\r\n\r\n" not in buf:
        data = await stream.receive_some(65536)
        if not data:
            return None, buf
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = int(
        next(
            (
                line.split(b":")[1]
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            b"0",
        )
    )
    while len(rest) < length:
        rest += await stream.receive_some(65536)
    return head + b"\r\n\r\n" + rest[:length], rest[length:]


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
                request, buf = await read_request(stream, buf)
                if request is None:
                    return
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
        (b"garbage\r\n\r\n", "malformed response"),
        (b"SPDY/3 200 OK\r\n\r\n", "malformed response"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
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
        with pytest.raises(
            UpstreamError, match="closed the connection in the middle of the response body"
        ):
            await post(Pool(dial_timeout=2), port)


async def test_nothing_listening_is_a_connect_error() -> None:
    from llmgw.http.client import ConnectFailed

    with reserve_port() as port, pytest.raises(ConnectFailed):  # held: nothing listens
        await post(Pool(dial_timeout=2), port)


# -- the parser alone: bytes in, status, headers and body out ------------------------

CHUNKED_ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5;x=1\r\nhello\r\n6\r\n world\r\n0\r\nT: v\r\n\r\n"
)


def parse(
    data: bytes, *, step: int | None = None, eof: bool = False
) -> tuple[ResponseParser, bytes]:
    """`data` fed to a parser whole or `step` bytes at a time; the parser and the body."""
    parser = ResponseParser()
    body = []
    for at in range(0, len(data), step or len(data) or 1):
        parser.feed(data[at : at + (step or len(data))])
        body.append(parser.take())
    if eof:
        parser.eof()
    return parser, b"".join(body)


@pytest.mark.parametrize("step", [None, 1, 7])
def test_a_response_parses_the_same_however_it_is_cut(step: int | None) -> None:
    parser, body = parse(CHUNKED_ANSWER, step=step)
    assert (parser.status, parser.complete, parser.keep_alive) == (200, True, True)
    assert body == b"hello world"
    # Trailer fields are checked, not kept.
    assert parser.headers == [(b"Content-Type", b"text/plain"), (b"Transfer-Encoding", b"chunked")]


def head_of(total: int, status: bytes = b"200 OK") -> bytes:
    """A response head of exactly `total` bytes (no body)."""
    base = b"HTTP/1.1 " + status + b"\r\nx-pad: \r\ncontent-length: 0\r\n\r\n"
    return base.replace(b"x-pad: ", b"x-pad: " + b"p" * (total - len(base)))


@pytest.mark.parametrize("step", [None, 1000])
def test_the_head_limit_is_exact(step: int | None) -> None:
    parser, _ = parse(head_of(MAX_HEAD), step=step)
    assert parser.complete
    with pytest.raises(BadResponse, match="head exceeds 64 KiB"):
        parse(head_of(MAX_HEAD + 1), step=step)


def test_informational_heads_count_against_the_head_limit() -> None:
    informational = b"HTTP/1.1 100 Continue\r\nx-a: 1\r\n\r\n"
    parser, body = parse(
        informational + informational + b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    )
    assert (parser.status, parser.headers, body) == (200, [(b"content-length", b"2")], b"ok")
    with pytest.raises(BadResponse, match="head exceeds"):
        parse(informational * (MAX_HEAD // len(informational)) + head_of(100))


def test_a_body_until_the_connection_ends() -> None:
    parser, body = parse(b"HTTP/1.1 200 OK\r\n\r\nall of it")
    assert not parser.complete
    parser.eof()
    assert (parser.complete, parser.keep_alive) == (True, False)
    assert body == b"all of it"


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel",
        b"HTTP/1.1 200 OK\r\ncontent-le",
    ],
)
def test_an_answer_cut_short_is_an_upstream_error_not_a_bad_response(answer: bytes) -> None:
    parser, _ = parse(answer)
    with pytest.raises(UpstreamError, match="closed the connection in the middle") as info:
        parser.eof()
    assert not isinstance(info.value, BadResponse)


@pytest.mark.parametrize(
    ("answer", "keep"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n", True),
        (b"HTTP/1.1 204 No Content\r\n\r\n", True),
    ],
)
def test_keep_alive_follows_the_version_and_connection_header(answer: bytes, keep: bool) -> None:
    parser, _ = parse(answer)
    assert (parser.complete, parser.keep_alive) == (True, keep)


def test_header_values_lose_their_trailing_whitespace() -> None:
    parser, _ = parse(b"HTTP/1.1 200 OK\r\nx-a: \t v w \t\r\ncontent-length: 0\r\n\r\n")
    assert parser.headers[0] == (b"x-a", b"v w")


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b"HTTP/1.1 42 X\r\ncontent-length: 0\r\n\r\n", "status"),
        (b"HTTP/1.1 600 X\r\ncontent-length: 0\r\n\r\n", "status 600 is outside 100-599"),
        (b"HTTP/1.1 999 X\r\ncontent-length: 0\r\n\r\n", "status 999"),
        (b"HTTP/1.1 200 O\x01K\r\ncontent-length: 0\r\n\r\n", "control character"),
        (b"HTTP/2.0 200 OK\r\ncontent-length: 0\r\n\r\n", "HTTP version 2.0"),
        (b"HTTP/1.1 101 Switching\r\nupgrade: h2c\r\n\r\n", "protocol switch"),
        *(
            (b"HTTP/1.1 200 OK\r\nx-a: a%sb\r\ncontent-length: 0\r\n\r\n" % c, "header")
            for c in (b"\n", b"\r", b"\x00", b"\x01", b"\x7f")
        ),
        (b"HTTP/1.1 200 OK\r\nx a: b\r\ncontent-length: 0\r\n\r\n", "header token"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 1\r\n\r\nx", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: +1\r\n\r\nx", "Content-Length"),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ntransfer-encoding: chunked\r\n\r\n",
            "Content-Length",
        ),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n", "only chunked"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n", "only chunked"),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
            "two Transfer-Encoding",
        ),
        *(
            (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body, "(?i)chunk")
            for body in (
                b"-6\r\n",
                b"+6\r\n",
                b"0x6\r\n",
                b"1_0\r\n",
                b"6 \r\n",
                b"1" * 17 + b"\r\n",
            )
        ),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1;a\x00\r\n", "extension"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nxy\r\n", "chunk data"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\nbad\r\n\r\n", "header"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\n", "header"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nxy", "bytes after the end"),
        (b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", "bytes after the end"),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1;" + b"e" * 2 * MAX_FRAMING,
            "framing",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\nx: "
            + b"v" * 2 * MAX_FRAMING,
            "framing",
        ),
    ],
)
def test_what_http_forbids_is_a_bad_response(answer: bytes, message: str) -> None:
    with pytest.raises(BadResponse, match=message):
        parse(answer)
    with pytest.raises(BadResponse, match=message):
        parse(answer, step=3)


def test_framing_between_data_is_no_limit_on_a_long_body() -> None:
    # A million one-byte chunks: 6 MB of framing in all, never 64 KiB without data.
    one = b"1\r\nx\r\n"
    parser, body = parse(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + one * 1_000_000 + b"0\r\n\r\n",
        step=65536,
    )
    assert parser.complete and body == b"x" * 1_000_000


# -- limits, deadlines and addresses on real sockets --------------------------------------


class RawServer:
    """A server in a thread that answers each connection's first request with `answer`
    (as fast as it is read) and then notes when the client closes the connection."""

    def __init__(self, answer: bytes) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.answer = answer
        self.closed = threading.Event()
        threading.Thread(target=self.run, daemon=True).start()

    def run(self) -> None:
        conn, _ = self.listener.accept()
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            conn.sendall(self.answer)
            while conn.recv(65536):
                pass
        self.closed.set()  # an EOF or a reset: the client closed it


BIG = 1024 * 1024


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % BIG + b"x" * BIG,
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        + (b"%x\r\n" % (BIG // 4) + b"x" * (BIG // 4) + b"\r\n") * 4
        + b"0\r\n\r\n",
    ],
    ids=["declared", "chunked"],
)
async def test_a_body_over_the_limit_is_refused_and_its_connection_closed(answer: bytes) -> None:
    server = RawServer(answer)
    with server.listener:
        response = await Pool(dial_timeout=2).post(f"http://127.0.0.1:{server.port}/", b"{}", [])
        with pytest.raises(BodyTooLarge, match="over the limit of 300000"):
            await response.aread(300_000)
        assert await trio.to_thread.run_sync(server.closed.wait, 5)


def fast_forever_server() -> socket.socket:
    """A server in a thread answering a chunked body that never ends, as fast as it is
    read (so the reader's reads never wait)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        conn, _ = listener.accept()
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            block = (b"400\r\n" + b"x" * 1024 + b"\r\n") * 64
            while True:
                conn.sendall(block)

    threading.Thread(target=run, daemon=True).start()
    return listener


async def test_a_deadline_holds_while_reads_never_wait() -> None:
    listener = fast_forever_server()
    with listener:
        pool = Pool(dial_timeout=2)
        response = await pool.post(f"http://127.0.0.1:{listener.getsockname()[1]}/", b"{}", [])
        read = 0
        started = trio.current_time()
        with trio.move_on_after(0.3) as scope:
            # Bounded, so that a deadline that never fires fails the test instead of
            # hanging it.
            while read < 4 * 1024**3 and (chunk := await response.read_some()):
                read += len(chunk)
        assert scope.cancelled_caught, f"read {read} bytes and never saw the deadline"
        assert trio.current_time() - started < 1.0
        await response.aclose()


def test_a_url_with_spaces_or_controls_is_refused() -> None:
    for url in ("http://h:1/a b", "http://h:1/a\x00b", "http://h\x00:1/"):
        with pytest.raises(ValueError, match="spaces or control characters"):
            Target(url)


async def test_errors_name_no_address() -> None:
    with reserve_port() as port, pytest.raises(ConnectFailed) as info:
        await post(Pool(dial_timeout=2), port)
    assert str(info.value) == "connection refused"
    assert "127.0.0.1" not in str(info.value) and str(port) not in str(info.value)


def test_describe_finds_the_cause_under_trios_connect_error() -> None:
    refused = ConnectionRefusedError(111, "Connection refused")
    outer = OSError("all attempts to connect to 10.0.0.5:8000 failed")
    outer.__cause__ = ExceptionGroup("all attempts", [refused])
    assert describe(outer) == "connection refused"
