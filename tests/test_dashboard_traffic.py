from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing

from llmgw.admin.api import AdminApp
from llmgw.config import load
from llmgw.dashboard import DashboardApp
from llmgw.dashboard.panels import MISSING
from llmgw.dashboard.traffic import UNBANDED, TrafficRing
from llmgw.domain.usage import Usage, UsageRecord, UsageSink
from llmgw.router.core import Router

RES = 10 ** (1 / 64)  # the histogram's bucket ratio: an estimate is within it


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def rec(
    status: int = 200,
    latency: float = 0.1,
    ttft: float | None = None,
    band: str | None = None,
    prompt: int = 0,
    completion: int = 0,
) -> UsageRecord:
    return UsageRecord(
        model="m",
        endpoint="e",
        status=status,
        usage=Usage(prompt, completion),
        latency=latency,
        ttft=ttft,
        band=band,
    )


def view(pools: list[tuple[str, float, dict[str, int]]]) -> dict[str, Any]:
    return {
        "enabled": True,
        "pools": [
            {
                "pool": name,
                "saturation": sat,
                "bands": [{"band": b, "depth": d, "priority": 0} for b, d in bands.items()],
            }
            for name, sat, bands in pools
        ],
    }


def ring(clock: Clock, window: float = 60.0, step: float = 5.0) -> TrafficRing:
    return TrafficRing(window=window, step=step, clock=clock)


async def test_what_it_is_given_as_a_usage_sink_the_traffic_page_reports() -> None:
    """The server gives the router the ring as a usage sink and the dashboard the same
    ring: finished requests recorded into it are what the traffic page's headline says
    (the last minute: requests, TTFT and latency of the successful ones, tokens)."""
    clock = Clock(1000.0)
    traffic = TrafficRing(clock=clock)
    endpoint = {"id": "e", "url": "http://127.0.0.1:9", "models": ["m"]}
    config = load(data={"endpoints": [endpoint]}, environ={})
    app = DashboardApp(AdminApp(Router(config)), traffic=traffic)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dashboard") as client:

        async def headline() -> str:
            page = await client.get("/traffic")
            assert page.status_code == 200
            found = re.search(r'<p class="headline">(.*?)</p>', page.text, re.DOTALL)
            assert found is not None, page.text
            return " ".join(re.sub(r"<[^>]+>", "", found.group(1)).split())

        clock.t = 1010.0
        none = MISSING  # nothing recorded yet
        assert await headline() == (
            f"Last minute: 0 req/s · TTFT p50 {none}, p90 {none}, p99 {none} · "
            f"latency p50 {none}, p99 {none} · 0 tokens/s · 0 errors/s: 0 of 0 requests"
        )
        sink: UsageSink = traffic
        for _ in range(4):
            sink.record(rec(200, latency=0.4, ttft=0.05, prompt=100, completion=50))
        sink.record(rec(503, latency=2.0))  # an error: counted, not in the latencies
        # A refusal llmgw answered itself (no endpoint) is an error the client saw.
        sink.record(attrs.evolve(rec(429, latency=0.001), endpoint=None))
        assert await headline() == (
            "Last minute: 0.60 req/s · TTFT p50 50ms, p90 50ms, p99 50ms · "
            "latency p50 400ms, p99 400ms · 60 tokens/s · "
            "0.20 errors/s: 2 of 6 requests (33.3%)"
        )
        # A client's mistake is shown beside the errors, not among them.
        sink.record(attrs.evolve(rec(404, latency=0.001), endpoint=None))
        assert await headline() == (
            "Last minute: 0.70 req/s · TTFT p50 50ms, p90 50ms, p99 50ms · "
            "latency p50 400ms, p99 400ms · 60 tokens/s · "
            "0.20 errors/s: 2 of 7 requests (28.6%) · 1 client errors (4xx)"
        )


@pytest.mark.parametrize(
    ("window", "step"),
    [(900, 0), (900, -5), (3, 5), (900, 7), (math.inf, 5), (900, math.nan), (1e6, 1e-3)],
)
def test_rejects_bad_window_and_step(window: float, step: float) -> None:
    with pytest.raises(ValueError):
        TrafficRing(window=window, step=step)


