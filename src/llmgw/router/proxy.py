"""Forwarding one request to one endpoint: phase deadlines, the SSE relay, usage.

An attempt either fails before anything reached the client (:class:`AttemptFailed`,
which the caller may retry elsewhere) or owns the client response from then on.
Streams are relayed event by event as they arrive: the client's response starts
only when the first event is in hand, so a replica that is slow to its first
token can still be abandoned for another.

What an engine sends is bounded on every path: the `total` deadline holds whether
or not reads wait (a read delivers a due deadline before it reads, see
llmgw.http.client.Response.read_some, and the relay checks it per read), a non-streaming
body is at most `router.max_response_bytes`, one SSE event at most
`router.max_event_bytes`, buffered linearly. An answer over a limit or against
HTTP/1.1 is a failure of the endpoint (Outcome.BAD_RESPONSE). Messages name no
engine address: they reach clients.

Non-streaming answers are buffered whole, and all of them at once share one budget
per process, `router.max_buffered_bytes` (:class:`BufferBudget`): an answer that does
not fit is :class:`BufferFull` (the client's 503, with Retry-After), not memory the
process takes. Buffered rather than streamed through because the proxy needs the
whole answer before the client sees any of it: an attempt that breaks or overruns
mid-body is still retried elsewhere or answered with a clean 502 (never a truncated
200), and Anthropic's Messages translate the whole JSON. Usage is read from the
body's ``"usage"`` member alone, never by parsing the whole answer.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import attrs
import trio

from llmgw.config import Timeouts
from llmgw.domain.usage import Usage
from llmgw.http.asgi import error_body
from llmgw.http.client import (
    PIECES_PER_YIELD,
    BadResponse,
    BodyTooLarge,
    ConnectFailed,
    ConnectTimeout,
    UpstreamError,
)
from llmgw.http.engine_client import EngineClient, UpstreamResponse, close_response
from llmgw.router.breaker import Outcome, classify_status
from llmgw.router.usage import estimate_prompt_tokens

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# Response headers worth passing on; hop-by-hop and length headers are ours to set.
# x-request-id is llmgw's own (the client's, or one it made), never the engine's.
_RELAYED_HEADERS = frozenset({b"content-type", b"openai-processing-ms"})
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
# Never in a header value llmgw writes, wherever it came from.
_BAD_VALUE = re.compile(rb"[\r\n\x00]")
# An error answer's body is read this far for its message, and no further.
_ERROR_BODY_BYTES = 4096
# After [DONE], the body's end is awaited this long and this far (to pool the connection).
_DRAIN_SECONDS = 1.0
_DRAIN_BYTES = 65536


class AttemptFailed(Exception):
    """An upstream attempt failed (before any byte reached the client, when raised).

    `outcome` is what it means for the endpoint's breaker (see breaker.Outcome).
    """

    def __init__(
        self,
        outcome: Outcome,
        message: str,
        *,
        phase: str | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.phase = phase
        self.status = status
        # The endpoint's id, set by the caller that knows it (for the client's message).
        self.endpoint: str | None = None

    @property
    def kind(self) -> str:
        return self.outcome.value


@attrs.define
class Delivery:
    """What an attempt that reached the client did."""

    status: int
    usage: Usage | None = None
    ttft: float | None = None
    # Set when the stream broke after it started: the endpoint's fault, reported to
    # the client as an SSE error event.
    failure: AttemptFailed | None = None
    events: int = 0
    itl: list[float] = attrs.field(factory=list)


def _relayed(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The engine's headers a client gets (never one with CR, LF or NUL in its value,
    though the parsers already refuse those)."""
    return [
        (k, v) for k, v in headers if k.lower() in _RELAYED_HEADERS and not _BAD_VALUE.search(v)
    ]


