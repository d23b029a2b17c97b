from __future__ import annotations

import random
from collections import Counter

import attrs
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from llmgw.config import RoutingProfile, ScoringConfig
from llmgw.router.scheduling import Candidate, Decision, Saturation, default_scheduler
from llmgw.router.scheduling.plugins import STALE_PENALTY, UNKNOWN_PENALTY
from tests.properties import examples

SCORING = ScoringConfig(target_waiting=4.0, kv_ceiling=0.9)
PROFILE = RoutingProfile(queue=1.0, inflight=1.0, kv=0.5, prefix=0.5, staleness=1.0)
SAT = Saturation(SCORING, stale_after=10.0)
SCORER = default_scheduler(SCORING, PROFILE, stale_after=10.0)


def cand(
    ep: str,
    *,
    waiting: float | None = 0.0,
    running: float | None = 0.0,
    kv: float | None = 0.0,
    inflight: int = 0,
    age: float | None = 1.0,
    weight: float = 1.0,
    priority: int = 0,
    throttled: bool = False,
    capacity: float | None = None,
    prefill: float = 0.0,
) -> Candidate:
    return Candidate(
        ep, waiting, running, kv, inflight, age, weight, priority, throttled, capacity,
        prefill=prefill,
    )  # fmt: skip


PROMPT = 2000.0  # tokens of the prompt in the session and prefix examples


def decide(
    cands: list[Candidate],
    session: str | None = None,
    prefix: dict[str, float] | None = None,
    seed: int = 0,
    prompt: float = PROMPT,
) -> Decision:
    """`prefix`: per endpoint, the fraction of the prompt it holds."""
    held = prefix or {}
    d = SCORER.pick(
        cands,
        session_endpoint=session,
        prefix_matches=held,
        rng=random.Random(seed),
        prompt_tokens=prompt,
        cached_tokens={ep: f * prompt for ep, f in held.items()},
    )
    assert d is not None
    return d


def pick(
    cands: list[Candidate],
    session: str | None = None,
    prefix: dict[str, float] | None = None,
    seed: int = 0,
    prompt: float = PROMPT,
) -> tuple[str, str]:
    d = decide(cands, session, prefix, seed, prompt)
    return d.endpoint_id, d.tier


# -- estimates ----------------------------------------------------------------


def test_load_combines_scraped_and_own_inflight() -> None:
    assert SAT.load(cand("a", running=3, waiting=2, inflight=1)) == 5.0
    # Scrapes lag: our own in-flight count is a floor.
    assert SAT.load(cand("a", running=3, waiting=2, inflight=9)) == 9.0
    # Nothing scraped, no peers: own in-flight stands in for everything.
    assert SAT.load(cand("a", running=None, waiting=None, kv=None, inflight=4)) == 4.0


def test_stale_metrics_are_not_trusted() -> None:
    stale = cand("a", running=50, waiting=50, inflight=2, age=11.0)
    assert SAT.load(stale) == 2.0
    assert SAT.estimate(stale).stale
    assert SAT.estimate(cand("a", age=None)).stale
    assert not SAT.estimate(cand("a", age=10.0)).stale


def test_unknown_metrics_take_the_peer_mean() -> None:
    peers = [
        cand("b", running=6, waiting=2, kv=0.4),
        cand("c", running=2, waiting=0, kv=0.2),
        cand("x", running=None, waiting=None, kv=None, inflight=1),
    ]
    prior = SAT.prior(peers)
    assert (prior.running, prior.waiting) == (4.0, 1.0)
    assert prior.kv_usage == pytest.approx(0.3)
    e = SAT.estimate(peers[2], prior)
    assert e.load == 5.0
    assert e.kv_usage == pytest.approx(0.3)
    assert e.unknown == 3


def test_saturated_each_dimension() -> None:
    assert not SAT.saturated(cand("a", running=3, waiting=3, kv=0.89))
    assert SAT.saturated(cand("a", waiting=4))
    assert SAT.saturated(cand("a", kv=0.9))
    assert SAT.saturated(cand("a", throttled=True))
    # A big batch is not full while the engine queues nothing: no count caps it.
    assert not SAT.saturated(cand("a", running=300, inflight=300, kv=0.5))
    assert not SAT.saturated(cand("a", running=None, waiting=None, kv=None, inflight=500))
    # A known capacity is: every slot taken, the next request would queue.
    assert not SAT.saturated(cand("a", running=7, capacity=8))
    assert SAT.saturated(cand("a", running=8, capacity=8))
    # Own requests count against it before a scrape shows them, and past it they are
    # queued at the engine.
    assert SAT.saturated(cand("a", running=4, inflight=8, capacity=8))
    past = SAT.estimate(cand("a", running=8, inflight=14, capacity=8))
    assert (past.load, past.waiting) == (14.0, 6.0)
    # Weight scales the queue an engine may hold.
    assert not SAT.saturated(cand("a", running=10, waiting=5, weight=2.0))
    assert SAT.saturated(cand("a", running=10, waiting=5, kv=0.95, weight=2.0))


