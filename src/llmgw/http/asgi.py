"""The few ASGI helpers llmgw's plain ASGI apps share.

The client API (and llmgw-sim) are plain ASGI apps rather than built on a framework:
on the request path every layer costs CPU per request. The operator surface, off
that path, is a quart-trio application (:mod:`llmgw.admin.web`).
"""

from __future__ import annotations

import io
import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from contextlib import AbstractContextManager
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_JSON = [(b"content-type", b"application/json")]

#: The scope extension llmgw's own server (:mod:`llmgw.http.server`) offers in place
#: of a task per request that waits on ``receive()`` for ``http.disconnect``: a
#: callable ``watch(on_gone)`` returning a context manager (None until the request
#: body is all read); while inside it and the response is not complete, the server
#: calls ``on_gone()`` once if the client closes the connection, noticed from
#: WATCH_AFTER (0.1 s) after the request entered it. One task per connection does the
#: watching, so a request pays no task, nursery or cancel scope of its own for it,
#: and one answered before the mark pays nothing (benchmarks/README.md, "The
#: disconnect watch").
WATCH_DISCONNECT = "llmgw.watch_disconnect"
Watch = Callable[[Callable[[], None]], AbstractContextManager[object] | None]


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    """An error in the OpenAI API's shape, the one shape every llmgw error takes."""
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    ).encode()


def header(scope: Mapping[str, Any], name: bytes) -> bytes | None:
    """The first value of request header `name` (lower case)."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


class BodyTooLarge(Exception):
    """The request body is over the app's limit; `declared` when Content-Length said so
    before any of it was read."""

    def __init__(self, limit: int, declared: int | None) -> None:
        super().__init__(f"request body exceeds the limit of {limit} bytes")
        self.limit = limit
        self.declared = declared


class ClientLeft(Exception):
    """The client disconnected before its request body was all read."""


async def read_body(scope: Mapping[str, Any], receive: Receive, limit: int) -> bytes:
    """The whole request body, at most `limit` bytes: refused unread when its
    Content-Length is over the limit (:class:`BodyTooLarge`), :class:`ClientLeft` when
    the client goes first. The listener bounds how long it may take."""
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit, int(declared))
    first = b""
    # Past one chunk the body grows in one buffer whose value is handed over without a
    # copy (a list of chunks joined at the end held every large body twice).
    rest: io.BytesIO | None = None
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientLeft
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit, None)
        if rest is not None:
            rest.write(chunk)
        elif not first:
            first = chunk
        elif chunk:
            rest = io.BytesIO()
            rest.write(first)
            rest.write(chunk)
            first = b""
        if not message.get("more_body"):
            return first if rest is None else rest.getvalue()


async def send_json(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*_JSON, (b"content-length", str(len(body)).encode()), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def answer_non_http(
    scope: Mapping[str, Any],
    receive: Callable[[], Awaitable[Mapping[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    """What llmgw's apps do with a scope that is not an HTTP request: acknowledge the
    lifespan events (they own no lifespan state) and ignore anything else. llmgw's own
    server (llmgw.http.server) sends neither; other ASGI servers may."""
    if scope["type"] != "lifespan":
        return
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def split(owns: Callable[[str], bool], app: App, default: App) -> App:
    """One listener, two apps: requests whose path `owns` accepts go to `app`, the rest
    (and lifespan events) to `default`."""

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and owns(scope["path"]):
            await app(scope, receive, send)
        else:
            await default(scope, receive, send)

    return dispatch


def under(prefix: str) -> Callable[[str], bool]:
    """A path test for `split`: `prefix` itself or anything below it."""
    below = prefix + "/"
    return lambda path: path == prefix or path.startswith(below)
