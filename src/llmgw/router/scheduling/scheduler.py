"""The scheduler: filters narrow the candidates, scorers rank the survivors, a picker
chooses. Pure and synchronous: candidates in, a :class:`Decision` out.

One request's pass (:meth:`Scheduler.pick`):

1. A :class:`Context` is made once: every candidate's :class:`~.state.Estimate`, the
   :class:`~.state.Prior`, who is saturated, and each one's relative load
   (``load / weight``). Plugins read it; none recomputes it.
2. Each :class:`Filter`, in order, keeps a subset of the survivors of the one before
   (an empty answer keeps them all: a request always has somewhere to go). An
   affinity filter that decides names the decision by setting ``ctx.tier``
   (``"session"``, ``"prefix"``); later affinity filters leave a decided request
   alone. Otherwise the tier is ``"score"``.
3. Every survivor's cost is the weighted sum of the :class:`Scorer` plugins' values
   (lower is better; weights are the routing profile's).
4. The :class:`Picker` chooses among the survivors by cost.

Ranked fallbacks (for retries) follow the chosen one: the candidates that survived
more filters first, then the unsaturated, then lower priority values, then lower cost.

Plugins are small objects with one method. A library user composes their own
(``llmgw.Router(config, schedulers={"chat": ...})``); the built-in routing profiles
are compositions of the plugins in :mod:`.plugins` (:func:`.plugins.default_scheduler`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Protocol

import attrs

from llmgw.router.scheduling.state import Candidate, Estimate, Prior, Saturation

__all__ = [
    "MISS_WEIGHT",
    "Context",
    "Decision",
    "Filter",
    "Picker",
    "Scheduler",
    "Scorer",
    "Spill",
]

# A prompt's tokens a replica does not hold count twice in its prefill work: they are
# computed there, and they take cache blocks that held someone else's prefix, which
# its owner then computes again (in a full cache; an emptier one loses nothing, but
# the router cannot see which).
MISS_WEIGHT = 2.0


@attrs.frozen
class Decision:
    endpoint_id: str
    # The filter that decided ("session", "prefix"), or "score".
    tier: str
    # The chosen endpoint first, then fallbacks for retries, best first.
    ranked: tuple[str, ...]
    # Per endpoint, the estimated tokens of this prompt it would have to prefill (what
    # the router charges to its prefill work while the request has no first token).
    uncached: Mapping[str, float] = attrs.field(factory=dict)
    # Per endpoint, the estimated tokens of this prompt its prefix cache holds.
    held: Mapping[str, float] = attrs.field(factory=dict)
    # The request had a home (its session's replica, or replicas holding its prefix)
    # and went elsewhere: (affinity, reason), see :class:`Spill`.
    spill: tuple[str, str] | None = None


@attrs.frozen
class Spill:
    """An affinity filter passed over a request's home(s): why, and which they were.

    `affinity` is ``"session"`` or ``"prefix"``; `reason` is ``"work"`` (the home had
    more prefill work than a miss elsewhere costs), ``"load"`` (the cache_aware rule's
    balance thresholds), ``"throttled"`` (it answered 429), ``"priority"`` (a replica
    with room on a preferred tier) or ``"gone"`` (not a candidate: left, stale, its
    breaker open). Counted only when the pick lands outside `homes`.
    """

    affinity: str
    reason: str
    homes: frozenset[str]


@attrs.define
class Context:
    """One request's view of its candidates, computed once per pick."""

    candidates: Sequence[Candidate]
    estimates: list[Estimate]
    prior: Prior
    saturated: list[bool]
    rel_load: list[float]  # load / weight
    session_endpoint: str | None
    prefix_matches: Mapping[str, float]
    rng: random.Random
    saturation: Saturation
    # The request's estimated prompt tokens, and per endpoint the tokens of it that
    # endpoint holds in its prefix cache (from the prefix table; absent: none).
    prompt_tokens: float = 0.0
    cached_tokens: Mapping[str, float] = attrs.field(factory=dict)
    # The request's affinity key (its session's, else its prompt's first block), when
    # routers that do not share their tables must agree on its home (Rendezvous).
    home_key: int | None = None
    # Set by the affinity filter that decided, if any.
    tier: str | None = None
    # Set by an affinity filter that passed over the request's home (the first one).
    spill: Spill | None = None

    def prefix_match(self, i: int) -> float:
        return self.prefix_matches.get(self.candidates[i].endpoint_id, 0.0)

    def uncached(self, i: int, unknown_held: float = 0.0) -> float:
        """Tokens of this prompt candidate `i` would have to prefill; `unknown_held` is
        what it is taken to hold where the prefix table says nothing of it."""
        held = self.cached_tokens.get(self.candidates[i].endpoint_id, unknown_held)
        return max(0.0, self.prompt_tokens - held)

    def work(self, i: int, unknown_held: float = 0.0) -> float:
        """Candidate `i`'s prefill work if it took this request, per unit of weight:
        what it still has to prefill, plus this prompt's part it does not hold counted
        :data:`MISS_WEIGHT` times."""
        c = self.candidates[i]
        return (c.prefill + MISS_WEIGHT * self.uncached(i, unknown_held)) / c.weight