def test_default_is_15_minutes_of_5_second_slots() -> None:
    r = TrafficRing()
    assert (r.window, r.step, r.slots) == (900.0, 5.0, 180)


def test_counts_rates_errors_and_tokens_of_a_slot() -> None:
    clock = Clock(0.0)
    r = ring(clock)
    clock.t = 1.0
    r.record(rec(200, prompt=10, completion=5))
    r.record(rec(503, prompt=7))
    r.record(rec(404))
    r.record(rec(499, completion=3))  # the client went away: not a service error
    clock.t = 6.0
    s = r.series()
    assert len(s.points) == 1  # only the complete slot
    p = s.points[0]
    assert p.start == -6.0 and p.seconds == 5.0
    assert p.requests == 4
    assert p.requests_per_second == pytest.approx(4 / 5)
    assert p.errors_per_second == pytest.approx(1 / 5)  # the 503
    assert p.client_errors_per_second == pytest.approx(1 / 5)  # the 404: the client's
    assert p.client_gone_per_second == pytest.approx(1 / 5)
    assert p.tokens_per_second == pytest.approx(25 / 5)
    assert p.completion_tokens_per_second == pytest.approx(8 / 5)

    cur = r.series(include_current=True)
    assert len(cur.points) == 2
    assert cur.points[1].requests == 0 and cur.points[1].seconds == pytest.approx(1.0)
    assert cur.points[1].requests_per_second == 0.0
    assert cur.points[1].latency_p50 is None


def test_first_slot_rates_cover_only_the_time_since_the_start() -> None:
    clock = Clock(102.0)  # slot 20 covers [100, 105): the ring saw 3 s of it
    r = ring(clock)
    r.record(rec())
    r.record(rec())
    r.record(rec())
    clock.t = 105.0
    (p,) = r.series().points
    assert p.seconds == pytest.approx(3.0) and p.start == pytest.approx(-3.0)
    assert p.requests_per_second == pytest.approx(1.0)


def test_slots_before_the_start_are_not_points() -> None:
    clock = Clock(1000.0)
    r = ring(clock, window=60, step=5)
    clock.t = 1012.0
    s = r.series()
    assert len(s.points) == 2  # [1000, 1005) and [1005, 1010); [1010, 1015) is running
    assert [p.start for p in s.points] == [-12.0, -7.0]
    assert all(p.requests == 0 and p.requests_per_second == 0.0 for p in s.points)
    col = s.column(lambda p: p.requests_per_second)
    assert len(col) == 12
    assert col[:10] == (None,) * 10 and col[10:] == (0.0, 0.0)
    # Once the window is full, it holds exactly `slots` points.
    clock.t = 1000.0 + 600.0
    s = r.series()
    assert len(s.points) == 12 and s.points[0].start == -60.0
    assert s.column(lambda p: p.requests_per_second) == (0.0,) * 12


def test_a_reused_slot_is_cleared() -> None:
    clock = Clock(0.0)
    r = ring(clock, window=20, step=5)  # 4 slots
    clock.t = 1.0
    r.record(rec(500, latency=1.0, ttft=0.5, band="batch"))
    for t in (6.0, 11.0, 16.0, 21.0):
        clock.t = t
        r.record(rec(200, latency=0.01))
    # t=26 writes slot 5, which lands where slot 0 was kept (4 + 1 ring entries).
    clock.t = 26.0
    r.record(rec(200, latency=0.02, ttft=0.02))
    clock.t = 30.0
    s = r.series()
    assert [p.requests for p in s.points] == [1, 1, 1, 1]  # slots 1..4
    assert sum(p.errors_per_second for p in s.points) == 0.0
    assert s.bands == (UNBANDED,)  # "batch" went with slot 0
    reused = s.points[-1]  # slot 5, kept where slot 0 was: none of slot 0 is left
    assert reused.requests == 1 and reused.errors_per_second == 0.0
    assert reused.ttft_p50 == reused.ttft_p99 == pytest.approx(0.02)
    assert reused.latency_p99 == pytest.approx(0.02)
    # Slot 6 (running) lands on slot 1's entry, not yet written: it reads as empty.
    cur = r.series(include_current=True).points[-1]
    assert cur.requests == 0 and cur.latency_p50 is None
    total = r.summary(last=20)  # slots 2..6
    assert total.requests == 4 and total.errors == 0
    assert total.latency_p99 is not None and total.latency_p99 < 0.03


