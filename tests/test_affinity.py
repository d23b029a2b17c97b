from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.router.affinity import (
    PrefixTable,
    SessionTable,
    prefix_hashes,
    prompt_text_for_affinity,
)
from tests.properties import examples

# -- sessions -----------------------------------------------------------------


def test_session_lookup_and_ttl() -> None:
    t = SessionTable(size=10, ttl=30.0)
    assert t.lookup("s", 0.0) is None
    t.record("s", "ep1", 0.0)
    assert t.lookup("s", 30.0) == "ep1"
    assert t.lookup("s", 30.1) is None
    # A use refreshes the TTL.
    t.record("s", "ep1", 25.0)
    assert t.lookup("s", 50.0) == "ep1"
    t.record("s", "ep2", 51.0)
    assert t.lookup("s", 52.0) == "ep2"


def test_session_lru_bound() -> None:
    t = SessionTable(size=3, ttl=1e9)
    for i, key in enumerate("abc"):
        t.record(key, f"ep{i}", float(i))
    t.record("a", "ep0", 3.0)  # a is now the most recent; b is the oldest
    t.record("d", "ep3", 4.0)
    assert len(t) == 3
    assert t.lookup("b", 5.0) is None
    assert t.lookup("a", 5.0) == "ep0"
    assert t.lookup("c", 5.0) == "ep2"
    assert t.lookup("d", 5.0) == "ep3"


def test_session_expired_entries_are_dropped() -> None:
    t = SessionTable(size=100, ttl=10.0)
    for i in range(50):
        t.record(f"k{i}", "ep", 0.0)
    t.record("late", "ep", 20.0)
    assert len(t) == 1
    t.expire(31.0)
    assert len(t) == 0


def test_session_forget_and_discard() -> None:
    t = SessionTable(size=100, ttl=100.0)
    t.record("a", "ep1", 0.0)
    t.record("b", "ep2", 0.0)
    t.record("c", "ep1", 0.0)
    t.forget("ep1")
    assert t.lookup("a", 1.0) is None
    assert t.lookup("c", 1.0) is None
    assert t.lookup("b", 1.0) == "ep2"
    t.discard("b")
    t.discard("missing")
    assert len(t) == 0


@settings(max_examples=examples(100))
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 3)), max_size=200))
def test_session_table_never_exceeds_its_size(ops: list[tuple[int, int]]) -> None:
    t = SessionTable(size=5, ttl=1e9)
    for step, (key, ep) in enumerate(ops):
        t.record(f"k{key}", f"ep{ep}", float(step))
        assert len(t) <= 5
        assert t.lookup(f"k{key}", float(step)) == f"ep{ep}"


# -- prefix hashing -----------------------------------------------------------


def test_prefix_hashes_whole_blocks_only() -> None:
    assert prefix_hashes("abc", 4, 10) == ()
    assert len(prefix_hashes("abcd", 4, 10)) == 1
    assert len(prefix_hashes("abcdefg", 4, 10)) == 1
    assert len(prefix_hashes("a" * 100, 4, 10)) == 10


def test_prefix_hashes_chain() -> None:
    a = prefix_hashes("AAAABBBBCCCC", 4, 10)
    b = prefix_hashes("AAAABBBBDDDD", 4, 10)
    c = prefix_hashes("XXXXBBBBCCCC", 4, 10)
    assert a[:2] == b[:2]
    assert a[2] != b[2]
    # Same block 1 text after a different block 0: a different chain.
    assert a[1] != c[1]
    assert a[2] != c[2]
    assert prefix_hashes("AAAA", 4, 10, seed="m1") != prefix_hashes("AAAA", 4, 10, seed="m2")


@settings(max_examples=examples(100))
@given(st.text(max_size=40), st.text(max_size=40), st.text(max_size=40))
def test_shared_prefix_shares_leading_hashes(common: str, x: str, y: str) -> None:
    a = prefix_hashes(common + x, 4, 100)
    b = prefix_hashes(common + y, 4, 100)
    shared = len(common) // 4
    assert a[:shared] == b[:shared]


# -- prefix table -------------------------------------------------------------


