"""Durations counted into fixed buckets: what a Prometheus histogram exports, kept as
plain values by the control plane (its metrics are read at scrape time, see
llmgw.control.fleet_metrics) and bounded by its buckets, not by what it observed."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

import attrs

#: Replica starts take seconds (a small model on llama.cpp) to many minutes (a large
#: one loading its weights).
START_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0)


@attrs.define
class Durations:
    """Observations of one series: a count per bucket (non-cumulative), their sum."""

    buckets: tuple[float, ...] = START_BUCKETS
    counts: list[int] = attrs.field()
    total: float = 0.0

    @counts.default
    def _zeros(self) -> list[int]:
        return [0] * (len(self.buckets) + 1)  # the last: above every bound

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> Iterator[tuple[str, int]]:
        """(upper bound, observations at or below it), ending with "+Inf"."""
        running = 0
        for bound, count in zip((*map(str, self.buckets), "+Inf"), self.counts, strict=True):
            running += count
            yield bound, running