async def _send_whole(
    send: Send,
    response: UpstreamResponse,
    extra_headers: list[tuple[bytes, bytes]],
    payload: bytes | list[bytes],
) -> None:
    """Relay an engine's answer whose whole body is in, in one response to the client
    (a long one block by block: each is written as it is, no copy of the whole)."""
    headers = _relayed(response.headers_raw) + extra_headers
    blocks = [payload] if isinstance(payload, bytes) else payload
    headers.append((b"content-length", b"%d" % sum(len(b) for b in blocks)))
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    last = len(blocks) - 1
    for i, block in enumerate(blocks):
        await send({"type": "http.response.body", "body": block, "more_body": i < last})


async def _read_prefix(response: UpstreamResponse, limit: int) -> bytes:
    """Up to about `limit` bytes of the body (all of it when shorter)."""
    parts: list[bytes] = []
    size = 0
    while size < limit and (chunk := await response.read_some()):
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


class _Held:
    """What one answer took of the budget, given back at once by :meth:`release`."""

    __slots__ = ("budget", "size")

    def __init__(self, budget: BufferBudget) -> None:
        self.budget = budget
        self.size = 0

    def grow(self, size: int) -> None:
        """Hold `size` bytes in all (BufferFull when the rest does not fit)."""
        if size > self.size:
            self.budget.take(size - self.size)
            self.size = size

    def release(self) -> None:
        self.budget.give(self.size)
        self.size = 0


# A body longer than one read is held in blocks of about this size: every block the
# same size, so what one answer frees the next reuses (a buffer grown in place moved
# and left holes in the heap: two 60 MiB answers took 200 MiB of RSS, not 125).
_BLOCK = 1024 * 1024


async def _read_held(response: UpstreamResponse, limit: int, held: _Held) -> bytes | list[bytes]:
    """The whole body (BodyTooLarge past `limit`), its bytes taken from the budget
    before they are read: all at once when the engine declared its length (so an
    answer that cannot fit is refused before any of it is read), else as they come.

    One read's bytes as they are (most answers); a longer body as blocks, never joined
    (which would hold it twice)."""
    declared: int | None = getattr(response, "declared_length", None)
    if declared is not None:
        if declared > limit:
            raise BodyTooLarge(f"a body of {declared} bytes, over the limit of {limit}")
        held.grow(declared)
    first = await response.read_some()
    if len(first) > limit:
        raise BodyTooLarge(f"a body over the limit of {limit} bytes")
    held.grow(len(first))
    chunk = await response.read_some() if first else b""
    if not chunk:
        return first
    blocks: list[bytes] = []
    pending = [first]  # reads not yet joined into a block
    size = pending_size = len(first)
    try:
        while chunk:
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(f"a body over the limit of {limit} bytes")
            held.grow(size)
            pending.append(chunk)
            pending_size += len(chunk)
            if pending_size >= _BLOCK:
                blocks.append(b"".join(pending))
                pending, pending_size = [], 0
            chunk = await response.read_some()
    except BaseException:
        # Freed now: the exception's traceback keeps this frame, and so the blocks,
        # alive for as long as the refusal is handled (the budget is given back at once).
        blocks.clear()
        pending.clear()
        raise
    if pending:
        blocks.append(b"".join(pending))
    return blocks


def _usage_in(event: bytes | bytearray) -> tuple[Usage | None, bool]:
    """The usage object in an SSE event, if any, and whether the event carries only usage."""
    i = event.find(b'"usage"')
    if i < 0:
        return None, False
    j = event.find(b":", i + 7)
    k = j + 1
    while k < len(event) and event[k] in b" \t":
        k += 1
    if j < 0 or k >= len(event) or event[k] != ord("{"):
        return None, False  # "usage": null
    try:
        obj = json.loads(event[event.index(b"data:") + 5 :])
    except (ValueError, json.JSONDecodeError):
        return None, False
    if not isinstance(obj, dict):
        return None, False
    if "usage" not in obj:  # nested: Responses' response.completed, Anthropic's message_start
        inner = obj.get("response", obj.get("message"))
        return Usage.from_openai(inner.get("usage") if isinstance(inner, dict) else None), False
    return Usage.from_openai(obj.get("usage")), not obj.get("choices")


class BufferFull(Exception):
    """A non-streaming answer does not fit in what is left of `router.max_buffered_bytes`
    now: not the endpoint's fault, and another replica's answer would not fit either."""


