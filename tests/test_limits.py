"""Rate limits shared through the store (issue #20): several SharedLimits, as several
processes or instances would hold, on one real SQLite file or PostgreSQL database,
each with its own store connection."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

import pytest
import trio

from llmgw.domain.keys import KeyRecord
from llmgw.router.limits import LimitExceeded, SharedLimits, lease_size
from llmgw.store import open_store
from llmgw.store.base import Store, StoreError
from llmgw.store.sql.threaded import ThreadedStore
from tests.test_store import WallClock, backend, url  # noqa: F401 - fixtures
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("backend")


def key(rpm: int | None = None, tpm: int | None = None) -> KeyRecord:
    return KeyRecord("k1", "k", "llmgw-k", None, None, rpm, tpm, admin=False, created_at=0.0)


class Mono:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def stores(url: str) -> AsyncIterator[tuple[list[ThreadedStore], WallClock]]:  # noqa: F811
    wall = WallClock()
    opened = [cast(ThreadedStore, await open_store(url, clock=wall)) for _ in range(3)]
    try:
        yield opened, wall
    finally:
        for s in opened:
            await s.aclose()


async def admitted(limits: SharedLimits, k: KeyRecord, tries: int) -> int:
    count = 0
    for _ in range(tries):
        try:
            await limits.admit(k, 0)
        except LimitExceeded as exc:
            assert exc.status == 429 and exc.code == "rpm_exceeded"
            continue
        count += 1
    return count


async def test_three_processes_admit_one_minutes_rpm_between_them(
    stores: tuple[list[ThreadedStore], WallClock],
) -> None:
    opened, wall = stores
    mono = Mono()
    procs = [SharedLimits(s, clock=mono) for s in opened]
    k = key(rpm=300)
    total = 0
    # Interleaved, as concurrent processes: each takes leases as it needs them.
    for _ in range(200):
        for limits in procs:
            total += await admitted(limits, k, 1)
    # Never above the limit; below it by at most one lease per process (leases that
    # the store granted and a process holds unspent).
    assert 300 - 3 * lease_size(300) <= total <= 300
    # A refusal says when the window's oldest grant leaves it.
    with pytest.raises(LimitExceeded) as info:
        for limits in procs:
            for _ in range(lease_size(300) + 1):
                await limits.admit(k, 0)
    assert info.value.retry_after == 60.0
    # A minute on, the window is empty again.
    wall.now += 60.5
    mono.now += 60.5
    assert await admitted(procs[0], k, 10) == 10


async def test_an_unspent_lease_expires_rather_than_admit_past_the_window(
    stores: tuple[list[ThreadedStore], WallClock],
) -> None:
    opened, wall = stores
    mono = Mono()
    a, b = SharedLimits(opened[0], clock=mono), SharedLimits(opened[1], clock=mono)
    k = key(rpm=200)  # leases of 2
    assert await admitted(a, k, 1) == 1  # a holds one more
    mono.now += 6.0  # past LEASE_TTL: that one is not admitted from any more
    wall.now += 6.0
    assert await admitted(b, k, 198) == 198  # b: what is still free in the window
    assert await admitted(a, k, 1) == 0


async def test_tokens_used_anywhere_count_against_the_tpm(
    stores: tuple[list[ThreadedStore], WallClock],
) -> None:
    opened, wall = stores
    mono = Mono()
    a, b = SharedLimits(opened[0], clock=mono), SharedLimits(opened[1], clock=mono)
    k = key(tpm=1000)
    await a.admit(k, 900)
    a.used("k1", 900)
    await a._flush()  # what the run loop does every FLUSH_EVERY
    mono.now += 2.0  # b's reads are fresh after TOKENS_FRESH
    with pytest.raises(LimitExceeded) as info:
        await b.admit(k, 200)
    assert info.value.code == "tpm_exceeded"
    await b.admit(k, 50)
    wall.now += 61.0
    mono.now += 61.0
    await b.admit(k, 900)


async def test_the_flush_loop_writes_what_was_used(
    stores: tuple[list[ThreadedStore], WallClock],
) -> None:
    opened, _ = stores
    limits = SharedLimits(opened[0])
    async with trio.open_nursery() as nursery:
        await nursery.start(limits.run)
        limits.used("k1", 123)

        async def written() -> bool:
            return (await opened[1].used_rate("k1", "tokens"))[0] == 123

        await wait_until(written, "the tokens in the store")
        nursery.cancel_scope.cancel()


class Gone:
    """A store that cannot be reached."""

    def wall_clock(self) -> float:
        return 0.0

    async def take_rate(self, *args: object) -> tuple[int, float | None]:
        raise StoreError("the store is restarting")

    async def used_rate(self, *args: object) -> tuple[int, float | None]:
        raise StoreError("the store is restarting")


async def test_while_the_store_is_away_a_process_counts_on_its_own() -> None:
    mono = Mono()
    limits = SharedLimits(cast(Store, Gone()), clock=mono)
    k = key(rpm=5)
    for _ in range(5):
        await limits.admit(k, 0)
    with pytest.raises(LimitExceeded) as info:
        await limits.admit(k, 0)
    assert info.value.status == 429 and info.value.code == "rpm_exceeded"
