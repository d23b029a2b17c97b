"""The pipeline's last stage, and the one place a request's end is written down:
metrics, the usage sinks (the store, the access log, per-key series), the key's token
use, the stored-response index, the scheduling plugins' ``complete`` hooks and the
trace span, for requests served, refused and abandoned alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from llmgw.domain.usage import Caller, Usage, UsageRecord
from llmgw.router.access import log_refusal
from llmgw.router.responses import Home
from llmgw.router.scheduling.hooks import Done, Hooks
from llmgw.router.usage import NO_USAGE

if TYPE_CHECKING:
    from llmgw.domain.usage import UsageSink
    from llmgw.router.access import AccessLog
    from llmgw.router.auth import Authenticator
    from llmgw.router.metrics import RouterMetrics
    from llmgw.router.pipeline.attempt import Try
    from llmgw.router.pipeline.request import Request
    from llmgw.router.pipeline.schedule import Picked
    from llmgw.router.proxy import Delivery
    from llmgw.router.refusal import HttpError
    from llmgw.router.responses import ResponseHomes

__all__ = ["Account", "Refusal"]


class Refusal:
    """Where a refusal came from, when no :class:`Request` was made yet (the route,
    the key, the body were refused)."""

    __slots__ = ("key_id", "path", "request_id", "started")

    def __init__(self, request_id: str, path: str, started: float, key_id: str | None) -> None:
        self.request_id = request_id
        self.path = path
        self.started = started
        self.key_id = key_id


class Account:
    """Writes down how each request ended."""

    def __init__(
        self,
        metrics: RouterMetrics,
        sinks: Sequence[UsageSink],
        *,
        access_log: AccessLog | None,
        auth: Authenticator,
        responses: ResponseHomes,
        hooks: Hooks,
    ) -> None:
        """`sinks` get every request that had a model (the access log among them);
        `access_log` alone also gets the refusals that came before one was known."""
        self.metrics = metrics
        self.sinks = tuple(sinks)
        self.access_log = access_log
        self.auth = auth
        self.responses = responses
        self.hooks = hooks

    def served(self, request: Request, at: Try, picked: Picked, delivery: Delivery) -> None:
        """An answer reached the client from `at`'s replica (whole, or cut by the
        engine: ``delivery.failure``)."""
        self._reached(request, at, picked, delivery, delivery.status, delivery.failure is None)
        if request.progress.response_id is not None and delivery.status == 200:
            owner = request.key.id if request.key is not None else None
            home = Home(at.state.endpoint.id, at.model.name, owner)
            self.responses.record(request.progress.response_id, home, trio.current_time())

    def abandoned(self, request: Request, at: Try, picked: Picked) -> None:
        """The client left while `at`'s answer was being relayed: what it got counts
        (its usage estimated from the events relayed), as a 499."""
        partial = at.partial
        partial.usage = Usage(request.prompt_tokens, partial.events, estimated=True)
        self._reached(request, at, picked, partial, 499, False)

    def _reached(
        self,
        request: Request,
        at: Try,
        picked: Picked,
        delivery: Delivery,
        status: int,
        clean: bool,
    ) -> None:
        now = trio.current_time()
        model, ident = at.model.name, at.state.endpoint.id
        latency = now - request.started
        usage = delivery.usage
        self._metrics(request, model, ident, status, latency, delivery)
        done = Done(
            ident, picked.decision.endpoint_id, status, usage, delivery.ttft, latency, now, clean
        )
        prediction = None
        for hook in self.hooks.complete:
            outcome = hook.complete(picked.ask, done, picked.notes.get(id(hook)))
            prediction = prediction or outcome
        progress = request.progress
        if progress.span is not None:
            failure = None if delivery.failure is None else delivery.failure.kind
            progress.span.served(model, ident, at.tier, status, usage, delivery.ttft, failure)
        if progress.caller.key_id is not None and usage is not None:
            self.auth.used(progress.caller.key_id, usage.prompt_tokens + usage.completion_tokens)
        # Every request that reached an engine is recorded, failures without a usage
        # block too (with no tokens): usage reports and the dashboard count errors.
        self._record(
            UsageRecord(
                model=model,
                endpoint=ident,
                status=status,
                usage=usage if usage is not None else NO_USAGE,
                latency=latency,
                ttft=delivery.ttft,
                key_id=progress.caller.key_id,
                band=progress.caller.band,
                tenant=progress.caller.tenant,
                retries=progress.retries,
                request_id=request.request_id,
                path=request.path,
                queue_wait=progress.queued,
                prediction=prediction,
                spills=progress.spills,
                fallback=at.model is not request.model,
                asked=request.body.model,
                client=_client(request),
                key_name=request.key.name if request.key is not None else None,
            )
        )

    def _metrics(
        self,
        request: Request,
        model: str,
        ident: str,
        status: int,
        latency: float,
        delivery: Delivery,
    ) -> None:
        m, route = self.metrics, request.route.operation
        m.requests.labels(model, ident, str(status), route).inc()
        m.duration.labels(model, route, "true" if request.stream else "false").observe(latency)
        if delivery.ttft is not None:
            m.ttft.labels(model, route).observe(delivery.ttft)
        if delivery.itl:
            m.itl.observe_all(model, delivery.itl)
        usage = delivery.usage
        if usage is not None:
            m.prompt_tokens.labels(model, ident).inc(usage.prompt_tokens)
            m.completion_tokens.labels(model, ident).inc(usage.completion_tokens)
            if usage.cached_tokens:
                m.cached_tokens.labels(model, ident).inc(usage.cached_tokens)
            if usage.estimated:
                m.estimated_usage.labels(model).inc()

    def unserved(self, request: Request, model: str, status: int) -> None:
        """Every replica tried failed before the client got anything (502 or 504)."""
        self.metrics.requests.labels(model, "", str(status), request.route.operation).inc()

    def refused(
        self,
        err: HttpError,
        request: Request | None = None,
        *,
        before: Refusal | None = None,
        code: str | None = None,
    ) -> None:
        """llmgw answered `err` itself: for `request`, or (`before`) for a request
        refused before it was one. `code` overrides the error's own (the Anthropic
        translation's refusals carry their type)."""
        code = code if code is not None else err.code
        model = request.model.name if request is not None else ""
        if request is not None:
            origin = Refusal(
                request.request_id,
                request.path,
                request.started,
                request.key.id if request.key is not None else None,
            )
        else:
            assert before is not None
            origin = before
        self.metrics.reject(code or str(err.status), model, origin.key_id)
        log_refusal(origin.request_id, err.status, code, str(err), model)
        progress = request.progress if request is not None else None
        caller = progress.caller if progress is not None else Caller(origin.key_id)
        record = UsageRecord(
            model=model,
            endpoint=None,
            status=err.status,
            usage=NO_USAGE,
            latency=trio.current_time() - origin.started,
            key_id=caller.key_id,
            band=caller.band,
            tenant=caller.tenant,
            retries=progress.retries if progress is not None else 0,
            request_id=origin.request_id,
            path=origin.path,
            queue_wait=progress.queued if progress is not None else None,
            error=code,
            spills=progress.spills if progress is not None else (),
            asked=request.body.model if request is not None else None,
            client=_client(request) if request is not None else None,
            key_name=request.key.name if request is not None and request.key else None,
        )
        if request is not None:
            # A client-visible failure once the model was known (429, 503, 502/504
            # after every attempt, 403, ...): usage and the dashboard count it.
            self._record(record)
        elif self.access_log is not None:
            self.access_log.record(record)

    def _record(self, record: UsageRecord) -> None:
        for sink in self.sinks:
            sink.record(record)

    def closed(self, request: Request, refused: HttpError | None, gone: bool) -> None:
        """The request is over: a client that left is counted, and its span ends with
        how the client was answered."""
        if gone:
            kind = "stream" if request.stream else "request"
            self.metrics.disconnects.labels(request.body.model, kind).inc()
        span = request.progress.span
        if span is None:
            return
        error: str | None
        if refused is not None:
            status, error = refused.status, refused.code or str(refused.status)
        elif span.status is not None:  # served, in whole or (the client left) in part
            status, error = span.status, "client_gone" if gone else None
        elif gone:
            status, error = 499, "client_gone"
        else:  # a bug: the ASGI server answers 500
            status, error = 500, "internal_error"
        progress = request.progress
        span.end(
            operation=request.route.operation,
            model=request.body.model,
            request_id=request.request_id,
            caller=progress.caller,
            queued=progress.queued,
            retries=progress.retries,
            status=status,
            error=error,
        )


def _client(request: Request) -> str | None:
    """The client's address, as the access log gives it."""
    client = request.scope.get("client")
    return f"{client[0]}:{client[1]}" if client else None
