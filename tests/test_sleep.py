"""The sleeper's calls to an engine (a raw plain-HTTP server plays it): a sleep and a
wake, and what a failed one does to the endpoint and the attempt."""

from __future__ import annotations

import socket

import pytest
import trio

from llmgw.http.engine_client import EngineClient
from llmgw.router.breaker import Outcome
from llmgw.router.endpoints import Endpoint, EndpointRegistry, EndpointState
from llmgw.router.metrics import RouterMetrics
from llmgw.router.proxy import AttemptFailed
from llmgw.router.sleep import Sleeper
from tests.raw_engine import RawEngine, ok

KEY = (b"authorization", b"Bearer k")
UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"


def _sleeper(url: str) -> tuple[Sleeper, EndpointState, list[EndpointState]]:
    """A sleeper of one asleep endpoint at `url`; the list hears of each wake."""
    registry = EndpointRegistry(failure_threshold=3, cooldown=1.0)
    registry.upsert(Endpoint("e", url, ("m",), headers=(KEY,), sleep_after=60.0))
    woke: list[EndpointState] = []
    sleeper = Sleeper(registry, RouterMetrics(), client=EngineClient(2.0), on_woke=woke.append)
    (state,) = registry.all()
    state.asleep = True  # as the sleeper's loop marks it before its call
    return sleeper, state, woke


def _count(sleeper: Sleeper, event: str) -> float:
    value = sleeper.metrics.registry.get_sample_value(
        "llmgw_engine_sleeps_total", {"model": "m", "event": event}
    )
    return value or 0.0


async def test_a_sleep_and_a_wake_are_posted_with_the_endpoints_headers() -> None:
    engine = RawEngine({b"/sleep?level=1": ok(b""), b"/wake_up": ok(b"")})
    async with trio.open_nursery() as nursery:
        sleeper, state, woke = _sleeper(f"http://127.0.0.1:{await nursery.start(engine.serve)}/")
        with trio.fail_after(10):
            await sleeper._sleep(state)
            assert state.asleep and _count(sleeper, "sleep") == 1
            await sleeper.wake(state)
        nursery.cancel_scope.cancel()
    assert not state.asleep and woke == [state] and _count(sleeper, "wake") == 1
    assert [h.split(b"\r\n")[0] for h in engine.heads] == [
        b"POST /sleep?level=1 HTTP/1.1",
        b"POST /wake_up HTTP/1.1",
    ]
    assert all(b"\r\nauthorization: Bearer k\r\n" in h for h in engine.heads)
    assert all(b"\r\ncontent-length: 0" in h for h in engine.heads)
    assert sleeper.client._httpx.made is False  # plain http://: llmgw's own client
    await sleeper.client.aclose()


async def test_a_refused_sleep_leaves_the_endpoint_awake() -> None:
    engine = RawEngine({b"/sleep?level=1": UNAVAILABLE})
    async with trio.open_nursery() as nursery:
        sleeper, state, _ = _sleeper(f"http://127.0.0.1:{await nursery.start(engine.serve)}")
        with trio.fail_after(10):
            await sleeper._sleep(state)
        nursery.cancel_scope.cancel()
    assert not state.asleep and state.used_at is not None  # tried again after sleep_after
    assert _count(sleeper, "sleep_failed") == 1 and _count(sleeper, "sleep") == 0
    await sleeper.client.aclose()


async def test_a_wake_answered_with_an_error_fails_the_attempt() -> None:
    engine = RawEngine({b"/wake_up": UNAVAILABLE})
    async with trio.open_nursery() as nursery:
        sleeper, state, woke = _sleeper(f"http://127.0.0.1:{await nursery.start(engine.serve)}")
        with trio.fail_after(10), pytest.raises(AttemptFailed) as caught:
            await sleeper.wake(state)
        nursery.cancel_scope.cancel()
    failure = caught.value
    assert (failure.outcome, failure.status, failure.phase) == (Outcome.SERVER_ERROR, 503, "wake")
    assert str(failure) == "could not be woken: /wake_up answered 503"
    assert state.asleep and woke == []  # the next attempt wakes it
    assert _count(sleeper, "wake_failed") == 1
    await sleeper.client.aclose()


async def test_a_wake_that_cannot_connect_says_why_without_the_address() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    sleeper, state, _ = _sleeper(f"http://127.0.0.1:{port}")
    with trio.fail_after(10), pytest.raises(AttemptFailed) as caught:
        await sleeper.wake(state)
    failure = caught.value
    assert (failure.outcome, failure.phase) == (Outcome.CONNECT_ERROR, "wake")
    assert str(failure) == "could not be woken: connection refused"  # it may reach a client
    assert state.asleep and _count(sleeper, "wake_failed") == 1
    await sleeper.client.aclose()
