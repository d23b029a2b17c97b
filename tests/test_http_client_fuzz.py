"""The router's upstream HTTP client (llmgw.http.client) against generated
answers (hypothesis), over real loopback sockets.

* Any well-formed response (after 0-2 informational ones), framed by Content-Length,
  chunked (with extensions and trailers) or the connection's end, and cut into pieces
  at arbitrary points, reaches the caller exactly: status, headers, body; and its
  connection is reused when HTTP/1.1 lets it be.
* Malformed answers (a well-formed one with bytes replaced, inserted or deleted, or
  plain junk), the connection closed after them, end within a bound as a response or
  an UpstreamError, nothing else; a response that is accepted has a status in
  200-599 and no CR, LF or NUL in any header; and the same pool serves the next
  request.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.http.client import Pool, UpstreamError
from tests.mangling import mangle
from tests.properties import examples
from tests.test_http_client import read_request

SETTINGS = settings(max_examples=examples(60))
WAIT = 5.0
GOOD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"

TOKEN = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
RESERVED = {"content-length", "transfer-encoding", "connection"}
names = st.text(TOKEN, min_size=1, max_size=12).filter(lambda n: n.lower() not in RESERVED)
# Visible ASCII with inner spaces and tabs (a value's outer whitespace is not part of it).
values = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.just("\t"), max_size=20
).map(lambda v: v.strip(" \t"))
reasons = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)


@st.composite
def responses(draw: Any) -> tuple[bytes, dict[str, Any]]:
    """A well-formed response and what the client must make of it."""
    out = b""
    for _ in range(draw(st.integers(0, 2))):
        code = draw(st.sampled_from([100, 102, 103]))
        hint = draw(st.sampled_from([b"", b"link: </a>; rel=preload\r\n"]))
        out += b"HTTP/1.1 %d Info\r\n%s\r\n" % (code, hint)
    status = draw(st.integers(200, 599).filter(lambda s: s not in (204, 304)))
    reason = draw(reasons).encode()
    headers = draw(st.lists(st.tuples(names, values), max_size=6))
    ows = st.sampled_from(["", " ", "\t", "  ", " \t"])
    body = draw(st.binary(max_size=300))
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    head = b"HTTP/1.1 %d %s\r\n" % (status, reason)
    head += b"".join(f"{n}:{draw(ows)}{v}{draw(ows)}\r\n".encode() for n, v in headers)
    if framing == "chunked":
        head += b"Transfer-Encoding: chunked\r\n\r\n"
        framed, rest = b"", body
        for size in draw(st.lists(st.integers(1, 64), max_size=8)):
            if not rest:
                break
            piece, rest = rest[:size], rest[size:]
            ext = draw(st.sampled_from(["", ";x=1", ";y", ';z="q s"', ";a;b=c"]))
            framed += b"%x%s\r\n%s\r\n" % (len(piece), ext.encode(), piece)
        if rest:
            framed += b"%x\r\n%s\r\n" % (len(rest), rest)
        framed += b"0\r\n" + draw(st.sampled_from([b"", b"T: v\r\n", b"A: 1\r\nB: 2\r\n"]))
        framed += b"\r\n"
    elif framing == "length":
        head += b"Content-Length: %d\r\n\r\n" % len(body)
        framed = body
    else:
        head += b"\r\n"
        framed = body
    extra = {"chunked": [("Transfer-Encoding", "chunked")], "close": []}
    expected = {
        "status": status,
        "headers": [(n, v) for n, v in headers]
        + extra.get(framing, [("Content-Length", str(len(body)))]),
        "body": body,
        "reused": framing != "close",
    }
    return out + head + framed, expected


class _Live(list[int]):
    """[port] + the live per-connection request counts."""

    def __init__(self, listener: trio.SocketListener, seen: list[int]) -> None:
        super().__init__([listener.socket.getsockname()[1]])
        self.seen = seen


@asynccontextmanager
async def serving(first: bytes, cuts: list[int], *, close: bool) -> AsyncIterator[_Live]:
    """A server answering its first request with `first` in pieces cut at `cuts` (and
    closing after it when `close`), every later one with GOOD. Yields [port, requests
    per connection...]."""
    seen: list[int] = []
    answered = False

    async def handle(stream: trio.SocketStream) -> None:
        nonlocal answered
        seen.append(0)
        index = len(seen) - 1
        buf = b""
        async with stream:
            try:
                while True:
                    request, buf = await read_request(stream, buf)
                    if request is None:
                        return
                    seen[index] += 1
                    if answered:
                        await stream.send_all(GOOD)
                        continue
                    answered = True
                    last = 0
                    for cut in sorted({c % (len(first) + 1) for c in cuts}):
                        await stream.send_all(first[last:cut])
                        await trio.sleep(0.001)  # a write of its own: the client sees it cut
                        last = cut
                    await stream.send_all(first[last:])
                    if close:
                        return
            except trio.BrokenResourceError:
                return  # the client reset it (closed with bytes unread)

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(
            functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1")
        )
        yield _Live(listener, seen)
        nursery.cancel_scope.cancel()


async def fetch(pool: Pool, port: int) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    response = await pool.post(f"http://127.0.0.1:{port}/v1/x", b'{"a": 1}', [])
    body = await response.aread()
    return response.status_code, response.headers_raw, body


@SETTINGS
@given(response=responses(), cuts=st.lists(st.integers(0, 10_000), max_size=6))
def test_a_well_formed_response_cut_anywhere_reaches_the_caller_exactly(
    response: tuple[bytes, dict[str, Any]], cuts: list[int]
) -> None:
    data, expected = response

    async def main() -> None:
        reused = expected["reused"]
        async with serving(data, cuts, close=not reused) as live:
            pool = Pool(dial_timeout=2)
            with trio.fail_after(WAIT):
                status, headers, body = await fetch(pool, live[0])
                assert status == expected["status"]
                assert [(k.decode(), v.decode()) for k, v in headers] == expected["headers"]
                assert body == expected["body"]
                assert await fetch(pool, live[0]) == (200, [(b"content-length", b"2")], b"ok")
            assert live.seen == ([2] if reused else [1, 1])

    trio.run(main)


@st.composite
def mangled(draw: Any) -> bytes:
    """A well-formed response with a few bytes replaced, inserted or deleted, or junk."""
    return mangle(
        draw, draw(responses())[0], [0, 9, 10, 13, 32, 43, 45, 58, 59, 95, 127, 255, *b"0xaZ"]
    )


@SETTINGS
@given(data=mangled(), cuts=st.lists(st.integers(0, 10_000), max_size=4))
def test_a_malformed_answer_is_an_upstream_error_or_a_clean_response(
    data: bytes, cuts: list[int]
) -> None:
    async def main() -> None:
        async with serving(data, cuts, close=True) as live:
            pool = Pool(dial_timeout=2)
            with trio.fail_after(WAIT):
                try:
                    status, headers, _ = await fetch(pool, live[0])
                except UpstreamError:
                    pass
                else:
                    assert 200 <= status <= 599
                    for name, value in headers:
                        for byte in b"\r\n\x00":
                            assert byte not in name and byte not in value, (name, value)
                # The pool lives on: the next request, on a new connection, is served.
                assert (await fetch(pool, live[0]))[2] == b"ok"

    trio.run(main)
