from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from llmgw.router.breaker import (
    Breaker,
    BreakerState,
    Outcome,
    Ticket,
    Verdict,
    classify_status,
    counts_as_failure,
    verdict,
)
from tests.properties import examples

CLOSED, OPEN, HALF = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


def fail(b: Breaker, now: float) -> BreakerState | None:
    t = b.acquire(now)
    assert t is not None
    return b.failure(t, now)


def open_breaker(threshold: int = 3, cooldown: float = 10.0) -> Breaker:
    b = Breaker(threshold, cooldown)
    for _ in range(threshold):
        fail(b, 0.0)
    assert b.state(0.0) is OPEN
    return b


def test_threshold_consecutive_failures_open() -> None:
    b = Breaker(3, 10.0)
    assert fail(b, 0.0) is None
    assert fail(b, 0.1) is None
    assert b.state(0.1) is CLOSED
    assert b.consecutive_failures == 2
    assert fail(b, 0.2) is OPEN
    assert b.state(0.2) is OPEN
    assert not b.allows(0.2)
    assert b.acquire(0.2) is None
    assert b.retry_at() == pytest.approx(10.2)


def test_success_resets_the_count() -> None:
    b = Breaker(3, 10.0)
    fail(b, 0.0)
    fail(b, 0.0)
    t = b.acquire(0.0)
    assert t is not None
    assert b.success(t, 0.0) is None
    assert b.consecutive_failures == 0
    fail(b, 0.0)
    fail(b, 0.0)
    assert b.state(0.0) is CLOSED


def test_threshold_one_is_pure_cooldown() -> None:
    b = Breaker(1, 5.0)
    assert fail(b, 0.0) is OPEN
    assert b.state(4.999) is OPEN
    assert b.state(5.0) is HALF


def test_cooldown_then_single_probe() -> None:
    b = open_breaker()
    assert b.state(9.9) is OPEN
    assert b.state(10.0) is HALF
    assert b.allows(10.0)
    probe = b.acquire(10.0)
    assert probe is not None and probe.is_probe
    # Exactly one probe: everyone else is kept out while it runs.
    assert not b.allows(10.5)
    assert b.acquire(10.5) is None
    assert b.state(10.5) is HALF


def test_probe_success_closes() -> None:
    b = open_breaker()
    probe = b.acquire(10.0)
    assert probe is not None
    assert b.success(probe, 11.0) is CLOSED
    assert b.state(11.0) is CLOSED
    t = b.acquire(11.0)
    assert t is not None and not t.is_probe


def test_probe_failure_reopens_for_another_cooldown() -> None:
    b = open_breaker()
    probe = b.acquire(10.0)
    assert probe is not None
    assert b.failure(probe, 12.0) is OPEN
    assert b.state(21.9) is OPEN
    assert b.state(22.0) is HALF
    assert b.acquire(22.0) is not None


def test_abandoned_probe_releases_the_slot() -> None:
    b = open_breaker()
    probe = b.acquire(10.0)
    assert probe is not None
    b.record(probe, Outcome.CLIENT_GONE, 10.5)
    assert b.state(10.5) is HALF
    assert b.allows(10.5)
    second = b.acquire(10.5)
    assert second is not None and second.is_probe
    # The abandoned probe reporting late changes nothing.
    assert b.success(probe, 10.6) is None
    assert b.failure(probe, 10.6) is None
    assert b.acquire(10.6) is None
    assert b.success(second, 11.0) is CLOSED


def test_rate_limited_probe_releases_and_throttles() -> None:
    b = open_breaker()
    probe = b.acquire(10.0)
    assert probe is not None
    assert b.record(probe, Outcome.RATE_LIMITED, 10.0, retry_after=3.0) is None
    assert b.allows(10.0)
    assert b.throttled(12.9)
    assert not b.throttled(13.0)


def test_rate_limit_hold_default_and_cap() -> None:
    b = Breaker(3, 10.0, rate_limit_hold=2.0, max_rate_limit_hold=30.0)
    t = b.acquire(0.0)
    assert t is not None
    b.rate_limited(t, 0.0)
    assert b.throttled(1.9) and not b.throttled(2.0)
    b.rate_limited(t, 5.0, retry_after=3600.0)
    assert b.throttled(34.9) and not b.throttled(35.0)
    # 429s never open the breaker.
    for _ in range(10):
        t = b.acquire(40.0)
        assert t is not None
        b.record(t, Outcome.RATE_LIMITED, 40.0)
    assert b.state(40.0) is CLOSED


def test_stragglers_do_not_extend_cooldown_or_close() -> None:
    b = Breaker(2, 10.0)
    slow = [b.acquire(0.0) for _ in range(5)]
    assert all(t is not None for t in slow)
    fail(b, 0.0)
    assert fail(b, 0.0) is OPEN
    # Requests issued before the trip report afterwards: ignored.
    for t in slow:
        assert t is not None
        assert b.failure(t, 9.0) is None
    assert b.retry_at() == pytest.approx(10.0)
    probe = b.acquire(10.0)
    assert probe is not None
    t0 = slow[0]
    assert t0 is not None
    assert b.success(t0, 10.1) is None
    assert b.state(10.1) is HALF
    assert b.acquire(10.1) is None