def test_score_terms() -> None:
    idle = SCORER.score(cand("a", age=0.0))
    assert idle == 0.0
    busy = SCORER.score(cand("a", running=4, waiting=2, kv=0.45, age=0.0))
    # queue 2/4 + inflight 6/8 + kv 0.5*0.45/0.9
    assert busy == pytest.approx(0.5 + 0.75 + 0.25)
    assert SCORER.score(cand("a", running=4, waiting=2, kv=0.45, age=0.0, weight=2.0)) == (
        pytest.approx((0.5 + 0.75) / 2 + 0.25)
    )
    # No staleness penalty in the first half of stale_after (10 s), then up to 1.
    assert SCORER.score(cand("a", age=0.3)) == SCORER.score(cand("a", age=4.9)) == 0.0
    assert SCORER.score(cand("a", age=7.5)) == pytest.approx(0.5)
    assert SCORER.score(cand("a", age=10.0)) == pytest.approx(1.0)
    assert SCORER.score(cand("a", age=10.1)) >= STALE_PENALTY
    assert SCORER.score(cand("a", age=0.0), prefix_match=1.0) == pytest.approx(-0.5)
    assert SCORER.score(cand("a", kv=None, age=0.0)) == pytest.approx(UNKNOWN_PENALTY)


# -- pick: tiers --------------------------------------------------------------


def test_empty_gives_none() -> None:
    assert SCORER.pick([], session_endpoint=None, prefix_matches={}, rng=random.Random(0)) is None


def test_lowest_score_wins() -> None:
    cands = [cand("a", running=5), cand("b", running=1), cand("c", running=3)]
    d = SCORER.pick(cands, session_endpoint=None, prefix_matches={}, rng=random.Random(0))
    assert d is not None
    assert (d.endpoint_id, d.tier) == ("b", "score")
    assert d.ranked == ("b", "c", "a")


def test_priority_tiers() -> None:
    p0 = cand("p0", running=6)
    p1 = cand("p1", priority=1)
    assert pick([p0, p1])[0] == "p0"  # busier but unsaturated: tier 0 first
    p0_full = cand("p0", running=8, capacity=8)
    assert pick([p0_full, p1])[0] == "p1"
    assert pick([cand("p0", running=6, waiting=4), p1])[0] == "p1"  # queueing: full too
    p1_full = cand("p1", running=9, priority=1, capacity=8)
    # Everyone saturated: everyone competes on score.
    assert pick([p0_full, p1_full])[0] == "p0"
    assert pick([cand("p0", running=12, capacity=8), p1_full])[0] == "p1"


def test_saturated_endpoint_skipped_even_if_score_lower() -> None:
    # a: kv over the ceiling but otherwise empty (low score); b: busy but under targets.
    a = cand("a", kv=0.95)
    b = cand("b", running=5, waiting=2, kv=0.1)
    assert SCORER.score(a) < SCORER.score(b)
    assert pick([a, b])[0] == "b"


def test_throttled_endpoint_is_avoided() -> None:
    assert pick([cand("a", throttled=True), cand("b", running=5)])[0] == "b"


def test_stale_used_only_when_nothing_fresh() -> None:
    fresh_busy = cand("fresh", running=7, waiting=3)
    stale_idle = cand("stale", age=30.0)
    never = cand("never", age=None)
    d = SCORER.pick(
        [stale_idle, fresh_busy, never],
        session_endpoint="stale",
        prefix_matches={"stale": 1.0},
        rng=random.Random(0),
    )
    assert d is not None
    assert d.endpoint_id == "fresh"
    assert d.ranked[0] == "fresh"
    assert set(d.ranked[1:]) == {"stale", "never"}
    # All stale: scored down, not dropped; own in-flight decides.
    only_stale = [cand("s1", age=30.0, inflight=3), cand("s2", age=None, inflight=1)]
    assert pick(only_stale)[0] == "s2"


# -- pick: session ------------------------------------------------------------


def test_session_stays_while_its_prefill_work_is_the_least() -> None:
    # Far more running there than elsewhere: running sequences are not prefill work,
    # and moving would prefill the whole conversation again.
    cands = [cand("s", running=30), cand("o", running=2)]
    assert pick(cands, session="s") == ("s", "session")
    # Its own queue of cache hits (300 tokens to prefill) is less than a miss (2000).
    assert pick([cand("s", prefill=300), cand("o")], session="s") == ("s", "session")


