"""A request's way through the router, one way: authenticate → admit → schedule →
attempt → account (each stage a module of this package, built with its collaborators).

Attempts go to the model's replicas in the pick's order, then, after a fresh pick
among those not yet tried, to its fallbacks' replicas, within ``router.retries`` + 1
attempts in all; only an attempt that sent nothing to the client is retried.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import trio

from llmgw.domain.endpoints import public_name
from llmgw.router.breaker import Outcome
from llmgw.router.pipeline.attempt import Try
from llmgw.router.proxy import AttemptFailed, BufferFull
from llmgw.router.refusal import HttpError, buffer_full_error

if TYPE_CHECKING:
    from llmgw.domain.catalog import ModelConfig
    from llmgw.router.endpoints import EndpointRegistry
    from llmgw.router.metrics import RouterMetrics
    from llmgw.router.pipeline.account import Account
    from llmgw.router.pipeline.admit import Admit
    from llmgw.router.pipeline.attempt import Attempt
    from llmgw.router.pipeline.authenticate import Authenticate
    from llmgw.router.pipeline.request import Request
    from llmgw.router.pipeline.schedule import Picked, Schedule

__all__ = ["Pipeline"]


class Pipeline:
    """The stages, in order."""

    def __init__(
        self,
        authenticate: Authenticate,
        admit: Admit,
        schedule: Schedule,
        attempt: Attempt,
        account: Account,
        endpoints: EndpointRegistry,
        metrics: RouterMetrics,
        *,
        retries: int,
        cooldown: float,
        inject_usage: bool,
    ) -> None:
        """`retries`: attempts after the first; `cooldown`, a breaker's (what a client
        refused for want of a replica is told to wait a third of); `inject_usage`: ask
        streaming engines for a usage chunk the client did not ask for."""
        self.authenticate = authenticate
        self.admit = admit
        self.schedule = schedule
        self.attempt = attempt
        self.account = account
        self.endpoints = endpoints
        self.metrics = metrics
        self.retries = retries
        self.cooldown = cooldown
        self.inject_usage = inject_usage

    async def serve(self, request: Request) -> None:
        """Serve `request`; an HttpError (accounted already) when llmgw refuses it."""
        try:
            band = self.admit.band(request)
            await self.authenticate.permit(request)
            request.progress.caller = self.admit.caller(request, band)
            with await self.admit.admit(request, band):
                await self._route(request)
        except HttpError as err:
            self.account.refused(err, request)
            raise

    async def _route(self, request: Request) -> None:
        prompt = await self.schedule.prompt(request)
        budget = self.retries + 1
        last: AttemptFailed | None = None
        attempted: ModelConfig | None = None
        tried: set[str] = set()
        payload = b""
        for model in request.chain:
            # Pick, try the ranked candidates, and pick again among those not yet tried:
            # a replica published after the first pick (e.g. a replacement) counts too.
            while budget > 0:
                usable = self.schedule.usable(request, model, tried, trio.current_time())
                picked = await self.schedule.pick(request, model, usable, prompt)
                if picked is None:
                    break
                if attempted is not model:
                    payload = self._first_pick(request, model)
                    attempted = model
                for endpoint_id in picked.decision.ranked:
                    if budget <= 0:
                        break
                    tried.add(endpoint_id)
                    at = self._try(request, model, picked, endpoint_id, payload)
                    if at is None:
                        continue
                    if last is not None:
                        self._retrying(request, model, last, endpoint_id)
                    budget -= 1
                    self.schedule.sent(picked, endpoint_id, prompt)
                    try:
                        await self._attempt(request, at, picked)
                    except AttemptFailed as failure:
                        last = failure
                        continue
                    return
        raise self._exhausted(request, attempted, last)

    def _first_pick(self, request: Request, model: ModelConfig) -> bytes:
        """The body `model`'s replicas get (engines know canonical names: an alias or a
        fallback is renamed), once per model."""
        first = request.chain[0]
        if model is not first:
            self.metrics.fallbacks.labels(first.name, model.name).inc()
            if request.progress.span is not None:
                request.progress.span.fallback(first.name, model.name)
        add_usage = (
            request.route.usage_option
            and request.stream
            and self.inject_usage
            and not request.wants_usage
        )
        # llmgw's own time: admission's queueing is its own histogram.
        self.metrics.overhead.observe(
            trio.current_time() - request.started - request.progress.queued
        )
        return request.body.payload(model.name, add_usage=add_usage)

    def _try(
        self, request: Request, model: ModelConfig, picked: Picked, endpoint_id: str, payload: bytes
    ) -> Try | None:
        """An attempt at `endpoint_id`, if it is still there and its breaker lets one."""
        state = self.endpoints.get(endpoint_id)
        ticket = state.breaker.acquire(trio.current_time()) if state else None
        if state is None or ticket is None:
            return None
        decision = picked.decision
        prefill = decision.uncached.get(endpoint_id, request.prompt_tokens)
        return Try(model, state, ticket, payload, prefill, decision.tier)

    def _retrying(
        self, request: Request, model: ModelConfig, last: AttemptFailed, endpoint_id: str
    ) -> None:
        self.metrics.retries.labels(model.name, last.kind).inc()
        request.progress.retries += 1
        if request.progress.span is not None:
            request.progress.span.retry(last.endpoint, last.kind, endpoint_id)

    async def _attempt(self, request: Request, at: Try, picked: Picked) -> None:
        """One attempt, accounted when it reached the client; AttemptFailed when it did
        not and another replica may be tried."""
        try:
            delivery = await self.attempt(request, at)
        except AttemptFailed:
            raise
        except BufferFull as exc:
            raise buffer_full_error(exc) from None
        except BaseException:
            # Cancelled (the client left) or a bug: what was relayed still counts.
            if at.partial.ttft is not None:
                self.account.abandoned(request, at, picked)
            raise
        self.account.served(request, at, picked, delivery)

    def _exhausted(
        self, request: Request, attempted: ModelConfig | None, last: AttemptFailed | None
    ) -> HttpError:
        """The refusal of a request no attempt answered."""
        requested = request.body.model
        if attempted is None:
            retry_after = str(max(1, math.ceil(self.cooldown / 3)))
            fallbacks = [m.name for m in request.chain[1:]]
            return HttpError(
                503,
                f"no replica of {requested!r} can take the request now"
                + (f" (fallbacks tried: {', '.join(fallbacks)})" if fallbacks else ""),
                type_="server_error",
                code="no_healthy_replica",
                headers=[(b"retry-after", retry_after.encode())],
            )
        status = 504 if last is not None and last.outcome is Outcome.TIMEOUT else 502
        self.account.unserved(request, attempted.name, status)
        # Endpoints are named as clients see them (public_name): no addresses, no
        # leader's fencing token.
        return HttpError(
            status,
            f"every replica tried failed; the last, endpoint "
            f"{public_name(last.endpoint or '')!r}: {last}"
            if last
            else "no replica was free",
            type_="server_error",
            code="upstream_timeout" if status == 504 else "upstream_error",
        )