class Filter(Protocol):
    """Keeps some of the candidates (by index into ``ctx.candidates``)."""

    def filter(self, ctx: Context, survivors: list[int]) -> list[int]:
        """A non-empty subset of `survivors` (`survivors` itself to keep all)."""
        ...


class Scorer(Protocol):
    """One term of a candidate's cost: lower is better, about 0..1 for a full replica."""

    def cost(self, ctx: Context, i: int) -> float: ...


class Picker(Protocol):
    """Chooses one of the survivors, given each one's cost."""

    def pick(self, ctx: Context, survivors: list[int], costs: list[float]) -> int: ...


@attrs.frozen
class Scheduler:
    """Filters, weighted scorers and a picker over one saturation model."""

    saturation: Saturation
    filters: tuple[Filter, ...]
    scorers: tuple[tuple[Scorer, float], ...]  # (plugin, weight)
    picker: Picker

    def context(
        self,
        candidates: Sequence[Candidate],
        *,
        session_endpoint: str | None = None,
        prefix_matches: Mapping[str, float] | None = None,
        rng: random.Random | None = None,
        prompt_tokens: float = 0.0,
        cached_tokens: Mapping[str, float] | None = None,
        home_key: int | None = None,
    ) -> Context:
        sat = self.saturation
        prior = sat.prior(candidates)
        ests = [sat.estimate(c, prior) for c in candidates]
        return Context(
            candidates=candidates,
            estimates=ests,
            prior=prior,
            saturated=[sat.full(c, e) for c, e in zip(candidates, ests, strict=True)],
            rel_load=[e.load / c.weight for c, e in zip(candidates, ests, strict=True)],
            session_endpoint=session_endpoint,
            prefix_matches=prefix_matches or {},
            rng=rng or random.Random(0),
            saturation=sat,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens or {},
            home_key=home_key,
        )

    def cost(self, ctx: Context, i: int) -> float:
        total = 0.0
        for scorer, weight in self.scorers:
            if weight:
                total += weight * scorer.cost(ctx, i)
        return total

    def score(self, c: Candidate, prefix_match: float = 0.0, prior: Prior | None = None) -> float:
        """One candidate's cost on its own (for display), as :meth:`pick` would rank it."""
        ctx = self.context([c], prefix_matches={c.endpoint_id: prefix_match})
        if prior is not None:
            ctx.prior = prior
            ctx.estimates[0] = self.saturation.estimate(c, prior)
        return self.cost(ctx, 0)

    def pick(
        self,
        candidates: Sequence[Candidate],
        *,
        session_endpoint: str | None,
        prefix_matches: Mapping[str, float],
        rng: random.Random,
        prompt_tokens: float = 0.0,
        cached_tokens: Mapping[str, float] | None = None,
        home_key: int | None = None,
    ) -> Decision | None:
        """Choose an endpoint (see the module docstring); None when there are no candidates."""
        if not candidates:
            return None
        ctx = self.context(
            candidates,
            session_endpoint=session_endpoint,
            prefix_matches=prefix_matches,
            rng=rng,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            home_key=home_key,
        )
        n = len(candidates)
        survived = [0] * n  # how many filters each candidate passed
        survivors = list(range(n))
        for f in self.filters:
            kept = f.filter(ctx, survivors) or survivors
            for i in kept:
                survived[i] += 1
            survivors = kept
        costs = [self.cost(ctx, i) for i in range(n)]
        chosen = survivors[0] if len(survivors) == 1 else self.picker.pick(ctx, survivors, costs)
        sats = ctx.saturated
        order = sorted(
            (i for i in range(n) if i != chosen),
            key=lambda i: (-survived[i], sats[i], candidates[i].priority, costs[i]),
        )
        ranked = (candidates[chosen].endpoint_id, *(candidates[i].endpoint_id for i in order))
        tier = ctx.tier or "score"
        uncached = {candidates[i].endpoint_id: ctx.uncached(i) for i in range(n)}
        chosen_id = candidates[chosen].endpoint_id
        spill = ctx.spill
        return Decision(
            endpoint_id=chosen_id,
            tier=tier,
            ranked=ranked,
            uncached=uncached,
            held=ctx.cached_tokens,
            spill=None
            if spill is None or chosen_id in spill.homes
            else (spill.affinity, spill.reason),
        )
