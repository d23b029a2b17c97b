"""Rank the candidate endpoints of one request from a snapshot of their state.

Pure and synchronous: candidates in, a :class:`Decision` out. O(candidates) per
request except the final ordering of fallbacks (a sort of the few candidates).

Estimates (per candidate; see :meth:`Scorer.estimate`)
------------------------------------------------------
Scraped numbers lag by up to a scrape interval; the router's own in-flight count
does not, so it is a floor under the scraped ones. A scraped value counts only while
the candidate is *fresh* (``age <= stale_after``); an absent or stale value is
*unknown*, never 0: it is replaced by the mean of the fresh candidates that report
it (the :class:`Prior`), or by nothing when none does, and the candidate pays a
small uncertainty penalty per unknown metric. Then::

    load = max(running + waiting, inflight)
    w    = waiting, or max(waiting, load - capacity) when the capacity is known
    kv   = kv_usage                              (None when unknown with no prior)

``capacity`` is how many sequences the engine runs at once, when something says so:
the control plane (from the flags it launched the engine with) or the endpoint's
configuration. Nothing guesses it: with no capacity the engine's own queue says when
it is full.

Saturation (:meth:`Scorer.saturated`, :meth:`Scorer.saturation`)
-----------------------------------------------------------------
A replica is full when the engine says so::

    throttled (a recent 429)
    or w >= target_waiting * weight              (its queue)
    or kv >= kv_ceiling                          (its KV cache)
    or load >= capacity                          (every slot taken; known capacity only)

and its saturation level, in [0, 1], is the fullest of those dimensions
(``w / (target_waiting * weight)``, ``kv / kv_ceiling``, ``load / capacity``). A
replica that reports nothing and has no known capacity is full only when it
throttles: its in-flight count orders it among its peers, it never caps it.

Score (:meth:`Scorer.score`, lower is better)::

    (queue * w / target_waiting + inflight * load / LOAD_UNIT) / weight
    + kv_w * kv/kv_ceiling                        (0 when kv is unknown with no prior)
    + UNKNOWN_PENALTY * (number of unknown metrics among waiting, running, kv)
    + staleness * max(0, age - h)/h, h = stale_after/2  (fresh: 0 .. 1)
    + STALE_PENALTY                               (stale or never scraped)
    + THROTTLE_PENALTY                            (throttled)
    - prefix * prefix_match

``LOAD_UNIT`` only scales the load term against the others (a replica ``LOAD_UNIT``
requests busier scores one unit worse); it limits nothing.

Pick (:meth:`Scorer.pick`)
--------------------------
1. Freshness: if any candidate is fresh, stale ones are left out (they stay in
   ``ranked`` as last-resort fallbacks). Stale endpoints are scored down, not dropped.
2. Priority tiers: the eligible set is the unsaturated candidates of the lowest
   priority value that has any; when every candidate is saturated, all are eligible.
3. Session: a session stays on its endpoint if it is eligible and its relative load
   (``load/weight``) is within the guard of the best other eligible one. The guard
   is ``rel_load <= session_load_factor * best_rel_load + 1``; the ``+ 1`` (one
   request) keeps an idle peer from pulling every session off its warm cache.
4. Prefix: the highest prefix match ``m`` wins (ties: lower score) among the
   eligible candidates within the prefix guard ``rel_load <= session_load_factor *
   best_rel_load + max(1, PREFIX_WORTH * m)``: a replica holding the whole prefix is
   worth up to ``PREFIX_WORTH`` extra requests, because a long prompt's prefill costs
   far more than a turn in a running batch. So a prefix stays on its home until the
   home is full by the engine's account (then it is not eligible) or that far above
   the least loaded; it then goes to the replica that holds it next best, which is
   the one it spilled to before (:class:`~llmgw.router.affinity.PrefixTable` ranks a
   second holder at half or more), so spilled traffic warms one more cache instead of
   all of them. When every replica is saturated, affinity still decides among them.
5. Score: the lowest score wins; exact ties (within ``TIE``) are broken at random in
   proportion to weight.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Literal

import attrs

from llmgw.config import RoutingProfile, ScoringConfig

__all__ = [
    "LOAD_UNIT",
    "PREFIX_WORTH",
    "STALE_PENALTY",
    "THROTTLE_PENALTY",
    "UNKNOWN_PENALTY",
    "Candidate",
    "Decision",
    "Estimate",
    "Prior",
    "Scorer",
    "Tier",
]

# In units of one normalised term (a replica at its target scores 1 per term).
UNKNOWN_PENALTY = 0.05
THROTTLE_PENALTY = 1.0
# Far above any realistic sum of terms; pick() also filters stale candidates
# outright, so this only orders them among themselves and in standalone scores.
STALE_PENALTY = 1000.0
TIE = 1e-9
# Requests of load worth one normalised score term; a scale, not a limit.
LOAD_UNIT = 8.0
# Extra requests a replica holding a request's whole prefix may carry over the least
# loaded before the prefix moves on (pick, step 4).
PREFIX_WORTH = 8.0

Tier = Literal["session", "prefix", "score"]


@attrs.frozen
class Candidate:
    """One endpoint's state as scoring sees it, assembled by the endpoint registry."""

    endpoint_id: str
    waiting: float | None
    running: float | None
    kv_usage: float | None
    # The router's own requests in flight to it: scrapes lag, local counts do not.
    inflight: int
    # Seconds since the last successful scrape; None = never scraped.
    age: float | None
    weight: float = 1.0
    # Lower is preferred; a higher value is used only while lower ones are saturated.
    priority: int = 0
    # It answered 429 recently (Breaker.throttled): saturated and scored down.
    throttled: bool = False
    # Sequences the engine runs at once, when known (launch flags, configuration).
    capacity: float | None = None


