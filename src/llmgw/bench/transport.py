"""The load generator's httpx transport: plain-HTTP POSTs on llmgw's own HTTP/1.1 client.

A load generator must cost less than what it measures. Through httpx's default
transport (httpcore and h11) a streamed request cost the generator about 2.2 ms of
CPU, more than llmgw spent routing and relaying it (1.3 ms): on a shared machine
the generator's CPU became queueing in the numbers. This transport sends plain
``http://`` POSTs, all the load generator sends, through the router's upstream client
(`llmgw.http.client`: one write per request, O(1) keep-alive pool,
socket calls that skip trio's scheduler when they need not wait) and hands the answer
back as an ``httpx.Response``, so everything above it stays httpx. Anything else
(``https://``, other methods) goes to a regular httpx transport.

Failures map to the httpx exceptions the runner already tells apart: connect errors
and timeouts, and broken connections as ``httpx.ReadError``.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import httpx

from llmgw.http.client import (
    ConnectFailed,
    ConnectTimeout,
    Pool,
    Response,
    UpstreamError,
)

__all__ = ["FastTransport"]

# Framing headers the client writes itself.
_OWN = frozenset({b"host", b"content-length", b"transfer-encoding", b"connection"})


class _Body(httpx.AsyncByteStream):
    def __init__(self, response: Response) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            while chunk := await self._response.read_some():
                yield chunk
        except UpstreamError as exc:
            raise httpx.ReadError(str(exc)) from None

    async def aclose(self) -> None:
        await self._response.aclose()


class FastTransport(httpx.AsyncBaseTransport):
    """Plain-HTTP POSTs through :class:`~llmgw.http.client.Pool`; the rest
    through httpx's own transport."""

    def __init__(self, connect_timeout: float = 10.0, concurrency: int = 256) -> None:
        # Room to keep every worker's connection alive between its requests.
        self._pool = Pool(connect_timeout, max_idle_per_host=max(256, concurrency))
        self._fallback = httpx.AsyncHTTPTransport(
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)], trust_env=False
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST" or request.url.scheme != "http":
            return await self._fallback.handle_async_request(request)
        body = await request.aread()
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in _OWN]
        try:
            response = await self._pool.post(str(request.url), body, headers)
        except ConnectTimeout as exc:
            raise httpx.ConnectTimeout(str(exc), request=request) from None
        except ConnectFailed as exc:
            raise httpx.ConnectError(str(exc), request=request) from None
        except UpstreamError as exc:
            raise httpx.ReadError(str(exc), request=request) from None
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers_raw,
            stream=_Body(response),
            request=request,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()
        await self._fallback.aclose()
