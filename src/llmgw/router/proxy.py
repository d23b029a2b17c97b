"""Forwarding one request to one endpoint: phase deadlines, the SSE relay, usage.

An attempt either fails before anything reached the client (:class:`AttemptFailed`,
which the caller may retry elsewhere) or owns the client response from then on.
Streams are relayed event by event as they arrive: the client's response starts
only when the first event is in hand, so a replica that is slow to its first
token can still be abandoned for another.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any, Protocol

import attrs
import httpx
import trio

from llmgw.asgi import error_body
from llmgw.config import Timeouts
from llmgw.router.breaker import Outcome, classify_status
from llmgw.router.upstream_http import ConnectFailed, ConnectTimeout, Pool, UpstreamError
from llmgw.router.usage import Usage, estimate_prompt_tokens

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# Response headers worth passing on; hop-by-hop and length headers are ours to set.
_RELAYED_HEADERS = frozenset({b"content-type", b"x-request-id", b"openai-processing-ms"})
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


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


class UpstreamResponse(Protocol):
    """What the proxy needs of a response (upstream_http.Response, or httpx's adapted)."""

    status_code: int
    headers_raw: list[tuple[bytes, bytes]]
    content: bytes

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aread(self) -> bytes: ...

    async def aclose(self) -> None: ...


class _HttpxResponse:
    """An httpx response seen through UpstreamResponse (https endpoints, an injected
    client); httpx's errors become UpstreamError."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status_code = response.status_code
        self.headers_raw = list(response.headers.raw)
        self.content = b""

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            raise UpstreamError(str(exc)) from None

    async def aread(self) -> bytes:
        try:
            self.content = await self._response.aread()
        except httpx.HTTPError as exc:
            raise UpstreamError(str(exc)) from None
        return self.content

    async def aclose(self) -> None:
        await self._response.aclose()


async def _close(response: UpstreamResponse) -> None:
    """Close even when cancelled (a client that left must still free the engine's slot),
    but never wait long for it."""
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + 1.0
        await response.aclose()


def _usage_in(event: bytes) -> tuple[Usage | None, bool]:
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
    return Usage.from_openai(obj.get("usage")), not obj.get("choices")


class Upstream:
    """Sends requests to engines over pooled connections."""

    def __init__(self, timeouts: Timeouts, client: httpx.AsyncClient | None = None) -> None:
        self.timeouts = timeouts
        # Plain http:// endpoints go through llmgw's own HTTP/1.1 client (see
        # upstream_http); httpx serves anything else, and an injected client serves all.
        self._injected = client
        self._client = client
        self.pool = Pool(timeouts.dial)

    def _new_client(self) -> httpx.AsyncClient:
        t = self.timeouts
        return httpx.AsyncClient(
            timeout=httpx.Timeout(connect=t.dial, read=None, write=None, pool=None),
            transport=httpx.AsyncHTTPTransport(
                retries=0,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
                socket_options=[(6, 1, 1)],  # IPPROTO_TCP, TCP_NODELAY, on
            ),
        )

    @property
    def client(self) -> httpx.AsyncClient:
        """The httpx client for endpoints the native client does not handle."""
        if self._client is None:
            self._client = self._new_client()
        return self._client

    async def aclose(self) -> None:
        await self.pool.aclose()
        if self._client is not None:
            await self._client.aclose()

    async def _send(
        self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> UpstreamResponse:
        if self._injected is None and url.startswith("http://"):
            return await self.pool.post(url, body, headers)
        client = self.client
        request = client.build_request("POST", url, content=body, headers=headers)
        try:
            return _HttpxResponse(await client.send(request, stream=True))
        except httpx.ConnectTimeout:
            raise ConnectTimeout("connect timeout") from None
        except httpx.ConnectError as exc:
            raise ConnectFailed(str(exc)) from None
        except httpx.HTTPError as exc:
            raise UpstreamError(str(exc)) from None

    async def _open(
        self, url: str, body: bytes, headers: list[tuple[bytes, bytes]], phase: str, deadline: float
    ) -> UpstreamResponse:
        # A bare CancelScope: fail_after's context-manager wrapper costs CPU per request.
        scope = trio.CancelScope(deadline=trio.current_time() + deadline)
        try:
            with scope:
                response = await self._send(url, body, headers)
        except ConnectTimeout:
            raise AttemptFailed(
                Outcome.TIMEOUT, f"could not connect within {self.timeouts.dial:g}s", phase="dial"
            ) from None
        except ConnectFailed as exc:
            raise AttemptFailed(Outcome.CONNECT_ERROR, f"connection failed: {exc}") from None
        except UpstreamError as exc:
            raise AttemptFailed(Outcome.BROKEN_STREAM, f"upstream error: {exc}") from None
        if scope.cancelled_caught:
            raise AttemptFailed(
                Outcome.TIMEOUT, f"no response headers within {deadline:g}s", phase=phase
            )
        if response.status_code >= 500 or response.status_code == 429:
            with trio.move_on_after(1.0), contextlib.suppress(UpstreamError):
                await response.aread()
            await response.aclose()
            text = response.content[:200].decode(errors="replace").strip()
            raise AttemptFailed(
                classify_status(response.status_code),
                f"upstream answered {response.status_code}: {text}",
                status=response.status_code,
            )
        return response

    async def unary(
        self,
        url: str,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        send: Send,
        extra_headers: list[tuple[bytes, bytes]],
    ) -> Delivery:
        """A non-streaming request. Engines send headers only once the whole answer is
        ready, so the wait for them is bounded by the `total` deadline, not
        `response_header`."""
        t = self.timeouts
        response = await self._open(url, body, headers, "total", t.total)
        scope = trio.CancelScope(deadline=trio.current_time() + t.total)
        payload = b""
        try:
            with scope:
                payload = await response.aread()
        except UpstreamError as exc:
            raise AttemptFailed(Outcome.BROKEN_STREAM, f"upstream body broke: {exc}") from None
        finally:
            await _close(response)
        if scope.cancelled_caught:
            raise AttemptFailed(
                Outcome.TIMEOUT, f"body not complete within {t.total:g}s", phase="total"
            )
        usage = None
        if response.status_code == 200 and b'"usage"' in payload:
            try:
                usage = Usage.from_openai(json.loads(payload).get("usage"))
            except (ValueError, AttributeError):
                usage = None
        out_headers = [
            (k, v) for k, v in response.headers_raw if k.lower() in _RELAYED_HEADERS
        ] + extra_headers
        out_headers.append((b"content-length", str(len(payload)).encode()))
        await send(
            {"type": "http.response.start", "status": response.status_code, "headers": out_headers}
        )
        await send({"type": "http.response.body", "body": payload, "more_body": False})
        return Delivery(response.status_code, usage)

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
    ) -> Delivery:
        """A streaming request, relayed event by event into `outcome`.

        The caller owns `outcome`, so what was relayed is still known when the
        client goes away and this is cancelled half-way."""
        t = self.timeouts
        response = await self._open(url, body, headers, "response_header", t.response_header)
        try:
            if response.status_code != 200:
                # An engine's 4xx: the client's fault, passed on unchanged.
                payload = await response.aread()
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status_code,
                        "headers": [
                            (k, v) for k, v in response.headers_raw if k.lower() in _RELAYED_HEADERS
                        ]
                        + extra_headers,
                    }
                )
                await send({"type": "http.response.body", "body": payload})
                return Delivery(response.status_code)
            return await self._relay(
                response, send, extra_headers, strip_usage, started, len(body), outcome
            )
        finally:
            await _close(response)

    async def _relay(
        self,
        response: UpstreamResponse,
        send: Send,
        extra_headers: list[tuple[bytes, bytes]],
        strip_usage: bool,
        started: float,
        body_size: int,
        outcome: Delivery,
    ) -> Delivery:
        t = self.timeouts
        chunks = response.aiter_raw()
        buf = b""
        done = False
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
                    bound, bound_phase = max(remaining, 0.0), "total"
                scope.deadline = now + bound
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                except UpstreamError as exc:
                    scope.deadline = math.inf
                    failure = AttemptFailed(Outcome.BROKEN_STREAM, f"upstream stream broke: {exc}")
                    return await self._broken(outcome, failure, send, extra_headers, body_size)
                scope.deadline = math.inf
                if b"\r" in chunk:
                    chunk = chunk.replace(b"\r\n", b"\n")
                buf = buf + chunk if buf else chunk
                out: list[bytes] = []
                while (i := buf.find(b"\n\n")) >= 0:
                    event, buf = buf[: i + 2], buf[i + 2 :]
                    if event.startswith(b"data: [DONE]"):
                        done = True
                        out.append(event)
                        break
                    usage, usage_only = _usage_in(event)
                    if usage is not None:
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
        if scope.cancelled_caught:
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
        with trio.move_on_after(1.0):
            async for _ in chunks:
                pass
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
