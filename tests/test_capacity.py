"""Learning a replica's capacity from its own queue (llmgw.router.scheduling.capacity)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.router.scheduling.capacity import NEAR, learn
from tests.properties import examples


def step(learned: float | None, running: float, waiting: float, **kw: float | None) -> float | None:
    kv = kw.pop("kv", 0.3)
    load = kw.pop("load", running + waiting)
    assert not kw
    return learn(
        learned,
        running=running,
        waiting=waiting,
        kv_usage=kv,
        load=float(load),  # type: ignore[arg-type]
        target_waiting=4.0,
        kv_ceiling=0.9,
    )


def test_unknown_until_the_engine_queues() -> None:
    # A big batch with no queue says nothing about a limit.
    assert step(None, 200, 0) is None
    # A passing arrival or two between engine steps is not a queue.
    assert step(None, 30, 3) is None
    # Metrics it does not report teach nothing.
    assert learn(None, running=None, waiting=9, kv_usage=None, load=9, target_waiting=4,
                 kv_ceiling=0.9) is None  # fmt: skip


def test_a_queue_with_room_in_the_cache_is_the_batch_limit() -> None:
    assert step(None, 32, 6) == 32
    assert step(None, 32, 6, kv=None) == 32  # llama.cpp reports no KV gauge
    # Relearned downwards too: it really runs only that many now.
    assert step(64, 40, 5) == 40
    # A full KV cache is its own signal (the scheduler's KV dimension) and no limit.
    assert step(None, 20, 9, kv=0.95) is None
    assert step(32, 20, 9, kv=0.95) == 32


def test_a_low_guess_doubles_while_the_engine_runs_all_it_is_sent() -> None:
    learned: float | None = step(None, 20, 4)  # a burst: really a 256-sequence engine
    assert learned == 20
    seen = [learned]
    for _ in range(5):
        # The router holds traffic near the guess; the engine queues nothing.
        learned = step(learned, NEAR * learned, 0)
        seen.append(learned)
    assert seen == [20, 40, 80, 160, 320, 640]
    # Far below the guess, or with a queue under the target, it stays.
    assert step(64, 10, 0) == 64
    assert step(64, 60, 2) == 64


@settings(max_examples=examples(200))
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=300),
            st.floats(min_value=0, max_value=50),
            st.one_of(st.none(), st.floats(min_value=0, max_value=1)),
        ),
        max_size=30,
    )
)
def test_never_below_what_it_was_seen_running_with_no_queue(
    samples: list[tuple[float, float, float | None]],
) -> None:
    """Whatever the scrapes, the learned capacity is never below the running count of
    the last scrape that showed a queue with room in the cache, and is only learned
    from such a scrape."""
    learned: float | None = None
    floor: float | None = None
    for running, waiting, kv in samples:
        learned = step(learned, running, waiting, kv=kv)
        if waiting >= 4 and running >= 1 and (kv is None or kv < 0.9):
            floor = running
        if floor is None:
            assert learned is None
        else:
            assert learned is not None and learned >= floor