def test_session_moves_when_its_prefill_work_exceeds_a_miss_elsewhere() -> None:
    # 4,500 tokens still to prefill at home; the whole 2,000-token prompt at o, counted
    # twice (MISS_WEIGHT), is less.
    cands = [cand("s", prefill=4500), cand("o", running=2)]
    assert pick(cands, session="s") == ("o", "score")
    # What the prefix table says the home holds counts: a home that holds none of it
    # is a miss like any other, and the less worked replica wins.
    cands = [cand("s", prefill=100), cand("o")]
    assert pick(cands, session="s", prefix={"s": 0.0}) == ("o", "prefix")


def test_session_stays_on_its_full_replica_unless_it_throttles() -> None:
    # Its engine's queue is at target: the turn waits there, cached, rather than
    # computing the whole conversation elsewhere.
    cands = [cand("s", waiting=4), cand("o", running=6)]
    assert pick(cands, session="s") == ("s", "session")
    # A 429 moves it.
    cands = [cand("s", throttled=True), cand("o", running=6)]
    assert pick(cands, session="s") == ("o", "score")
    # So does a replica with room on a lower priority value (a fallback tier's
    # session comes back).
    cands = [cand("s", priority=1), cand("o", running=6)]
    assert pick(cands, session="s") == ("o", "score")


def test_session_unknown_endpoint_ignored() -> None:
    assert pick([cand("a"), cand("b", running=1)], session="gone") == ("a", "score")


def test_session_alone_stays() -> None:
    assert pick([cand("s", running=7)], session="s") == ("s", "session")


def test_session_work_is_per_unit_of_weight() -> None:
    # Weight 2 with 6,000 tokens ahead works through them as fast as weight 1 with 3,000,
    # less than a miss at o (4,000); at weight 1 it is more.
    cands = [cand("s", prefill=6000, weight=2.0), cand("o")]
    assert pick(cands, session="s") == ("s", "session")
    assert pick([cand("s", prefill=6000), cand("o")], session="s") == ("o", "score")


# -- pick: prefix -------------------------------------------------------------


def test_prefix_goes_where_its_prefill_work_is_least() -> None:
    # a holds 90% (200 tokens to compute, 400 of work), b half (1,000, 2,000 of work):
    # a, whatever is running.
    cands = [cand("a", running=40), cand("b", running=2), cand("c", running=2)]
    assert pick(cands, prefix={"a": 0.9, "b": 0.5}) == ("a", "prefix")
    # a has 2,000 tokens of others' prefill ahead: b's 2,000 of work is less than a's
    # 2,400.
    cands = [cand("a", prefill=2000), cand("b"), cand("c")]
    assert pick(cands, prefix={"a": 0.9, "b": 0.5}) == ("b", "prefix")
    # Both holders busier than a miss at idle c: the prompt spills to c.
    cands = [cand("a", prefill=4000), cand("b", prefill=3000), cand("c")]
    assert pick(cands, prefix={"a": 0.9, "b": 0.5}) == ("c", "prefix")


def test_prefix_stays_home_when_its_engine_is_full_until_a_miss_costs_less() -> None:
    # A big engine with 40 running and nothing queued has room: the prefix stays.
    cands = [cand("a", running=40), cand("b", running=34)]
    assert pick(cands, prefix={"a": 1.0}) == ("a", "prefix")
    # Every slot of a taken, or its queue at the target: it is full by its engine's
    # account. Another holder with room takes the overflow (no third cache warmed)...
    full = [cand("a", running=8, capacity=8), cand("b", running=6), cand("c", running=5)]
    assert pick(full, prefix={"a": 1.0, "b": 0.5}) == ("b", "prefix")
    # ...and with none, the home is still the least work for this prompt (a queue of
    # hits ahead of it against a whole prompt computed, and another's prefix evicted,
    # elsewhere).
    assert pick(full, prefix={"a": 1.0}) == ("a", "prefix")
    queued = [cand("a", running=8, waiting=4), cand("b", running=6), cand("c", running=5)]
    assert pick(queued, prefix={"a": 1.0}) == ("a", "prefix")
    # More prefill queued there than a miss at c costs: the prompt leaves.
    busy = [cand("a", waiting=4, prefill=4500), cand("b", running=6), cand("c", running=5)]
    assert pick(busy, prefix={"a": 1.0}) == ("c", "prefix")
    # A home that answered 429 is left at once.
    throttled = [attrs.evolve(cand("a"), throttled=True), cand("b"), cand("c", running=1)]
    assert pick(throttled, prefix={"a": 1.0}) == ("b", "score")


def test_a_prefix_spills_only_to_replicas_with_room_in_the_best_tier() -> None:
    # The home is busy; c is idle but full by its KV cache, d is on a fallback tier.
    cands = [
        cand("a", waiting=4, prefill=4500),
        cand("b", running=2),
        cand("c", kv=0.95),
        attrs.evolve(cand("d"), priority=1),
    ]
    assert pick(cands, prefix={"a": 1.0}) == ("b", "prefix")


