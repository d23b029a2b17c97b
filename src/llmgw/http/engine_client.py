"""The one client to engines: llmgw's own for plain http://, httpx for the rest.

Everything the router says to an engine goes through the one :class:`EngineClient`
its Router makes: the proxy's requests (:meth:`EngineClient.send`), scrapes, a
stored response's follow-ups (:meth:`EngineClient.request`), sleep and wake calls
and tokenize calls (:meth:`EngineClient.fetch`). Plain ``http://`` goes through one
keep-alive :class:`~llmgw.http.client.Pool` (the proxy's fast path); any other scheme
through one httpx client made on first use (:mod:`llmgw.http.engine_httpx`), so a
process whose engines all speak plain HTTP never imports httpx. A given httpx client
(a library caller's, a test's MockTransport) takes every URL instead.

Whichever client carries it, a failure is an :class:`~llmgw.http.client.UpstreamError`
(:class:`~llmgw.http.client.BadResponse`, :class:`~llmgw.http.client.BodyTooLarge`,
:class:`~llmgw.http.client.ConnectFailed`, :class:`~llmgw.http.client.ConnectTimeout`)
whose message names no engine address: it may reach a client. Only the connect is
timed here (the dial timeout); every caller bounds its exchange with a cancel scope.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Protocol

import trio

from llmgw.http.client import Pool, Response
from llmgw.http.ondemand import OnDemandClient

if TYPE_CHECKING:
    import httpx

__all__ = ["EngineClient", "UpstreamResponse", "close_response"]


class UpstreamResponse(Protocol):
    """A response, whichever client carried it (llmgw.http.client.Response, or
    llmgw.http.engine_httpx.HttpxResponse)."""

    status_code: int
    headers_raw: list[tuple[bytes, bytes]]
    content: bytes

    @property
    def complete(self) -> bool:
        """The whole body is in hand: reading it will not wait."""
        ...

    async def read_some(self) -> bytes: ...

    async def aread(self, limit: int | None = None) -> bytes: ...

    async def aclose(self) -> None: ...


async def close_response(response: UpstreamResponse) -> None:
    """Close even when cancelled (a client that left must still free the engine's slot),
    but never wait long for it."""
    if isinstance(response, Response):
        # llmgw's own client closes without waiting (no checkpoint, so no Cancelled
        # either): the shielded scope below would cost CPU on every request for nothing.
        await response.aclose()
        return
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + 1.0
        await response.aclose()


def _new_httpx(dial_timeout: float) -> httpx.AsyncClient:
    from llmgw.http import engine_httpx  # first use only: see its docstring

    return engine_httpx.new_client(dial_timeout)


class EngineClient:
    """Requests to engines, over one pool of llmgw's own connections (plain http://)
    and one httpx client (the rest, or all of them when `given`)."""

    __slots__ = ("_httpx", "_native", "pool")

    def __init__(self, dial_timeout: float, given: httpx.AsyncClient | None = None) -> None:
        self.pool = Pool(dial_timeout)
        self._native = given is None  # may plain http:// take llmgw's own client?
        self._httpx = OnDemandClient(lambda: _new_httpx(dial_timeout), given)

    async def send(
        self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> UpstreamResponse:
        """POST `body` to `url` (the proxy's requests): the response once its head is
        in, its body as the engine sent it (relayed, so never decoded here). The caller
        closes it (:func:`close_response`)."""
        if self._native and url.startswith("http://"):
            return await self.pool.post(url, body, headers)
        return await self._httpx_send("POST", url, headers, body, decoded=False)

    @asynccontextmanager
    async def request(
        self,
        method: str,
        url: str,
        headers: Sequence[tuple[bytes, bytes]] = (),
        body: bytes | None = None,
    ) -> AsyncIterator[UpstreamResponse]:
        """`method` `url` (with `body`, if any): the response once its head is in, closed
        after the block. Its body is read as meant, not as coded for the wire: httpx
        asks for gzip and decodes it; llmgw's own client asks for no coding."""
        if self._native and url.startswith("http://"):
            response: UpstreamResponse = await self.pool.request(
                method.encode(), url, headers, body
            )
        else:
            response = await self._httpx_send(method, url, headers, body, decoded=True)
        try:
            yield response
        finally:
            await close_response(response)

    async def fetch(
        self,
        method: str,
        url: str,
        headers: Sequence[tuple[bytes, bytes]] = (),
        *,
        body: bytes | None = None,
        limit: int,
    ) -> tuple[int, bytes]:
        """`method` `url`: the status and the whole body, at most `limit` bytes
        (BodyTooLarge past it, reading no further)."""
        async with self.request(method, url, headers, body) as response:
            return response.status_code, await response.aread(limit)

    async def _httpx_send(
        self,
        method: str,
        url: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes | None,
        *,
        decoded: bool,
    ) -> UpstreamResponse:
        from llmgw.http import engine_httpx

        return await engine_httpx.send(
            self._httpx.get(), method, url, headers, body, decoded=decoded
        )

    async def aclose(self) -> None:
        await self.pool.aclose()
        await self._httpx.aclose()
