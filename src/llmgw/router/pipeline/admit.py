"""The pipeline's admission stage: a request's priority band and tenant, then its wait
in the band's queue while the model's replicas are above the band's saturation ceiling
(llmgw.router.admission), or, for an autoscaled model at zero, its wait for the first
replica (wake on request, llmgw.router.coldstart)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

import trio

from llmgw.domain.usage import Caller
from llmgw.http.asgi import header
from llmgw.router.admission import PASS_THROUGH, AdmissionRejected, UnknownBand
from llmgw.router.refusal import HttpError

if TYPE_CHECKING:
    from llmgw.config import AdmissionConfig, Band
    from llmgw.domain.catalog import ModelConfig
    from llmgw.router.admission import AdmissionController, Ticket
    from llmgw.router.coldstart import ColdStarts
    from llmgw.router.endpoints import EndpointRegistry
    from llmgw.router.metrics import RouterMetrics
    from llmgw.router.pipeline.request import Request

__all__ = ["Admit"]


class Admit:
    """Bands, tenants, queues and cold starts."""

    def __init__(
        self,
        config: AdmissionConfig,
        admission: AdmissionController,
        cold: ColdStarts,
        endpoints: EndpointRegistry,
        metrics: RouterMetrics,
    ) -> None:
        self.admission = admission
        self.cold = cold
        self.endpoints = endpoints
        self.metrics = metrics
        self.band_header = config.band_header.lower().encode()
        self.tenant_header = config.tenant_header.lower().encode()

    def band(self, request: Request) -> Band:
        """The request's band: its key's, where keys are in use (the header is trusted
        only without them); 400 for a band the configuration does not have."""
        key = request.key
        value = None if key is not None else header(request.scope, self.band_header)
        try:
            return self.admission.select_band(
                value.decode(errors="replace") if value else None,
                key.band if key is not None else None,
            )
        except UnknownBand as exc:
            raise HttpError(
                400, str(exc), param=self.band_header.decode(), code="unknown_band"
            ) from None

    def caller(self, request: Request, band: Band) -> Caller:
        """Who the request is for fairness: its key, else the tenant header's value."""
        key = request.key
        if key is not None:
            return Caller(key.id, band.name, key.id)
        tenant = (header(request.scope, self.tenant_header) or b"").decode(errors="replace")
        return Caller(None, band.name, tenant or None)

    async def admit(self, request: Request, band: Band) -> Ticket:
        """Wait for room; the ticket is held until the request ends. With no replica to
        queue for, the pass-through ticket (routing then answers 503 at once) unless the
        model starts on request."""
        now = trio.current_time()
        pool = next(
            (
                m.name
                for m in request.chain
                if any(s.breaker.allows(now) for s in self.endpoints.serving(m.name))
            ),
            None,
        )
        if pool is not None:
            return await self._queue(request, band, pool)
        cold = self.cold.model_for(request.chain) if self.admission.enabled else None
        if cold is None:
            return PASS_THROUGH
        return await self._cold(request, band, cold)

    async def _queue(self, request: Request, band: Band, pool: str) -> Ticket:
        progress = request.progress
        tenant = progress.caller.tenant or ""
        queued = trio.current_time()
        try:
            ticket = await self.admission.admit(pool, band, tenant, request.expected_tokens)
        except AdmissionRejected as exc:
            progress.queued = trio.current_time() - queued  # the wait that gave up
            self.metrics.admission_rejected.labels(band.name, exc.reason).inc()
            if progress.span is not None:
                progress.span.admitted(queued, trio.current_time(), band.name, pool, exc.reason)
            why = "its queue is full" if exc.reason == "queue_full" else "it waited too long"
            raise HttpError(
                429,
                f"band {band.name!r} cannot be admitted for {pool!r} now: {why}",
                type_="rate_limit_exceeded",
                code=exc.reason,
                headers=[(b"retry-after", str(max(1, round(exc.retry_after))).encode())],
            ) from None
        progress.queued = trio.current_time() - queued
        if progress.span is not None:
            progress.span.admitted(queued, queued + progress.queued, band.name, pool)
        return ticket

    async def _cold(self, request: Request, band: Band, model: ModelConfig) -> Ticket:
        """Wait in `band`'s queue for `model`'s first replica, up to its
        `cold_start_timeout`."""
        assert model.autoscale is not None
        timeout = float(model.autoscale.cold_start_timeout)
        progress = request.progress
        queued = trio.current_time()
        outcome = "disconnected"  # unless the wait ends otherwise
        try:
            with self.cold.wait(model.name) as wait:
                with wait.scope:
                    ticket = await self._wait(request, band, model.name, timeout)
                if wait.refused is not None:
                    outcome = "unplaceable"
                    raise HttpError(
                        503,
                        f"model {model.name!r} has no replica and cannot be placed: {wait.refused}",
                        type_="server_error",
                        code="model_unplaceable",
                        # A fleet change is needed: nodes joining, or the operator's.
                        headers=[(b"retry-after", b"60")],
                    )
            outcome = "admitted"
        except AdmissionRejected as exc:
            progress.queued = trio.current_time() - queued
            outcome = "queue_full" if exc.reason == "queue_full" else "starting"
            self.metrics.admission_rejected.labels(band.name, exc.reason).inc()
            raise _cold_refusal(exc, band, model, timeout) from None
        finally:
            self.metrics.cold_waits.labels(model.name, outcome).inc()
        progress.queued = trio.current_time() - queued
        self.metrics.cold_wait.labels(model.name).observe(progress.queued)
        if progress.span is not None:
            progress.span.admitted(queued, queued + progress.queued, band.name, model.name)
        return ticket

    async def _wait(self, request: Request, band: Band, model: str, ttl: float) -> Ticket:
        """Queue for `model`'s first replica, for up to `ttl` seconds (admission's own
        deadline: its refusal says why)."""
        tenant = request.progress.caller.tenant or ""
        cost = request.expected_tokens
        return await _admitted_while_awake(
            request, partial(self.admission.admit, model, band, tenant, cost, ttl=ttl)
        )