def test_a_clock_jump_past_the_window_empties_the_ring() -> None:
    clock = Clock(0.0)
    r = ring(clock, window=60, step=5)
    for i in range(12):
        clock.t = i * 5 + 1.0
        r.record(rec(500, latency=0.2, ttft=0.1, band="a", prompt=3))
        r.sample_queues(view([("p", 0.9, {"a": 4})]))
    clock.t = 1000.0
    s = r.series()
    assert len(s.points) == 12
    assert all(p.requests == 0 for p in s.points)
    assert all(p.ttft_p99 is None and p.latency_p50 is None for p in s.points)
    assert s.bands == () and s.pools == ()
    total = r.summary(last=60)
    assert (total.requests, total.errors, total.prompt_tokens) == (0, 0, 0)
    assert total.ttft_p50 is None and total.error_ratio is None
    assert total.max_queue_depth == {} and total.max_saturation == {}


def test_a_clock_going_back_counts_as_standing_still() -> None:
    clock = Clock(10.0)
    r = ring(clock)
    r.record(rec())
    clock.t = 3.0
    r.record(rec())
    clock.t = 16.0
    assert [p.requests for p in r.series().points] == [2]


def test_percentiles_from_known_latencies() -> None:
    clock = Clock(0.0)
    r = ring(clock)
    clock.t = 1.0
    for i in range(1, 101):  # 1 ms .. 100 ms
        r.record(rec(latency=i / 1000, ttft=i / 10000))
    clock.t = 5.0
    p = r.series().points[0]
    for got, want in [
        (p.latency_p50, 0.050),
        (p.latency_p90, 0.090),
        (p.latency_p99, 0.099),
        (p.ttft_p50, 0.0050),
        (p.ttft_p90, 0.0090),
    ]:
        assert got is not None and want / RES <= got <= want * RES, (got, want)
    # Sub-millisecond TTFTs fall in the bottom bucket; the estimate stays within the seen.
    assert p.ttft_p50 is not None and 0.0001 <= p.ttft_p50 <= 0.01


def test_percentiles_close_together_are_told_apart() -> None:
    # Clients measured p50/p90/p99 = 596/624/664 ms; the dashboard showed 635 for all
    # three (8 buckets per decade put them in one).
    clock = Clock(0.0)
    r = ring(clock)
    clock.t = 1.0
    latencies = [0.560 + 0.110 * (i / 199) ** 2 for i in range(200)]
    for latency in latencies:
        r.record(rec(latency=latency))
    clock.t = 5.0
    p = r.series().points[0]
    exact = [latencies[math.ceil(q * 200) - 1] for q in (0.5, 0.9, 0.99)]
    got = [p.latency_p50, p.latency_p90, p.latency_p99]
    assert got[0] is not None and got[1] is not None and got[2] is not None
    assert got[0] < got[1] < got[2], got
    for g, want in zip(got, exact, strict=True):
        assert abs(g / want - 1) < 0.02, (got, exact)


def test_percentiles_of_one_sample_are_exact_and_huge_values_are_kept() -> None:
    clock = Clock(0.0)
    r = ring(clock)
    r.record(rec(latency=0.3137, ttft=0.0421))
    r.record(rec(500, latency=99.0))  # errors stay out of the latency distribution
    clock.t = 5.0
    p = r.series().points[0]
    assert p.latency_p50 == p.latency_p99 == pytest.approx(0.3137)
    assert p.ttft_p50 == p.ttft_p99 == pytest.approx(0.0421)
    r.record(rec(latency=5000.0))  # beyond the top bound
    clock.t = 10.0
    assert r.series().points[1].latency_p99 == pytest.approx(5000.0)


