"""Learning a replica's capacity from its own queue (llmgw.router.scheduling.capacity)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.router.scheduling.capacity import NEAR, Learned, learn
from tests.properties import examples


def step(
    learned: Learned | None,
    running: float,
    waiting: float,
    *,
    kv: float | None = 0.3,
    load: float | None = None,
) -> Learned | None:
    return learn(
        learned,
        running=running,
        waiting=waiting,
        kv_usage=kv,
        load=running + waiting if load is None else load,
        target_waiting=4.0,
        kv_ceiling=0.9,
    )


def capacity(learned: Learned | None) -> float | None:
    return None if learned is None else learned.capacity


def twice(running: float, waiting: float, **kw: float | None) -> Learned | None:
    """Two scrapes in a row with the same numbers."""
    return step(step(None, running, waiting, **kw), running, waiting, **kw)  # type: ignore[arg-type]


def test_unknown_until_the_engine_queues_in_two_scrapes_in_a_row() -> None:
    # A big batch with no queue says nothing about a limit.
    assert step(None, 200, 0) is None
    # A passing arrival or two between engine steps is not a queue.
    assert step(None, 30, 3) is None
    # One queued scrape may be a burst, or an engine behind its steps for a moment.
    seen = step(None, 30, 6)
    assert capacity(seen) is None
    assert step(seen, 60, 0) is None  # gone a scrape later: nothing learned
    assert capacity(step(seen, 32, 5)) == 32
    # Metrics it does not report teach nothing.
    assert learn(None, running=None, waiting=9, kv_usage=None, load=9, target_waiting=4,
                 kv_ceiling=0.9) is None  # fmt: skip


def test_a_queue_with_room_in_the_cache_is_the_batch_limit() -> None:
    assert capacity(twice(32, 6)) == 32
    assert capacity(twice(32, 6, kv=None)) == 32  # llama.cpp reports no KV gauge
    # Relearned downwards too, a tenth a scrape: one scrape may catch the engine
    # between finishing sequences and starting the queued ones.
    assert capacity(step(Learned(64), 40, 5)) == 64 * 0.9
    assert capacity(step(Learned(42), 40, 5)) == 40
    # A full KV cache is its own signal (the scheduler's KV dimension) and no limit.
    assert twice(20, 9, kv=0.95) is None
    assert capacity(step(Learned(32), 20, 9, kv=0.95)) == 32


def test_probing_past_a_real_limit_comes_back_to_it() -> None:
    # At its real limit of 32 the engine runs 32 and queues nothing (the router holds
    # the rest): the capacity grows a little, the engine queues, it comes back.
    grown = step(Learned(32), 32, 0)
    assert capacity(grown) == 32 * 1.1
    back = step(grown, 32, 2, load=35)
    assert back == Learned(32)
    # A scrape between two engine steps: fewer running, the queue not yet scheduled.
    assert step(Learned(32), 20, 6) == Learned(32 * 0.9)


def test_a_low_guess_grows_faster_with_each_scrape_that_shows_room() -> None:
    learned = twice(20, 4)  # a burst: really a 256-sequence engine
    assert learned == Learned(20)
    seen = []
    while learned is not None and learned.capacity < 256:
        learned = step(learned, NEAR * learned.capacity, 0)
        assert learned is not None
        seen.append(round(learned.capacity, 1))
    # Past the real 256 in six scrapes; there the engine queues and it comes back.
    assert seen == [22.0, 26.4, 37.0, 66.5, 173.0, 726.5]
    # Far below the learned capacity, nothing is learned either way.
    assert step(Learned(64), 10, 0) == Learned(64)
    assert step(Learned(64), 10, 2) == Learned(64)


@settings(max_examples=examples(200))
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=300),
            st.floats(min_value=0, max_value=50),
            st.one_of(st.none(), st.floats(min_value=0, max_value=1)),
            st.floats(min_value=0, max_value=400),
        ),
        max_size=30,
    )
)
def test_only_learned_from_a_queue_and_never_below_one_since(
    samples: list[tuple[float, float, float | None, float]],
) -> None:
    """Whatever the scrapes: unknown until the engine held a real queue with room in its
    cache in two scrapes in a row, then never below the smallest running count of any
    scrape since that showed a queue (the engine ran at least that many when it was
    full), nor falling by more than a tenth in one scrape."""
    learned: Learned | None = None
    floor: float | None = None
    queued_before = False
    for running, waiting, kv, extra in samples:
        load = running + waiting + extra
        before = capacity(learned)
        learned = step(learned, running, waiting, kv=kv, load=load)
        room = kv is None or kv < 0.9
        queued = waiting >= 4 and running >= 1 and room
        if before is not None:
            after = capacity(learned)
            assert after is not None and after >= 0.9 * before - 1e-9
        if queued and (floor is not None or queued_before):
            floor = running if floor is None else min(floor, running)
        elif floor is not None and waiting > 0 and running >= 1 and room:
            floor = min(floor, running)
        if room:  # a full KV cache teaches nothing either way
            queued_before = queued
        if floor is None:
            assert capacity(learned) is None
        else:
            got = capacity(learned)
            assert got is not None and got >= floor