class BufferBudget:
    """Bytes of non-streaming answers the process may hold at once (all requests)."""

    __slots__ = ("capacity", "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0

    def take(self, size: int) -> None:
        """Reserve `size` bytes; BufferFull (nothing reserved) when they do not fit."""
        if self.used + size > self.capacity:
            # What other requests hold stays out of it: the message reaches a client.
            raise BufferFull(
                f"the engine's answer ({size} bytes more) does not fit in what the gateway "
                "may hold of answers at once now (router.max_buffered_bytes); retry shortly"
            )
        self.used += size

    def give(self, size: int) -> None:
        self.used -= size


_USAGE_KEY = b'"usage"'
# A usage object is a few hundred bytes (token counts and their details).
_USAGE_BYTES = 4096
_DECODER = json.JSONDecoder()


def usage_of(payload: bytes | list[bytes]) -> Usage | None:
    """The usage of a whole JSON answer (one bytes, or blocks), from its last
    ``"usage"`` member alone (a JSON string cannot hold that sequence unescaped, so it
    is a key): an answer of tens of MiB is not parsed, or joined, for a few counts."""
    blocks = [payload] if isinstance(payload, bytes) else payload
    window = _USAGE_BYTES + len(_USAGE_KEY)
    seam = len(_USAGE_KEY) - 1  # a key split between two blocks starts this near the end
    after = b""  # the start of what follows the block looked at
    for block in reversed(blocks):
        if after and (found := (block[-seam:] + after[:seam]).find(_USAGE_KEY)) >= 0:
            return _usage_at(block[-seam:] + after, found)
        found = block.rfind(_USAGE_KEY)
        if found >= 0:
            return _usage_at(block[found : found + window] + after, 0)
        after = (block[:window] + after)[:window]
    return None


def _usage_at(data: bytes, i: int) -> Usage | None:
    """The usage object of the ``"usage"`` key at `i` of `data`, if whole there."""
    k = i + len(_USAGE_KEY)
    end = min(len(data), k + _USAGE_BYTES)
    while k < end and data[k] in b" \t\r\n:":
        k += 1
    if k >= end or data[k] != ord("{"):
        return None  # "usage": null
    try:
        obj, _ = _DECODER.raw_decode(data[k:end].decode())
    except (ValueError, UnicodeDecodeError):
        return None
    return Usage.from_openai(obj) if isinstance(obj, dict) else None


class PathMissing(Exception):
    """The engine answered 404 to a path tried first with a fallback (an API some
    versions of an engine serve): nothing was relayed, try the other way."""


class Upstream:
    """Sends requests to engines through `client` (the Router's one engine client)
    and relays their answers."""

    def __init__(
        self,
        timeouts: Timeouts,
        client: EngineClient,
        *,
        max_response_bytes: int,
        max_event_bytes: int,
        max_buffered_bytes: int | None = None,
    ) -> None:
        self.timeouts = timeouts
        self.max_response_bytes = max_response_bytes
        self.max_event_bytes = max_event_bytes
        self.budget = BufferBudget(
            max_response_bytes if max_buffered_bytes is None else max_buffered_bytes
        )
        self.client = client

    async def _open(
        self,
        url: str,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        phase: str,
        deadline: float,
    ) -> UpstreamResponse:
        """Send the request; the response once its head is in, by `deadline` (absolute).
        An engine's 5xx or 429 is an AttemptFailed carrying the start of its message."""
        # A bare CancelScope: fail_after's context-manager wrapper costs CPU per request.
        scope = trio.CancelScope(deadline=deadline)
        try:
            with scope:
                response = await self.client.send(url, body, headers)
        except ConnectTimeout:
            raise AttemptFailed(
                Outcome.TIMEOUT, f"could not connect within {self.timeouts.dial:g}s", phase="dial"
            ) from None
        except ConnectFailed as exc:
            raise AttemptFailed(Outcome.CONNECT_ERROR, f"connection failed: {exc}") from None
        except BadResponse as exc:
            raise AttemptFailed(Outcome.BAD_RESPONSE, f"bad response: {exc}") from None
        except UpstreamError as exc:
            raise AttemptFailed(Outcome.BROKEN_STREAM, f"upstream error: {exc}") from None
        if scope.cancelled_caught:
            t = self.timeouts
            limit = t.response_header if phase == "response_header" else t.total
            raise AttemptFailed(
                Outcome.TIMEOUT, f"no response headers within {limit:g}s", phase=phase
            )
        status = response.status_code
        if status >= 500 or status == 429:
            text = b""
            with trio.move_on_after(1.0), contextlib.suppress(UpstreamError):
                text = await _read_prefix(response, _ERROR_BODY_BYTES)
            await close_response(response)
            message = text[:200].decode(errors="replace").strip()
            raise AttemptFailed(
                classify_status(status),
                f"upstream answered {status}: {message}",
                status=status,
            )
        return response

    async def unary(
        self,
        url: str,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        send: Send,
        extra_headers: list[tuple[bytes, bytes]],
        missing_ok: bool = False,
    ) -> Delivery:
        """A non-streaming request. Engines send headers only once the whole answer is
        ready, so the wait for them is bounded by the `total` deadline, not
        `response_header`; the body must come by the same deadline, and be at most
        `max_response_bytes`. With `missing_ok`, a 404 is PathMissing, not relayed."""
        t = self.timeouts
        end = trio.current_time() + t.total
        response = await self._open(url, body, headers, "total", end)
        held = _Held(self.budget)
        try:
            try:
                if missing_ok and response.status_code == 404:
                    raise PathMissing(url)
                payload = await self._whole_body(response, end, held)
            finally:
                await close_response(response)
            if payload is None:
                raise AttemptFailed(
                    Outcome.TIMEOUT, f"body not complete within {t.total:g}s", phase="total"
                )
            usage = usage_of(payload) if response.status_code == 200 else None
            await _send_whole(send, response, extra_headers, payload)
        finally:
            held.release()  # handed over (or dropped): the budget's again
        return Delivery(response.status_code, usage)

    def _bad_body(self, exc: BadResponse) -> str:
        if isinstance(exc, BodyTooLarge):
            return f"bad response: {exc} (router.max_response_bytes)"
        return f"bad response: {exc}"

    async def stream(
        self,
        url: str,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        send: Send,
        extra_headers: list[tuple[bytes, bytes]],
        *,
        strip_usage: bool,
        started: float,
        outcome: Delivery,
        first_token: Callable[[], None] | None = None,
        final: tuple[bytes, ...] = (),
        missing_ok: bool = False,
    ) -> Delivery:
        """A streaming request, relayed event by event into `outcome`.

        The caller owns `outcome`, so what was relayed is still known when the
        client goes away and this is cancelled half-way. `first_token` is called once,
        when the first event is in (the engine's prefill is done). A stream is whole
        once ``data: [DONE]`` came, or an event starting with one of `final` (the
        Responses API ends with its ``response.completed`` event instead)."""
        t = self.timeouts
        end = started + t.total
        now = trio.current_time()
        if now + t.response_header < end:
            response = await self._open(
                url, body, headers, "response_header", now + t.response_header
            )
        else:
            response = await self._open(url, body, headers, "total", end)
        try:
            if missing_ok and response.status_code == 404:
                raise PathMissing(url)
            if response.status_code != 200:
                # An engine's 4xx: the client's fault, passed on unchanged once its body
                # is in (by the first_token deadline, as the answer in a token's place).
                return await self._pass_on(response, send, extra_headers, end)
            return await self._relay(
                response,
                send,
                extra_headers,
                strip_usage,
                started,
                len(body),
                outcome,
                first_token,
                final,
            )
        finally:
            await close_response(response)

    async def _pass_on(
        self,
        response: UpstreamResponse,
        send: Send,
        extra_headers: list[tuple[bytes, bytes]],
        end: float,
    ) -> Delivery:
        t = self.timeouts
        now = trio.current_time()
        phase, deadline = "first_token", now + t.first_token
        if end < deadline:
            phase, deadline = "total", end
        held = _Held(self.budget)
        try:
            payload = await self._whole_body(response, deadline, held)
            if payload is None:
                limit = t.first_token if phase == "first_token" else t.total
                raise AttemptFailed(
                    Outcome.TIMEOUT,
                    f"the body of a {response.status_code} answer did not come within {limit:g}s",
                    phase=phase,
                )
            await _send_whole(send, response, extra_headers, payload)
        finally:
            held.release()
        return Delivery(response.status_code)

    async def _whole_body(
        self, response: UpstreamResponse, deadline: float, held: _Held
    ) -> bytes | list[bytes] | None:
        """The whole body, at most `max_response_bytes` and within the buffer budget
        (`held` keeps what it took until the caller releases it), by `deadline` (None
        once it has passed); a body refused or cut short is an AttemptFailed, one that
        does not fit the budget BufferFull."""
        try:
            if response.complete:  # came with the head (a small answer): no wait to bound
                return await _read_held(response, self.max_response_bytes, held)
            with trio.CancelScope(deadline=deadline):
                return await _read_held(response, self.max_response_bytes, held)
        except BadResponse as exc:
            raise AttemptFailed(Outcome.BAD_RESPONSE, self._bad_body(exc)) from None
        except UpstreamError as exc:
            raise AttemptFailed(Outcome.BROKEN_STREAM, f"upstream body broke: {exc}") from None
        return None

    async def _relay(
        self,
        response: UpstreamResponse,
        send: Send,
        extra_headers: list[tuple[bytes, bytes]],
        strip_usage: bool,
        started: float,
        body_size: int,
        outcome: Delivery,
        first_token: Callable[[], None] | None,
        final: tuple[bytes, ...] = (),
    ) -> Delivery:
        t = self.timeouts
        events = _Events(self.max_event_bytes)
        done = False
        expired = False
        phase, deadline = "first_token", float(t.first_token)
        last = started
        end = started + t.total
        # One cancel scope for the whole relay, its deadline moved per read (cheaper
        # than a fail_after per event); no deadline while sending to the client.
        bound_phase = phase
        with trio.CancelScope() as scope:
            while not done:
                bound, bound_phase = deadline, phase
                now = trio.current_time()
                remaining = end - now
                if remaining < bound:
                    bound, bound_phase = remaining, "total"
                    if remaining <= 0:  # checked here too: reads that never wait
                        expired = True
                        break
                scope.deadline = now + bound
                try:
                    chunk = await response.read_some()
                    if not chunk:
                        break
                    split = events.split(chunk)
                except UpstreamError as exc:
                    scope.deadline = math.inf
                    if isinstance(exc, BadResponse):
                        failure = AttemptFailed(Outcome.BAD_RESPONSE, f"bad response: {exc}")
                    else:
                        failure = AttemptFailed(
                            Outcome.BROKEN_STREAM, f"upstream stream broke: {exc}"
                        )
                    return await self._broken(outcome, failure, send, extra_headers, body_size)
                scope.deadline = math.inf
                if len(split) > PIECES_PER_YIELD:  # much work for one read: let others run
                    await trio.lowlevel.checkpoint()
                out: list[bytes | bytearray] = []
                for event in split:
                    if event.startswith(b"data: [DONE]"):
                        done = True
                        out.append(event)
                        break
                    if final and event.startswith(final):
                        done = True
                    usage, usage_only = _usage_in(event)
                    if usage is not None:
                        earlier = outcome.usage
                        if earlier is not None and not usage.prompt_tokens:
                            # Output counted now, input earlier (Anthropic's stream).
                            usage = attrs.evolve(
                                usage,
                                prompt_tokens=earlier.prompt_tokens,
                                cached_tokens=earlier.cached_tokens,
                            )
                        outcome.usage = usage
                        if usage_only and strip_usage:
                            continue
                    if not usage_only:
                        outcome.events += 1
                    out.append(event)
                if not out:
                    continue
                now = trio.current_time()
                if outcome.ttft is None:
                    outcome.ttft = now - started
                    if first_token is not None:
                        first_token()
                    await send(
                        {
                            "type": "http.response.start",
                            "status": 200,
                            "headers": _SSE_HEADERS + extra_headers,
                        }
                    )
                    phase, deadline = "idle", t.idle
                else:
                    outcome.itl.append(now - last)
                last = now
                # [DONE] ends the client's response in the same write.
                await send(
                    {
                        "type": "http.response.body",
                        "body": out[0] if len(out) == 1 else b"".join(out),
                        "more_body": not done,
                    }
                )
        if expired or scope.cancelled_caught:
            what = (
                f"stream exceeded {t.total:g}s"
                if bound_phase == "total"
                else (f"no data within {deadline:g}s")
            )
            failure = AttemptFailed(Outcome.TIMEOUT, what, phase=bound_phase)
            return await self._broken(outcome, failure, send, extra_headers, body_size)
        if outcome.ttft is None:
            failure = AttemptFailed(
                Outcome.BROKEN_STREAM, "upstream ended the stream without any event"
            )
            raise failure
        if not done:
            failure = AttemptFailed(
                Outcome.BROKEN_STREAM, "upstream ended the stream without [DONE]"
            )
            return await self._broken(outcome, failure, send, extra_headers, body_size)
        # Read the body's end (the chunked terminator) so the connection goes back to
        # the pool instead of being closed: a new TCP connection per stream costs CPU.
        with trio.move_on_after(_DRAIN_SECONDS), contextlib.suppress(UpstreamError):
            drained = 0
            while drained < _DRAIN_BYTES and (rest := await response.read_some()):
                drained += len(rest)
        if outcome.usage is None:
            outcome.usage = Usage(estimate_prompt_tokens(body_size), outcome.events, estimated=True)
        return outcome

    async def _broken(
        self,
        outcome: Delivery,
        failure: AttemptFailed,
        send: Send,
        extra_headers: list[tuple[bytes, bytes]],
        body_size: int,
    ) -> Delivery:
        """The stream failed: retry if the client saw nothing, else end it with an error event."""
        if outcome.ttft is None:
            raise failure
        outcome.failure = failure
        code = f"upstream_{failure.phase}_timeout" if failure.phase else "upstream_error"
        event = b"data: " + error_body(str(failure), "upstream_error", code) + b"\n\n"
        await send({"type": "http.response.body", "body": event, "more_body": False})
        if outcome.usage is None:
            outcome.usage = Usage(estimate_prompt_tokens(body_size), outcome.events, estimated=True)
        return outcome


class _Events:
    """SSE bytes split into events (each ending in a blank line), CRLF made LF.

    Linear in the stream's size: a piece is appended to the unfinished event once and
    each byte searched for the boundary once (a 48 MiB event without one took
    quadratic time before). An event longer than `limit` is a BadResponse."""

    __slots__ = ("_carry_cr", "_pending", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._pending = bytearray()  # the start of an event whose end has not come
        self._carry_cr = False  # the last piece ended in CR: the next may start with LF

    def split(self, chunk: bytes) -> list[bytes | bytearray]:
        if self._carry_cr or b"\r" in chunk:
            if self._carry_cr:
                chunk = b"\r" + chunk
            self._carry_cr = chunk.endswith(b"\r")
            if self._carry_cr:
                chunk = chunk[:-1]
            chunk = chunk.replace(b"\r\n", b"\n")
        pending = self._pending
        data: bytes | bytearray
        if pending:
            scan = len(pending) - 1  # a boundary may straddle the two pieces
            pending += chunk
            data = pending
        else:
            scan = 0
            data = chunk
        limit = self.limit
        events: list[bytes | bytearray] = []
        pos = 0
        while (i := data.find(b"\n\n", scan)) >= 0:
            if i + 2 - pos > limit:
                raise self._too_large()
            events.append(data[pos : i + 2])
            pos = scan = i + 2
        if data is pending:
            if pos:
                del pending[:pos]
        elif pos < len(data):
            pending += data[pos:] if pos else data
        if len(pending) > limit:
            raise self._too_large()
        return events

    def _too_large(self) -> BadResponse:
        return BadResponse(f"an SSE event over {self.limit} bytes (router.max_event_bytes)")