def test_empty_slots_have_no_percentiles_not_zero() -> None:
    clock = Clock(0.0)
    r = ring(clock)
    r.record(rec(latency=0.5, ttft=0.1))
    clock.t = 20.0
    ps = r.series().points
    assert ps[0].latency_p50 is not None
    assert [p.latency_p50 for p in ps[1:]] == [None, None, None]
    assert [p.ttft_p90 for p in ps[1:]] == [None, None, None]


def test_summary_merges_slots_of_the_last_seconds() -> None:
    clock = Clock(0.0)
    r = ring(clock, window=60, step=5)
    # 10 slots of 10 requests, slot k with latencies around (k+1) * 100 ms.
    for k in range(10):
        clock.t = k * 5 + 2.0
        for _ in range(10):
            r.record(rec(latency=(k + 1) * 0.1, band="interactive" if k % 2 else None))
        r.sample_queues(view([("p", k / 10, {"interactive": k})]))
    clock.t = 50.0
    total = r.summary(last=60)
    assert total.requests == 100 and total.seconds == pytest.approx(50.0)
    assert total.requests_per_second == pytest.approx(2.0)
    assert total.latency_p50 is not None and 0.5 / RES <= total.latency_p50 <= 0.5 * RES
    assert total.latency_p99 == pytest.approx(1.0)  # clamped to the largest seen
    assert total.requests_by_band == {UNBANDED: 50, "interactive": 50}
    assert total.max_queue_depth == {"interactive": 9}
    assert total.max_saturation == {"p": pytest.approx(0.9)}
    # The last 10 s: slots 8 and 9, and the current (empty) slot 10.
    recent = r.summary(last=10)
    assert recent.requests == 20 and recent.seconds == pytest.approx(10.0)
    assert recent.latency_p50 is not None and 0.9 / RES <= recent.latency_p50 <= 0.9 * RES
    assert recent.max_queue_depth == {"interactive": 9}
    with pytest.raises(ValueError):
        r.summary(last=0)


def test_bands_without_a_name_count_as_unbanded() -> None:
    clock = Clock(0.0)
    r = ring(clock)
    r.record(rec(band=None))
    r.record(rec(band="interactive"))
    r.record(rec(band="interactive"))
    clock.t = 5.0
    p = r.series().points[0]
    assert p.requests_per_second_by_band == {
        UNBANDED: pytest.approx(0.2),
        "interactive": pytest.approx(0.4),
    }
    named = TrafficRing(window=60, step=5, clock=clock, unbanded="standard")
    named.record(rec(band=None))
    assert named.summary().requests_by_band == {"standard": 1}


def test_queue_depth_sums_pools_and_keeps_the_max_within_a_slot() -> None:
    clock = Clock(0.0)
    r = ring(clock)
    clock.t = 1.0
    r.sample_queues(view([("a", 0.5, {"hi": 2, "lo": 1}), ("b", 0.2, {"hi": 3})]))
    clock.t = 2.0
    r.sample_queues(view([("a", 0.9, {"hi": 1, "lo": 0}), ("b", 0.1, {"hi": 0})]))
    clock.t = 6.0
    r.sample_queues(view([("a", 0.3, {"hi": 0})]))
    clock.t = 16.0
    s = r.series()
    assert s.bands == ("hi", "lo") and s.pools == ("a", "b")
    p0, p1, p2 = s.points
    assert p0.queue_depth == {"hi": 5, "lo": 1}
    assert p0.saturation == {"a": pytest.approx(0.9), "b": pytest.approx(0.2)}
    # Slot 1 sampled pool a only (band lo and pool b absent: None, not 0).
    assert p1.queue_depth == {"hi": 0, "lo": None}
    assert p1.saturation == {"a": pytest.approx(0.3), "b": None}
    # Slot 2 was never sampled.
    assert p2.queue_depth == {"hi": None, "lo": None}
    assert p2.saturation == {"a": None, "b": None}


