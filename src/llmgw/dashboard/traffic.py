"""The last few minutes of traffic, in memory, for the dashboard's charts.

:class:`TrafficRing` is a :class:`~llmgw.domain.usage.UsageSink`: the router hands it
every finished request, on the hot path, so :meth:`TrafficRing.record` is a handful of
additions into the current time slot and nothing else. Its memory is fixed: one slot
per ``step`` seconds of the ``window`` (default 180 slots of 5 s = 15 min), each with
counters and two log-spaced latency histograms, so percentiles cost no samples and
merge across slots by adding bucket counts. :meth:`TrafficRing.run` samples the
router's admission view once per slot for queue depth and pool saturation.

Decisions the dashboard relies on:

* Slots are aligned on the clock (slot ``n`` covers ``[n*step, (n+1)*step)``) and
  reused lazily: a slot remembers which ``n`` it holds and is cleared when written
  under a newer ``n``; a read of a slot holding another ``n`` reads as empty. A clock
  jump of more than the window therefore empties the whole ring without a sweep.
  A clock that goes back is taken as standing still.
* Times in :class:`TrafficPoint` are seconds relative to the moment of the query
  (negative: ``-900.0`` is 15 minutes ago), so charts need not know the clock.
* Slots before the ring was created are not points at all: a series holds at most
  ``slots`` points, from the first slot since the start. A slot that passed without
  traffic is a point with zero rates and ``None`` percentiles (absent is not zero).
* A request without a band counts under ``unbanded`` (``"-"`` unless the app passes
  the admission's default band name).
* Requests, errors and retries are also counted per model (the record's model: a
  catalog name, never a client's string, so their number is bounded). Refusals
  (llmgw's own 429, 503, 403, 504, ... with no endpoint) are errors like any other:
  they are what clients saw. Retries are counted only from records that carry a count
  (``UsageRecord.retries``); a model with none in a slot has no retries value there
  (unknown), not 0.
* The router's model of the engines, weighed (issue #31): the prefix table's
  predictions per outcome (``UsageRecord.prediction``: hit, miss, over, under) and the
  affinity spills per ``affinity:reason`` (``UsageRecord.spills``), the sets of
  llmgw_prefix_predictions_total and llmgw_affinity_spills_total, so bounded. A slot
  without predictions has no prediction shares (None, not 0); spills, like retries,
  are counted only from records that carry them (None in a slot without one). Whether
  any engine reported cached tokens at all (``Usage.cached_tokens`` not None) is
  counted too: without that no prediction can be weighed, and the chart says so.
  With workers, every worker's records come to the one ring (llmgw.workers.pool), so
  these series merge like the rest: by counting them in one place.
* Errors are what the service failed to do: statuses >= 500, and 429 (a queue full, a
  key's limit reached: capacity the operator may want to see). Other 4xx are the
  client's mistakes (a bad body, key or model name) and count as ``client_errors``,
  beside the errors, not among them; 499, which the router uses for a client that went
  away, is counted as ``client_gone``. The
  end-to-end latency histogram takes successful requests only (a fast 4xx or a client
  that left would distort it); TTFT takes every request that got a first token.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import attrs
import trio

from llmgw.domain.usage import UsageRecord
from llmgw.errors import first_line

__all__ = [
    "CLIENT_GONE",
    "UNBANDED",
    "TrafficPoint",
    "TrafficRing",
    "TrafficSeries",
    "TrafficSummary",
]

log = logging.getLogger(__name__)

_V = TypeVar("_V", int, float)

UNBANDED = "-"
"""The band name requests without a band are counted under (by default)."""

CLIENT_GONE = 499
"""The status the router records for a client that went away mid-request."""

# Latency buckets: 64 per decade from 1 ms to ~750 s (bounds 10**(1/64) ≈ 1.037 apart),
# plus one bucket under and one over; kept sparse, so a slot holds only the buckets its
# requests fell in. With 8 per decade, latencies of 596, 624 and 664 ms all fell in one
# bucket and the dashboard showed p50 = p90 = p99 = 635 ms.
_PER_DECADE = 64
_LOW = 1e-3
_LAST = 6 * _PER_DECADE - 8  # the bucket from the last bound (~750 s) up


def _bound(k: int) -> float:
    return _LOW * 10 ** (k / _PER_DECADE)


def _bucket(value: float) -> int:
    """The histogram bucket of a latency: 0 below 1 ms, `_LAST` from ~750 s; bucket `i`
    in between holds ``[_bound(i - 1), _bound(i))``."""
    if value < _LOW:
        return 0
    return min(int(math.log10(value / _LOW) * _PER_DECADE) + 1, _LAST)


@attrs.define
class _Histogram:
    """Counts per log-spaced bucket (sparse), and the exact extremes (to clamp
    estimates)."""

    counts: dict[int, int] = attrs.field(factory=dict)
    n: int = 0
    lo: float = math.inf
    hi: float = -math.inf

    def add(self, value: float) -> None:
        b = _bucket(value)
        counts = self.counts
        counts[b] = counts.get(b, 0) + 1
        self.n += 1
        if value < self.lo:
            self.lo = value
        if value > self.hi:
            self.hi = value

    def merge(self, other: _Histogram) -> None:
        if not other.n:
            return
        counts = self.counts
        for i, c in other.counts.items():
            counts[i] = counts.get(i, 0) + c
        self.n += other.n
        self.lo = min(self.lo, other.lo)
        self.hi = max(self.hi, other.hi)

    def quantile(self, q: float) -> float | None:
        """The nearest-rank ``q`` quantile, placed within its bucket by its rank among
        the bucket's samples (log-uniformly, clamped to the values seen); None without
        samples."""
        if not self.n:
            return None
        rank = max(1, math.ceil(q * self.n))
        seen = 0
        for i in sorted(self.counts):
            c = self.counts[i]
            if seen + c >= rank:
                break
            seen += c
        lo = max(_bound(i - 1) if i > 0 else self.lo, self.lo)
        hi = min(_bound(i) if i < _LAST else self.hi, self.hi)
        if lo <= 0 or hi <= lo:  # one value seen in the bucket, or latencies of 0
            return (lo + hi) / 2
        return float(lo * (hi / lo) ** ((rank - seen - 0.5) / c))


def _quantiles(h: _Histogram) -> tuple[float | None, float | None, float | None]:
    return h.quantile(0.5), h.quantile(0.9), h.quantile(0.99)


_UNUSED = -(1 << 62)  # the slot number of a slot never written (no clock reads that)


@attrs.define
class _Slot:
    """One step of traffic. ``n`` is the slot number it holds."""

    n: int = _UNUSED
    requests: int = 0
    errors: int = 0
    client_gone: int = 0
    client_errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft: _Histogram = attrs.field(factory=_Histogram)
    latency: _Histogram = attrs.field(factory=_Histogram)
    bands: dict[str, int] = attrs.field(factory=dict)
    model_requests: dict[str, int] = attrs.field(factory=dict)
    model_errors: dict[str, int] = attrs.field(factory=dict)
    model_retries: dict[str, int] = attrs.field(factory=dict)  # counted records only
    # Sampled, max within the slot; a missing key is "not sampled".
    depth: dict[str, int] = attrs.field(factory=dict)
    saturation: dict[str, float] = attrs.field(factory=dict)
    # The prefix table's predictions weighed, per outcome; records whose engine
    # reported cached tokens; spills per "affinity:reason", from `spill_counted`
    # records (those carrying a spill count).
    predictions: dict[str, int] = attrs.field(factory=dict)
    cache_reports: int = 0
    spills: dict[str, int] = attrs.field(factory=dict)
    spill_counted: int = 0

    def reset(self, n: int) -> None:
        self.n = n
        self.requests = self.errors = self.client_gone = self.client_errors = 0
        self.prompt_tokens = self.completion_tokens = 0
        self.ttft = _Histogram()
        self.latency = _Histogram()
        self.bands = {}
        self.model_requests = {}
        self.model_errors = {}
        self.model_retries = {}
        self.depth = {}
        self.saturation = {}
        self.predictions = {}
        self.cache_reports = self.spill_counted = 0
        self.spills = {}


_EMPTY = _Slot()


@attrs.frozen
class TrafficPoint:
    """One slot of the series. Rates are per second of the time the slot covered
    (``seconds``: the step, or less for the first slot since the start and the
    current one); percentiles are seconds, None without a sample."""

    start: float  # seconds relative to the query (<= 0)
    seconds: float
    requests: int
    requests_per_second: float
    errors_per_second: float
    client_gone_per_second: float
    client_errors_per_second: float
    tokens_per_second: float  # prompt + completion
    completion_tokens_per_second: float
    ttft_p50: float | None
    ttft_p90: float | None
    ttft_p99: float | None
    latency_p50: float | None
    latency_p90: float | None
    latency_p99: float | None
    # Every band / pool seen in the series is a key of every point.
    requests_per_second_by_band: dict[str, float]
    requests_per_second_by_model: dict[str, float]
    errors_per_second_by_model: dict[str, float]
    retries_per_second_by_model: dict[str, float | None]  # None: no count recorded
    queue_depth: dict[str, int | None]  # max sampled in the slot, summed over pools
    saturation: dict[str, float | None]  # per pool, max sampled in the slot
    # The prefix table's predictions weighed against the engines in the slot, and the
    # shares of them the engines confirmed (hit + miss), found evicted (over) and found
    # holding more (under): None without a prediction (the three add up to 1).
    predictions: int = 0
    predictions_confirmed: float | None = None
    predictions_over: float | None = None
    predictions_under: float | None = None
    # Per "affinity:reason" seen in the series; None: no record counted spills.
    spills_per_second: dict[str, float | None] = attrs.field(factory=dict)


@attrs.frozen
class TrafficSeries:
    """The slots since the start (at most ``slots`` of them), oldest first."""

    step: float
    slots: int  # how many points a full window holds
    points: tuple[TrafficPoint, ...]
    bands: tuple[str, ...]  # sorted: request bands and sampled queue bands
    pools: tuple[str, ...]  # sorted: pools whose saturation was sampled
    models: tuple[str, ...] = ()  # sorted: models of the requests recorded
    spills: tuple[str, ...] = ()  # sorted: the "affinity:reason" of spills recorded
    # Requests whose engine reported cached prompt tokens (0: none did, so no prefix
    # prediction could be weighed), and records that carried a spill count.
    cache_reports: int = 0
    spill_counted: int = 0

    def column(self, get: Callable[[TrafficPoint], float | None]) -> tuple[float | None, ...]:
        """One value per slot of the full window, None before the start: what a chart
        spanning the window plots (the latest point on the right)."""
        pad: tuple[float | None, ...] = (None,) * (self.slots - len(self.points))
        return pad + tuple(get(p) for p in self.points)


@attrs.frozen
class TrafficSummary:
    """Totals and merged percentiles over the last ``seconds`` (the headline numbers)."""

    seconds: float
    requests: int
    errors: int
    client_gone: int
    client_errors: int
    prompt_tokens: int
    completion_tokens: int
    requests_per_second: float
    errors_per_second: float
    tokens_per_second: float
    completion_tokens_per_second: float
    error_ratio: float | None  # errors / requests; None without requests
    ttft_p50: float | None
    ttft_p90: float | None
    ttft_p99: float | None
    latency_p50: float | None
    latency_p90: float | None
    latency_p99: float | None
    requests_by_band: dict[str, int]
    requests_by_model: dict[str, int]
    errors_by_model: dict[str, int]
    retries_by_model: dict[str, int]  # only models with a count recorded
    max_queue_depth: dict[str, int]
    max_saturation: dict[str, float]


def _rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def _share(count: int, total: int) -> float | None:
    return count / total if total else None


class TrafficRing:
    """The last ``window`` seconds of traffic in ``step``-second slots (see the module)."""

    def __init__(
        self,
        *,
        window: float = 900.0,
        step: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        unbanded: str = UNBANDED,
    ) -> None:
        if not (math.isfinite(step) and step > 0):
            raise ValueError(f"step must be a positive number of seconds, got {step!r}")
        if not (math.isfinite(window) and window >= step):
            raise ValueError(f"window must be at least one step ({step}s), got {window!r}")
        slots = round(window / step)
        if abs(slots * step - window) > 1e-6 * window:
            raise ValueError(f"window ({window}s) must be a whole number of steps ({step}s)")
        if slots > 100_000:
            raise ValueError(f"window/step gives {slots} slots; at most 100000")
        self.window = float(window)
        self.step = float(step)
        self.slots = slots
        self.unbanded = unbanded
        self._clock = clock
        self._started = clock()
        self._first = self._index(self._started)
        self._head = self._first
        # One more slot than the window, so a full window of complete slots is kept
        # besides the one being filled.
        self._ring = [_Slot() for _ in range(slots + 1)]

    # -- writing (hot path) -------------------------------------------------------

    def _index(self, now: float) -> int:
        return math.floor(now / self.step)

    def _now(self) -> tuple[float, int]:
        """The clock and its slot number; a clock that went back counts as the latest."""
        now = self._clock()
        n = self._index(now)
        if n < self._head:
            n = self._head
        else:
            self._head = n
        return now, n

    def _current(self) -> _Slot:
        _, n = self._now()
        slot = self._ring[n % len(self._ring)]
        if slot.n != n:
            slot.reset(n)
        return slot

    def record(self, record: UsageRecord) -> None:
        """Count one finished request into the current slot (O(1), never blocks)."""
        slot = self._current()
        slot.requests += 1
        model = record.model
        slot.model_requests[model] = slot.model_requests.get(model, 0) + 1
        if record.retries is not None:
            slot.model_retries[model] = slot.model_retries.get(model, 0) + record.retries
        status = record.status
        if status == CLIENT_GONE:
            slot.client_gone += 1
        elif 400 <= status < 500 and status != 429:
            slot.client_errors += 1
        elif status >= 400:
            slot.errors += 1
            slot.model_errors[model] = slot.model_errors.get(model, 0) + 1
        elif record.latency >= 0:
            slot.latency.add(record.latency)
        if record.ttft is not None and record.ttft >= 0:
            slot.ttft.add(record.ttft)
        usage = record.usage
        slot.prompt_tokens += usage.prompt_tokens
        slot.completion_tokens += usage.completion_tokens
        if usage.cached_tokens is not None:
            slot.cache_reports += 1
        if record.prediction is not None:
            slot.predictions[record.prediction] = slot.predictions.get(record.prediction, 0) + 1
        if record.spills is not None:
            slot.spill_counted += 1
            for affinity, reason in record.spills:
                key = f"{affinity}:{reason}"
                slot.spills[key] = slot.spills.get(key, 0) + 1
        band = record.band if record.band is not None else self.unbanded
        slot.bands[band] = slot.bands.get(band, 0) + 1

    def sample_queues(self, view: Mapping[str, Any]) -> None:
        """Note queue depth per band (summed over pools) and saturation per pool from the
        router's admission view (``router.admission_view()``), keeping the max per slot.
        Entries that are not shaped as expected are skipped: a dashboard reading must
        never fail the sampler."""
        depths: dict[str, int] = {}
        saturation: dict[str, float] = {}
        for pool in view.get("pools") or ():
            if not isinstance(pool, Mapping):
                continue
            name, sat = pool.get("pool"), pool.get("saturation")
            if isinstance(name, str) and isinstance(sat, int | float):
                saturation[name] = max(float(sat), saturation.get(name, -math.inf))
            for q in pool.get("bands") or ():
                if not isinstance(q, Mapping):
                    continue
                band, depth = q.get("band"), q.get("depth")
                if isinstance(band, str) and isinstance(depth, int):
                    depths[band] = depths.get(band, 0) + depth
        slot = self._current()
        for band, depth in depths.items():
            if depth > slot.depth.get(band, -1):
                slot.depth[band] = depth
        for name, sat in saturation.items():
            if sat > slot.saturation.get(name, -math.inf):
                slot.saturation[name] = sat

    async def run(
        self,
        admission_view: Callable[[], Mapping[str, Any]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Sample the admission view now and then once per slot, in the middle of each
        (so every slot gets exactly one sample however the clocks drift), until
        cancelled. A failing view is logged and skipped, never fatal."""
        self._sample(admission_view)
        task_status.started()
        while True:
            _, n = self._now()
            await trio.sleep(max(0.0, (n + 1.5) * self.step - self._clock()))
            self._sample(admission_view)

    def _sample(self, admission_view: Callable[[], Mapping[str, Any]]) -> None:
        try:
            self.sample_queues(admission_view())
        except Exception as exc:
            log.warning("dashboard: cannot sample the admission queues: %s", first_line(exc))

    # -- reading -----------------------------------------------------------------

    def _slot(self, n: int) -> _Slot:
        """Slot ``n`` as stored, or an empty one when the ring holds another."""
        slot = self._ring[n % len(self._ring)]
        return slot if slot.n == n else _EMPTY

    def _covered(self, n: int, now: float) -> tuple[float, float]:
        """Where slot ``n`` begins (or the start, if later) and how long it has run."""
        begin = max(n * self.step, self._started)
        end = min((n + 1) * self.step, now)
        return begin, max(0.0, end - begin)

    def series(self, *, include_current: bool = False) -> TrafficSeries:
        """The complete slots since the start (plus the one being filled, when asked:
        its rates cover only the seconds it has run, so they jump about), oldest first,
        at most ``slots`` of them."""
        now, head = self._now()
        last = head if include_current else head - 1
        first = max(self._first, last - self.slots + 1)
        slots = [(n, self._slot(n)) for n in range(first, last + 1)]
        bands = sorted({b for _, s in slots for b in (*s.bands, *s.depth)})
        pools = sorted({p for _, s in slots for p in s.saturation})
        models = sorted({m for _, s in slots for m in s.model_requests})
        spills = sorted({k for _, s in slots for k in s.spills})
        points = []
        for n, s in slots:
            begin, seconds = self._covered(n, now)
            ttft = _quantiles(s.ttft)
            latency = _quantiles(s.latency)
            predicted = sum(s.predictions.values())
            points.append(
                TrafficPoint(
                    start=begin - now,
                    seconds=seconds,
                    requests=s.requests,
                    requests_per_second=_rate(s.requests, seconds),
                    errors_per_second=_rate(s.errors, seconds),
                    client_gone_per_second=_rate(s.client_gone, seconds),
                    client_errors_per_second=_rate(s.client_errors, seconds),
                    tokens_per_second=_rate(s.prompt_tokens + s.completion_tokens, seconds),
                    completion_tokens_per_second=_rate(s.completion_tokens, seconds),
                    ttft_p50=ttft[0],
                    ttft_p90=ttft[1],
                    ttft_p99=ttft[2],
                    latency_p50=latency[0],
                    latency_p90=latency[1],
                    latency_p99=latency[2],
                    requests_per_second_by_band={
                        b: _rate(s.bands.get(b, 0), seconds) for b in bands
                    },
                    requests_per_second_by_model={
                        m: _rate(s.model_requests.get(m, 0), seconds) for m in models
                    },
                    errors_per_second_by_model={
                        m: _rate(s.model_errors.get(m, 0), seconds) for m in models
                    },
                    retries_per_second_by_model={
                        m: _rate(s.model_retries[m], seconds) if m in s.model_retries else None
                        for m in models
                    },
                    queue_depth={b: s.depth.get(b) for b in bands},
                    saturation={p: s.saturation.get(p) for p in pools},
                    predictions=predicted,
                    predictions_confirmed=_share(
                        s.predictions.get("hit", 0) + s.predictions.get("miss", 0), predicted
                    ),
                    predictions_over=_share(s.predictions.get("over", 0), predicted),
                    predictions_under=_share(s.predictions.get("under", 0), predicted),
                    spills_per_second={
                        k: _rate(s.spills.get(k, 0), seconds) if s.spill_counted else None
                        for k in spills
                    },
                )
            )
        return TrafficSeries(
            step=self.step,
            slots=self.slots,
            points=tuple(points),
            bands=tuple(bands),
            pools=tuple(pools),
            models=tuple(models),
            spills=tuple(spills),
            cache_reports=sum(s.cache_reports for _, s in slots),
            spill_counted=sum(s.spill_counted for _, s in slots),
        )

    def summary(self, last: float = 60.0) -> TrafficSummary:
        """Everything in the slots overlapping the last ``last`` seconds (at most the
        window; the current slot included), merged; ``seconds`` is the time covered."""
        if not last > 0:
            raise ValueError(f"last must be a positive number of seconds, got {last!r}")
        now, head = self._now()
        first = max(self._first, self._index(now - min(last, self.window)), head - self.slots)
        slots = [self._slot(n) for n in range(first, head + 1)]
        seconds = max(0.0, now - max(first * self.step, self._started))
        ttft, latency = _Histogram(), _Histogram()
        bands: dict[str, int] = {}
        by_model: dict[str, int] = {}
        errors_by_model: dict[str, int] = {}
        retries_by_model: dict[str, int] = {}
        depth: dict[str, int] = {}
        saturation: dict[str, float] = {}
        for s in slots:
            ttft.merge(s.ttft)
            latency.merge(s.latency)
            _add(bands, s.bands.items())
            _add(by_model, s.model_requests.items())
            _add(errors_by_model, s.model_errors.items())
            _add(retries_by_model, s.model_retries.items())
            _max(depth, s.depth.items())
            _max(saturation, s.saturation.items())
        requests = sum(s.requests for s in slots)
        errors = sum(s.errors for s in slots)
        prompt = sum(s.prompt_tokens for s in slots)
        completion = sum(s.completion_tokens for s in slots)
        t, lat = _quantiles(ttft), _quantiles(latency)
        return TrafficSummary(
            seconds=seconds,
            requests=requests,
            errors=errors,
            client_gone=sum(s.client_gone for s in slots),
            client_errors=sum(s.client_errors for s in slots),
            prompt_tokens=prompt,
            completion_tokens=completion,
            requests_per_second=_rate(requests, seconds),
            errors_per_second=_rate(errors, seconds),
            tokens_per_second=_rate(prompt + completion, seconds),
            completion_tokens_per_second=_rate(completion, seconds),
            error_ratio=errors / requests if requests else None,
            ttft_p50=t[0],
            ttft_p90=t[1],
            ttft_p99=t[2],
            latency_p50=lat[0],
            latency_p90=lat[1],
            latency_p99=lat[2],
            requests_by_band=dict(sorted(bands.items())),
            requests_by_model=dict(sorted(by_model.items())),
            # Every model with requests, those without errors at 0 (a count, not absent).
            errors_by_model={m: errors_by_model.get(m, 0) for m in sorted(by_model)},
            retries_by_model=dict(sorted(retries_by_model.items())),
            max_queue_depth=dict(sorted(depth.items())),
            max_saturation=dict(sorted(saturation.items())),
        )


def _add(into: dict[str, int], items: Iterable[tuple[str, int]]) -> None:
    for k, v in items:
        into[k] = into.get(k, 0) + v


def _max(into: dict[str, _V], items: Iterable[tuple[str, _V]]) -> None:
    for k, v in items:
        if k not in into or v > into[k]:
            into[k] = v
