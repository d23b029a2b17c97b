"""The pure engine model, driven with a number for a clock."""

from __future__ import annotations

import pytest

from llmgw.sim import tokens
from llmgw.sim.model import (
    BLOCK_SIZE,
    BlockManager,
    Engine,
    EngineConfig,
    Request,
    StepOutcome,
    Token,
)


def prompt(n: int, salt: int = 0) -> tuple[int, ...]:
    """`n` distinct-looking token ids; different salts share no block."""
    return tuple(salt * 1_000_000 + i for i in range(n))


def run(engine: Engine, now: float = 0.0, limit: int = 10_000) -> tuple[float, list[StepOutcome]]:
    """Step until idle; returns the clock at the end and every outcome."""
    outcomes = []
    for _ in range(limit):
        out = engine.step(now)
        if out is None:
            return now, outcomes
        now = out.step.ends
        outcomes.append(out)
    raise AssertionError("engine never went idle")


def first_token_time(outcomes: list[StepOutcome], rid: str) -> float:
    for out in outcomes:
        if any(t.request_id == rid and t.index == 0 for t in out.tokens):
            return out.step.ends
    raise AssertionError(f"{rid} never produced a token")


def tokens_of(outcomes: list[StepOutcome], rid: str) -> list[Token]:
    return [t for out in outcomes for t in out.tokens if t.request_id == rid]


# -- tokenizer ----------------------------------------------------------------------------


def test_tokenizer_is_prefix_stable_and_about_four_chars_per_token() -> None:
    text = "the quick brown fox jumps over the lazy dog " * 10
    ids = tokens.encode(text)
    assert len(ids) == tokens.count(text) == -(-len(text) // 4)
    assert tokens.encode(text + "and more")[: len(text) // 4] == ids[: len(text) // 4]
    assert tokens.encode(text) == ids  # deterministic


def test_generated_words_retokenize_to_one_token_each() -> None:
    assert all(tokens.count(w) == 1 for w in tokens.WORDS)
    assert len(set(tokens.WORDS)) == len(tokens.WORDS) > 100


def test_chat_render_rejects_bad_messages() -> None:
    assert "<|user|>\nhi\n" in tokens.render_chat([{"role": "user", "content": "hi"}])
    parts = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}]
    assert "<|user|>\na\n" in tokens.render_chat([{"role": "user", "content": parts}])
    with pytest.raises(ValueError):
        tokens.render_chat([{"content": "no role"}])


# -- prefix cache -------------------------------------------------------------------------