def test_malformed_views_are_skipped() -> None:
    clock = Clock(0.0)
    r = ring(clock)
    r.sample_queues({})
    r.sample_queues({"pools": None})
    r.sample_queues(
        {
            "pools": [
                "junk",
                {"pool": "a", "saturation": "high", "bands": [None, {"band": "x"}]},
                {"pool": "b", "saturation": 0.5, "bands": [{"band": "y", "depth": 2}]},
            ]
        }
    )
    clock.t = 5.0
    p = r.series().points[0]
    assert p.queue_depth == {"y": 2}
    assert p.saturation == {"b": 0.5}


def test_run_samples_once_per_slot_with_a_mock_clock() -> None:
    calls: list[float] = []
    seen: dict[str, Any] = {}

    def admission_view() -> Mapping[str, Any]:
        calls.append(trio.current_time())
        if len(calls) == 3:
            raise RuntimeError("router gone for a moment")
        return view([("p", len(calls) / 10, {"hi": len(calls)})])

    async def main() -> None:
        r = TrafficRing(window=60, step=5, clock=trio.current_time)
        async with trio.open_nursery() as nursery:
            await nursery.start(r.run, admission_view)
            assert len(calls) == 1  # sampled before started()
            await trio.sleep(31.0)  # 31 s of virtual time (MockClock, below)
            nursery.cancel_scope.cancel()
        seen["series"] = r.series(include_current=True)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    # Once at 0, then in the middle of every following slot.
    assert calls == [0.0, 7.5, 12.5, 17.5, 22.5, 27.5]
    s = seen["series"]
    assert [p.queue_depth["hi"] for p in s.points] == [1, 2, None, 4, 5, 6, None]
    assert [p.saturation["p"] for p in s.points] == pytest.approx(
        [0.1, 0.2, None, 0.4, 0.5, 0.6, None]
    )


def test_errors_and_refusals_are_counted_per_model() -> None:
    """A refusal llmgw answered itself for want of capacity (no endpoint: a 429, 504) is
    an error of its model like an engine's 5xx; a client's mistake (403) and a client
    that went away are not."""
    clock = Clock(0.0)
    r = ring(clock)
    clock.t = 1.0
    for status in (200, 200, 503):
        r.record(attrs.evolve(rec(status), model="a"))
    for status in (429, 429, 403, 504, 499):
        r.record(attrs.evolve(rec(status), model="a", endpoint=None))
    r.record(attrs.evolve(rec(200), model="b"))
    clock.t = 6.0
    (p,) = r.series().points
    assert r.series().models == ("a", "b")
    assert p.errors_per_second == pytest.approx(4 / 5)
    assert p.client_errors_per_second == pytest.approx(1 / 5)
    assert p.errors_per_second_by_model == {"a": pytest.approx(4 / 5), "b": 0.0}
    assert p.requests_per_second_by_model == {"a": pytest.approx(8 / 5), "b": pytest.approx(1 / 5)}
    s = r.summary(60.0)
    assert s.errors == 4 and s.client_errors == 1 and s.requests == 9
    assert s.errors_by_model == {"a": 4, "b": 0}
    assert s.requests_by_model == {"a": 8, "b": 1}


def test_retries_per_model_only_from_records_that_count_them() -> None:
    """Retries are summed from records carrying a count; a model whose records carry
    none has an unknown retry rate, not 0."""
    clock = Clock(0.0)
    r = ring(clock)
    clock.t = 1.0
    r.record(attrs.evolve(rec(200), model="a", retries=2))
    r.record(attrs.evolve(rec(502), model="a", endpoint=None, retries=1))
    r.record(attrs.evolve(rec(200), model="a", retries=0))
    r.record(attrs.evolve(rec(200), model="b"))  # not counted
    clock.t = 6.0
    (p,) = r.series().points
    assert p.retries_per_second_by_model == {"a": pytest.approx(3 / 5), "b": None}
    assert r.summary(60.0).retries_by_model == {"a": 3}


def cached(record: UsageRecord, tokens: int | None = 0) -> UsageRecord:
    """`record` as an engine that reported `tokens` cached prompt tokens answered it."""
    return attrs.evolve(record, usage=attrs.evolve(record.usage, cached_tokens=tokens))


