"""OpenTelemetry traces of client requests: a span per request, a child for its
admission and one for each upstream attempt, the W3C trace context continued from
the client's ``traceparent`` and passed on to the engine (docs/router.md, Tracing).

Off unless ``[tracing] endpoint`` is set, and then free: the router holds no
:class:`Tracing`, a request pays one ``is None`` check, and OpenTelemetry is not even
imported. On, spans are made explicitly, never through OTel's current-span context
(a contextvar, which trio copies per task): a request's :class:`RequestSpan` belongs
to the value that carries the request, which ends it. Attributes are set once, when a
step ends, never per streamed event. A request the sampler leaves out gets no span
at all and is passed on as with tracing off (the client's trace context unchanged).
Spans leave through the SDK's BatchSpanProcessor, whose own thread exports them
(trio is never blocked); :meth:`Tracing.aclose` flushes what is left.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import trio

from llmgw.version import __version__

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from llmgw.domain.usage import Caller, Usage

__all__ = ["AttemptSpan", "RequestSpan", "Tracing", "TracingSettings"]


class TracingSettings(Protocol):
    """What a tracer is made from: llmgw.config.TracingConfig (whose check says when
    the `tracing` extra is missing, llmgw.extras)."""

    @property
    def endpoint(self) -> str: ...
    @property
    def sample_ratio(self) -> float: ...
    @property
    def parent_based(self) -> bool: ...
    @property
    def service_name(self) -> str: ...
    @property
    def timeout(self) -> float: ...
    @property
    def headers(self) -> Mapping[str, str]: ...


class Tracing:
    """The tracer of one router: its sampler, the OTLP/HTTP exporter and the batch
    processor that feeds it."""

    def __init__(self, config: TracingSettings) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace import SpanKind, StatusCode, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._timeout = float(config.timeout)
        ratio = TraceIdRatioBased(config.sample_ratio)
        # A provider of its own, never OTel's global one: two routers in a process
        # (tests, a library user) keep their settings apart.
        self._provider = TracerProvider(
            sampler=ParentBased(ratio) if config.parent_based else ratio,
            resource=Resource.create(
                {"service.name": config.service_name, "service.version": __version__}
            ),
        )
        exporter = OTLPSpanExporter(
            endpoint=config.endpoint, headers=dict(config.headers), timeout=self._timeout
        )
        self._provider.add_span_processor(
            BatchSpanProcessor(exporter, export_timeout_millis=self._timeout * 1000)
        )
        self.tracer = self._provider.get_tracer("llmgw.router", __version__)
        self.propagator = TraceContextTextMapPropagator()
        self.set_span_in_context = set_span_in_context
        self.kinds = SpanKind
        self.error = StatusCode.ERROR

    def request(
        self, trace: Sequence[tuple[bytes, bytes]], name: str, started: float
    ) -> RequestSpan | None:
        """The span of a request that began at trio time `started`, continuing the
        client's `trace` headers (``traceparent``, ``tracestate``); None when the
        sampler leaves it out."""
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in trace}
        parent = self.propagator.extract(carrier) if carrier else None
        # OTel takes wall-clock nanoseconds; the router keeps trio's clock.
        offset = time.time_ns() - int(trio.current_time() * 1e9)
        span = self.tracer.start_span(
            name,
            context=parent,
            kind=self.kinds.SERVER,
            start_time=offset + int(started * 1e9),
        )
        if not span.is_recording():
            return None
        return RequestSpan(self, span, offset)

    async def aclose(self) -> None:
        """Export what is still queued, for at most `timeout`; then stop."""
        with trio.CancelScope(shield=True), trio.move_on_after(self._timeout):
            # The export thread may hang on a collector that does not answer: bounded,
            # and abandoned past the bound.
            await trio.to_thread.run_sync(self._provider.shutdown, abandon_on_cancel=True)


class RequestSpan:
    """One request's span, owned by the request; its children are made through it.
    The attribute names are the GenAI semantic conventions' (``gen_ai.*``) and
    llmgw's own (``llmgw.*``), all here."""

    __slots__ = ("_offset", "_tracing", "span", "status")

    def __init__(self, tracing: Tracing, span: Span, offset: int) -> None:
        self._tracing = tracing
        self.span = span
        self._offset = offset  # wall-clock ns minus trio's clock in ns
        #: The status the client got from the attempt that served it, if one did.
        self.status: int | None = None

    def _ns(self, t: float) -> int:
        return self._offset + int(t * 1e9)

    def admitted(
        self, start: float, end: float, band: str, pool: str, refused: str | None = None
    ) -> None:
        """Admission's child span, from trio time `start` to `end`: made once its
        outcome is known (`refused`: why not), nothing held while the request waits."""
        t = self._tracing
        child = t.tracer.start_span(
            "admission",
            context=t.set_span_in_context(self.span),
            start_time=self._ns(start),
            attributes={
                "llmgw.band": band,
                "llmgw.pool": pool,
                "llmgw.admission.wait": end - start,
            },
        )
        if refused is not None:
            child.set_attribute("error.type", refused)
            child.set_status(t.error, refused)
        child.end(self._ns(end))

    def attempt(self, endpoint: str, model: str, tier: str) -> AttemptSpan:
        """The child span of one upstream attempt (at `endpoint`, for `model` as the
        engine knows it, picked by the decision `tier`), started now."""
        t = self._tracing
        child = t.tracer.start_span(
            "upstream",
            context=t.set_span_in_context(self.span),
            kind=t.kinds.CLIENT,
            attributes={
                "llmgw.replica": endpoint,
                "gen_ai.request.model": model,
                "llmgw.decision.tier": tier,
            },
        )
        return AttemptSpan(t, child)

    def retry(self, failed: str | None, reason: str, endpoint: str) -> None:
        """An event: the attempt at `failed` failed for `reason`; `endpoint` is next."""
        self.span.add_event(
            "llmgw.retry",
            {
                "llmgw.retry.failed_replica": failed or "",
                "llmgw.retry.reason": reason,
                "llmgw.replica": endpoint,
            },
        )

    def fallback(self, asked: str, model: str) -> None:
        """An event: the model `asked` for had no replica left; `model` is tried."""
        self.span.add_event(
            "llmgw.fallback", {"llmgw.fallback.from": asked, "llmgw.fallback.to": model}
        )

    def served(
        self,
        model: str,
        endpoint: str,
        tier: str,
        status: int,
        usage: Usage | None,
        ttft: float | None,
        failure: str | None,
    ) -> None:
        """What the attempt that reached the client delivered (a stream cut by the
        engine half-way: `failure`, its kind)."""
        self.status = status
        attributes: dict[str, str | bool | int | float] = {
            "gen_ai.response.model": model,
            "llmgw.replica": endpoint,
            "llmgw.decision.tier": tier,
        }
        if usage is not None:
            attributes["gen_ai.usage.input_tokens"] = usage.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = usage.completion_tokens
            if usage.estimated:
                attributes["llmgw.usage.estimated"] = True
        if ttft is not None:
            attributes["llmgw.ttft"] = ttft
        if failure is not None:
            attributes["error.type"] = failure
            self.span.set_status(self._tracing.error, f"the engine's stream broke: {failure}")
        self.span.set_attributes(attributes)

    def end(
        self,
        *,
        operation: str,
        model: str,
        request_id: str,
        caller: Caller,
        queued: float,
        retries: int,
        status: int,
        error: str | None,
    ) -> None:
        """End the span of a request answered with `status` (`error`: the code of a
        refusal, or why it ended without an answer)."""
        attributes: dict[str, str | bool | int | float] = {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": model,
            "llmgw.request_id": request_id,
            "llmgw.admission.wait": queued,
            "llmgw.retries": retries,
            "http.response.status_code": status,
        }
        for name, value in (
            ("llmgw.key_id", caller.key_id),
            ("llmgw.band", caller.band),
            ("llmgw.tenant", caller.tenant),
        ):
            if value is not None:
                attributes[name] = value
        if error is not None:
            attributes["error.type"] = error
            if status >= 500:  # a server span's error: the server's failure, not the client's
                self.span.set_status(self._tracing.error, error)
        self.span.set_attributes(attributes)
        self.span.end()


class AttemptSpan:
    """One upstream attempt's span, and the trace context the engine gets for it."""

    __slots__ = ("_tracing", "span")

    def __init__(self, tracing: Tracing, span: Span) -> None:
        self._tracing = tracing
        self.span = span

    def headers(self) -> list[tuple[bytes, bytes]]:
        """``traceparent`` (and the client's ``tracestate``) naming this span as the
        parent of what the engine records."""
        carrier: dict[str, str] = {}
        t = self._tracing
        t.propagator.inject(carrier, context=t.set_span_in_context(self.span))
        return [(k.encode(), v.encode("latin-1")) for k, v in carrier.items()]

    def end(self, outcome: str, status: int | None, error: str | None = None) -> None:
        """End it: the breaker's `outcome` of the attempt, the engine's `status` if
        it answered, `error` when it failed."""
        attributes: dict[str, str | bool | int | float] = {"llmgw.outcome": outcome}
        if status is not None:
            attributes["http.response.status_code"] = status
        if error is not None:
            attributes["error.type"] = outcome
            self.span.set_status(self._tracing.error, error)
        self.span.set_attributes(attributes)
        self.span.end()