def test_repeated_prompt_hits_the_prefix_cache_and_prefills_faster() -> None:
    engine = Engine(EngineConfig())
    p = prompt(2000)
    engine.add(Request("a", p, max_tokens=4), 0.0)
    now, first = run(engine)
    ttft_cold = first_token_time(first, "a") - 0.0
    done_a = next(f for o in first for f in o.finished)
    assert done_a.cached_tokens == 0

    engine.add(Request("b", p, max_tokens=4), now)
    _, second = run(engine, now)
    ttft_warm = first_token_time(second, "b") - now
    done_b = next(f for o in second for f in o.finished)
    # Everything but the last (partial) block is reused; at least one token is recomputed.
    assert done_b.cached_tokens == (2000 - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert ttft_warm < ttft_cold / 3
    s = engine.stats()
    assert s.prefix_queries == 4000
    assert s.prefix_hits == done_b.cached_tokens


def test_shared_prefix_hits_only_the_shared_full_blocks() -> None:
    engine = Engine(EngineConfig())
    shared = prompt(100)
    engine.add(Request("a", shared + prompt(50, salt=1), max_tokens=1), 0.0)
    now, _ = run(engine)
    engine.add(Request("b", shared + prompt(50, salt=2), max_tokens=1), now)
    _, outcomes = run(engine, now)
    done = next(f for o in outcomes for f in o.finished)
    assert done.cached_tokens == 96  # six full blocks of the 100 shared tokens


def test_no_prefix_caching_means_no_hits() -> None:
    engine = Engine(EngineConfig(enable_prefix_caching=False))
    for rid in ("a", "b"):
        engine.add(Request(rid, prompt(200), max_tokens=1), 0.0)
        run(engine)
    assert engine.stats().prefix_hits == 0


def test_reset_prefix_cache_forgets_cached_blocks() -> None:
    engine = Engine(EngineConfig())
    engine.add(Request("a", prompt(200), max_tokens=1), 0.0)
    now, _ = run(engine)
    assert engine.stats().num_cached_blocks > 0
    engine.reset_prefix_cache()
    assert engine.stats().num_cached_blocks == 0
    engine.add(Request("b", prompt(200), max_tokens=1), now)
    _, outcomes = run(engine, now)
    assert next(f for o in outcomes for f in o.finished).cached_tokens == 0


def test_lru_eviction_when_blocks_run_out() -> None:
    kv = BlockManager(num_blocks=4)
    a = [kv.allocate(), kv.allocate()]
    kv.register(a[0], 101)
    kv.register(a[1], 102)
    kv.release(a)  # cached but unreferenced: evictable, tail first
    b = kv.allocate()
    kv.register(b, 201)
    kv.release([b])
    assert kv.num_free == 4 and kv.num_cached == 3
    kv.allocate()  # the one never-used block goes first
    assert kv.num_cached == 3
    kv.allocate()  # then the least recently released cached block: a's tail
    assert kv.lookup([101, 102]) == [a[0]] and kv.num_cached == 2
    kv.allocate()  # then a's head
    assert kv.lookup([101]) == [] and kv.lookup([201]) == [b]  # b was released last
    kv.allocate()
    assert kv.lookup([201]) == [] and kv.num_free == 0
    with pytest.raises(RuntimeError):
        kv.allocate()


def test_engine_evicts_old_prefixes_to_admit_new_prompts() -> None:
    engine = Engine(EngineConfig(num_blocks=20))
    engine.add(Request("a", prompt(160), max_tokens=1), 0.0)  # 10 full blocks
    now, _ = run(engine)
    engine.add(Request("b", prompt(160, salt=1), max_tokens=1), now)
    now, _ = run(engine, now)
    engine.add(Request("c", prompt(160, salt=2), max_tokens=1), now)  # evicts a's blocks
    now, _ = run(engine, now)
    engine.add(Request("d", prompt(160), max_tokens=1), now)  # a's prompt again: gone
    _, outcomes = run(engine, now)
    assert next(f for o in outcomes for f in o.finished).cached_tokens == 0
    assert engine.stats().num_used_blocks == 0


# -- batching and the waiting queue -------------------------------------------------------


def test_batch_limit_leaves_requests_waiting() -> None:
    engine = Engine(EngineConfig(max_num_seqs=2))
    for rid in "abc":
        engine.add(Request(rid, prompt(20, salt=ord(rid)), max_tokens=3), 0.0)
    step = engine.begin_step(0.0)
    assert step is not None
    assert {rid for rid, _ in step.work} == {"a", "b"}
    s = engine.stats()
    assert (s.num_running, s.num_waiting) == (2, 1)
    first = engine.end_step(step.ends)
    assert {t.request_id for t in first.tokens} == {"a", "b"}
    _, outcomes = run(engine, step.ends)
    assert first_token_time(outcomes, "c") > step.ends + 2 * 0.01  # after a and b finished
    assert len(tokens_of(outcomes, "c")) == 3


def test_full_cache_leaves_requests_waiting() -> None:
    engine = Engine(EngineConfig(num_blocks=10))
    engine.add(Request("a", prompt(100), max_tokens=20), 0.0)  # 7 blocks
    engine.add(Request("b", prompt(100, salt=1), max_tokens=20), 0.0)  # 7 more: no room
    step = engine.begin_step(0.0)
    assert step is not None and [rid for rid, _ in step.work] == ["a"]
    assert engine.stats().num_waiting == 1
    engine.end_step(step.ends)
    _, outcomes = run(engine, step.ends)
    assert len(tokens_of(outcomes, "b")) == 20
    assert engine.stats().num_used_blocks == 0


def test_decode_growth_preempts_the_newest_sequence() -> None:
    # Two sequences fit at admission but not while both grow.
    engine = Engine(EngineConfig(num_blocks=6))
    engine.add(Request("a", prompt(32), max_tokens=30), 0.0)
    engine.add(Request("b", prompt(32, salt=1), max_tokens=30), 0.0)
    _, outcomes = run(engine)
    assert engine.stats().preemptions >= 1
    assert any("b" in o.step.preempted for o in outcomes)
    for rid in "ab":  # both still produce every token, in order, exactly once
        assert [t.index for t in tokens_of(outcomes, rid)] == list(range(30))


def test_decode_step_time_grows_with_batch() -> None:
    cfg = EngineConfig(decode_step_ms=10, decode_ms_per_seq=1, prefill_us_per_token=0)

    def decode_step(batch: int) -> float:
        engine = Engine(cfg)
        for i in range(batch):
            engine.add(Request(f"r{i}", prompt(8, salt=i), max_tokens=5), 0.0)
        engine.step(0.0)  # prefill
        out = engine.step(1.0)
        assert out is not None and out.step.num_decodes == batch
        return out.step.duration

    assert decode_step(1) == pytest.approx(0.011)
    assert decode_step(16) == pytest.approx(0.026)
    assert decode_step(1) < decode_step(4) < decode_step(16)


def test_prefill_cost_is_proportional_to_uncached_tokens() -> None:
    cfg = EngineConfig(decode_step_ms=0, prefill_us_per_token=100, max_num_batched_tokens=8192)
    costs = []
    for n in (500, 1000, 2000):
        engine = Engine(cfg)
        engine.add(Request("a", prompt(n), max_tokens=1), 0.0)
        out = engine.step(0.0)
        assert out is not None
        costs.append(out.step.duration)
    assert costs == pytest.approx([0.05, 0.1, 0.2])


def test_long_prompt_is_prefilled_in_chunks_alongside_decodes() -> None:
    engine = Engine(EngineConfig(max_num_batched_tokens=512))
    engine.add(Request("short", prompt(10), max_tokens=10), 0.0)
    engine.step(0.0)
    engine.add(Request("long", prompt(2000, salt=1), max_tokens=1), 0.0)
    out = engine.step(0.1)
    assert out is not None
    assert dict(out.step.work) == {"short": 1, "long": 511}
    assert [t.request_id for t in out.tokens] == ["short"]  # decode not stalled


# -- abort, usage, determinism ------------------------------------------------------------


def test_abort_frees_blocks_at_once_even_mid_step() -> None:
    engine = Engine(EngineConfig())
    engine.add(Request("a", prompt(300), max_tokens=50), 0.0)
    engine.add(Request("w", prompt(300, salt=1), max_tokens=50), 0.0)
    run_steps = engine.begin_step(0.0)
    assert run_steps is not None
    assert engine.stats().num_used_blocks > 0
    assert engine.abort("a") and engine.abort("w")
    s = engine.stats()
    assert (s.num_running, s.num_waiting, s.num_used_blocks, s.kv_usage) == (0, 0, 0, 0.0)
    out = engine.end_step(run_steps.ends)
    assert out.tokens == ()
    assert not engine.abort("a")
    assert engine.stats().requests_aborted == 2


def test_abort_of_a_waiting_request() -> None:
    engine = Engine(EngineConfig(max_num_seqs=1))
    engine.add(Request("a", prompt(10), max_tokens=5), 0.0)
    engine.add(Request("b", prompt(10, salt=1), max_tokens=5), 0.0)
    engine.step(0.0)
    assert engine.abort("b")
    _, outcomes = run(engine)
    assert tokens_of(outcomes, "b") == []


def test_usage_is_consistent_with_emitted_tokens() -> None:
    engine = Engine(EngineConfig(max_num_seqs=3))
    sizes = {"a": 7, "b": 1, "c": 33, "d": 12}
    for i, (rid, n) in enumerate(sizes.items()):
        engine.add(Request(rid, prompt(40 + i, salt=i), max_tokens=n), 0.0)
    _, outcomes = run(engine)
    finished = {f.request_id: f for o in outcomes for f in o.finished}
    for i, (rid, n) in enumerate(sizes.items()):
        emitted = tokens_of(outcomes, rid)
        assert [t.index for t in emitted] == list(range(n))
        assert [t.finished for t in emitted] == [False] * (n - 1) + [True]
        assert finished[rid].completion_tokens == n
        assert finished[rid].prompt_tokens == 40 + i
    s = engine.stats()
    assert s.generation_tokens == sum(sizes.values())
    assert s.prompt_tokens == sum(40 + i for i in range(4))
    assert s.requests_finished == 4
    assert (s.num_running, s.num_waiting, s.num_used_blocks) == (0, 0, 0)


def test_request_seed_makes_output_deterministic() -> None:
    def texts(engine_seed: int, request_seed: int | None) -> str:
        engine = Engine(EngineConfig(seed=engine_seed))
        engine.add(Request("x", prompt(30), max_tokens=20, seed=request_seed), 0.0)
        _, outcomes = run(engine)
        return "".join(t.text for t in tokens_of(outcomes, "x"))

    assert texts(1, 42) == texts(2, 42)
    assert texts(1, 42) != texts(1, 43)
    assert texts(5, None) == texts(5, None)  # the engine seed decides
    assert texts(5, None) != texts(6, None)


def test_impossible_requests_are_refused() -> None:
    engine = Engine(EngineConfig(num_blocks=4, max_model_len=100))
    with pytest.raises(ValueError, match="context length"):
        engine.add(Request("a", prompt(90), max_tokens=20), 0.0)
    with pytest.raises(ValueError, match="KV cache"):
        engine.add(Request("a", prompt(60), max_tokens=10), 0.0)
    with pytest.raises(ValueError, match="empty"):
        engine.add(Request("a", (), max_tokens=10), 0.0)
    engine.add(Request("a", prompt(10), max_tokens=10), 0.0)
    with pytest.raises(ValueError, match="duplicate"):
        engine.add(Request("a", prompt(10), max_tokens=10), 0.0)


def test_not_before_holds_a_request_back_without_blocking_others() -> None:
    engine = Engine(EngineConfig())
    engine.add(Request("late", prompt(10), max_tokens=1, not_before=1.0), 0.0)
    engine.add(Request("now", prompt(10, salt=1), max_tokens=1), 0.0)
    assert engine.next_wakeup(0.0) == 1.0
    out = engine.step(0.0)
    assert out is not None and [t.request_id for t in out.tokens] == ["now"]
    assert engine.step(0.5) is None
    assert engine.next_wakeup(0.5) == 1.0
    out = engine.step(1.0)
    assert out is not None and [t.request_id for t in out.tokens] == ["late"]