@attrs.frozen
class Prior:
    """Stand-ins for unknown metrics: means over fresh candidates that report them."""

    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None


@attrs.frozen
class Estimate:
    waiting: float
    load: float
    kv_usage: float | None
    unknown: int  # how many of waiting, running, kv_usage were unknown
    stale: bool


@attrs.frozen
class Decision:
    endpoint_id: str
    tier: Tier
    # The chosen endpoint first, then fallbacks for retries, best first.
    ranked: tuple[str, ...]


@attrs.frozen
class Scorer:
    scoring: ScoringConfig
    profile: RoutingProfile
    stale_after: float

    # -- per candidate ----------------------------------------------------------

    def is_stale(self, c: Candidate) -> bool:
        return c.age is None or c.age > self.stale_after

    def prior(self, candidates: Sequence[Candidate]) -> Prior:
        w_sum = r_sum = k_sum = 0.0
        w_n = r_n = k_n = 0
        for c in candidates:
            if self.is_stale(c):
                continue
            if c.waiting is not None:
                w_sum += c.waiting
                w_n += 1
            if c.running is not None:
                r_sum += c.running
                r_n += 1
            if c.kv_usage is not None:
                k_sum += c.kv_usage
                k_n += 1
        return Prior(
            waiting=w_sum / w_n if w_n else None,
            running=r_sum / r_n if r_n else None,
            kv_usage=k_sum / k_n if k_n else None,
        )

    def estimate(self, c: Candidate, prior: Prior | None = None) -> Estimate:
        stale = self.is_stale(c)
        if stale:
            w, r, k = None, None, None
        else:
            w, r, k = c.waiting, c.running, c.kv_usage
        unknown = 0
        if w is None:
            unknown += 1
            w = prior.waiting if prior is not None and prior.waiting is not None else 0.0
        if r is None:
            unknown += 1
            r = prior.running if prior is not None and prior.running is not None else 0.0
        if k is None:
            unknown += 1
            k = prior.kv_usage if prior is not None else None
        load = max(r + w, float(c.inflight))
        if c.capacity is not None:
            # Past its slots, what we sent queues at the engine, seen or not.
            w = max(w, load - c.capacity)
        return Estimate(waiting=w, load=load, kv_usage=k, unknown=unknown, stale=stale)

    def load(self, c: Candidate, prior: Prior | None = None) -> float:
        return self.estimate(c, prior).load

    def saturated(self, c: Candidate, prior: Prior | None = None) -> bool:
        return self._saturated(c, self.estimate(c, prior))

    def saturation(self, c: Candidate, prior: Prior | None = None) -> float:
        """How full one replica is, in [0, 1]: the fullest of its three dimensions."""
        if c.throttled:
            return 1.0
        s = self.scoring
        e = self.estimate(c, prior)
        level = e.waiting / (s.target_waiting * c.weight)
        if e.kv_usage is not None:
            level = max(level, e.kv_usage / s.kv_ceiling)
        if c.capacity is not None:
            level = max(level, e.load / c.capacity)
        return min(1.0, max(0.0, level))

    def score(self, c: Candidate, prefix_match: float = 0.0, prior: Prior | None = None) -> float:
        return self._score(c, self.estimate(c, prior), prefix_match)

    # -- pool -------------------------------------------------------------------

    def pool_saturation(self, candidates: Sequence[Candidate]) -> float:
        """Capacity-weighted mean of :meth:`saturation` over the replicas, in [0, 1].

        No replicas gives 1.0: nothing can be admitted. Stale or absent metrics fall
        back to the prior and own in-flight counts, like scoring.
        """
        if not candidates:
            return 1.0
        prior = self.prior(candidates)
        total = weights = 0.0
        for c in candidates:
            total += c.weight * self.saturation(c, prior)
            weights += c.weight
        return total / weights if weights > 0 else 1.0

    def pick(
        self,
        candidates: Sequence[Candidate],
        *,
        session_endpoint: str | None,
        prefix_matches: Mapping[str, float],
        rng: random.Random,
    ) -> Decision | None:
        """Choose an endpoint (see the module docstring); None when there are no candidates."""
        if not candidates:
            return None
        prior = self.prior(candidates)
        factor = self.scoring.session_load_factor
        n = len(candidates)
        ests = [self.estimate(c, prior) for c in candidates]
        sats = [self._saturated(c, e) for c, e in zip(candidates, ests, strict=True)]
        scores = [
            self._score(c, e, prefix_matches.get(c.endpoint_id, 0.0))
            for c, e in zip(candidates, ests, strict=True)
        ]

        any_fresh = not all(e.stale for e in ests)
        tier: int | None = None
        for i in range(n):
            if not sats[i] and not (any_fresh and ests[i].stale):
                p = candidates[i].priority
                if tier is None or p < tier:
                    tier = p
        eligible = [
            i
            for i in range(n)
            if not (any_fresh and ests[i].stale)
            and (tier is None or (not sats[i] and candidates[i].priority == tier))
        ]
        rel = [ests[i].load / candidates[i].weight for i in range(n)]

        chosen: int | None = None
        kind: Tier = "score"
        if session_endpoint is not None:
            s = next((i for i in eligible if candidates[i].endpoint_id == session_endpoint), None)
            if s is not None:
                best_other = min((rel[i] for i in eligible if i != s), default=None)
                if best_other is None or rel[s] <= factor * best_other + 1.0:
                    chosen, kind = s, "session"

        if chosen is None and prefix_matches:
            # A cached prefix saves its prefill, the expensive part of a long prompt, and
            # keeps the prefix from being cached (and evicting another) elsewhere: so the
            # prefix guard is looser than the session one. It still caps the pile-up: a
            # hot prefix spreads once its home is PREFIX_WORTH * m above the least loaded.
            base = factor * min(rel[i] for i in eligible)
            best_match = 0.0
            for i in eligible:
                m = prefix_matches.get(candidates[i].endpoint_id, 0.0)
                if m <= 0.0 or rel[i] > base + max(1.0, PREFIX_WORTH * m):
                    continue
                if (
                    chosen is None
                    or m > best_match
                    or (m == best_match and scores[i] < scores[chosen])
                ):
                    chosen, best_match = i, m
            if chosen is not None:
                kind = "prefix"

        if chosen is None:
            best = min(scores[i] for i in eligible)
            near = [i for i in eligible if scores[i] <= best + TIE]
            chosen = near[0] if len(near) == 1 else _weighted_choice(candidates, near, rng)

        eligible_set = set(eligible)
        order = sorted(
            (i for i in range(n) if i != chosen),
            key=lambda i: (
                ests[i].stale,
                i not in eligible_set,
                sats[i],
                candidates[i].priority,
                scores[i],
            ),
        )
        ranked = (candidates[chosen].endpoint_id, *(candidates[i].endpoint_id for i in order))
        return Decision(endpoint_id=candidates[chosen].endpoint_id, tier=kind, ranked=ranked)

    # -- internals --------------------------------------------------------------

    def _saturated(self, c: Candidate, e: Estimate) -> bool:
        """Full by the engine's account: a 429, its queue, its KV cache, or its slots."""
        s = self.scoring
        return (
            c.throttled
            or e.waiting >= s.target_waiting * c.weight
            or (e.kv_usage is not None and e.kv_usage >= s.kv_ceiling)
            or (c.capacity is not None and e.load >= c.capacity)
        )

    def _score(self, c: Candidate, e: Estimate, prefix_match: float) -> float:
        s, p = self.scoring, self.profile
        total = (
            p.queue * e.waiting / s.target_waiting + p.inflight * e.load / LOAD_UNIT
        ) / c.weight
        if e.kv_usage is not None:
            total += p.kv * e.kv_usage / s.kv_ceiling
        total += UNKNOWN_PENALTY * e.unknown
        if e.stale:
            total += STALE_PENALTY
        elif c.age is not None:
            # No penalty for the first half of stale_after: scrapes a few milliseconds
            # apart must not decide between idle peers (that would send every request of
            # a quiet period to whichever was scraped last).
            half = self.stale_after / 2
            total += p.staleness * max(0.0, c.age - half) / half
        if c.throttled:
            total += THROTTLE_PENALTY
        return total - p.prefix * prefix_match


def _weighted_choice(
    candidates: Sequence[Candidate], indices: list[int], rng: random.Random
) -> int:
    total = 0.0
    for i in indices:
        total += candidates[i].weight
    x = rng.random() * total
    for i in indices:
        x -= candidates[i].weight
        if x < 0:
            return i
    return indices[-1]
