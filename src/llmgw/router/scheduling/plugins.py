"""The built-in filters, scorers and picker.

What a ``[router.profiles.*]`` entry runs unless it names its own plugins
(llmgw.router.scheduling.registry, where each of these has its name)::

    filters:  Fresh -> SessionAffinity -> PrefixAffinity -> Room -> Rendezvous
    scorers:  Queue*queue + Load*inflight + Prefill*prefill + KvCache*kv
              + Staleness*staleness + Unknown + Stale + Throttle + PrefixBonus*prefix
              (weights: the profile)
    picker:   LowestCost (exact ties at random, in proportion to weight)

Filters
-------
* :class:`Fresh`: if any candidate is fresh, stale ones are left out (they stay in
  ``ranked`` as last-resort fallbacks).
* :class:`Room`: the unsaturated candidates of the lowest priority value that has
  any; when every candidate is saturated, all of them.
* :class:`SessionAffinity` and :class:`PrefixAffinity` decide by *prefill work*:
  a replica's work for a request is the prompt tokens it still has to prefill for
  the router's requests that have not had their first token (``Candidate.prefill``)
  plus the tokens of this prompt its prefix cache does not hold, counted twice
  (:data:`~.scheduler.MISS_WEIGHT`: computed there, and evicting another prefix that
  is then computed again), per unit of weight
  (:meth:`~.scheduler.Context.work`). A cache miss on a 2,000-token prompt is 4,000
  tokens of work; a queue of requests that hit the cache is a few hundred. So a
  prompt stays on the replica that holds it until that replica has more prefill
  ahead of it than a miss elsewhere would cost, the trade llm-d's 2026 scheduler
  makes with its count of uncached prefill tokens in flight. Prompt sizes are
  estimated from bytes (``usage.BYTES_PER_TOKEN``), which all replicas share, so
  the comparison holds without a tokenizer. The engine's reported queue does not
  enter the work: tried as a floor (its queue times what a request there recently
  had to prefill), each of two workers then counted the other's backlog too and hot
  prefixes spilled sooner (llmgw-sim prefill-heavy, closed-loop TTFT p90 668 and
  1205 ms against 280 and 187 without it, uniform and Zipf; issue #31's results).

  - :class:`SessionAffinity` (before Room): a session stays on its replica unless
    another fresh replica's work is lower, its own answered 429, or it is on a
    higher priority value than a replica with room; also when its engine is full:
    moving a conversation computes all of it again, and the engine's queue holds
    the turn meanwhile. (Measured: leaving full replicas moved the sessions the
    queue would have served sooner from their cache, and halved a 4-slot fleet's
    throughput; benchmarks/results/history-to-2026-12-07.md, "2026-12-02 (later):
    routing_quality after prefill-work affinity".) Where the prefix table says nothing of the
    session's replica (hashing off, a prompt shorter than a block) it is taken to
    hold the whole conversation.
  - :class:`PrefixAffinity` (before Room too): when a replica holds part of the
    prompt, the ones with the least work (within :data:`WORK_TIE`) are kept, among
    the holders and the replicas with room (in Room's priority tier; not one that
    answered 429). A full holder is left for another holder with room (the overflow
    warms no third cache); with none, it stays a candidate, for the session's
    reason: its queue holds the request while a miss elsewhere computes the whole
    prompt again and evicts someone else's. (Measured: with Room first, a
    serialized-prefill engine whose queue reached ``target_waiting`` lost its
    prefixes to whichever replica had just drained, and the fleet fell to round
    robin's hit rate and throughput; issue #31,
    benchmarks/results/2026-12-07-routing-quality.md.) When the home
    has too much work the prompt spills to the least-worked replica, which then
    holds it too: later requests balance between the holders by their work, so
    spilled traffic warms one more cache instead of all of them.

  When every replica is saturated, affinity still decides among them.

  - :class:`Rendezvous`: only where routers do not share their tables (the workers
    of one server, llmgw.workers) and so must agree without talking: a request that
    neither affinity decided (a session or a prompt this router has not routed)
    goes to the home its key hashes to, by weighted rendezvous hashing over the
    survivors (the same home in every worker, and a key moves only when its home
    leaves), unless that home has more prefill ahead than a miss elsewhere costs
    (the same load guard as the prefix rule). The key is the session's, else the
    prompt's first block (a prompt shorter than a block has none).

Scorers (cost, lower is better; a replica at its targets scores about 1 per term)
------------------------------------------------------------------------------------
``Queue``: ``w / target_waiting / weight``; ``Load``: ``load / LOAD_UNIT / weight``
(a scale, not a limit); ``Prefill``: ``prefill / PREFILL_UNIT / weight`` (the prompt
tokens still to prefill there, a scale too); ``KvCache``: ``kv / kv_ceiling`` (0 when
unknown with no prior); ``Staleness``: ``max(0, age - h) / h`` with ``h = stale_after / 2`` (no
penalty in the first half, so scrapes milliseconds apart do not decide between idle
peers); ``Unknown``: :data:`UNKNOWN_PENALTY` per unknown metric; ``Stale``:
:data:`STALE_PENALTY`; ``Throttle``: :data:`THROTTLE_PENALTY` after a 429;
``PrefixBonus``: ``-m``.
"""

