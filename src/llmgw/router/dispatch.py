"""What happens to a client request once it is read (llmgw.router.app): admission by
priority band, or a cold start's wait for a first replica; routing over the replicas
of the model, then of its fallbacks; and each attempt at one replica, relayed by
:mod:`llmgw.router.proxy`. Attempts are retried elsewhere only while nothing has
reached the client.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import trio

from llmgw.domain.endpoints import public_name
from llmgw.domain.usage import Caller, Usage
from llmgw.http.asgi import header
from llmgw.router.admission import AdmissionRejected, UnknownBand
from llmgw.router.auth import AuthError
from llmgw.router.body import BIG_BODY, BodyError
from llmgw.router.breaker import Outcome, Ticket, classify_status
from llmgw.router.call import (
    REQUEST_ID,
    Call,
    HttpError,
    Native,
    Routing,
    auth_error,
    buffer_full_error,
    engine_of,
)
from llmgw.router.kv_events import Exact, KVEvents, tokenize_body
from llmgw.router.proxy import AttemptFailed, BufferFull, Delivery, PathMissing
from llmgw.router.responses import Home

if TYPE_CHECKING:
    from llmgw.config import Band
    from llmgw.domain.catalog import ModelConfig
    from llmgw.router.endpoints import EndpointState


class Dispatch:
    """Admission, routing and attempts for the client app's requests."""

    def __init__(self, router: Routing, big_parses: trio.CapacityLimiter) -> None:
        self.router = router
        # The client app's: a large body's prompt text is decoded in a worker thread,
        # one at a time with the app's parses.
        self._big_parses = big_parses

    async def serve(self, call: Call) -> None:
        """Admission by priority band, then routing. The request waits in its band's
        queue while the model's pool is above the band's saturation ceiling."""
        router = self.router
        admission = router.admission
        key = call.key
        # With keys, the key decides the band and is the tenant; the headers are
        # trusted only without them.
        value = None if key is not None else header(call.scope, router.band_header)
        try:
            band = admission.select_band(
                value.decode(errors="replace") if value else None,
                key.band if key is not None else None,
            )
        except UnknownBand as exc:
            raise HttpError(
                400, str(exc), param=router.band_header.decode(), code="unknown_band"
            ) from None
        limit = call.body.max_tokens
        expected = len(call.body.raw) // 4 + (limit if limit is not None else 256)
        if key is not None:
            try:
                router.auth.check_model(key, call.body.model, call.chain[0].name)
                await router.auth.admit(key, expected)
            except AuthError as exc:
                raise auth_error(exc) from None
            tenant = key.id
        else:
            tenant = (header(call.scope, router.tenant_header) or b"").decode(errors="replace")
        call.caller = Caller(key.id if key is not None else None, band.name, tenant or None)
        now = trio.current_time()
        pool = next(
            (
                m.name
                for m in call.chain
                if any(s.breaker.allows(now) for s in router.endpoints.serving(m.name))
            ),
            None,
        )
        if pool is None:
            cold = router.cold.model_for(call.chain) if admission.enabled else None
            if cold is None:  # nothing to queue for: routing answers 503 at once
                await self._route(call)
                return
            await self._serve_cold(call, cold, band, tenant, expected)
            return
        queued = trio.current_time()
        try:
            ticket = await admission.admit(pool, band, tenant, expected)
        except AdmissionRejected as exc:
            call.queued = trio.current_time() - queued  # the wait that gave up, for the log
            router.metrics.admission_rejected.labels(band.name, exc.reason).inc()
            if call.span is not None:
                call.span.admitted(queued, trio.current_time(), band.name, pool, exc.reason)
            why = "its queue is full" if exc.reason == "queue_full" else "it waited too long"
            raise HttpError(
                429,
                f"band {band.name!r} cannot be admitted for {pool!r} now: {why}",
                type_="rate_limit_exceeded",
                code=exc.reason,
                headers=[(b"retry-after", str(max(1, round(exc.retry_after))).encode())],
            ) from None
        call.queued = trio.current_time() - queued
        if call.span is not None:
            call.span.admitted(queued, queued + call.queued, band.name, pool)
        with ticket:
            await self._route(call)

    async def _serve_cold(
        self, call: Call, model: ModelConfig, band: Band, tenant: str, expected: int
    ) -> None:
        """Wake on request (router/coldstart.py): wait in `band`'s queue for `model`'s
        first replica, up to its `cold_start_timeout`, then route as usual."""
        router = self.router
        assert model.autoscale is not None
        timeout = float(model.autoscale.cold_start_timeout)
        metrics = router.metrics
        queued = trio.current_time()
        outcome = "disconnected"  # unless the wait ends otherwise
        try:
            with router.cold.wait(model.name) as wait:
                with wait.scope:
                    ticket = await router.admission.admit(
                        model.name, band, tenant, expected, ttl=timeout
                    )
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
            call.queued = trio.current_time() - queued
            outcome = "queue_full" if exc.reason == "queue_full" else "starting"
            router.metrics.admission_rejected.labels(band.name, exc.reason).inc()
            if exc.reason == "queue_full":
                raise HttpError(
                    429,
                    f"band {band.name!r} cannot queue for {model.name!r} now: its queue is full",
                    type_="rate_limit_exceeded",
                    code="queue_full",
                    headers=[(b"retry-after", str(max(1, round(exc.retry_after))).encode())],
                ) from None
            raise HttpError(
                503,
                f"model {model.name!r} is starting: no replica was ready within its "
                f"cold_start_timeout ({timeout:g}s)",
                type_="server_error",
                code="model_starting",
                headers=[(b"retry-after", str(_starting_retry(timeout)).encode())],
            ) from None
        finally:
            metrics.cold_waits.labels(model.name, outcome).inc()
        call.queued = trio.current_time() - queued
        metrics.cold_wait.labels(model.name).observe(call.queued)
        if call.span is not None:
            call.span.admitted(queued, queued + call.queued, band.name, model.name)
        with ticket:
            await self._route(call)

    async def _route(self, call: Call) -> None:
        """Try the model's replicas in score order, then its fallbacks' replicas, within
        `retries` + 1 attempts in all; only attempts that sent nothing to the client
        are retried."""
        router = self.router
        chain = call.chain
        prompt_text = await self._prompt_text(call) if router.prefixes else None
        prompt_tokens = call.prompt_tokens
        budget = router.config.router.retries + 1
        last: AttemptFailed | None = None
        attempted: ModelConfig | None = None
        tried: set[str] = set()
        kv = router.kv_events
        # Token ids per model (its engines' tokenizer), asked once per request.
        tokenized: dict[str, list[int] | None] = {}
        for model in chain:
            payload = b""
            # Pick, try the ranked candidates, and pick again among those not yet tried:
            # a replica published after the first pick (e.g. a replacement) counts too.
            while budget > 0:
                now = trio.current_time()
                usable = [
                    s
                    for s in router.endpoints.serving(model.name)
                    if s.endpoint.id not in tried
                    and s.breaker.allows(now)
                    and call.route.served_by(engine_of(s))
                    and (call.pinned is None or s.endpoint.id == call.pinned)
                ]
                prefix = (
                    router.prefixes.chain(prompt_text, model.name)
                    if router.prefixes and prompt_text and usable
                    else None
                )
                exact = None
                if kv is not None and usable and kv.covers(s.endpoint.id for s in usable):
                    exact = await self._exact(call, model, usable, kv, tokenized)
                    now = trio.current_time()
                decision = (
                    router.choose(
                        model, usable, call.session_key, prefix, now, prompt_tokens, exact
                    )
                    if usable
                    else None
                )
                if decision is None:
                    break
                if attempted is not model:
                    if model is not chain[0]:
                        router.metrics.fallbacks.labels(chain[0].name, model.name).inc()
                        if call.span is not None:
                            call.span.fallback(chain[0].name, model.name)
                    # Engines know canonical names: an alias or a fallback is renamed.
                    payload = call.body.payload(model.name, add_usage=self._add_usage(call))
                    # llmgw's own time: admission's queueing is its own histogram.
                    router.metrics.overhead.observe(
                        trio.current_time() - call.started - call.queued
                    )
                    attempted = model
                router.metrics.decisions.labels(model.name, decision.tier).inc()
                if decision.spill is not None:
                    router.metrics.spills.labels(model.name, *decision.spill).inc()
                    call.spills += (decision.spill,)
                for endpoint_id in decision.ranked:
                    if budget <= 0:
                        break
                    tried.add(endpoint_id)
                    state = router.endpoints.get(endpoint_id)
                    ticket = state.breaker.acquire(trio.current_time()) if state else None
                    if state is None or ticket is None:
                        continue
                    if last is not None:
                        router.metrics.retries.labels(model.name, last.kind).inc()
                        call.retries += 1
                        if call.span is not None:
                            call.span.retry(last.endpoint, last.kind, endpoint_id)
                    budget -= 1
                    if kv is not None:
                        ids = tokenized.get(model.name)
                        kv.sent(endpoint_id, kv.owes(endpoint_id, ids), trio.current_time())
                    prefill = decision.uncached.get(endpoint_id, prompt_tokens)
                    try:
                        delivery = await self._attempt(
                            call, model, state, ticket, payload, prefill, decision.tier
                        )
                    except AttemptFailed as failure:
                        last = failure
                        continue
                    except BufferFull as exc:
                        raise buffer_full_error(exc) from None
                    router.finish(
                        model,
                        state,
                        delivery,
                        session_key=call.session_key,
                        latency=trio.current_time() - call.started,
                        caller=call.caller,
                        retries=call.retries,
                        request_id=call.request_id,
                        path=call.scope["path"],
                        queue_wait=call.queued,
                        probe=decision.probe if endpoint_id == decision.endpoint_id else None,
                        spills=call.spills,
                    )
                    if call.response_id is not None and delivery.status == 200:
                        owner = call.key.id if call.key is not None else None
                        home = Home(state.endpoint.id, model.name, owner)
                        router.responses.record(call.response_id, home, trio.current_time())
                    return
        requested = call.body.model
        if attempted is None:
            retry_after = str(max(1, math.ceil(router.config.router.cooldown / 3)))
            fallbacks = [m.name for m in chain[1:]]
            raise HttpError(
                503,
                f"no replica of {requested!r} can take the request now"
                + (f" (fallbacks tried: {', '.join(fallbacks)})" if fallbacks else ""),
                type_="server_error",
                code="no_healthy_replica",
                headers=[(b"retry-after", retry_after.encode())],
            )
        status = 504 if last is not None and last.outcome is Outcome.TIMEOUT else 502
        router.metrics.requests.labels(attempted.name, "", str(status)).inc()
        # Endpoints are named as clients see them (public_name): no addresses, no
        # leader's fencing token.
        raise HttpError(
            status,
            f"every replica tried failed; the last, endpoint "
            f"{public_name(last.endpoint or '')!r}: {last}"
            if last
            else "no replica was free",
            type_="server_error",
            code="upstream_timeout" if status == 504 else "upstream_error",
        )

    async def _exact(
        self,
        call: Call,
        model: ModelConfig,
        usable: list[EndpointState],
        kv: KVEvents,
        tokenized: dict[str, list[int] | None],
    ) -> Exact | None:
        """What the engines' own indexes say the usable replicas hold of this prompt,
        for those whose KV-cache events are up; None (the estimated table decides)
        when none is, or the prompt could not be tokenized in time."""
        router = self.router
        feeds = kv.up_feeds((s.endpoint.id for s in usable), trio.current_time())
        if not feeds:
            kv.lookups.labels(model.name, "down").inc()
            return None
        members = getattr(call.body, "members", None)  # a form body has none
        body = tokenize_body(model.name, members) if members is not None else None
        if body is None:  # no prompt to look up (an embedding's input, a form)
            kv.lookups.labels(model.name, "no_prompt").inc()
            return None
        if any(model.name in f.loras for f in feeds):
            # A LoRA adapter's blocks are keyed by it as well as by their tokens.
            kv.lookups.labels(model.name, "lora").inc()
            return None
        if model.name not in tokenized:
            ids = None
            # Any of them tokenizes as the others would: spread the asking.
            tokenizer = router.endpoints.get(router.rng.choice(feeds).endpoint_id)
            if tokenizer is not None:
                e = tokenizer.endpoint
                ids = await kv.tokenize(e.url, e.headers, body)
            tokenized[model.name] = ids
        ids = tokenized[model.name]
        if ids is None:
            kv.lookups.labels(model.name, "failed").inc()
            return None
        kv.lookups.labels(model.name, "exact").inc()
        return kv.exact(ids, feeds, call.prompt_tokens)

    async def _prompt_text(self, call: Call) -> str:
        """The prompt text prefix affinity hashes; a large body's is decoded in a
        worker thread, one at a time."""
        prefixes = self.router.prefixes
        assert prefixes is not None
        body = call.body
        chars = prefixes.block_chars * prefixes.max_blocks
        try:
            if len(body.raw) > BIG_BODY:
                fields = await trio.to_thread.run_sync(
                    body.affinity_fields, chars, limiter=self._big_parses
                )
            else:
                fields = body.affinity_fields(chars)
        except BodyError as exc:
            raise HttpError(400, str(exc), param=exc.param) from None
        return prefixes.text(fields)

    def _add_usage(self, call: Call) -> bool:
        """Ask the engine for a usage chunk the client did not ask for (to account)."""
        return (
            call.route.usage_option
            and call.stream
            and self.router.config.router.inject_usage
            and not call.wants_usage
        )

    async def _attempt(
        self,
        call: Call,
        model: ModelConfig,
        state: EndpointState,
        ticket: Ticket,
        payload: bytes,
        prefill: float,
        tier: str,
    ) -> Delivery:
        """One attempt at one endpoint; raises AttemptFailed when it may be retried.

        `prefill` (the prompt tokens it is estimated to compute) counts in the
        endpoint's prefill work until the first token, or the answer, is in. `tier`
        is the routing decision's that picked it (for its trace)."""
        router = self.router
        native = call.native
        # The engine speaks the client's API itself (its request, its answer as is),
        # unless it showed it does not; then the translation.
        tries = (True, False) if native is not None and _native_for(native, state) else (False,)
        base = state.endpoint.url.rstrip("/")
        request_id = call.scope[REQUEST_ID]
        extra = [
            (b"x-llmgw-model", model.name.encode()),
            (b"x-llmgw-endpoint", state.public.encode()),
            (b"x-request-id", request_id),
        ]
        traced = (
            None if call.span is None else call.span.attempt(state.endpoint.id, model.name, tier)
        )
        headers = [
            (b"content-type", call.body.content_type),
            (b"x-request-id", request_id),
            *state.endpoint.headers,
            # Traced, the engine's parent span is this attempt's; else the client's.
            *(call.trace if traced is None else traced.headers()),
        ]
        in_flight = router.metrics.in_flight.labels(model.name)
        in_flight.inc()
        state.inflight += 1
        state.prefill += prefill
        prefilling = True

        def prefilled() -> None:
            nonlocal prefilling
            if prefilling:
                prefilling = False
                state.prefill -= prefill

        partial = Delivery(200)
        try:
            await router.sleeper.wake(state)  # a sleeping engine first wakes
            for natively in tries:
                send, path, final = call.send, call.route.path, call.route.final
                strip, body = not call.wants_usage, payload
                if natively:
                    assert native is not None
                    send, path, final, strip = native.send, native.path, native.final, False
                    body = native.body.payload(model.name, add_usage=False)
                try:
                    if call.stream:
                        delivery = await router.upstream.stream(
                            base + path,
                            body,
                            headers,
                            send,
                            extra,
                            strip_usage=strip,
                            final=final,
                            started=call.started,
                            outcome=partial,
                            first_token=prefilled,
                            missing_ok=natively,
                        )
                    else:
                        delivery = await router.upstream.unary(
                            base + path, body, headers, send, extra, missing_ok=natively
                        )
                    break
                except PathMissing:
                    state.lacks_native = True  # an engine version without that API
        except AttemptFailed as failure:
            failure.endpoint = state.endpoint.id
            router.record_attempt(state, ticket, failure.outcome, failure)
            if traced is not None:
                traced.end(failure.kind, failure.status, str(failure))
            raise
        except BufferFull:
            # Says nothing about the replica (its answer came): the probe slot is freed.
            router.record_attempt(state, ticket, Outcome.CLIENT_GONE, None)
            if traced is not None:
                traced.end("buffer_full", None)
            raise
        except BaseException:
            # Cancelled (the client left) or a bug: the probe slot must not stick,
            # and what was already relayed still counts.
            router.record_attempt(state, ticket, Outcome.CLIENT_GONE, None)
            if traced is not None:
                traced.end(Outcome.CLIENT_GONE.value, None)
            if partial.ttft is not None:
                partial.usage = Usage(call.prompt_tokens, partial.events, estimated=True)
                if call.span is not None:
                    call.span.served(
                        model.name, state.endpoint.id, tier, 499, partial.usage, partial.ttft, None
                    )
                router.finish(
                    model,
                    state,
                    partial,
                    session_key=None,
                    latency=trio.current_time() - call.started,
                    caller=call.caller,
                    status=499,
                    retries=call.retries,
                    request_id=call.request_id,
                    path=call.scope["path"],
                    queue_wait=call.queued,
                    spills=call.spills,
                )
            raise
        finally:
            prefilled()
            state.inflight -= 1
            state.used_at = trio.current_time()  # idle from here (router/sleep.py)
            in_flight.dec()
        broken = delivery.failure
        outcome = broken.outcome if broken else classify_status(delivery.status)
        router.record_attempt(state, ticket, outcome, broken)
        if traced is not None and call.span is not None:
            traced.end(outcome.value, delivery.status, None if broken is None else str(broken))
            call.span.served(
                model.name,
                state.endpoint.id,
                tier,
                delivery.status,
                delivery.usage,
                delivery.ttft,
                None if broken is None else broken.kind,
            )
        return delivery


def _starting_retry(cold_start_timeout: float) -> int:
    """Retry-After for a cold start that outlasted its timeout: a tenth of it (the
    start may be nearly done), from 1 s to a minute."""
    return min(60, max(1, math.ceil(cold_start_timeout / 10)))


def _native_for(native: Native, state: EndpointState) -> bool:
    """Whether `state`'s engine is sent the client's own request (it serves that API,
    and has not shown otherwise)."""
    return engine_of(state) in native.engines and not state.lacks_native
