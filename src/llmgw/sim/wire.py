"""The simulator's HTTP plumbing over llmgw's ASGI server: reading a JSON body,
answering JSON or starting an SSE stream, and OpenAI-shaped errors."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from llmgw.http import asgi

Scope = Mapping[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY = 64 * 1024 * 1024


class HTTPError(Exception):
    """An OpenAI-shaped error response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class Disconnected(Exception):
    pass


JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


async def start_stream(send: Send) -> None:
    """Send an SSE response's head now, before its first event (as engines do; the
    server would otherwise hold it for the first body bytes)."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    await send({"type": "http.response.body", "body": b"", "more_body": True})


async def send_bytes(send: Send, status: int, body: bytes, headers: list[Any]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send: Send, status: int, obj: Any) -> None:
    await send_bytes(send, status, dumps(obj), JSON_HEADERS)


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


async def read_body(scope: Scope, receive: Receive) -> bytes:
    try:
        return await asgi.read_body(scope, receive, MAX_BODY)
    except asgi.ClientLeft:
        raise Disconnected from None
    except asgi.BodyTooLarge:
        raise HTTPError(413, "request body too large") from None


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise HTTPError(400, f"malformed JSON body: {e}", code="invalid_json") from None
    except RecursionError:
        raise HTTPError(
            400, "malformed JSON body: nested too deeply", code="invalid_json"
        ) from None
    if not isinstance(obj, dict):
        raise HTTPError(400, "the request body must be a JSON object", code="invalid_json")
    return obj


async def watch_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    # The body has been read, so the only thing left to receive is the disconnect.
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return
