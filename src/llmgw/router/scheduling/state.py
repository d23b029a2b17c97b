"""How full a replica is, by its engine's own account: candidates, estimates, saturation.

Pure values and arithmetic, shared by the scheduler (which replica) and admission (how
full a model's pool is).

Estimates (:meth:`Saturation.estimate`)
---------------------------------------
Scraped numbers lag by up to a scrape interval; the router's own in-flight count
does not, so it is a floor under the scraped ones. A scraped value counts only while
the candidate is *fresh* (``age <= stale_after``); an absent or stale value is
*unknown*, never 0: it is replaced by the mean of the fresh candidates that report
it (the :class:`Prior`), or by nothing when none does. Then::

    load = max(running + waiting, inflight)
    w    = waiting, or max(waiting, load - capacity) when the capacity is known
    kv   = kv_usage                              (None when unknown with no prior)

``capacity`` is how many sequences the engine runs at once, when something says so:
the control plane (from the flags it launched the engine with), the endpoint's
configuration, or the engine itself (llama.cpp's ``/props``). Nothing guesses it:
without one, the engine's own queue alone says when it is full. (A capacity learned
from the queue was tried and measured: on an engine that queues for its step's token
budget, not its sequence limit, it learned the number running then as the limit and
held the engine there, at half its throughput; benchmarks/results/history-to-2026-12-07.md,
"2026-12-02 (later): routing_quality after prefill-work affinity".)

Saturation (:meth:`Saturation.saturated`, :meth:`Saturation.level`)
-------------------------------------------------------------------
A replica is full when the engine says so::

    throttled (a recent 429)
    or w >= target_waiting * weight              (its queue)
    or kv >= kv_ceiling                          (its KV cache)
    or load >= capacity                          (every slot taken; known capacity only)

and its saturation level, in [0, 1], is the fullest of those dimensions
(``w / (target_waiting * weight)``, ``kv / kv_ceiling``, ``load / capacity``; 1 when
throttled). A replica that reports nothing and has no known capacity is full only
when it throttles: its in-flight count orders it among its peers, it never caps it.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from llmgw.config import ScoringConfig

__all__ = ["Candidate", "Estimate", "Prior", "Saturation"]


@attrs.frozen
class Candidate:
    """One endpoint's state as the scheduler sees it, assembled by the endpoint registry."""

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
    # The endpoint's pool (configuration): for plugins that prefer one over another.
    pool: str = "default"
    # Estimated uncached prompt tokens of the router's requests to it that have not had
    # their first token yet: the prefill work it still has ahead (the router's count).
    prefill: float = 0.0


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
class Saturation:
    """The engine-account model of one configuration (see the module docstring)."""

    scoring: ScoringConfig
    stale_after: float

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
        return self.full(c, self.estimate(c, prior))

    def full(self, c: Candidate, e: Estimate) -> bool:
        """Full by the engine's account: a 429, its queue, its KV cache, or its slots."""
        s = self.scoring
        return (
            c.throttled
            or e.waiting >= s.target_waiting * c.weight
            or (e.kv_usage is not None and e.kv_usage >= s.kv_ceiling)
            or (c.capacity is not None and e.load >= c.capacity)
        )

    def level(self, c: Candidate, prior: Prior | None = None) -> float:
        """How full one replica is, in [0, 1]: the fullest of its dimensions."""
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

    def pool(self, candidates: Sequence[Candidate]) -> float:
        """Capacity-weighted mean of :meth:`level` over the replicas, in [0, 1].

        No replicas gives 1.0: nothing can be admitted. Stale or absent metrics fall
        back to the prior and own in-flight counts, like scheduling.
        """
        if not candidates:
            return 1.0
        prior = self.prior(candidates)
        total = weights = 0.0
        for c in candidates:
            total += c.weight * self.level(c, prior)
            weights += c.weight
        return total / weights if weights > 0 else 1.0
