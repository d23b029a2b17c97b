"""A worker's /admin pages: forwarded to the control process over a unix socket.

The dashboard behind a login on the client port needs the control plane and the
store, which live in the control process; a worker passes those requests through,
whole, to the control process's unix socket, and the answer back. The socket is the
control process's own (mode 0600 in a private directory), so the header naming the
client's address (:data:`CLIENT_HEADER`, which the login's rate limit is kept by) is
believed there, and any copy of it a client sends is dropped here.
"""

from __future__ import annotations

import httpx

from llmgw.http.asgi import BodyTooLarge, ClientLeft, Receive, Scope, Send, read_body

__all__ = ["CLIENT_HEADER", "MAX_FORM_BYTES", "Forward"]

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


class Forward:
    """An ASGI app passing each request to the HTTP server on unix socket `path`."""

    def __init__(self, path: str, *, timeout: float = 30.0) -> None:
        self.client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=path),
            base_url="http://control",
            timeout=timeout,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await read_body(scope, receive, MAX_FORM_BYTES)
        except BodyTooLarge:
            await _plain(send, 413, b"request body too large")
            return
        except ClientLeft:
            return
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
        host = next((v for k, v in scope["headers"] if k == b"host"), None)
        if host is not None:
            headers.append((b"host", host))
        client = scope.get("client")
        if client:
            headers.append((CLIENT_HEADER, str(client[0]).encode()))
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        try:
            answer = await self.client.request(
                scope["method"], target.decode("latin-1"), headers=headers, content=body
            )
        except httpx.HTTPError:
            await _plain(send, 502, b"the control process did not answer")
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
        await self.client.aclose()


async def _plain(send: Send, status: int, text: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(text))],
        }
    )
    await send({"type": "http.response.body", "body": text})