def test_prefix_affinity_holds_when_every_replica_is_saturated() -> None:
    # Both at their capacity (8): the prefix still decides, by prefill work.
    cands = [cand("a", running=9, capacity=8), cand("b", running=8, capacity=8)]
    assert pick(cands, prefix={"a": 1.0}) == ("a", "prefix")


def test_prefix_tie_goes_to_lower_score() -> None:
    cands = [cand("a", running=1), cand("b")]
    assert pick(cands, prefix={"a": 0.5, "b": 0.5}) == ("b", "prefix")


def test_a_prefix_stays_on_its_kv_full_home() -> None:
    cands = [cand("a", kv=0.95), cand("b", running=2)]
    assert pick(cands, prefix={"a": 1.0}) == ("a", "prefix")


def test_decision_carries_each_replicas_uncached_tokens() -> None:
    d = SCORER.pick(
        [cand("a"), cand("b")],
        session_endpoint=None,
        prefix_matches={"a": 0.75},
        rng=random.Random(0),
        prompt_tokens=2000.0,
        cached_tokens={"a": 1500.0},
    )
    assert d is not None
    assert d.uncached == {"a": 500.0, "b": 2000.0}


def test_hot_prefix_spills_to_one_more_holder_at_a_time() -> None:
    """Every request shares a 2,000-token prefix plus 100 tokens of its own. Each pick
    adds its uncached tokens to the chosen one's prefill work; between picks every
    replica prefills 60 tokens, so one replica cannot keep up with the prefix (100
    in, 60 out) and two can. The home takes requests until its backlog passes a
    miss's cost, then one replica takes the miss and becomes a holder; the two
    holders then keep up, and the prefix stays on them."""
    prefill = {"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.0}
    holders: dict[str, float] = {"a": 2000.0}
    order: list[str] = []
    rng = random.Random(1)
    for _ in range(400):
        cands = [cand(ep, prefill=w) for ep, w in prefill.items()]
        d = SCORER.pick(
            cands,
            session_endpoint=None,
            prefix_matches=dict.fromkeys(holders, 1.0),
            rng=rng,
            prompt_tokens=2100.0,
            cached_tokens=holders,
        )
        assert d is not None
        ep = d.endpoint_id
        prefill[ep] += d.uncached[ep]
        if ep not in holders:
            order.append(ep)
            holders[ep] = 2000.0
        for other in prefill:
            prefill[other] = max(0.0, prefill[other] - 60.0)
    assert len(order) == 1, order
    assert max(prefill.values()) <= 2100.0 + 100.0, prefill


def spill(
    cands: list[Candidate], session: str | None = None, prefix: dict[str, float] | None = None
) -> tuple[str, tuple[str, str] | None]:
    d = decide(cands, session, prefix)
    return d.endpoint_id, d.spill


def test_a_request_sent_away_from_its_home_names_why() -> None:
    # Kept home: no spill.
    assert spill([cand("s"), cand("o")], session="s") == ("s", None)
    assert spill([cand("a"), cand("b")], prefix={"a": 1.0}) == ("a", None)
    # The session's home has more prefill ahead than a miss elsewhere costs.
    assert spill([cand("s", prefill=4500), cand("o")], session="s") == ("o", ("session", "work"))
    # Its home answered 429; is on a fallback tier; is no longer a candidate.
    throttled = [cand("s", throttled=True), cand("o")]
    assert spill(throttled, session="s") == ("o", ("session", "throttled"))
    assert spill([cand("s", priority=1), cand("o")], session="s") == ("o", ("session", "priority"))
    assert spill([cand("o")], session="s") == ("o", ("session", "gone"))
    # The prefix's holders are all busier than a miss at c.
    busy = [cand("a", prefill=4000), cand("b", prefill=3000), cand("c")]
    assert spill(busy, prefix={"a": 0.9, "b": 0.5}) == ("c", ("prefix", "work"))
    # Overflow to a second holder stays within the homes: not a spill.
    full = [cand("a", running=8, capacity=8), cand("b", running=6), cand("c", running=5)]
    assert spill(full, prefix={"a": 1.0, "b": 0.5}) == ("b", None)
    assert spill([cand("a", throttled=True), cand("b")], prefix={"a": 1.0}) == (
        "b",
        ("prefix", "throttled"),
    )
    assert spill([cand("b"), cand("c")], prefix={"a": 1.0}) in {
        ("b", ("prefix", "gone")),
        ("c", ("prefix", "gone")),
    }
    # No home at all: nothing to spill from.
    assert spill([cand("b"), cand("c")])[1] is None


def test_cache_aware_counts_its_balance_override_as_a_spill() -> None:
    rule = default_scheduler(SCORING, attrs.evolve(PROFILE, rule="cache_aware"), stale_after=10.0)
    d = rule.pick(
        [cand("a", running=60), cand("b")],
        session_endpoint=None,
        prefix_matches={"a": 1.0},
        rng=random.Random(0),
        prompt_tokens=PROMPT,
        cached_tokens={"a": PROMPT},
    )
    assert d is not None and (d.endpoint_id, d.tier, d.spill) == (
        "b",
        "balance",
        ("prefix", "load"),
    )


# -- pick: weights and ties ---------------------------------------------------


def test_weight_share_among_idle_equals() -> None:
    rng = random.Random(42)
    cands = [cand("heavy", weight=2.0), cand("light")]
    counts: Counter[str] = Counter()
    for _ in range(3000):
        d = SCORER.pick(cands, session_endpoint=None, prefix_matches={}, rng=rng)
        assert d is not None
        counts[d.endpoint_id] += 1
    assert counts["heavy"] / 3000 == pytest.approx(2 / 3, abs=0.04)


def test_weight_share_under_load() -> None:
    # Closed loop: each pick adds in-flight work; work completes at random. About 20
    # in flight: with only a handful, integer counts bend the share (~1.7-1.9x).
    rng = random.Random(7)
    inflight = {"heavy": 0, "light": 0}
    weights = {"heavy": 2.0, "light": 1.0}
    served: Counter[str] = Counter()
    for _ in range(4000):
        cands = [
            cand(ep, running=None, waiting=None, kv=None, inflight=n, weight=weights[ep])
            for ep, n in inflight.items()
        ]
        d = SCORER.pick(cands, session_endpoint=None, prefix_matches={}, rng=rng)
        assert d is not None
        inflight[d.endpoint_id] += 1
        served[d.endpoint_id] += 1
        for ep in inflight:  # each request finishes with probability 0.05 per step
            inflight[ep] -= sum(rng.random() < 0.05 for _ in range(inflight[ep]))
    assert served["heavy"] / served["light"] == pytest.approx(2.0, rel=0.15)


def test_random_ties_spread() -> None:
    cands = [cand(f"e{i}") for i in range(4)]
    seen = {pick(cands, seed=s)[0] for s in range(60)}
    assert seen == {"e0", "e1", "e2", "e3"}


# -- pool saturation ----------------------------------------------------------


def test_pool_saturation() -> None:
    assert SAT.pool([]) == 1.0
    assert SAT.pool([cand("a")]) == 0.0
    # max(2/4, 0.45/0.9) = 0.5 and max(0, 0, 6/8) = 0.75 (b runs 6 of its 8 slots)
    two = [cand("a", running=2, waiting=2, kv=0.45), cand("b", running=6, capacity=8)]
    assert SAT.pool(two) == pytest.approx(0.625)
    # Without a capacity, running sequences fill nothing: the engine's queue and KV do.
    assert SAT.pool([cand("b", running=6)]) == 0.0
    # Clipped at 1; throttled counts as full.
    assert SAT.pool([cand("a", waiting=40), cand("b", throttled=True)]) == 1.0
    # Capacity-weighted: the weight-3 replica counts three times.
    weighted = [cand("a", running=8, weight=3.0, capacity=24), cand("b")]
    assert SAT.pool(weighted) == pytest.approx((3 * (8 / 24) + 0) / 4)


def test_pool_saturation_absent_metrics_not_empty() -> None:
    blind = cand("a", running=None, waiting=None, kv=None, inflight=6, capacity=8)
    assert SAT.pool([blind]) == pytest.approx(0.75)
    stale = cand("a", running=0, waiting=0, kv=0, inflight=4, age=60.0, capacity=8)
    assert SAT.pool([stale]) == pytest.approx(0.5)
    # Nothing says how much it holds: own requests order it, they never fill it.
    assert SAT.pool([attrs.evolve(blind, capacity=None)]) == 0.0
    # A blind replica next to a busy one is assumed as busy, not idle.
    busy = cand("b", running=6, waiting=1)
    assert SAT.pool([busy, cand("a", running=None, waiting=None)]) == (
        pytest.approx(SAT.pool([busy]))
    )


# -- properties ---------------------------------------------------------------

metric = st.one_of(st.none(), st.floats(min_value=0, max_value=20))
kv_metric = st.one_of(st.none(), st.floats(min_value=0, max_value=1))


@st.composite
def candidates(draw: st.DrawFn, fresh_only: bool = False) -> list[Candidate]:
    n = draw(st.integers(min_value=1, max_value=6))
    out = []
    for i in range(n):
        age = (
            draw(st.floats(min_value=0, max_value=10))
            if fresh_only
            else draw(st.one_of(st.none(), st.floats(min_value=0, max_value=30)))
        )
        out.append(
            Candidate(
                endpoint_id=f"e{i}",
                waiting=draw(metric),
                running=draw(metric),
                kv_usage=draw(kv_metric),
                inflight=draw(st.integers(min_value=0, max_value=20)),
                age=age,
                weight=draw(st.sampled_from([0.5, 1.0, 2.0])),
                priority=draw(st.integers(min_value=0, max_value=2)),
                throttled=draw(st.booleans()),
                capacity=draw(st.one_of(st.none(), st.integers(min_value=1, max_value=20))),
            )
        )
    return out


def routing(cands: list[Candidate]) -> st.SearchStrategy[tuple[str | None, dict[str, float]]]:
    ids = [c.endpoint_id for c in cands]
    return st.tuples(
        st.one_of(st.none(), st.sampled_from([*ids, "gone"])),
        st.dictionaries(st.sampled_from(ids), st.floats(min_value=0, max_value=1)),
    )


@settings(max_examples=examples(150))
@given(st.data())
def test_choice_is_a_candidate_and_ranked_is_a_permutation(data: st.DataObject) -> None:
    cands = data.draw(candidates())
    session, prefix = data.draw(routing(cands))
    d = SCORER.pick(
        cands,
        session_endpoint=session,
        prefix_matches=prefix,
        rng=random.Random(data.draw(st.integers())),
    )
    assert d is not None
    ids = [c.endpoint_id for c in cands]
    assert d.endpoint_id in ids
    assert d.ranked[0] == d.endpoint_id
    assert sorted(d.ranked) == sorted(ids)
    if d.tier == "session":
        assert d.endpoint_id == session


@st.composite
def scenarios(
    draw: st.DrawFn, fresh_only: bool = False
) -> tuple[list[Candidate], str | None, dict[str, float]]:
    cands = draw(candidates(fresh_only=fresh_only))
    session, prefix = draw(routing(cands))
    return cands, session, prefix


def blind(ep: str, inflight: int, weight: float = 1.0) -> Candidate:
    """Fresh, but reporting none of waiting, running or KV usage."""
    return cand(ep, waiting=None, running=None, kv=None, inflight=inflight, age=0.0, weight=weight)


@settings(max_examples=examples(150))
@given(scenarios(fresh_only=True))
# Found by hypothesis (issue #14): the prefix tier chose e1, then full by request count
# (4 in flight at weight 0.5, under the old target_inflight), over two idle peers.
@example(([blind("e0", 0), blind("e1", 4, weight=0.5), blind("e2", 0)], None, {"e1": 1.0}))
# The same full only by its capacity: now the prefix tier leaves it too.
@example(
    (
        [blind("e0", 0), attrs.evolve(blind("e1", 4, weight=0.5), capacity=4), blind("e2", 0)],
        None,
        {"e1": 1.0},
    )
)
def test_saturated_never_chosen_over_room_in_its_tier(
    scenario: tuple[list[Candidate], str | None, dict[str, float]],
) -> None:
    """While a replica has room, the choice is in the best priority tier that has room,
    and only the affinity tiers choose a replica full by its engine's account: the
    session's own replica, or one that holds part of the prompt; never one that
    answered 429, and never on a worse priority tier than the best one with room."""
    cands, session, prefix = scenario
    cached = {ep: f * PROMPT for ep, f in prefix.items() if f > 0}
    d = SCORER.pick(
        cands,
        session_endpoint=session,
        prefix_matches=prefix,
        rng=random.Random(0),
        prompt_tokens=PROMPT,
        cached_tokens=cached,
    )
    assert d is not None
    prior = SAT.prior(cands)
    chosen = next(c for c in cands if c.endpoint_id == d.endpoint_id)
    room = [c for c in cands if not SAT.saturated(c, prior)]
    if not room:
        return
    best_tier = min(c.priority for c in room)
    if d.tier == "session":  # it may stay, full, but not on a worse tier than room's
        assert chosen.priority <= best_tier, (chosen, room)
    else:
        assert chosen.priority == best_tier, (chosen, room)
    if SAT.saturated(chosen, prior):
        if d.tier == "session":
            assert chosen.endpoint_id == session, (chosen, room)
        else:
            assert d.tier == "prefix" and chosen.endpoint_id in cached, (chosen, d.tier, room)
        assert not chosen.throttled


@settings(max_examples=examples(150))
@given(st.data())
def test_stale_only_when_all_stale(data: st.DataObject) -> None:
    cands = data.draw(candidates())
    session, prefix = data.draw(routing(cands))
    d = SCORER.pick(cands, session_endpoint=session, prefix_matches=prefix, rng=random.Random(0))
    assert d is not None
    chosen = next(c for c in cands if c.endpoint_id == d.endpoint_id)
    if SAT.is_stale(chosen):
        assert all(SAT.is_stale(c) for c in cands)


@settings(max_examples=examples(150))
@given(
    waiting=st.floats(min_value=0, max_value=20),
    running=st.floats(min_value=0, max_value=20),
    kv=st.floats(min_value=0, max_value=1),
    inflight=st.integers(min_value=0, max_value=20),
    absent=st.sets(st.sampled_from(["waiting", "running", "kv"]), min_size=1),
    order=st.booleans(),
    seed=st.integers(),
)
def test_absent_metrics_never_look_emptier(
    waiting: float,
    running: float,
    kv: float,
    inflight: int,
    absent: set[str],
    order: bool,
    seed: int,
) -> None:
    reporting = cand("reporting", waiting=waiting, running=running, kv=kv, inflight=inflight)
    blind = cand(
        "blind",
        waiting=None if "waiting" in absent else waiting,
        running=None if "running" in absent else running,
        kv=None if "kv" in absent else kv,
        inflight=inflight,
    )
    cands = [blind, reporting] if order else [reporting, blind]
    prior = SAT.prior(cands)
    assert SAT.load(blind, prior) >= SAT.load(reporting, prior)
    assert SCORER.score(blind, 0.0, prior) > SCORER.score(reporting, 0.0, prior)
    d = SCORER.pick(cands, session_endpoint=None, prefix_matches={}, rng=random.Random(seed))
    assert d is not None
    assert (d.endpoint_id, d.tier, d.ranked) == ("reporting", "score", ("reporting", "blind"))


@settings(max_examples=examples(100))
@given(st.data())
def test_blind_load_at_least_mean_of_reporters_and_own_inflight(data: st.DataObject) -> None:
    cands = data.draw(candidates(fresh_only=True))
    inflight = data.draw(st.integers(min_value=0, max_value=20))
    blind = cand("blind", waiting=None, running=None, kv=None, inflight=inflight)
    prior = SAT.prior([*cands, blind])
    reporters = [c for c in cands if c.waiting is not None and c.running is not None]
    assume(reporters)
    load = SAT.load(blind, prior)
    assert load >= inflight
    assert prior.running is not None and prior.waiting is not None
    assert load >= prior.running + prior.waiting - 1e-9


@settings(max_examples=examples(100))
@given(st.data())
def test_pool_saturation_in_unit_interval(data: st.DataObject) -> None:
    cands = data.draw(candidates())
    s = SAT.pool(cands)
    assert 0.0 <= s <= 1.0


# -- the pipeline -------------------------------------------------------------------------


def test_a_custom_filter_runs_after_the_built_in_ones_and_cannot_leave_nothing() -> None:
    from llmgw.router.scheduling import Context

    seen: list[list[str]] = []

    class OnlyPool:
        def __init__(self, pool: str) -> None:
            self.pool = pool

        def filter(self, ctx: Context, survivors: list[int]) -> list[int]:
            seen.append([ctx.candidates[i].endpoint_id for i in survivors])
            return [i for i in survivors if ctx.candidates[i].pool == self.pool]

    sched = default_scheduler(SCORING, PROFILE, 10.0, filters=(OnlyPool("eu"),))
    cands = [
        attrs.evolve(cand("us"), pool="us"),
        attrs.evolve(cand("eu", running=3), pool="eu"),
        attrs.evolve(cand("eu-full", waiting=4), pool="eu"),
    ]
    d = sched.pick(cands, session_endpoint=None, prefix_matches={}, rng=random.Random(0))
    assert d is not None and d.endpoint_id == "eu"
    assert seen == [["us", "eu"]]  # Room had left the saturated one out already
    # Ranked: the one the custom filter dropped, then the saturated one.
    assert d.ranked == ("eu", "us", "eu-full")
    # Nothing in the pool: the filter's empty answer keeps what it was given.
    d = sched.pick(cands[:1], session_endpoint=None, prefix_matches={}, rng=random.Random(0))
    assert d is not None and d.endpoint_id == "us"


def test_a_custom_scorer_and_picker() -> None:
    from llmgw.router.scheduling import Context

    class Cheap:
        def cost(self, ctx: Context, i: int) -> float:
            return 0.0 if ctx.candidates[i].pool == "spot" else 1.0

    class Last:
        def pick(self, ctx: Context, survivors: list[int], costs: list[float]) -> int:
            return survivors[-1]

    cands = [cand("a", running=2), attrs.evolve(cand("b", running=4), pool="spot")]
    weighted = default_scheduler(SCORING, PROFILE, 10.0, scorers=((Cheap(), 1.0),))
    d = weighted.pick(cands, session_endpoint=None, prefix_matches={}, rng=random.Random(0))
    # b's extra 2 requests cost 2/8 = 0.25: less than a's 1.0 for not being spot.
    assert d is not None and (d.endpoint_id, d.tier) == ("b", "score")
    assert weighted.score(cands[0]) == pytest.approx(SCORER.score(cands[0]) + 1.0)
    last = default_scheduler(SCORING, PROFILE, 10.0, picker=Last())
    d = last.pick([cand("a"), cand("b", running=5)], session_endpoint=None, prefix_matches={},
                  rng=random.Random(0))  # fmt: skip
    assert d is not None and d.endpoint_id == "b"


# -- rendezvous homes (routers that share no tables: the workers) ---------------------


def home(cands: list[Candidate], key: int, prompt: float = PROMPT) -> tuple[str, str]:
    d = SCORER.pick(cands, session_endpoint=None, prefix_matches={}, rng=random.Random(0),
                    prompt_tokens=prompt, home_key=key)  # fmt: skip
    assert d is not None
    return d.endpoint_id, d.tier


@settings(max_examples=examples(200))
@given(st.integers(), st.integers(2, 8), st.randoms(use_true_random=False))
def test_a_key_has_one_home_in_any_order_and_moves_only_when_its_home_leaves(
    key: int, n: int, rnd: random.Random
) -> None:
    fleet = [cand(f"e{i}") for i in range(n)]
    ep, tier = home(fleet, key)
    assert tier == "home"
    shuffled = list(fleet)
    rnd.shuffle(shuffled)
    assert home(shuffled, key)[0] == ep  # another router, another order: the same home
    others = [c for c in fleet if c.endpoint_id != ep]
    gone = rnd.choice(others)
    assert home([c for c in fleet if c is not gone], key)[0] == ep  # a peer leaving
    assert home(others, key)[0] != ep  # the home leaving


def test_homes_spread_by_weight() -> None:
    fleet = [cand("a"), cand("b"), cand("c", weight=2.0)]
    counts = Counter(home(fleet, key)[0] for key in range(4000))
    assert 0.4 < counts["c"] / 4000 < 0.6  # half, by its weight
    assert abs(counts["a"] - counts["b"]) < 400


def test_a_busy_home_spills_to_the_scorers() -> None:
    fleet = [cand("a"), cand("b")]
    key = next(k for k in range(100) if home(fleet, k)[0] == "a")
    # More prefill ahead of it than a miss elsewhere costs (2 x the prompt): scored.
    busy = [cand("a", prefill=2 * PROMPT + 1), cand("b")]
    assert home(busy, key) == ("b", "score")
    near = [cand("a", prefill=2 * PROMPT - 1), cand("b")]
    assert home(near, key) == ("a", "home")


def test_affinity_the_router_knows_comes_before_the_home() -> None:
    fleet = [cand("a"), cand("b")]
    key = next(k for k in range(100) if home(fleet, k)[0] == "a")
    d = SCORER.pick(fleet, session_endpoint=None, prefix_matches={"b": 1.0},
                    rng=random.Random(0), prompt_tokens=PROMPT,
                    cached_tokens={"b": PROMPT}, home_key=key)  # fmt: skip
    assert d is not None and (d.endpoint_id, d.tier) == ("b", "prefix")


# -- the cache_aware rule (the peers') ----------------------------------------------------

PEER_RULE = default_scheduler(SCORING, RoutingProfile(rule="cache_aware"), 10.0)


def peer_pick(cands: list[Candidate], cached: dict[str, float]) -> tuple[str, str]:
    d = PEER_RULE.pick(
        cands,
        session_endpoint=None,
        prefix_matches={ep: t / PROMPT for ep, t in cached.items()},
        rng=random.Random(0),
        prompt_tokens=PROMPT,
        cached_tokens=cached,
    )
    assert d is not None
    return d.endpoint_id, d.tier


def test_cache_aware_keeps_the_longest_match_until_the_load_is_badly_uneven() -> None:
    # Full by its engine's account, 30 requests more than the idlest: still the match.
    cands = [cand("a", running=8, waiting=30), cand("b", running=8), cand("c", running=9)]
    assert peer_pick(cands, {"a": 1800.0, "b": 1000.0}) == ("a", "prefix")
    # 33 more, and more than the idlest at all: the least loaded, whatever it holds.
    cands = [cand("a", running=8, waiting=33), cand("b", running=8), cand("c", running=9)]
    assert peer_pick(cands, {"a": 1800.0, "b": 1000.0}) == ("b", "balance")
    # Under half of the prompt held anywhere: the least loaded.
    cands = [cand("a", running=3), cand("b", running=1)]
    assert peer_pick(cands, {"a": 900.0}) == ("b", "score")


def test_an_unknown_routing_rule_is_a_configuration_error() -> None:
    import llmgw

    with pytest.raises(llmgw.ConfigError, match="rule: one of work, cache_aware"):
        llmgw.load_config(data={"router": {"profiles": {"x": {"rule": "nope"}}}}, environ={})
    config = llmgw.load_config(data={"router": {"default_profile": "cache_aware"}}, environ={})
    assert config.router.profiles["cache_aware"].rule == "cache_aware"
