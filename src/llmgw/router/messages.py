"""``POST /v1/messages`` (Anthropic's Messages API) over the chat completions path.

The request is translated to a chat completion (:func:`llmgw.router.anthropic.to_chat`)
and routed like one, so admission, scoring, retries, breakers, deadlines and usage
accounting are the chat path's, counted from the engine's own answer. What goes back
to the client passes through :class:`AnthropicSend`, an ASGI ``send`` that turns the
engine's answer into Anthropic's: a whole response at its end, a stream event by
event as it comes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llmgw.http.asgi import Send
from llmgw.router import anthropic

__all__ = ["AnthropicSend", "CountSend", "json_response"]

_JSON = b"application/json"
# Headers of the engine's answer that still describe the translated one.
_KEPT = frozenset({b"x-llmgw-model", b"x-llmgw-endpoint", b"x-request-id", b"retry-after"})
# One SSE event of the engine's stream may be large, but never without bound: the
# proxy already holds each to router.max_event_bytes.
_EVENT_END = b"\n\n"


def _held(
    start: dict[str, Any] | None, whole: bytes | bytearray
) -> tuple[int, Any, list[tuple[bytes, bytes]]]:
    """An engine's whole answer, held to be sent translated: its status, its JSON (None
    when it is not JSON) and the headers of it that still hold."""
    head = start or {"status": 502, "headers": []}
    try:
        decoded: Any = json.loads(whole) if whole else None
    except ValueError:
        decoded = None
    return int(head["status"]), decoded, [(k, v) for k, v in head["headers"] if k in _KEPT]


async def json_response(
    send: Send, status: int, body: dict[str, Any], headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", _JSON),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


class AnthropicSend:
    """The client's ``send`` for a translated request: given the engine's answer (as
    the proxy relays it), sends Anthropic's."""

    def __init__(
        self, send: Send, model: str, *, stream: bool, stop_sequences: Sequence[str] | None
    ) -> None:
        self._send = send
        self._model = model
        self._stream = stream
        self._stops = stop_sequences
        self._start: dict[str, Any] | None = None
        self._streaming = False
        self._buffer = bytearray()
        self._whole = bytearray()
        self._translator = anthropic.StreamTranslator(model, stop_sequences=stop_sequences)

    async def __call__(self, message: Any) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self._start = dict(message)
            status = int(message["status"])
            content_type = next((v for k, v in message["headers"] if k == b"content-type"), b"")
            self._streaming = (
                self._stream and status == 200 and content_type.startswith(b"text/event-stream")
            )
            if self._streaming:
                await self._send(message)  # the same SSE head
            return
        if kind != "http.response.body":
            await self._send(message)
            return
        chunk = bytes(message.get("body", b""))
        more = bool(message.get("more_body"))
        if self._streaming:
            await self._relay(chunk, more)
        else:
            self._whole += chunk
            if not more:
                await self._answer()

    async def _relay(self, chunk: bytes, more: bool) -> None:
        self._buffer += chunk
        out = bytearray()
        while (end := self._buffer.find(_EVENT_END)) >= 0:
            event = bytes(self._buffer[:end])
            del self._buffer[: end + len(_EVENT_END)]
            out += self._translate(event)
        if not more and not self._translator.done:
            # Cut short without an error of its own (the proxy ends a failed stream
            # with one): Anthropic's clients need an error event to tell.
            out += anthropic.encode(*anthropic.error_event("the engine's stream ended early"))
            self._translator.done = True
        await self._send({"type": "http.response.body", "body": bytes(out), "more_body": more})

    def _translate(self, event: bytes) -> bytes:
        out = bytearray()
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue  # comments, `event:` lines: the chat stream has none we need
            payload = line[5:].strip()
            try:
                decoded: Any = "[DONE]" if payload == b"[DONE]" else json.loads(payload)
                events = self._translator.feed(decoded)
            except (ValueError, anthropic.MessagesError) as exc:
                message = exc.message if isinstance(exc, anthropic.MessagesError) else str(exc)
                events = [anthropic.error_event(f"untranslatable engine stream: {message}")]
                self._translator.done = True
            for name, data in events:
                out += anthropic.encode(name, data)
        return bytes(out)

    async def _answer(self) -> None:
        status, response, kept = _held(self._start, self._whole)
        body: dict[str, Any]
        if status == 200 and isinstance(response, dict):
            try:
                body = anthropic.from_chat(response, self._model, stop_sequences=self._stops)
            except anthropic.MessagesError as exc:
                status, body = exc.status, exc.body()
        elif status == 200:
            status, body = 502, anthropic.error_body(502, "the engine's answer is not JSON")
        else:
            body = anthropic.error_from_chat(status, response)
        await json_response(self._send, status, body, kept)


class CountSend:
    """The client's ``send`` for ``count_tokens``: an engine's ``/tokenize`` answer
    (vLLM's and SGLang's ``count``, llama.cpp's ``tokens``) as ``{"input_tokens": n}``."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._start: dict[str, Any] | None = None
        self._whole = bytearray()

    async def __call__(self, message: Any) -> None:
        if message["type"] == "http.response.start":
            self._start = dict(message)
            return
        if message["type"] != "http.response.body":
            return
        self._whole += bytes(message.get("body", b""))
        if message.get("more_body"):
            return
        status, answer, kept = _held(self._start, self._whole)
        if status != 200:
            await json_response(self._send, status, anthropic.error_from_chat(status, answer), kept)
            return
        counted = answer.get("count") if isinstance(answer, dict) else None
        if counted is None and isinstance(answer, dict) and isinstance(answer.get("tokens"), list):
            counted = len(answer["tokens"])
        if not isinstance(counted, int) or isinstance(counted, bool):
            body = anthropic.error_body(502, "the engine's tokenize answer has no count")
            await json_response(self._send, 502, body, kept)
            return
        await json_response(self._send, 200, {"input_tokens": counted}, kept)
