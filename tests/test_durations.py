"""The control plane's bucketed durations (exported as a Prometheus histogram)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmgw.control.durations import Durations


def test_observations_land_in_the_first_bucket_at_or_above_them() -> None:
    d = Durations(buckets=(1.0, 5.0))
    for seconds in (0.2, 1.0, 1.5, 5.0, 9.0):
        d.observe(seconds)
    assert list(d.cumulative()) == [("1.0", 2), ("5.0", 4), ("+Inf", 5)]
    assert d.total == 16.7


@given(st.lists(st.floats(0.0, 1e5), max_size=50))
def test_cumulative_counts_are_the_observations_at_or_below_each_bound(
    seen: list[float],
) -> None:
    d = Durations()
    for seconds in seen:
        d.observe(seconds)
    for bound, count in d.cumulative():
        limit = float("inf") if bound == "+Inf" else float(bound)
        assert count == sum(s <= limit for s in seen)