def test_prefix_predictions_are_shares_of_the_slots_predictions_and_absent_is_not_zero() -> None:
    """Per slot, the share of the prefix table's predictions the engines confirmed (hit
    and miss), found evicted (over) and found holding more (under); a slot whose
    requests carried no prediction has none of the three, not 0."""
    clock = Clock(0.0)
    r = ring(clock)
    clock.t = 1.0
    for outcome in ("hit", "hit", "hit", "miss", "over", "over", "under", "hit"):
        r.record(cached(attrs.evolve(rec(), prediction=outcome), 100))
    r.record(cached(rec(), 0))  # weighed nothing (no prediction): not counted
    clock.t = 6.0
    r.record(cached(rec(), 50))  # requests, cached tokens reported, no prediction
    r.record(rec())
    clock.t = 11.0
    r.record(cached(attrs.evolve(rec(), prediction="under"), 10))
    clock.t = 21.0  # [15, 20) passes without a request
    s = r.series()
    first, second, third, empty = s.points
    assert first.predictions == 8
    assert first.predictions_confirmed == pytest.approx(5 / 8)
    assert first.predictions_over == pytest.approx(2 / 8)
    assert first.predictions_under == pytest.approx(1 / 8)
    for p in (second, empty):
        assert p.predictions == 0
        assert p.predictions_confirmed is p.predictions_over is p.predictions_under is None
    assert (third.predictions_confirmed, third.predictions_over) == (0.0, 0.0)
    assert third.predictions_under == 1.0
    assert s.cache_reports == 11
    col = s.column(lambda p: p.predictions_confirmed)
    assert col[-4:] == (pytest.approx(5 / 8), None, 0.0, None)


def test_no_cached_tokens_reported_is_counted_as_none() -> None:
    """Engines that never report cached tokens (None) leave cache_reports at 0; a
    report of 0 cached tokens is a report."""
    clock = Clock(0.0)
    r = ring(clock)
    clock.t = 1.0
    r.record(rec())
    r.record(cached(rec(), None))
    clock.t = 6.0
    assert r.series().cache_reports == 0
    r.record(cached(rec(), 0))
    clock.t = 11.0
    assert r.series().cache_reports == 1


def test_spills_per_reason_only_from_records_that_count_them() -> None:
    """Spills are counted per affinity:reason from the records that carry a spill count
    (one per routing decision that passed over the home); a slot whose records carry
    none has no spill rate, while one with counted records and no spill has 0."""
    clock = Clock(0.0)
    r = ring(clock)
    clock.t = 1.0
    r.record(attrs.evolve(rec(), spills=(("prefix", "work"),)))
    r.record(attrs.evolve(rec(), spills=(("prefix", "throttled"), ("session", "gone"))))
    r.record(attrs.evolve(rec(502), endpoint=None, spills=(("prefix", "work"),)))
    r.record(attrs.evolve(rec(), spills=()))
    clock.t = 6.0
    r.record(attrs.evolve(rec(), spills=()))  # counted: none
    clock.t = 11.0
    r.record(rec())  # not counted
    clock.t = 16.0
    s = r.series()
    assert s.spills == ("prefix:throttled", "prefix:work", "session:gone")
    assert s.spill_counted == 5
    first, second, third = s.points
    assert first.spills_per_second == {
        "prefix:throttled": pytest.approx(1 / 5),
        "prefix:work": pytest.approx(2 / 5),
        "session:gone": pytest.approx(1 / 5),
    }
    assert second.spills_per_second == dict.fromkeys(s.spills, 0.0)
    assert third.spills_per_second == dict.fromkeys(s.spills, None)


def test_a_reused_slot_forgets_its_predictions_and_spills() -> None:
    clock = Clock(0.0)
    r = ring(clock, window=20, step=5)  # 4 slots, 5 ring entries
    clock.t = 1.0
    r.record(cached(attrs.evolve(rec(), prediction="over", spills=(("prefix", "load"),)), 1))
    clock.t = 26.0  # slot 5, where slot 0 was
    r.record(rec())
    clock.t = 30.0
    s = r.series()
    assert s.spills == () and s.cache_reports == 0 and s.spill_counted == 0
    assert all(p.predictions == 0 and p.spills_per_second == {} for p in s.points)