from __future__ import annotations

import math

import attrs

from llmgw.router.scheduling.scheduler import (
    MISS_WEIGHT,
    Context,
    Spill,
)
from llmgw.router.scheduling.state import Candidate

__all__ = [
    "BALANCE_ABS",
    "BALANCE_REL",
    "CACHE_MATCH",
    "LOAD_UNIT",
    "PREFILL_UNIT",
    "STALE_PENALTY",
    "THROTTLE_PENALTY",
    "TIE",
    "UNKNOWN_PENALTY",
    "WORK_TIE",
    "CacheAware",
    "Fresh",
    "KvCache",
    "Load",
    "LowestCost",
    "Prefill",
    "PrefixAffinity",
    "PrefixBonus",
    "Queue",
    "Rendezvous",
    "Room",
    "SessionAffinity",
    "Stale",
    "Staleness",
    "Throttle",
    "Unknown",
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
# Tokens of prefill work worth one normalised score term (a long prompt, about one
# engine step's token budget); a scale, not a limit.
PREFILL_UNIT = 2048.0
# Prefill work (tokens) within which two replicas are equal for prefix affinity: the
# scorers choose between them. Below the error of a prompt size estimated from bytes.
WORK_TIE = 1.0


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
    def filter(self, ctx: Context, survivors: list[int]) -> list[int]:
        if ctx.tier is not None or ctx.session_endpoint is None:
            return survivors
        cands = ctx.candidates
        home = ctx.session_endpoint
        s = next((i for i in survivors if cands[i].endpoint_id == home), None)
        if s is None:
            return _spill(ctx, survivors, "session", "gone", {home})
        if cands[s].throttled:
            return _spill(ctx, survivors, "session", "throttled", {home})
        # Priority stays Room's to decide: a session on a fallback tier comes back.
        room = [cands[i].priority for i in survivors if not ctx.saturated[i]]
        if room and cands[s].priority > min(room):
            return _spill(ctx, survivors, "session", "priority", {home})
        # The session's replica holds its conversation: where the prefix table says
        # nothing (hashing off, a prompt too short to hash) all of it counts as held.
        work = ctx.work(s, unknown_held=ctx.prompt_tokens)
        if any(ctx.work(i) < work for i in survivors if i != s):
            return _spill(ctx, survivors, "session", "work", {home})
        ctx.tier = "session"
        return [s]


def _spill(
    ctx: Context, survivors: list[int], affinity: str, reason: str, homes: set[str]
) -> list[int]:
    """Note that an affinity filter passed over the request's home(s) (the first one
    to do so names the spill) and keep every survivor."""
    if ctx.spill is None and homes:
        ctx.spill = Spill(affinity, reason, frozenset(homes))
    return survivors


@attrs.frozen
class PrefixAffinity:
    def filter(self, ctx: Context, survivors: list[int]) -> list[int]:
        if ctx.tier is not None or not ctx.cached_tokens:
            return survivors
        cached, cands, full = ctx.cached_tokens, ctx.candidates, ctx.saturated
        # Room's tier: the best priority with room; holders in it may be full, unless
        # another holder has room (a second holder takes the overflow, warming no
        # third cache).
        room = [cands[i].priority for i in survivors if not full[i]]
        tier = min(room) if room else None
        holder_room = any(
            cands[i].endpoint_id in cached and not full[i] and cands[i].priority == tier
            for i in survivors
        )
        eligible = [
            i
            for i in survivors
            if tier is None
            or (
                cands[i].priority == tier
                and not cands[i].throttled
                and (not full[i] or (cands[i].endpoint_id in cached and not holder_room))
            )
        ]
        homes = set(cached)
        if not any(cands[i].endpoint_id in cached for i in eligible):
            held = [i for i in survivors if cands[i].endpoint_id in cached]
            reason = (
                "gone"
                if not held
                else "throttled"
                if all(cands[i].throttled for i in held)
                else "priority"
            )
            return _spill(ctx, survivors, "prefix", reason, homes)
        work = [ctx.work(i) for i in eligible]
        least = min(work)
        ctx.tier = "prefix"
        # A replica that holds none of it is kept only when every holder had more work.
        _spill(ctx, survivors, "prefix", "work", homes)
        return [i for i, w in zip(eligible, work, strict=True) if w <= least + WORK_TIE]


@attrs.frozen
class Rendezvous:
    def filter(self, ctx: Context, survivors: list[int]) -> list[int]:
        if ctx.tier is not None or ctx.home_key is None or len(survivors) < 2:
            return survivors
        cands = ctx.candidates
        home = max(survivors, key=lambda i: _rendezvous(ctx.home_key, cands[i]))
        # A miss's cost elsewhere, as PrefixAffinity weighs it: a busy home spills.
        least = min(cands[i].prefill / cands[i].weight for i in survivors)
        if cands[home].prefill / cands[home].weight > least + MISS_WEIGHT * ctx.prompt_tokens:
            return survivors
        ctx.tier = "home"
        return [home]


def _rendezvous(key: int | None, c: Candidate) -> float:
    """Weighted rendezvous (highest random weight) score of `c` for `key`: -w / ln(u),
    u uniform in (0, 1) from the hash of the pair (hash() agrees across processes
    started with one PYTHONHASHSEED: llmgw.workers gives its workers one)."""
    u = ((_mix(hash((key, c.endpoint_id))) >> 11) + 0.5) / (1 << 53)
    return -c.weight / math.log(u)


_M64 = (1 << 64) - 1


def _mix(h: int) -> int:
    """SplitMix64's finalizer: tuple hashes of nearby keys differ in few bits, and
    rendezvous needs every bit of the pair's hash to look independent."""
    z = (h + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


# The cache_aware rule's thresholds: vllm-router's and sglang-router's defaults
# (balance_abs_threshold, balance_rel_threshold, cache_threshold).
BALANCE_ABS = 32.0
BALANCE_REL = 1.0001
CACHE_MATCH = 0.5


@attrs.frozen
class CacheAware:
    """The rule of vllm-router's and sglang-router's cache_aware policies: while the
    fleet's load (requests, Estimate.load) is not uneven by more than `abs_threshold`
    and `rel_threshold` times, the replica holding the longest part of the prompt if
    that is at least `match_threshold` of it; otherwise the least loaded. (Theirs sends
    an unmatched prompt to the replica whose cache tree is smallest; the router keeps
    no size per replica, so the least loaded stands in.)"""

    abs_threshold: float = BALANCE_ABS
    rel_threshold: float = BALANCE_REL
    match_threshold: float = CACHE_MATCH

    def filter(self, ctx: Context, survivors: list[int]) -> list[int]:
        if ctx.tier is not None or len(survivors) < 2:
            return survivors
        load = [ctx.estimates[i].load / ctx.candidates[i].weight for i in survivors]
        most, least = max(load), min(load)
        lightest = [i for i, x in zip(survivors, load, strict=True) if x <= least + TIE]
        if most - least > self.abs_threshold and most > self.rel_threshold * least:
            ctx.tier = "balance"
            return _spill(ctx, lightest, "prefix", "load", set(ctx.cached_tokens))
        if ctx.prompt_tokens > 0 and ctx.cached_tokens:
            held = [ctx.cached_tokens.get(ctx.candidates[i].endpoint_id, 0.0) for i in survivors]
            best = max(held)
            if best >= self.match_threshold * ctx.prompt_tokens:
                ctx.tier = "prefix"
                return [i for i, h in zip(survivors, held, strict=True) if h >= best - TIE]
        return lightest


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
class Prefill:
    unit: float = PREFILL_UNIT

    def cost(self, ctx: Context, i: int) -> float:
        c = ctx.candidates[i]
        return c.prefill / self.unit / c.weight


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