def test_prefix_match_longest_chain() -> None:
    t = PrefixTable(size=1000, ttl=100.0)
    req = prefix_hashes("A" * 40, 4, 100)  # 10 blocks
    t.record(req[:3], "short", 0.0)
    t.record(req[:8], "long", 0.0)
    t.record(prefix_hashes("B" * 40, 4, 100), "other", 0.0)
    m = t.match(req, 1.0)
    assert m == {"short": 0.3, "long": 0.8}
    assert t.match((), 1.0) == {}


def test_prefix_match_ttl() -> None:
    t = PrefixTable(size=1000, ttl=10.0)
    h = prefix_hashes("A" * 16, 4, 100)
    t.record(h, "old", 0.0)
    t.record(h[:2], "new", 5.0)
    assert t.match(h, 10.0) == {"old": 1.0, "new": 0.5}
    assert t.match(h, 10.5) == {"new": 0.5}
    assert t.match(h, 16.0) == {}
    t.expire(16.0)
    assert len(t) == 0


def test_prefix_lru_evicts_long_tails_first() -> None:
    t = PrefixTable(size=6, ttl=1e9)
    a = prefix_hashes("A" * 16, 4, 100)
    b = prefix_hashes("B" * 16, 4, 100)
    t.record(a, "ep-a", 0.0)
    t.record(b, "ep-b", 1.0)
    assert len(t) == 6
    # a's two longest prefixes went; its shorter prefixes still match.
    assert t.match(a, 2.0) == {"ep-a": 0.5}
    assert t.match(b, 2.0) == {"ep-b": 1.0}


def test_prefix_forget() -> None:
    t = PrefixTable(size=100, ttl=100.0)
    h = prefix_hashes("A" * 16, 4, 100)
    t.record(h, "x", 0.0)
    t.record(h[:2], "y", 0.0)
    t.forget("x")
    assert t.match(h, 1.0) == {"y": 0.5}
    assert len(t) == 2
    t.forget("y")
    assert len(t) == 0


def test_prefix_table_size_zero_is_off() -> None:
    t = PrefixTable(size=0, ttl=100.0)
    h = prefix_hashes("A" * 16, 4, 100)
    t.record(h, "x", 0.0)
    assert len(t) == 0
    assert t.match(h, 0.0) == {}


@settings(max_examples=examples(100))
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 6), st.sampled_from(["p", "q", "r"])),
        max_size=60,
    )
)
def test_prefix_table_bounded_and_fractions_valid(ops: list[tuple[int, int, str]]) -> None:
    t = PrefixTable(size=10, ttl=1e9)
    for step, (prompt, blocks, ep) in enumerate(ops):
        h = prefix_hashes(chr(65 + prompt) * 4 * blocks, 4, 100)
        t.record(h, ep, float(step))
        assert len(t) <= 10
        m = t.match(h, float(step))
        assert all(0.0 < f <= 1.0 for f in m.values())
        # What was just recorded is held whole: by its most frequent holder fully,
        # by any other holder at least half.
        assert max(m.values()) == 1.0
        assert m[ep] >= 0.5


def test_a_spilled_prefix_keeps_its_home() -> None:
    t = PrefixTable(size=100, ttl=100.0)
    h = prefix_hashes("S" * 64, 16, 100)
    for i in range(9):
        t.record(h, "home", float(i))
    t.record(h, "spill", 9.0)
    m = t.match(h, 10.0)
    assert m["home"] == 1.0
    assert 0.5 < m["spill"] < 0.6


# -- prompt text --------------------------------------------------------------


def test_chat_text_includes_roles_and_parts() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe"},
                    {"type": "image_url", "image_url": {"url": "http://img/1.png"}},
                ],
            },
        ],
    }
    text = prompt_text_for_affinity(body)
    assert "system" in text and "You are helpful." in text
    assert "Describe" in text and "http://img/1.png" in text
    assert text.index("You are helpful.") < text.index("Describe")


def test_chat_message_boundaries_matter() -> None:
    one = {"messages": [{"role": "user", "content": "ab"}, {"role": "user", "content": "c"}]}
    two = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "bc"}]}
    assert prompt_text_for_affinity(one) != prompt_text_for_affinity(two)