def test_probe_failure_after_early_success_still_counts() -> None:
    # The probe reports success at response headers; its stream breaks later.
    b = open_breaker(threshold=1)
    probe = b.acquire(10.0)
    assert probe is not None
    assert b.success(probe, 10.1) is CLOSED
    assert b.failure(probe, 30.0) is OPEN


def test_probe_timeout_frees_a_leaked_probe() -> None:
    b = Breaker(1, 10.0, probe_timeout=5.0)
    fail(b, 0.0)
    leaked = b.acquire(10.0)
    assert leaked is not None
    assert b.acquire(14.9) is None
    fresh = b.acquire(15.0)
    assert fresh is not None and fresh.probe != leaked.probe
    assert b.success(leaked, 15.1) is None  # too late: the new probe decides
    assert b.failure(fresh, 15.2) is OPEN


def test_reset_closes_and_voids_tickets() -> None:
    b = open_breaker()
    b.reset()
    assert b.state(0.0) is CLOSED
    t = b.acquire(0.0)
    assert t is not None


def test_record_dispatch() -> None:
    b = Breaker(2, 10.0)
    t = b.acquire(0.0)
    assert t is not None
    assert b.record(t, Outcome.SERVER_ERROR, 0.0) is None
    assert b.record(t, Outcome.CLIENT_ERROR, 0.0) is None  # 4xx: success, resets
    assert b.consecutive_failures == 0
    assert b.record(t, Outcome.TIMEOUT, 0.0) is None
    assert b.record(t, Outcome.BROKEN_STREAM, 0.0) is OPEN


def test_invalid_parameters() -> None:
    with pytest.raises(ValueError):
        Breaker(0, 1.0)
    with pytest.raises(ValueError):
        Breaker(1, 0.0)


@pytest.mark.parametrize(
    ("status", "outcome", "failure"),
    [
        (200, Outcome.OK, False),
        (204, Outcome.OK, False),
        (400, Outcome.CLIENT_ERROR, False),
        (404, Outcome.CLIENT_ERROR, False),
        (413, Outcome.CLIENT_ERROR, False),
        (422, Outcome.CLIENT_ERROR, False),
        (408, Outcome.TIMEOUT, True),
        (429, Outcome.RATE_LIMITED, False),
        (500, Outcome.SERVER_ERROR, True),
        (501, Outcome.NOT_IMPLEMENTED, False),
        (502, Outcome.SERVER_ERROR, True),
        (503, Outcome.SERVER_ERROR, True),
        (504, Outcome.SERVER_ERROR, True),
    ],
)
def test_classify_status(status: int, outcome: Outcome, failure: bool) -> None:
    assert classify_status(status) is outcome
    assert counts_as_failure(outcome) is failure


def test_verdicts() -> None:
    for o in (Outcome.CONNECT_ERROR, Outcome.TIMEOUT, Outcome.BROKEN_STREAM):
        assert verdict(o) is Verdict.FAILURE
    assert verdict(Outcome.CLIENT_GONE) is Verdict.NONE
    assert verdict(Outcome.RATE_LIMITED) is Verdict.NONE
    assert verdict(Outcome.CLIENT_ERROR) is Verdict.SUCCESS
    assert {verdict(o) for o in Outcome} == set(Verdict)


class BreakerMachine(RuleBasedStateMachine):
    """Random interleavings of acquire / outcomes / time: never two live probes."""

    def __init__(self) -> None:
        super().__init__()
        self.b = Breaker(2, 5.0)
        self.now = 0.0
        self.tickets: list[Ticket] = []
        # Probe tickets handed out in half-open that have not reported yet.
        self.live_probes: list[Ticket] = []

    def _settled(self, t: Ticket) -> None:
        self.tickets.remove(t)
        if t in self.live_probes:
            self.live_probes.remove(t)

    @rule(dt=st.floats(min_value=0.0, max_value=4.0))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule()
    def acquire(self) -> None:
        allowed = self.b.allows(self.now)
        state = self.b.state(self.now)
        t = self.b.acquire(self.now)
        assert (t is not None) == allowed
        if t is None:
            assert state is not CLOSED
            return
        assert t.is_probe == (state is HALF)
        if t.is_probe:
            assert not self.live_probes, "a second probe while one is outstanding"
            self.live_probes.append(t)
        self.tickets.append(t)

    @precondition(lambda self: self.tickets)
    @rule(i=st.integers(min_value=0), outcome=st.sampled_from(list(Outcome)))
    def report(self, i: int, outcome: Outcome) -> None:
        t = self.tickets[i % len(self.tickets)]
        before = self.b.state(self.now)
        entered = self.b.record(t, outcome, self.now)
        self._settled(t)
        if entered is CLOSED:
            assert before is HALF and t.is_probe
        if entered is not None or self.b.state(self.now) is not HALF:
            # Leaving half-open ends every probe's claim on the slot.
            self.live_probes.clear()

    @invariant()
    def probe_slot_consistent(self) -> None:
        if self.b.state(self.now) is HALF and not self.live_probes:
            assert self.b.allows(self.now), "half-open stuck with no live probe"


BreakerMachine.TestCase.settings = settings(max_examples=examples(150), stateful_step_count=40)
TestBreakerMachine = BreakerMachine.TestCase
