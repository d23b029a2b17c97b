"""llmgw.http.server against clients that break the protocol or hold resources on purpose.

Each finding of issue #15 on the listener side, over real loopback sockets: bytes the
parser must refuse (and what it must not serve after them), the exact head limit, a
response head that would carry CR/LF/NUL or a status that is none, a client that
stops reading, the connection cap, a body that stops coming, a half-closed client.
"""

from __future__ import annotations

import json
import logging
import socket
from typing import Any

import pytest
import trio

from llmgw.http.server import MAX_HEAD_BYTES, ClientDisconnected

from .test_http_server import WAIT, connect, request, running

CHUNKED = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"


async def answer_status(raw: bytes) -> tuple[int, bytes]:
    return int(raw.split(b" ", 2)[1]), raw.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize(
    "body",
    [
        b"-6\r\nabc\r\n0\r\n\r\n",  # int(x, 16) takes a sign: the old parser walked back
        b"+3\r\nabc\r\n0\r\n\r\n",
        b"0x3\r\nabc\r\n0\r\n\r\n",
        b"1_0\r\nabc\r\n0\r\n\r\n",
        b"3;a b\r\nabc\r\n0\r\n\r\n",  # a space inside an extension name
        b"3;\x01\r\nabc\r\n0\r\n\r\n",
        b"3\r\nabc\r\n0\r\nX y\r\n\r\n",  # a trailer line that is no field
        b"3\r\nabc\r\n0\r\nX: " + b"y" * 5000 + b"\r\n\r\n",  # trailers past 4 KiB
        b"3\r\nabcd\r\n0\r\n\r\n",  # more data than the size said
        b"ffffffffffffffffff\r\n",  # a size past 64 bits
    ],
    ids=[
        "negative",
        "plus",
        "0x",
        "underscore",
        "ext-space",
        "ext-ctl",
        "bad-trailer",
        "huge-trailer",
        "overlong-data",
        "overflow",
    ],
)
async def test_a_malformed_chunked_body_is_a_400_and_the_app_sees_a_disconnect(
    body: bytes,
) -> None:
    async with running() as server, connect(server) as client:
        await client.send(CHUNKED + body)
        status, _ = await answer_status(await client.raw_until_closed())
        assert status == 400
        assert server.app.calls == 1


async def test_a_bare_lf_ending_a_chunked_body_hides_no_request() -> None:
    # `0\r\n\n`: a lenient parser took the blank line's LF as the end and the next GET
    # as a trailer, answering two GETs where three requests seemed to be.
    async with running() as server, connect(server) as client:
        gets = b"GET /a HTTP/1.1\r\nHost: t\r\n\r\nGET /b HTTP/1.1\r\nHost: t\r\n\r\n"
        await client.send(CHUNKED + b"3\r\nabc\r\n0\r\n\n" + gets)
        answer = await client.raw_until_closed()
        assert answer.count(b"HTTP/1.1 ") == 1
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert server.app.calls == 1  # the POST only; nothing after the break is served


def padded(total: int) -> bytes:
    """A GET whose head (request line to blank line) is `total` bytes."""
    base = b"GET / HTTP/1.1\r\nHost: t\r\nX-Pad: \r\n\r\n"
    pad = total - len(base)
    return b"GET / HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"p" * pad + b"\r\n\r\n"


async def test_the_head_limit_is_exact() -> None:
    async with running() as server:
        async with connect(server) as client:
            raw = padded(MAX_HEAD_BYTES)
            assert len(raw) == MAX_HEAD_BYTES
            await client.send(raw)
            assert (await client.raw_until(b"}")).startswith(b"HTTP/1.1 200 ")
        async with connect(server) as client:
            await client.send(padded(MAX_HEAD_BYTES + 1))
            assert (await client.raw_until_closed()).startswith(b"HTTP/1.1 431 ")
        async with connect(server) as client:
            # A line that never ends is cut once the head is past the limit, not
            # buffered on: the server answers while the client is still sending.
            await client.send(b"GET / HTTP/1.1\r\nHost: t\r\nX: " + b"a" * (MAX_HEAD_BYTES + 1))
            assert (await client.raw_until_closed()).startswith(b"HTTP/1.1 431 ")
        assert server.app.calls == 1


async def test_a_response_head_never_carries_cr_lf_nul_or_a_non_status() -> None:
    calls: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        calls.append(scope["path"])
        bad: dict[str, tuple[int, list[tuple[bytes, bytes]]]] = {
            "/lf": (200, [(b"x-a", b"1\nset-cookie: evil=1")]),
            "/cr": (200, [(b"x-a", b"1\rset-cookie: evil=1")]),
            "/nul": (200, [(b"x-a", b"1\0")]),
            "/name": (200, [(b"x a", b"1")]),
            "/42": (42, []),
            "/600": (600, []),
        }
        status, headers = bad[scope["path"]]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"hi"})

    async with running(app) as server:
        for path in ("/lf", "/cr", "/nul", "/name", "/42", "/600"):
            async with connect(server) as client:
                await client.send(request("GET", path))
                answer = await client.raw_until_closed()
                assert answer.startswith(b"HTTP/1.1 500 "), (path, answer)
                assert b"evil" not in answer and b"\0" not in answer
    assert len(calls) == 6