def test_chat_growing_conversation_keeps_its_prefix() -> None:
    turn1 = {
        "messages": [{"role": "system", "content": "S" * 600}, {"role": "user", "content": "hi"}]
    }
    turn2 = {
        "messages": [
            *turn1["messages"],
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"},
        ]
    }
    t1, t2 = prompt_text_for_affinity(turn1), prompt_text_for_affinity(turn2)
    assert t2.startswith(t1)


def test_completions_prompt_forms() -> None:
    assert prompt_text_for_affinity({"prompt": "Once upon"}) == "Once upon"
    assert prompt_text_for_affinity({"prompt": ["first", "second"]}) == "first"
    assert prompt_text_for_affinity({"prompt": [1, 2, 3]}) == "1,2,3"
    assert prompt_text_for_affinity({"prompt": [[4, 5], [6]]}) == "4,5"
    assert prompt_text_for_affinity({"prompt": []}) == ""


def test_limit_cuts_text() -> None:
    body = {"messages": [{"role": "user", "content": "x" * 10_000}] * 50}
    assert len(prompt_text_for_affinity(body, limit=1000)) == 1000
    assert len(prompt_text_for_affinity({"prompt": "y" * 5000}, limit=100)) == 100
    assert len(prompt_text_for_affinity({"prompt": list(range(10_000))}, limit=100)) == 100


def test_malformed_bodies_give_text_without_raising() -> None:
    bad: list[dict[str, object]] = [
        {},
        {"messages": "nope"},
        {"messages": [None, 3, {"role": 5, "content": {"x": 1}}]},
        {"messages": [{"role": "user", "content": [None, 1, {"type": "image_url"}]}]},
        {"prompt": 42},
        {"prompt": [None]},
    ]
    for body in bad:
        assert isinstance(prompt_text_for_affinity(body), str)


def naive_match(table: PrefixTable, hashes: list[int], now: float) -> dict[str, float]:
    """The definition: walk the chain from its start, stop at the first block nobody
    holds, and give each endpoint its share at the deepest block it holds."""
    result: dict[str, float] = {}
    cutoff = now - table.ttl
    for i, h in enumerate(hashes):
        holders = table._entries.get(h)
        live = {ep: n for ep, (seen, n, _) in (holders or {}).items() if seen >= cutoff}
        if not live:
            break
        most = max(live.values())
        for ep, n in live.items():
            result[ep] = (i + 1) / len(hashes) * (0.5 + 0.5 * n / most)
    return result


@settings(max_examples=examples(200))
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=3),  # which of 4 prompts
            st.integers(min_value=1, max_value=6),  # how many of its blocks
            st.sampled_from(["a", "b", "c"]),
            st.floats(min_value=0, max_value=5),  # time step
        ),
        max_size=40,
    ),
    st.integers(min_value=1, max_value=12),  # table size: small, so LRU evicts
    st.integers(min_value=0, max_value=3),
    st.floats(min_value=0, max_value=30),
)
def test_match_agrees_with_the_walk_from_the_start(
    records: list[tuple[int, int, str, float]], size: int, probe: int, later: float
) -> None:
    # Four prompts sharing a first block in pairs: chains that share and diverge.
    chains = [[1, 10, 11, 12, 13, 14], [1, 10, 21, 22, 23, 24], [2, 30, 31, 32, 33, 34],
              [2, 40, 41, 42, 43, 44]]  # fmt: skip
    table = PrefixTable(size, ttl=10.0)
    now = 0.0
    for prompt, blocks, ep, step in records:
        now += step
        table.record(chains[prompt][:blocks], ep, now)
    at = now + later
    assert table.match(chains[probe], at) == pytest.approx(naive_match(table, chains[probe], at))


# -- the table against the engines' answers -------------------------------------------


