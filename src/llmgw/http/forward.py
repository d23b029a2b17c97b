"""Passing a request on, whole, to another llmgw process and its answer back.

Off the hot path, for the operator surface: a worker's /admin pages go to its
control process over a unix socket (llmgw.workers), and a follower instance's
control-plane API goes to the leader's admin listener (llmgw.control.leadership).
Bodies are small (a login, a JSON change) and read whole. The header naming the
client's address (:data:`CLIENT_HEADER`, which the login's rate limit is kept by) is
added here and any copy of it a client sent is dropped; only a unix socket's peer
believes it (llmgw.workers.pool.trust_forwarded_client).
"""

from __future__ import annotations

import math
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from llmgw.http.asgi import BodyTooLarge, ClientLeft, Receive, Scope, Send, read_body
from llmgw.http.ondemand import OnDemandClient

if TYPE_CHECKING:
    import httpx

__all__ = ["CLIENT_HEADER", "MAX_FORM_BYTES", "Forward", "Unanswered", "bad_gateway"]

#: The header carrying the client's address to the control process.
CLIENT_HEADER = b"x-llmgw-forwarded-client"
#: The largest /admin request body passed on: a login or a small form.
MAX_FORM_BYTES = 1024 * 1024
#: Headers that belong to one hop (RFC 9110 7.6.1), not passed on.
_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        CLIENT_HEADER,
    }
)


#: What answers the client when the target did not (the error, None for the deadline).
Unanswered = Callable[[Send, "Exception | None"], Awaitable[None]]


async def bad_gateway(send: Send, error: Exception | None) -> None:
    await _plain(send, 502, b"the llmgw process this is passed on to did not answer")


class Forward:
    """An ASGI app passing each request to the HTTP(S) server at `base_url`, or on the
    unix socket `uds`; `host` replaces the request's Host (the target's own name, for
    a target that checks it). `timeout` is httpx's (each step's); with a `deadline`
    the whole exchange gets that many seconds (a cancel scope: a target that accepts
    and then says nothing is not waited on longer); `verify` is httpx's (an SSL context
    for https); `unanswered` answers the client when the target did not (default: 502)."""

    def __init__(
        self,
        base_url: str = "http://control",
        *,
        uds: str | None = None,
        host: str | None = None,
        timeout: float = 30.0,
        deadline: float | None = None,
        verify: ssl.SSLContext | bool = True,
        unanswered: Unanswered = bad_gateway,
    ) -> None:
        self.host = host
        self.deadline = math.inf if deadline is None else deadline
        self.unanswered = unanswered

        def make() -> httpx.AsyncClient:
            import httpx  # on first use (llmgw.http.ondemand)

            transport = httpx.AsyncHTTPTransport(uds=uds) if uds is not None else None
            return httpx.AsyncClient(
                transport=transport, base_url=base_url, timeout=timeout, verify=verify
            )

        self._client = OnDemandClient(make)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        import httpx  # on first use (llmgw.http.ondemand)

        try:
            body = await read_body(scope, receive, MAX_FORM_BYTES)
        except BodyTooLarge:
            await _plain(send, 413, b"request body too large")
            return
        except ClientLeft:
            return
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
        host = next((v for k, v in scope["headers"] if k == b"host"), None)
        if self.host is not None:
            host = self.host.encode()
        if host is not None:
            headers.append((b"host", host))
        client = scope.get("client")
        if client:
            headers.append((CLIENT_HEADER, str(client[0]).encode()))
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        answer = None
        try:
            with trio.move_on_after(self.deadline):
                answer = await self._client.get().request(
                    scope["method"], target.decode("latin-1"), headers=headers, content=body
                )
        except httpx.HTTPError as exc:
            await self.unanswered(send, exc)
            return
        if answer is None:
            await self.unanswered(send, None)
            return
        out = [
            (k.lower(), v)
            for k, v in answer.headers.raw
            if k.lower() not in _HOP and k.lower() != b"content-encoding"
        ]
        out.append((b"content-length", str(len(answer.content)).encode()))
        await send({"type": "http.response.start", "status": answer.status_code, "headers": out})
        await send({"type": "http.response.body", "body": answer.content})

    async def aclose(self) -> None:
        await self._client.aclose()


async def _plain(send: Send, status: int, text: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(text))],
        }
    )
    await send({"type": "http.response.body", "body": text})
