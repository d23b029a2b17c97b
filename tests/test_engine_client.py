"""The one engine client: which client carries which URL, what each operation sends
and reads, and its failures, which name no engine address."""

from __future__ import annotations

import gzip
import socket

import httpx
import pytest
import trio

from llmgw.http.client import BodyTooLarge, ConnectFailed
from llmgw.http.engine_client import EngineClient, close_response
from tests.raw_engine import RawEngine, ok


def _refused_port() -> int:
    """A port of 127.0.0.1 nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_plain_http_takes_llmgws_own_client_for_every_operation_on_one_pool() -> None:
    engine = RawEngine(
        {
            b"/v1/chat/completions": ok(b'{"id": "x"}'),
            b"/metrics": ok(b"vllm:num_requests_running 1\n"),
            b"/sleep?level=1": ok(b""),
            b"/tokenize": ok(b'{"tokens": [1, 2]}'),
        }
    )
    client = EngineClient(dial_timeout=2.0)
    key = [(b"x-k", b"v")]
    async with trio.open_nursery() as nursery:
        base = f"http://127.0.0.1:{await nursery.start(engine.serve)}"
        with trio.fail_after(10):
            response = await client.send(base + "/v1/chat/completions", b'{"model": "m"}', key)
            try:
                assert (response.status_code, await response.aread()) == (200, b'{"id": "x"}')
            finally:
                await close_response(response)
            async with client.request("GET", base + "/metrics", key) as page:
                assert await page.aread(1024) == b"vllm:num_requests_running 1\n"
            slept = await client.fetch("POST", base + "/sleep?level=1", key, body=b"", limit=16)
            assert slept == (200, b"")
            tokens = await client.fetch("POST", base + "/tokenize", key, body=b"{}", limit=64)
            assert tokens == (200, b'{"tokens": [1, 2]}')
        nursery.cancel_scope.cancel()
    await client.aclose()
    heads = engine.heads
    assert [h.split(b"\r\n")[0] for h in heads] == [
        b"POST /v1/chat/completions HTTP/1.1",
        b"GET /metrics HTTP/1.1",
        b"POST /sleep?level=1 HTTP/1.1",
        b"POST /tokenize HTTP/1.1",
    ]
    assert all(b"\r\nx-k: v" in h for h in heads)
    assert [body for _, _, body in engine.requests] == [b'{"model": "m"}', b"", b"", b"{}"]
    assert b"content-length" not in heads[1] and b"content-length: 0" in heads[2]
    assert not any(b"accept-encoding" in h.lower() for h in heads)  # bodies come plain
    # One pool for every operation: all four on one kept-alive connection.
    assert {number for number, _, _ in engine.requests} == {1}
    assert client._httpx.made is False  # and no httpx client was made


async def test_a_body_over_the_limit_is_refused_as_it_comes() -> None:
    engine = RawEngine({b"/props": ok(b"x" * 100), b"/chunked": _chunked(b"y" * 100)})
    client = EngineClient(dial_timeout=2.0)
    async with trio.open_nursery() as nursery:
        base = f"http://127.0.0.1:{await nursery.start(engine.serve)}"
        with trio.fail_after(10):
            assert await client.fetch("GET", base + "/props", limit=100) == (200, b"x" * 100)
            for path in ("/props", "/chunked"):  # its length declared, or not
                with pytest.raises(BodyTooLarge):
                    await client.fetch("GET", base + path, limit=99)
        nursery.cancel_scope.cancel()
    await client.aclose()


def _chunked(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (
        len(body),
        body,
    )


async def test_a_given_client_carries_every_url_relaying_bodies_raw_and_reading_them_decoded() -> (
    None
):
    page = b"vllm:num_requests_running 1\n" * 40
    packed = gzip.compress(page, mtime=0)
    seen: list[httpx.Request] = []

    def serve(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/read":  # made of bytes: httpx reads it at once
            return httpx.Response(200, content=page)
        # Streamed, as from a socket.
        return httpx.Response(
            200, stream=httpx.ByteStream(packed), headers={"content-encoding": "gzip"}
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(serve)) as given:
        client = EngineClient(2.0, given)
        response = await client.send("http://engine/v1/completions", b"{}", [(b"x-k", b"v")])
        try:
            assert await response.aread() == packed  # relayed as the engine sent it
        finally:
            await close_response(response)
        response = await client.send("http://engine/read", b"{}", [])
        try:
            assert await response.aread() == page
        finally:
            await close_response(response)
        assert await client.fetch("GET", "http://engine/metrics", limit=len(page)) == (200, page)
        with pytest.raises(BodyTooLarge):  # bounded as decoded: no expanding past it
            await client.fetch("GET", "http://engine/metrics", limit=len(page) - 1)
    assert [(r.method, str(r.url)) for r in seen] == [
        ("POST", "http://engine/v1/completions"),
        ("POST", "http://engine/read"),
        ("GET", "http://engine/metrics"),
        ("GET", "http://engine/metrics"),
    ]
    assert seen[0].content == b"{}" and seen[0].headers["x-k"] == "v"
    assert client.pool._targets == {}  # llmgw's own client never dialled


async def test_a_refused_connection_is_connect_failed_naming_no_address() -> None:
    port = _refused_port()
    client = EngineClient(dial_timeout=2.0)
    with trio.fail_after(10):
        for scheme in ("http", "https"):  # llmgw's own client, then httpx's
            with pytest.raises(ConnectFailed) as caught:
                await client.fetch("GET", f"{scheme}://127.0.0.1:{port}/metrics", limit=10)
            message = str(caught.value)
            assert message and "127.0.0.1" not in message and str(port) not in message
            assert client._httpx.made is (scheme == "https")  # made on first use
    await client.aclose()