class LruEngine:
    """An engine's prefix cache of `capacity` blocks, least recently used out first; a
    prompt's tail blocks are older than its head (vLLM frees them in that order)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def serve(self, chain: Sequence[int]) -> int:
        """Serve a prompt; the leading blocks it found cached."""
        cached = 0
        for h in chain:
            if h not in self.blocks:
                break
            cached += 1
        for h in reversed(chain):
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)
        return cached

    def reset(self) -> None:
        self.blocks.clear()


def replay(
    table: PrefixTable, engine: LruEngine, prompts: int, blocks: int, n: int, *, learn: bool
) -> list[str]:
    """`n` requests to one endpoint, prompts drawn at random (seeded); per request
    whether the table's prediction agreed with the engine."""
    rng = random.Random(7)
    chains = [prefix_hashes(chr(65 + p) * 4 * blocks, 4, 100) for p in range(prompts)]
    outcomes = []
    for step in range(n):
        chain = chains[rng.randrange(prompts)]
        probe = table.probe(chain, "ep", float(step))
        table.record(chain, "ep", float(step))
        cached = engine.serve(chain)
        if learn:
            outcomes.append(table.observe("ep", probe, cached, settle=0.5))
        else:
            agreed = (probe.held >= blocks - 1) == (cached >= blocks - 1)
            outcomes.append("hit" if agreed else "over")
    return outcomes


def test_the_table_learns_an_engines_cache_from_its_answers() -> None:
    """An engine that holds 5 of 8 prompts: a table that trusts its ttl predicts a hit
    for every prompt it saw; one that weighs the engine's answers learns where its
    LRU cuts and predicts what the engine does."""
    blocks, capacity = 8, 40
    naive = replay(PrefixTable(1000, 1e9), LruEngine(capacity), 8, blocks, 600, learn=False)
    table = PrefixTable(1000, 1e9, learn=True)
    learnt = replay(table, LruEngine(capacity), 8, blocks, 600, learn=True)

    def agreement(outcomes: list[str]) -> float:
        tail = outcomes[300:]
        return sum(o in ("hit", "miss") for o in tail) / len(tail)

    assert agreement(naive) < 0.7
    assert agreement(learnt) >= 0.9
    assert table.capacity("ep") is not None


def test_a_miss_on_a_block_still_in_its_first_prefill_teaches_nothing() -> None:
    t = PrefixTable(1000, 1e9, learn=True)
    chain = prefix_hashes("A" * 32, 4, 100)
    t.record(chain, "ep", 0.0)
    probe = t.probe(chain, "ep", 0.2)  # picked 0.2 s after the first: still prefilling
    t.record(chain, "ep", 0.2)
    assert t.observe("ep", probe, 0, settle=1.0) == "over"
    assert t.capacity("ep") is None
    probe = t.probe(chain, "ep", 5.0)
    t.record(chain, "ep", 5.0)
    assert t.observe("ep", probe, 0, settle=1.0) == "over"
    assert t.capacity("ep") == len(chain)  # never below the prompt it just computed


def test_a_capacity_learnt_too_low_rises_with_the_engines_hits() -> None:
    """A reset cache (an engine restarted) looks like a small one; the blocks the
    engine then keeps holding, at distances past the bound, raise it again."""
    blocks = 8
    table = PrefixTable(1000, 1e9, learn=True)
    engine = LruEngine(64)
    replay(table, engine, 4, blocks, 50, learn=True)  # everything fits: all hits
    assert table.capacity("ep") is None
    engine.reset()
    chains = [prefix_hashes(chr(65 + p) * 4 * blocks, 4, 100) for p in range(4)]
    for step, chain in enumerate(chains * 3, start=100):
        probe = table.probe(chain, "ep", float(step))
        table.record(chain, "ep", float(step))
        table.observe("ep", probe, engine.serve(chain), settle=0.5)
    low = table.capacity("ep")
    assert low is not None and low < 4 * blocks
    outcomes = replay(table, engine, 4, blocks, 100, learn=True)
    capacity = table.capacity("ep")
    assert capacity is not None and capacity >= 4 * blocks
    # Agreed again: no hit predicted that the engine lacked, few it held unforeseen
    # (references count repeats, so a long gap can still pass the bound).
    tail = outcomes[-50:]
    assert "over" not in tail and tail.count("hit") >= 45
