"""A streaming answer begun before any replica can give it: SSE comments while a
model wakes (router/coldstart.py), so that proxies and load balancers between the
client and llmgw see bytes, not an idle connection, through a cold start of minutes.

Once begun the status is 200 and the headers are llmgw's: the replica's own status
line is dropped when it is 200, and an error answer (or llmgw's refusal: the start
outlasted ``cold_start_timeout``) becomes an SSE event carrying the error in OpenAI's
shape, which the official clients raise as an API error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from llmgw.http.asgi import Send
    from llmgw.router.refusal import HttpError

__all__ = ["EVERY", "FIRST", "EarlyStream"]

#: Seconds a stream waits for its replica before the answer begins without it: a
#: replica that comes up sooner gives its own status and headers.
FIRST = 1.0
#: Seconds between comments: well under the idle timeouts proxies default to (30-60 s).
EVERY = 5.0

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
]


class EarlyStream:
    """A streaming request's answer begun before its replica's; :meth:`keep_alive`
    begins it. Until then nothing passes through here: the relay sends as usual, and
    only a begun answer's events go through :attr:`relay` (no cost per event for the
    streams that never wait)."""

    def __init__(
        self,
        send: Send,
        headers: list[tuple[bytes, bytes]],
        wrap: Callable[[Send], Send] | None = None,
    ) -> None:
        """`send` is the client's; `wrap`, if given, puts what the request's own send
        chain adds (a Responses id tap) around :attr:`relay`."""
        self._send = send
        self._headers = headers
        self.begun = False
        # The replica's error answer, collected to be sent as one event.
        self._error: bytearray | None = None
        #: Where the relay sends once the answer has begun.
        self.relay: Send = self._fitted if wrap is None else wrap(self._fitted)

    async def keep_alive(self, comment: bytes) -> None:
        """Until cancelled: after FIRST seconds begin the answer, then send `comment`
        as an SSE comment every EVERY seconds."""
        await trio.sleep(FIRST)
        if not self.begun:
            self.begun = True
            start = {"type": "http.response.start", "status": 200}
            await self._whole({**start, "headers": [*_SSE_HEADERS, *self._headers]})
        while True:
            line = b": " + comment + b"\n\n"
            await self._whole({"type": "http.response.body", "body": line, "more_body": True})
            await trio.sleep(EVERY)

    async def _whole(self, message: dict[str, Any]) -> None:
        """Send `message` even when the wait ends meanwhile: half a comment would run
        into the replica's first event. A client that reads nothing for EVERY seconds
        is not waited for."""
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + EVERY
            await self._send(message)

    async def _fitted(self, message: MutableMapping[str, Any]) -> None:
        """The relay's message fitted into the begun answer."""
        if message["type"] == "http.response.start":
            if message["status"] != 200:
                self._error = bytearray()
            return
        if self._error is None:
            await self._send(message)
            return
        self._error += message.get("body", b"")
        if not message.get("more_body"):
            await self._event(_error_object(bytes(self._error)))

    async def refuse(self, err: HttpError) -> None:
        """llmgw's refusal of a request whose answer has begun, as its last event."""
        error = {"message": str(err), "type": err.type, "code": err.code, "param": err.param}
        await self._event({"error": error})

    async def _event(self, data: dict[str, Any]) -> None:
        line = b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
        await self._send({"type": "http.response.body", "body": line, "more_body": False})


def _error_object(body: bytes) -> dict[str, Any]:
    """A replica's error answer as an ``{"error": ...}`` object (OpenAI's shape when it
    is one already; its text as the message otherwise)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return {"error": parsed["error"]}
    if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):  # vLLM's
        fields = ("message", "type", "code", "param")
        return {"error": {k: parsed.get(k) for k in fields}}
    message = body.decode(errors="replace")[:1000] or "the replica answered an error"
    return {"error": {"message": message, "type": "upstream_error", "code": None}}
