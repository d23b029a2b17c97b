from __future__ import annotations

import pytest

from llmgw.control.activity import ActivityTracker
from llmgw.domain.usage import Usage, UsageRecord


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def record(model: str = "m", tokens: int = 10) -> UsageRecord:
    return UsageRecord(model=model, endpoint="e", status=200, usage=Usage(tokens, 0), latency=0.1)


def test_unknown_model_has_no_activity() -> None:
    a = ActivityTracker(clock=Clock())
    got = a.get("m")
    assert got.last_request is None and got.idle_seconds is None
    assert got.requests_per_second == 0.0


def test_a_steady_rate_converges_and_decays_when_idle() -> None:
    clock = Clock()
    a = ActivityTracker(window=10.0, clock=clock)
    for _ in range(600):  # 2 requests/s for 5 minutes
        clock.now += 0.5
        a.record(record(tokens=100))
    got = a.get("m")
    assert got.requests_per_second == pytest.approx(2.0, rel=0.05)
    assert got.tokens_per_second == pytest.approx(200.0, rel=0.05)
    assert got.idle_seconds == 0.0
    clock.now += 60.0
    quiet = a.get("m")
    assert quiet.idle_seconds == 60.0
    assert quiet.requests_per_second < 0.01
    assert a.get("other").requests_per_second == 0.0
