"""The pipeline's attempt stage: one try of a request at one replica, relayed to the
client by llmgw.router.proxy. Counts the replica's in-flight requests and prefill work
while it runs, wakes a sleeping engine first, and records the outcome on the replica's
breaker. Raises :class:`~llmgw.router.proxy.AttemptFailed` when nothing reached the
client and another replica may be tried.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from llmgw.router.breaker import Outcome, Ticket, classify_status
from llmgw.router.pipeline.request import REQUEST_ID, engine_of
from llmgw.router.proxy import AttemptFailed, BufferFull, Delivery, PathMissing

if TYPE_CHECKING:
    from llmgw.domain.catalog import ModelConfig
    from llmgw.router.endpoints import EndpointState
    from llmgw.router.metrics import RouterMetrics
    from llmgw.router.pipeline.request import Request
    from llmgw.router.proxy import Upstream
    from llmgw.router.sleep import Sleeper

__all__ = ["Attempt", "Try"]


class Try:
    """One attempt's inputs: the replica, its breaker ticket, the body to send, the
    prompt tokens it is estimated to compute, and the routing tier that chose it."""

    __slots__ = ("model", "partial", "payload", "prefill", "state", "ticket", "tier")

    def __init__(
        self,
        model: ModelConfig,
        state: EndpointState,
        ticket: Ticket,
        payload: bytes,
        prefill: float,
        tier: str,
    ) -> None:
        self.model = model
        self.state = state
        self.ticket = ticket
        self.payload = payload
        self.prefill = prefill
        self.tier = tier
        # What was relayed so far: what an abandoned attempt is accounted by.
        self.partial = Delivery(200)


class Attempt:
    """Tries at replicas over the upstream client."""

    def __init__(self, upstream: Upstream, sleeper: Sleeper, metrics: RouterMetrics) -> None:
        self.upstream = upstream
        self.sleeper = sleeper
        self.metrics = metrics

    async def __call__(self, request: Request, at: Try) -> Delivery:
        """Send `request` as `at` says; its delivery, or AttemptFailed (retryable),
        BufferFull, or whatever cancelled it (then ``at.partial`` says what the client
        got)."""
        model, state = at.model, at.state
        span = request.progress.span
        traced = None if span is None else span.attempt(state.endpoint.id, model.name, at.tier)
        in_flight = self.metrics.in_flight.labels(model.name)
        in_flight.inc()
        state.inflight += 1
        state.prefill += at.prefill
        prefilling = True

        def prefilled() -> None:
            # Until the first token (or the answer) the prompt counts as prefill work.
            nonlocal prefilling
            if prefilling:
                prefilling = False
                state.prefill -= at.prefill

        try:
            await self.sleeper.wake(state)  # a sleeping engine first wakes
            headers = [
                (b"content-type", request.body.content_type),
                (b"x-request-id", request.scope[REQUEST_ID]),
                *state.endpoint.headers,
                # Traced, the engine's parent span is this attempt's; else the client's.
                *(request.trace if traced is None else traced.headers()),
            ]
            delivery = await self._send(request, at, headers, prefilled)
        except AttemptFailed as failure:
            failure.endpoint = state.endpoint.id
            self.record(state, at.ticket, failure.outcome, failure)
            if traced is not None:
                traced.end(failure.kind, failure.status, str(failure))
            raise
        except BaseException as exc:
            # The buffer budget spent (nothing to say of the replica: its answer came),
            # cancelled (the client left) or a bug: the probe slot must not stick.
            self.record(state, at.ticket, Outcome.CLIENT_GONE, None)
            if traced is not None:
                gone = "buffer_full" if isinstance(exc, BufferFull) else Outcome.CLIENT_GONE.value
                traced.end(gone, None)
            raise
        finally:
            prefilled()
            state.inflight -= 1
            state.used_at = trio.current_time()  # idle from here (router/sleep.py)
            in_flight.dec()
        broken = delivery.failure
        outcome = broken.outcome if broken else classify_status(delivery.status)
        self.record(state, at.ticket, outcome, broken)
        if traced is not None:
            traced.end(outcome.value, delivery.status, None if broken is None else str(broken))
        return delivery

    async def _send(
        self,
        request: Request,
        at: Try,
        headers: list[tuple[bytes, bytes]],
        first_token: Callable[[], None],
    ) -> Delivery:
        """The engine speaks the client's API itself (its request, its answer as is)
        unless it showed it does not; then the translation."""
        state, model = at.state, at.model
        native = request.native
        natives = native is not None and engine_of(state) in native.engines
        tries = (True, False) if natives and not state.lacks_native else (False,)
        base = state.endpoint.url.rstrip("/")
        extra = [
            (b"x-llmgw-model", model.name.encode()),
            (b"x-llmgw-endpoint", state.public.encode()),
            (b"x-request-id", request.scope[REQUEST_ID]),
        ]
        early = request.early
        # A stream whose answer began while its model woke is fitted into it.
        relay = early.relay if early is not None and early.begun else request.send
        for natively in tries:
            send, path, final = relay, request.route.path, request.route.final
            strip, body = not request.wants_usage, at.payload
            if natively:
                assert native is not None
                send, path, final, strip = native.send, native.path, native.final, False
                body = native.body.payload(model.name, add_usage=False)
            try:
                if request.stream:
                    return await self.upstream.stream(
                        base + path,
                        body,
                        headers,
                        send,
                        extra,
                        strip_usage=strip,
                        final=final,
                        started=request.started,
                        outcome=at.partial,
                        first_token=first_token,
                        missing_ok=natively,
                    )
                return await self.upstream.unary(
                    base + path, body, headers, send, extra, missing_ok=natively
                )
            except PathMissing:
                state.lacks_native = True  # an engine version without that API
        raise AssertionError("unreachable: the translated try raises or returns")

    def record(
        self, state: EndpointState, ticket: Ticket, outcome: Outcome, failure: AttemptFailed | None
    ) -> None:
        """The attempt's outcome on the replica's breaker, and its failure counted."""
        now = trio.current_time()
        ident = state.endpoint.id
        if failure is not None:
            self.metrics.upstream_errors.labels(ident, failure.kind).inc()
            if failure.phase is not None:
                self.metrics.timeouts.labels(ident, failure.phase).inc()
        new_state = state.breaker.record(ticket, outcome, now)
        if new_state is not None:
            self.metrics.breaker_transitions.labels(ident, new_state.value).inc()
