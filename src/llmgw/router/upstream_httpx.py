"""The proxy's way to engines its own client does not reach: httpx.

Used for https:// endpoints and for a client a library user injects (Router's
`upstream=`); plain http:// goes through :mod:`llmgw.http.client`. Imported only when
first needed, so a gateway with plain-HTTP engines never loads httpx on the hot path
(a worker process saves its import, about 6.5 MB). httpx's errors become the
UpstreamError family, named by class only: httpx's messages may carry the URL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from llmgw.config import Timeouts
from llmgw.http.client import (
    BadResponse,
    BodyTooLarge,
    ConnectFailed,
    ConnectTimeout,
    UpstreamError,
)

__all__ = ["HttpxResponse", "new_client", "send"]


def _error(exc: httpx.HTTPError) -> UpstreamError:
    if isinstance(exc, httpx.RemoteProtocolError | httpx.DecodingError):
        return BadResponse(f"httpx: {type(exc).__name__}")
    return UpstreamError(f"httpx: {type(exc).__name__}")


class HttpxResponse:
    """An httpx response seen as the proxy's UpstreamResponse."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._chunks: AsyncIterator[bytes] | None = None
        self.status_code = response.status_code
        self.headers_raw = list(response.headers.raw)
        self.content = b""

    @property
    def complete(self) -> bool:
        return False  # httpx reads the body only when asked

    async def read_some(self) -> bytes:
        if self._chunks is None:
            self._chunks = self._response.aiter_raw()
        try:
            while True:
                chunk = await anext(self._chunks)
                if chunk:
                    return chunk
        except StopAsyncIteration:
            return b""
        except httpx.HTTPError as exc:
            raise _error(exc) from None

    async def aread(self, limit: int | None = None) -> bytes:
        parts: list[bytes] = []
        size = 0
        while chunk := await self.read_some():
            size += len(chunk)
            if limit is not None and size > limit:
                raise BodyTooLarge(f"a body over the limit of {limit} bytes")
            parts.append(chunk)
        self.content = b"".join(parts)
        return self.content

    async def aclose(self) -> None:
        await self._response.aclose()


def new_client(timeouts: Timeouts) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=timeouts.dial, read=None, write=None, pool=None),
        transport=httpx.AsyncHTTPTransport(
            retries=0,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            socket_options=[(6, 1, 1)],  # IPPROTO_TCP, TCP_NODELAY, on
        ),
    )


async def send(
    client: httpx.AsyncClient, url: str, body: bytes, headers: list[tuple[bytes, bytes]]
) -> HttpxResponse:
    """POST `body` to `url`; the response once its head is in."""
    request = client.build_request("POST", url, content=body, headers=headers)
    try:
        response = HttpxResponse(await client.send(request, stream=True))
    except httpx.ConnectTimeout:
        raise ConnectTimeout("connect timeout") from None
    except httpx.ConnectError as exc:
        raise ConnectFailed(f"httpx: {type(exc).__name__}") from None
    except httpx.HTTPError as exc:
        raise _error(exc) from None
    if not 100 <= response.status_code <= 599:  # h11 takes any three digits
        await response.aclose()
        raise BadResponse(f"status {response.status_code} is outside 100-599")
    return response
