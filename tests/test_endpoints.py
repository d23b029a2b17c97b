"""The endpoint registry's live state: what scoring sees between scrapes."""

from __future__ import annotations

from llmgw.domain.engine_metrics import EngineSample
from llmgw.router.breaker import Breaker
from llmgw.router.endpoints import Endpoint, EndpointState


def state(waiting: float, running: float, inflight_at_scrape: int) -> EndpointState:
    s = EndpointState(Endpoint("e", "http://e", ("m",)), Breaker(3, 15.0))
    s.sample = EngineSample("vllm", waiting=waiting, running=running)
    s.last_scrape = 0.0
    s.inflight = s.inflight_at_scrape = inflight_at_scrape
    return s


def test_finished_requests_free_their_slots_before_the_next_scrape() -> None:
    s = state(waiting=2, running=4, inflight_at_scrape=6)
    s.inflight = 3  # three of ours finished since the scrape
    c = s.candidate(1.0)
    # Six queued or running minus three finished: the waiting two moved up.
    assert (c.waiting, c.running) == (0, 3)


def test_new_requests_join_the_queue_when_there_is_one() -> None:
    s = state(waiting=1, running=4, inflight_at_scrape=5)
    s.inflight = 7
    assert (s.candidate(1.0).waiting, s.candidate(1.0).running) == (3, 4)
    s = state(waiting=0, running=2, inflight_at_scrape=2)
    s.inflight = 3
    assert (s.candidate(1.0).waiting, s.candidate(1.0).running) == (0, 3)


def test_other_clients_load_is_kept_and_never_goes_negative() -> None:
    s = state(waiting=0, running=5, inflight_at_scrape=1)  # four are someone else's
    s.inflight = 0
    assert (s.candidate(1.0).waiting, s.candidate(1.0).running) == (0, 4)
    s = state(waiting=0, running=1, inflight_at_scrape=3)
    s.inflight = 0
    assert (s.candidate(1.0).waiting, s.candidate(1.0).running) == (0, 0)


def test_unknown_stays_unknown() -> None:
    s = EndpointState(Endpoint("e", "http://e", ("m",)), Breaker(3, 15.0))
    s.inflight = 2
    c = s.candidate(1.0)
    assert c.waiting is None and c.running is None and c.inflight == 2


def test_with_a_known_capacity_what_fits_in_its_slots_runs() -> None:
    # A scrape between two engine steps: 2 waiting for the next step, 2 slots free.
    s = state(waiting=2, running=14, inflight_at_scrape=16)
    s.reported_capacity = 16
    s.inflight = 17  # one more sent since
    assert (s.candidate(1.0).waiting, s.candidate(1.0).running) == (1, 16)
    s.inflight = 15  # or one of ours finished: all of them fit
    assert (s.candidate(1.0).waiting, s.candidate(1.0).running) == (0, 15)
    # Without one, what was sent joins the queue it saw (as above).
    s.reported_capacity = None
    s.inflight = 17
    assert (s.candidate(1.0).waiting, s.candidate(1.0).running) == (3, 14)


def test_finished_requests_give_their_kv_blocks_back_before_the_next_scrape() -> None:
    s = state(waiting=0, running=10, inflight_at_scrape=10)
    s.sample = EngineSample("vllm", waiting=0, running=10, kv_usage=0.95)
    assert s.candidate(1.0).kv_usage == 0.95
    s.inflight = 5  # half of them finished: about half the blocks are free
    assert s.candidate(1.0).kv_usage == 0.475
    s.inflight = 0
    assert s.candidate(1.0).kv_usage == 0.0
    # New requests since may wait for blocks rather than take them: no guess upwards.
    s.inflight = 14
    assert s.candidate(1.0).kv_usage == 0.95
