"""The pipeline's scheduling stage: which replica of a model a request goes to.

What it needs of the request is gathered first (its prompt's leading text, hashed per
model; its token ids where the engines publish their KV-cache index), the memories'
``prepare`` hooks add what they know (llmgw.router.scheduling.hooks), the model's
routing profile picks (pure: llmgw.router.scheduling.scheduler), and the
``pre_request`` hooks hear of the pick.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs
import trio

from llmgw.router.body import BIG_BODY, BodyError
from llmgw.router.kv_events import KVEvents, tokenize_body
from llmgw.router.pipeline.request import engine_of
from llmgw.router.refusal import HttpError
from llmgw.router.scheduling.hooks import Ask, Facts, Hooks

if TYPE_CHECKING:
    from llmgw.domain.catalog import ModelConfig
    from llmgw.router.affinity import PrefixIndex
    from llmgw.router.endpoints import EndpointRegistry, EndpointState
    from llmgw.router.kv_events import Exact
    from llmgw.router.metrics import RouterMetrics
    from llmgw.router.pipeline.request import Request
    from llmgw.router.scheduling import Decision, Scheduler

__all__ = ["Picked", "Prompt", "Schedule"]


@attrs.frozen
class Picked:
    """A pick, and what its ``pre_request`` hooks noted for their ``complete``."""

    ask: Ask
    decision: Decision
    notes: Mapping[int, object]  # id(plugin) -> its note


@attrs.define
class Prompt:
    """What scheduling learnt of one request's prompt, asked once per request."""

    text: str | None
    # Token ids per model (its engines' tokenizer), None where tokenizing failed.
    tokens: dict[str, list[int] | None] = attrs.field(factory=dict)


class Schedule:
    """Candidates, the profile's pick, and the hooks around it."""

    def __init__(
        self,
        schedulers: Mapping[str, Scheduler],
        default_profile: str,
        hooks: Hooks,
        endpoints: EndpointRegistry,
        metrics: RouterMetrics,
        *,
        prefixes: PrefixIndex | None,
        kv_events: KVEvents | None,
        big_parses: trio.CapacityLimiter,
        rng: random.Random,
        rendezvous: bool = False,
    ) -> None:
        """`prefixes` hashes prompts (None: prefix affinity off); `kv_events`, the
        engines' own indexes (None: no endpoint publishes one); `big_parses`, the
        client app's limiter for parses of large bodies in a worker thread; with
        `rendezvous` a session or prompt this router has not routed goes to the home
        its key hashes to (scheduling.plugins.Rendezvous)."""
        self.schedulers = schedulers
        self.default_profile = default_profile
        self.hooks = hooks
        self.endpoints = endpoints
        self.metrics = metrics
        self.prefixes = prefixes
        self.kv = kv_events
        self._big_parses = big_parses
        self.rng = rng
        self.rendezvous = rendezvous

    def scheduler_for(self, model: ModelConfig) -> Scheduler:
        return self.schedulers[model.routing_profile or self.default_profile]

    async def prompt(self, request: Request) -> Prompt:
        """The prompt text prefix affinity hashes (None with it off); a large body's is
        decoded in a worker thread, one at a time."""
        prefixes = self.prefixes
        if prefixes is None:
            return Prompt(None)
        body = request.body
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
        return Prompt(prefixes.text(fields))

    def usable(
        self, request: Request, model: ModelConfig, tried: set[str], now: float
    ) -> list[EndpointState]:
        """`model`'s replicas this request may still try now."""
        return [
            s
            for s in self.endpoints.serving(model.name)
            if s.endpoint.id not in tried
            and s.breaker.allows(now)
            and request.route.served_by(engine_of(s))
            and (request.pinned is None or s.endpoint.id == request.pinned)
        ]

    async def pick(
        self, request: Request, model: ModelConfig, usable: list[EndpointState], prompt: Prompt
    ) -> Picked | None:
        """Pick one of `usable` (None when it is empty) and tell the hooks."""
        if not usable:
            return None
        prefixes = self.prefixes
        prefix = prefixes.chain(prompt.text, model.name) if prefixes and prompt.text else ()
        exact = None
        kv = self.kv
        if kv is not None and kv.covers(s.endpoint.id for s in usable):
            exact = await self._exact(request, model, usable, kv, prompt)
        ask = Ask(model.name, request.session_key, prefix, request.prompt_tokens, exact)
        now = trio.current_time()
        facts = Facts()
        for hook in self.hooks.prepare:
            hook.prepare(ask, facts, now)
        home_key = None
        if self.rendezvous:
            home_key = (
                hash(("session", ask.session_key)) if ask.session_key else (prefix or (None,))[0]
            )
        decision = self.scheduler_for(model).pick(
            [s.candidate(now) for s in usable],
            session_endpoint=facts.session_endpoint,
            prefix_matches=facts.prefix_matches,
            rng=self.rng,
            prompt_tokens=ask.prompt_tokens,
            cached_tokens=facts.cached_tokens,
            home_key=home_key,
        )
        if decision is None:
            return None
        notes = {id(h): h.pre_request(ask, decision, now) for h in self.hooks.pre_request}
        self.metrics.decisions.labels(model.name, decision.tier).inc()
        if decision.spill is not None:
            self.metrics.spills.labels(model.name, *decision.spill).inc()
            request.progress.spills += (decision.spill,)
        return Picked(ask, decision, notes)

    def sent(self, picked: Picked, endpoint_id: str, prompt: Prompt) -> None:
        """An attempt goes to `endpoint_id`: the engines' indexes expect its blocks."""
        kv = self.kv
        if kv is not None:
            ids = prompt.tokens.get(picked.ask.model)
            kv.sent(endpoint_id, kv.owes(endpoint_id, ids), trio.current_time())

    async def _exact(
        self,
        request: Request,
        model: ModelConfig,
        usable: list[EndpointState],
        kv: KVEvents,
        prompt: Prompt,
    ) -> Exact | None:
        """What the engines' own indexes say the usable replicas hold of this prompt,
        for those whose KV-cache events are up; None (the estimated table decides)
        when none is, or the prompt could not be tokenized in time."""
        feeds = kv.up_feeds((s.endpoint.id for s in usable), trio.current_time())
        if not feeds:
            kv.lookups.labels(model.name, "down").inc()
            return None
        members = getattr(request.body, "members", None)  # a form body has none
        body = tokenize_body(model.name, members) if members is not None else None
        if body is None:  # no prompt to look up (an embedding's input, a form)
            kv.lookups.labels(model.name, "no_prompt").inc()
            return None
        if any(model.name in f.loras for f in feeds):
            # A LoRA adapter's blocks are keyed by it as well as by their tokens.
            kv.lookups.labels(model.name, "lora").inc()
            return None
        if model.name not in prompt.tokens:
            ids = None
            # Any of them tokenizes as the others would: spread the asking.
            tokenizer = self.endpoints.get(self.rng.choice(feeds).endpoint_id)
            if tokenizer is not None:
                e = tokenizer.endpoint
                ids = await kv.tokenize(e.url, e.headers, body)
            prompt.tokens[model.name] = ids
        ids = prompt.tokens[model.name]
        if ids is None:
            kv.lookups.labels(model.name, "failed").inc()
            return None
        kv.lookups.labels(model.name, "exact").inc()
        return kv.exact(ids, feeds, request.prompt_tokens)
