"""The engine client's way to engines llmgw's own client does not reach: httpx.

Used for https:// engines and for a client a library user injects (Router's
`upstream=`); plain http:// goes through :mod:`llmgw.http.client`. Imported only when
first needed (:mod:`llmgw.http.engine_client`), so a gateway with plain-HTTP engines
never loads httpx (a worker process saves its import, about 6.5 MB). httpx's errors
become the UpstreamError family, named by class only: httpx's messages may carry the
URL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import httpx

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
    """An httpx response seen as llmgw.http.engine_client.UpstreamResponse: its body
    as sent (`decoded` False: the proxy relays it) or with its content coding removed."""

    def __init__(self, response: httpx.Response, decoded: bool) -> None:
        self._response = response
        self._decoded = decoded
        self._chunks: AsyncIterator[bytes] | None = None
        self.status_code = response.status_code
        self.headers_raw = list(response.headers.raw)
        self.content = b""

    @property
    def complete(self) -> bool:
        return False  # httpx reads the body only when asked

    async def read_some(self) -> bytes:
        if self._chunks is None:
            r = self._response
            # One read already (a MockTransport's made of bytes) has only its decoded body.
            raw = not self._decoded and not r.is_stream_consumed
            self._chunks = r.aiter_raw() if raw else r.aiter_bytes()
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
        """The whole body; BodyTooLarge once it is longer than `limit` bytes (as
        decoded, when it is: a small compressed body cannot expand past it either)."""
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


def new_client(dial_timeout: float) -> httpx.AsyncClient:
    """Only the connect is timed here: every caller bounds its exchange with a cancel
    scope of its own deadline."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=dial_timeout, read=None, write=None, pool=None),
        transport=httpx.AsyncHTTPTransport(
            retries=0,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            socket_options=[(6, 1, 1)],  # IPPROTO_TCP, TCP_NODELAY, on
        ),
    )


async def send(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes | None,
    *,
    decoded: bool,
) -> HttpxResponse:
    """`method` `url` with `body`; the response once its head is in."""
    request = client.build_request(method, url, content=body, headers=list(headers))
    try:
        response = HttpxResponse(await client.send(request, stream=True), decoded)
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
