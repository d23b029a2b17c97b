"""UsageBatcher against a fake store, on trio's virtual clock (no threads, no database).

The same batcher against both real backends is in test_store.py.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import pytest
import trio
import trio.testing

from llmgw.domain.usage import Usage, UsageRecord, UsageSink
from llmgw.store import TimedUsage, UsageBatcher


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})


def rec(model: str) -> UsageRecord:
    return UsageRecord(model=model, endpoint=None, status=200, usage=Usage(1, 1), latency=0.1)


class FakeStore:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.fail_next = 0
        self.delay = 0.0

    async def record_usage(self, batch: Sequence[TimedUsage]) -> None:
        await trio.sleep(self.delay)  # the write's duration (virtual time)
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("database is down")
        self.batches.append([r.model for _, r in batch])

    @property
    def models(self) -> list[str]:
        return [m for b in self.batches for m in b]


def test_the_batcher_is_a_usage_sink() -> None:
    sink: UsageSink = UsageBatcher(FakeStore())
    sink.record(rec("m"))
    assert isinstance(sink, UsageBatcher) and sink.pending == 1


def test_record_stamps_wall_clock_time() -> None:
    now = [1000.0]
    batcher = UsageBatcher(FakeStore(), clock=lambda: now[0])
    batcher.record(rec("a"))
    now[0] = 1001.5
    batcher.record(rec("b"))
    assert [t for t, _ in batcher._buffer] == [1000.0, 1001.5]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        UsageBatcher(FakeStore(), max_batch=0)
    with pytest.raises(ValueError):
        UsageBatcher(FakeStore(), max_batch=10, max_buffer=5)
    with pytest.raises(ValueError):
        UsageBatcher(FakeStore(), flush_interval=0)


async def test_flushes_at_the_interval_and_when_a_batch_fills() -> None:
    store = FakeStore()
    batcher = UsageBatcher(store, max_batch=4, flush_interval=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        batcher.record(rec("a"))
        await trio.sleep(0.5)  # virtual time, as every sleep here
        assert store.batches == []  # not yet: half an interval
        await trio.sleep(0.6)  # past the interval
        assert store.batches == [["a"]]
        start = trio.current_time()
        for m in "bcdef":
            batcher.record(rec(m))
        await trio.sleep(0.01)  # a full batch goes at once, with what else is waiting
        assert store.batches == [["a"], ["b", "c", "d", "e"], ["f"]]
        assert trio.current_time() - start < 0.1
        nursery.cancel_scope.cancel()
    assert batcher.written == 6 and batcher.batches == 3


async def test_a_failed_write_is_retried_in_order() -> None:
    store = FakeStore()
    store.fail_next = 2
    batcher = UsageBatcher(store, max_batch=2, flush_interval=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        for m in "abc":
            batcher.record(rec(m))
        await trio.sleep(0.1)  # the first attempt has failed (virtual time)
        assert store.batches == [] and batcher.failed_writes == 1
        batcher.record(rec("d"))
        await trio.sleep(5)  # several intervals: the retries (virtual time)
        nursery.cancel_scope.cancel()
    assert store.models == ["a", "b", "c", "d"]
    assert batcher.failed_writes == 2 and batcher.dropped == 0 and batcher.lost == 0


async def test_a_failing_store_does_not_spin() -> None:
    store = FakeStore()
    store.fail_next = 10**9
    batcher = UsageBatcher(store, max_batch=1, max_buffer=10, flush_interval=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        for _ in range(100):
            batcher.record(rec("x"))
            await trio.sleep(0.01)  # one record every 10 ms of virtual time
        nursery.cancel_scope.cancel()
    # ~1 s of virtual time: about one attempt per interval, not one per record.
    assert batcher.failed_writes <= 4
    assert batcher.dropped == 90
    assert batcher.lost == 10  # still failing at shutdown


async def test_put_back_on_a_full_buffer_drops_the_oldest() -> None:
    store = FakeStore()
    store.fail_next = 1
    batcher = UsageBatcher(store, max_batch=3, max_buffer=4, flush_interval=1.0)
    for m in "abcd":
        batcher.record(rec(m))
    store.delay = 0.5

    async def more() -> None:
        await trio.sleep(0.1)  # while the write of a, b, c is in flight
        batcher.record(rec("e"))
        batcher.record(rec("f"))
        batcher.record(rec("g"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(more)
        assert await batcher.flush() is False
    # a, b, c came back in front of d, e, f, g: the three oldest gave way.
    assert [r.model for _, r in batcher._buffer] == ["d", "e", "f", "g"]
    assert batcher.dropped == 3


async def test_shutdown_finishes_the_write_in_flight_then_flushes() -> None:
    store = FakeStore()
    store.delay = 2.0
    batcher = UsageBatcher(store, max_batch=2, flush_interval=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        for m in "abcde":
            batcher.record(rec(m))
        await trio.sleep(0.5)  # the first batch is being written
        nursery.cancel_scope.cancel()
    assert store.batches == [["a", "b"], ["c", "d"], ["e"]]
    assert batcher.lost == 0 and batcher.pending == 0


async def test_shutdown_is_bounded_and_counts_what_it_could_not_write() -> None:
    store = FakeStore()
    store.delay = 4.0
    batcher = UsageBatcher(store, max_batch=1, flush_interval=100.0, shutdown_timeout=10.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        for m in "abcdef":
            batcher.record(rec(m))
        await trio.sleep(0.001)  # the first write has begun (virtual time)
        started = trio.current_time()
        nursery.cancel_scope.cancel()
    took = trio.current_time() - started
    # The write in flight finishes (4 s), then the shutdown flush gets 10 s: 2 more and
    # a third cut off. That one may still commit on a real store, so it is lost, not
    # retried, and so is the rest.
    assert took == pytest.approx(14.0, abs=0.1)
    assert store.models == ["a", "b", "c"]
    assert batcher.lost == 3 and batcher.pending == 0


async def test_a_write_that_times_out_is_not_retried() -> None:
    store = FakeStore()
    store.delay = 60.0
    batcher = UsageBatcher(store, max_batch=2, flush_interval=1.0, write_timeout=5.0)
    batcher.record(rec("a"))
    assert await batcher.flush() is False
    assert batcher.lost == 1 and batcher.pending == 0 and store.batches == []


async def test_a_store_outage_logs_one_line_per_interval_not_tracebacks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two minutes of failing writes (one every 2 s): a concise line when it starts and
    at most one per LOG_EVERY after it, each counting the failures it stands for, no
    traceback; one line when the writes succeed again."""
    store = FakeStore()
    store.fail_next = 10**9
    batcher = UsageBatcher(store, max_batch=10, flush_interval=1.0)
    caplog.set_level(logging.INFO, logger="llmgw.store.usage")
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        batcher.record(rec("a"))
        await trio.sleep(120)  # the outage (virtual time)
        failed = batcher.failed_writes
        store.fail_next = 0
        await trio.sleep(5)  # the next attempts succeed (virtual time)
        nursery.cancel_scope.cancel()
    assert failed >= 40  # it kept retrying meanwhile
    assert store.models == ["a"]
    lines = [r for r in caplog.records if r.name == "llmgw.store.usage"]
    assert all(r.exc_info is None for r in lines), [r.getMessage() for r in lines]
    assert all("\n" not in r.getMessage() for r in lines)
    warnings = [r.getMessage() for r in lines if r.levelno == logging.WARNING]
    assert 2 <= len(warnings) <= 120 / UsageBatcher.LOG_EVERY + 1, warnings
    assert "database is down" in warnings[0]
    # The later lines say how many failures they stand for, the last one all of them.
    counts = [int(m) for w in warnings[1:] for m in re.findall(r"(\d+) failed writes", w)]
    assert len(counts) == len(warnings) - 1 and sum(counts) + 1 <= failed, warnings
    back = [r.getMessage() for r in lines if r.levelno == logging.INFO]
    assert [int(n) for m in back for n in re.findall(r"written again after (\d+)", m)] == [
        failed
    ], back