async def _admitted_while_awake(
    request: Request, admitting: Callable[[], Awaitable[Ticket]]
) -> Ticket:
    """`admitting`'s ticket; meanwhile a stream's answer begins with SSE comments
    (router/pipeline/early.py) so that nothing between client and llmgw times out."""
    early = request.early
    if early is None:
        return await admitting()
    ticket: Ticket | None = None
    refused: AdmissionRejected | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(early.keep_alive, b"waking")
        try:
            ticket = await admitting()
        except AdmissionRejected as exc:
            refused = exc  # raised outside, so no exception group wraps it
        finally:
            nursery.cancel_scope.cancel()
    if refused is not None:
        raise refused
    assert ticket is not None
    return ticket


def _cold_refusal(
    exc: AdmissionRejected, band: Band, model: ModelConfig, timeout: float
) -> HttpError:
    if exc.reason == "queue_full":
        return HttpError(
            429,
            f"band {band.name!r} cannot queue for {model.name!r} now: its queue is full",
            type_="rate_limit_exceeded",
            code="queue_full",
            headers=[(b"retry-after", str(max(1, round(exc.retry_after))).encode())],
        )
    return HttpError(
        503,
        f"model {model.name!r} is starting: no replica was ready within its "
        f"cold_start_timeout ({timeout:g}s)",
        type_="server_error",
        code="model_starting",
        headers=[(b"retry-after", str(_starting_retry(timeout)).encode())],
    )


def _starting_retry(cold_start_timeout: float) -> int:
    """Retry-After for a cold start that outlasted its timeout: a tenth of it (the
    start may be nearly done), from 1 s to a minute."""
    return min(60, max(1, math.ceil(cold_start_timeout / 10)))