async def test_a_client_that_stops_reading_is_cut_after_send_timeout() -> None:
    gone = trio.Event()
    sent = 0

    async def flood(scope: Any, receive: Any, send: Any) -> None:
        nonlocal sent
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        chunk = b"x" * 65536
        try:
            while True:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                sent += len(chunk)
        except ClientDisconnected:
            gone.set()  # the app learns that the client is gone, from the send
            raise

    async with running(flood, send_timeout=0.5) as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        async with stream:
            await stream.send_all(request("GET", "/"))
            started = trio.current_time()
            with trio.fail_after(WAIT):
                await gone.wait()
            elapsed = trio.current_time() - started
    assert 0.5 <= elapsed < WAIT
    assert sent < 64 * 1024 * 1024  # the buffers filled, then the writer waited


async def test_past_max_connections_a_client_gets_a_one_line_503() -> None:
    async with running(max_connections=1) as server, connect(server) as holder:
        await holder.send(request("POST", "/slow", b"x"))
        with trio.fail_after(WAIT):
            await server.app.holding.wait()
        async with connect(server) as extra:
            answer = await extra.raw_until_closed()
        assert answer.startswith(b"HTTP/1.1 503 ")
        assert b"retry-after: 1" in answer
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == (
            "service_unavailable"
        )
        server.app.release.set()
        head, _ = await holder.response()
        assert head.status_code == 200  # the one it holds is served as usual


async def test_a_body_that_stops_coming_is_a_408_after_body_timeout() -> None:
    expiries: list[int] = []
    async with (
        running(
            body_timeout=0.3,
            body_timeout_key="router.timeouts.client_body",
            on_body_timeout=lambda: expiries.append(1),
        ) as server,
        connect(server) as client,
    ):
        await client.send(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789"
        )
        started = trio.current_time()
        answer = await client.raw_until_closed()
        assert trio.current_time() - started >= 0.3
    status, body = await answer_status(answer)
    assert status == 408
    message = json.loads(body)["error"]["message"]
    assert message == (
        "the request body did not arrive within 0.3s (router.timeouts.client_body); 10 bytes came"
    )
    assert expiries == [1]


async def test_a_half_closed_client_is_gone_and_no_error_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="llmgw.http.server")
    async with running() as server, connect(server) as client:
        await client.send(request("POST", "/watch", b"{}"))
        client.stream.socket.shutdown(socket.SHUT_WR)
        with trio.fail_after(WAIT):
            await server.app.disconnected.wait()
        assert await client.raw_until_closed() == b""
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_an_upgrade_request_is_served_plainly_then_the_connection_closes() -> None:
    async with running() as server, connect(server) as client:
        await client.send(
            b"GET /a HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n"
            b"GET /b HTTP/1.1\r\nHost: t\r\n\r\n"
        )
        answer = await client.raw_until_closed()
    assert answer.count(b"HTTP/1.1 ") == 1 and answer.startswith(b"HTTP/1.1 200 ")
    assert b'"path": "/a"' in answer
    assert server.app.calls == 1


# A listener in its own process with 64 file descriptors: the connections below use
# them up, so accept() fails with EMFILE until they close.
_FD_STARVED = """
import functools, logging, resource, sys, trio
from llmgw.http.server import HttpServerConfig, serve
from llmgw.units import Address

async def app(scope, receive, send):
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})

async def main():
    async def forever():
        await trio.sleep_forever()
    async def report(task_status=trio.TASK_STATUS_IGNORED):
        run = functools.partial(serve, shutdown_trigger=forever)
        urls = await nursery.start(run, app, Address("127.0.0.1", 0), HttpServerConfig())
        print(urls[0].rsplit(":", 1)[1], flush=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(report)

logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
trio.run(main)
"""


def test_out_of_file_descriptors_the_listener_logs_once_and_serves_again(
    tmp_path: Any,
) -> None:
    import subprocess
    import sys
    import time

    from .waiting import wait_for

    errors = tmp_path / "stderr"
    with errors.open("w") as sink:
        child = subprocess.Popen(
            [sys.executable, "-c", _FD_STARVED], stdout=subprocess.PIPE, stderr=sink, text=True
        )
    held: list[socket.socket] = []
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())

        def failures() -> int:
            return errors.read_text().count("accept failed")

        for _ in range(80):  # more than the child has descriptors for
            held.append(socket.create_connection(("127.0.0.1", port)))
        wait_for(failures, "accept() to fail with EMFILE", WAIT)
        # The behaviour under test is time spent out of descriptors: the accept loop
        # retries every 100 ms, and the old one logged every failure (622 lines in #15).
        time.sleep(1.5)
        assert failures() == 1, errors.read_text()
        assert "out of file descriptors" in errors.read_text()
        for sock in held:
            sock.close()
        held.clear()

        def served() -> bool:
            with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                return sock.recv(100).startswith(b"HTTP/1.1 200 ")

        assert wait_for(served, "a new client served once descriptors are free", WAIT)
    finally:
        for sock in held:
            sock.close()
        child.kill()
        child.wait()
