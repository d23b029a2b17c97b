"""The built-in filters, scorers and picker, and the routing profiles made of them.

:func:`default_scheduler` is what every ``[router.profiles.*]`` entry runs::

    filters:  Fresh -> Room -> SessionAffinity -> PrefixAffinity
    scorers:  Queue*queue + Load*inflight + KvCache*kv + Staleness*staleness
              + Unknown + Stale + Throttle + PrefixBonus*prefix   (weights: the profile)
    picker:   LowestCost (exact ties at random, in proportion to weight)

Filters
-------
* :class:`Fresh`: if any candidate is fresh, stale ones are left out (they stay in
  ``ranked`` as last-resort fallbacks).
* :class:`Room`: the unsaturated candidates of the lowest priority value that has
  any; when every candidate is saturated, all of them.
* :class:`SessionAffinity`: a session stays on its endpoint if that survived and its
  relative load (``load/weight``) is within ``load_factor * best_other + 1``; the
  ``+ 1`` (one request) keeps an idle peer from pulling every session off its warm
  cache.
* :class:`PrefixAffinity`: the highest prefix match ``m`` wins among the survivors
  within ``load_factor * least + max(1, worth * m)``: a replica holding the whole
  prefix is worth up to ``worth`` (:data:`PREFIX_WORTH`) extra requests, because a
  long prompt's prefill costs far more than a turn in a running batch. So a prefix
  stays on its home until the home is full by its engine's account (Room left it
  out) or that far above the least loaded; it then goes to the replica that holds it
  next best, the one it spilled to before (the prefix table ranks a second holder at
  half or more), so spilled traffic warms one more cache instead of all of them.
  When every replica is saturated, affinity still decides among them.

Scorers (cost, lower is better; a replica at its targets scores about 1 per term)
------------------------------------------------------------------------------------
``Queue``: ``w / target_waiting / weight``; ``Load``: ``load / LOAD_UNIT / weight``
(a scale, not a limit); ``KvCache``: ``kv / kv_ceiling`` (0 when unknown with no
prior); ``Staleness``: ``max(0, age - h) / h`` with ``h = stale_after / 2`` (no
penalty in the first half, so scrapes milliseconds apart do not decide between idle
peers); ``Unknown``: :data:`UNKNOWN_PENALTY` per unknown metric; ``Stale``:
:data:`STALE_PENALTY`; ``Throttle``: :data:`THROTTLE_PENALTY` after a 429;
``PrefixBonus``: ``-m``.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from llmgw.config import RoutingProfile, ScoringConfig
from llmgw.router.scheduling.pipeline import Context, Filter, Picker, Scheduler, Scorer
from llmgw.router.scheduling.state import Saturation

__all__ = [
    "LOAD_UNIT",
    "PREFIX_WORTH",
    "STALE_PENALTY",
    "THROTTLE_PENALTY",
    "TIE",
    "UNKNOWN_PENALTY",
    "Fresh",
    "KvCache",
    "Load",
    "LowestCost",
    "PrefixAffinity",
    "PrefixBonus",
    "Queue",
    "Room",
    "SessionAffinity",
    "Stale",
    "Staleness",
    "Throttle",
    "Unknown",
    "default_scheduler",
    "default_schedulers",
]

# In units of one normalised term (a replica at its target scores 1 per term).
UNKNOWN_PENALTY = 0.05
THROTTLE_PENALTY = 1.0
# Far above any realistic sum of terms; Fresh also filters stale candidates
# outright, so this only orders them among themselves and in standalone scores.
STALE_PENALTY = 1000.0
TIE = 1e-9
# Requests of load worth one normalised score term; a scale, not a limit.
LOAD_UNIT = 8.0
# Extra requests a replica holding a request's whole prefix may carry over the least
# loaded before the prefix moves on.
PREFIX_WORTH = 8.0


# -- filters ----------------------------------------------------------------------------


@attrs.frozen
class Fresh:
    def filter(self, ctx: Context, survivors: list[int]) -> list[int]:
        fresh = [i for i in survivors if not ctx.estimates[i].stale]
        return fresh or survivors


@attrs.frozen
class Room:
    def filter(self, ctx: Context, survivors: list[int]) -> list[int]:
        room = [i for i in survivors if not ctx.saturated[i]]
        if not room:
            return survivors
        best = min(ctx.candidates[i].priority for i in room)
        return [i for i in room if ctx.candidates[i].priority == best]


@attrs.frozen
class SessionAffinity:
    load_factor: float

    def filter(self, ctx: Context, survivors: list[int]) -> list[int]:
        if ctx.tier is not None or ctx.session_endpoint is None:
            return survivors
        s = next(
            (i for i in survivors if ctx.candidates[i].endpoint_id == ctx.session_endpoint), None
        )
        if s is None:
            return survivors
        rel = ctx.rel_load
        best_other = min((rel[i] for i in survivors if i != s), default=None)
        if best_other is not None and rel[s] > self.load_factor * best_other + 1.0:
            return survivors
        ctx.tier = "session"
        return [s]


@attrs.frozen
class PrefixAffinity:
    load_factor: float
    worth: float = PREFIX_WORTH

    def filter(self, ctx: Context, survivors: list[int]) -> list[int]:
        if ctx.tier is not None or not ctx.prefix_matches:
            return survivors
        rel = ctx.rel_load
        base = self.load_factor * min(rel[i] for i in survivors)
        best, kept = 0.0, []
        for i in survivors:
            m = ctx.prefix_match(i)
            if m <= 0.0 or rel[i] > base + max(1.0, self.worth * m):
                continue
            if m > best:
                best, kept = m, [i]
            elif m == best:
                kept.append(i)
        if not kept:
            return survivors
        ctx.tier = "prefix"
        return kept


# -- scorers ----------------------------------------------------------------------------


@attrs.frozen
class Queue:
    target_waiting: float

    def cost(self, ctx: Context, i: int) -> float:
        return ctx.estimates[i].waiting / self.target_waiting / ctx.candidates[i].weight


@attrs.frozen
class Load:
    unit: float = LOAD_UNIT

    def cost(self, ctx: Context, i: int) -> float:
        return ctx.estimates[i].load / self.unit / ctx.candidates[i].weight


@attrs.frozen
class KvCache:
    kv_ceiling: float

    def cost(self, ctx: Context, i: int) -> float:
        kv = ctx.estimates[i].kv_usage
        return 0.0 if kv is None else kv / self.kv_ceiling


@attrs.frozen
class Staleness:
    stale_after: float

    def cost(self, ctx: Context, i: int) -> float:
        age = ctx.candidates[i].age
        if age is None or ctx.estimates[i].stale:
            return 0.0  # Stale's to count
        half = self.stale_after / 2
        return max(0.0, age - half) / half


@attrs.frozen
class Unknown:
    def cost(self, ctx: Context, i: int) -> float:
        return UNKNOWN_PENALTY * ctx.estimates[i].unknown


@attrs.frozen
class Stale:
    def cost(self, ctx: Context, i: int) -> float:
        return STALE_PENALTY if ctx.estimates[i].stale else 0.0


@attrs.frozen
class Throttle:
    def cost(self, ctx: Context, i: int) -> float:
        return THROTTLE_PENALTY if ctx.candidates[i].throttled else 0.0


@attrs.frozen
class PrefixBonus:
    def cost(self, ctx: Context, i: int) -> float:
        return -ctx.prefix_match(i)


# -- picker -----------------------------------------------------------------------------


@attrs.frozen
class LowestCost:
    """The lowest cost; exact ties (within :data:`TIE`) at random in proportion to weight."""

    def pick(self, ctx: Context, survivors: list[int], costs: list[float]) -> int:
        best = min(costs[i] for i in survivors)
        near = [i for i in survivors if costs[i] <= best + TIE]
        if len(near) == 1:
            return near[0]
        total = 0.0
        for i in near:
            total += ctx.candidates[i].weight
        x = ctx.rng.random() * total
        for i in near:
            x -= ctx.candidates[i].weight
            if x < 0:
                return i
        return near[-1]


# -- profiles ---------------------------------------------------------------------------


def default_scheduler(
    scoring: ScoringConfig,
    profile: RoutingProfile,
    stale_after: float,
    *,
    filters: tuple[Filter, ...] = (),
    scorers: tuple[tuple[Scorer, float], ...] = (),
    picker: Picker | None = None,
) -> Scheduler:
    """The built-in composition for one routing profile; `filters` run after the
    built-in ones, `scorers` add to the built-in terms, `picker` replaces LowestCost."""
    f = scoring.session_load_factor
    return Scheduler(
        saturation=Saturation(scoring, stale_after),
        filters=(Fresh(), Room(), SessionAffinity(f), PrefixAffinity(f), *filters),
        scorers=(
            (Queue(scoring.target_waiting), profile.queue),
            (Load(), profile.inflight),
            (KvCache(scoring.kv_ceiling), profile.kv),
            (Staleness(stale_after), profile.staleness),
            (Unknown(), 1.0),
            (Stale(), 1.0),
            (Throttle(), 1.0),
            (PrefixBonus(), profile.prefix),
            *scorers,
        ),
        picker=picker or LowestCost(),
    )


def default_schedulers(
    scoring: ScoringConfig, profiles: Mapping[str, RoutingProfile], stale_after: float
) -> dict[str, Scheduler]:
    return {name: default_scheduler(scoring, p, stale_after) for name, p in profiles.items()}
