"""The scrape loop against pages an engine might serve: gzip, oversized, llama.cpp's
slots. httpx's MockTransport plays the engine behind an injected client (httpx's
path, as for https:// engines); a raw socket server plays one over plain http://
(llmgw's own client)."""

from __future__ import annotations

import gzip
import json

import httpx
import trio
import trio.testing

from llmgw.http.engine_client import EngineClient
from llmgw.router.endpoints import Endpoint, EndpointRegistry
from llmgw.router.metrics import RouterMetrics
from llmgw.router.scraper import CAPACITY_EVERY, MAX_METRICS_BYTES, Scraper, capacity_in
from tests.raw_engine import RawEngine, ok

VLLM_PAGE = b"vllm:num_requests_running 3\nvllm:num_requests_waiting 1\n"
LLAMA_PAGE = b"llamacpp:requests_processing 2\nllamacpp:requests_deferred 0\n"


def scraper(handler: httpx.MockTransport, capacity: int | None = None) -> Scraper:
    registry = EndpointRegistry(failure_threshold=3, cooldown=1.0)
    registry.upsert(Endpoint("e", "http://engine", ("m",), capacity=capacity))
    return Scraper(
        registry,
        RouterMetrics(),
        interval=1.0,
        timeout=1.0,
        client=EngineClient(1.0, httpx.AsyncClient(transport=handler)),
    )


async def test_a_gzip_page_is_read_decoded() -> None:
    def serve(request: httpx.Request) -> httpx.Response:
        assert "gzip" in request.headers["accept-encoding"]
        return httpx.Response(
            200, content=gzip.compress(VLLM_PAGE), headers={"content-encoding": "gzip"}
        )

    s = scraper(httpx.MockTransport(serve))
    (state,) = s.endpoints.all()
    await s.scrape_one(state)
    assert state.last_error is None
    assert state.sample is not None and (state.sample.running, state.sample.waiting) == (3, 1)


async def test_an_oversized_page_fails_the_scrape_and_keeps_the_last_sample() -> None:
    pages = [VLLM_PAGE, VLLM_PAGE + b"# " + b"x" * MAX_METRICS_BYTES + b"\n"]

    def serve(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=pages.pop(0))

    s = scraper(httpx.MockTransport(serve))
    (state,) = s.endpoints.all()
    await s.scrape_one(state)
    first = state.sample
    await s.scrape_one(state)
    assert state.last_error == f"the /metrics page is larger than {MAX_METRICS_BYTES} bytes"
    assert state.sample is first


def test_llama_cpp_says_how_many_slots_it_runs() -> None:
    asked: list[str] = []
    props = [httpx.Response(503), httpx.Response(200, json={"total_slots": 6})]

    def serve(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path == "/props":
            return props.pop(0)
        return httpx.Response(200, content=LLAMA_PAGE)

    clock = trio.testing.MockClock()

    async def main() -> None:
        s = scraper(httpx.MockTransport(serve))
        (state,) = s.endpoints.all()
        await s.scrape_one(state)
        assert state.capacity is None  # /props failed: unknown, its queue still counts
        await s.scrape_one(state)
        assert asked == ["/metrics", "/props", "/metrics"]  # not asked again at once
        clock.jump(CAPACITY_EVERY)
        await s.scrape_one(state)
        assert state.capacity == 6
        assert state.candidate(trio.current_time()).capacity == 6
        await s.scrape_one(state)
        assert asked.count("/props") == 2  # known: never asked again

    trio.run(main, clock=clock)


async def test_a_configured_capacity_wins_and_props_is_not_asked() -> None:
    asked: list[str] = []

    def serve(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(200, content=LLAMA_PAGE)

    s = scraper(httpx.MockTransport(serve), capacity=2)
    (state,) = s.endpoints.all()
    await s.scrape_one(state)
    assert asked == ["/metrics"] and state.capacity == 2


def test_a_reported_capacity_is_read_strictly() -> None:
    assert capacity_in(json.dumps({"total_slots": 4}).encode(), "total_slots") == 4
    for bad in (b"", b"[]", b"{}", b'{"total_slots": 0}', b'{"total_slots": true}',
                b'{"total_slots": "4"}', b'{"total_slots": 4.5}', b"\xff"):  # fmt: skip
        assert capacity_in(bad, "total_slots") is None, bad


async def test_a_queue_never_becomes_a_capacity() -> None:
    """Nothing guesses a capacity: an engine queueing behind 32 running sequences is full
    by its queue, and a configured capacity stays what it says."""
    queued = b"vllm:num_requests_running 32\nvllm:num_requests_waiting 6\n"
    s = scraper(httpx.MockTransport(lambda r: httpx.Response(200, content=queued)))
    (state,) = s.endpoints.all()
    for _ in range(3):
        await s.scrape_one(state)
    assert (state.capacity, state.capacity_source) == (None, None)
    pinned = scraper(httpx.MockTransport(lambda r: httpx.Response(200, content=queued)), 256)
    (state,) = pinned.endpoints.all()
    await pinned.scrape_one(state)
    assert (state.capacity, state.capacity_source) == (256, "configured")


# -- plain http:// pages: llmgw's own client, against a raw socket server ----------


def _native(port: int, capacity: int | None = None) -> Scraper:
    registry = EndpointRegistry(failure_threshold=3, cooldown=1.0)
    registry.upsert(Endpoint("e", f"http://127.0.0.1:{port}", ("m",), capacity=capacity))
    return Scraper(registry, RouterMetrics(), client=EngineClient(5.0), interval=1.0, timeout=5.0)


async def test_a_plain_http_page_is_read_by_llmgws_own_client_without_httpx() -> None:
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    chunked += b"%x\r\n%s\r\n0\r\n\r\n" % (len(VLLM_PAGE), VLLM_PAGE)
    engine = RawEngine({b"/metrics": chunked})
    async with trio.open_nursery() as nursery:
        port = await nursery.start(engine.serve)
        s = _native(port)
        (state,) = s.endpoints.all()
        await s.scrape_one(state)
        await s.scrape_one(state)  # on the kept-alive connection
        assert state.last_error is None
        assert state.sample is not None and (state.sample.running, state.sample.waiting) == (3, 1)
        seen = engine.heads
        assert len(seen) == 2 and all(h.startswith(b"GET /metrics HTTP/1.1\r\n") for h in seen)
        assert engine.connections == 1
        assert not any(b"accept-encoding" in h.lower() for h in seen)  # pages come plain
        assert s.client._httpx.made is False  # no httpx client was made
        await s.client.aclose()
        nursery.cancel_scope.cancel()


async def test_plain_http_failures_say_what_went_wrong_and_keep_the_last_sample() -> None:
    big = ok(VLLM_PAGE + b"# " + b"x" * MAX_METRICS_BYTES + b"\n")
    cases = [
        (b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n", "/metrics answered 503"),
        (big, f"the /metrics page is larger than {MAX_METRICS_BYTES} bytes"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: -6\r\n\r\n", "scrape failed: "),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort", "scrape failed: "),
    ]
    for answer, error in cases:
        answers = {b"/metrics": ok(VLLM_PAGE)}
        cut: set[bytes] = set()
        async with trio.open_nursery() as nursery:
            port = await nursery.start(RawEngine(answers, cut).serve)
            s = _native(port)
            (state,) = s.endpoints.all()
            await s.scrape_one(state)
            first = state.sample
            assert first is not None and state.last_error is None
            answers[b"/metrics"] = answer
            if answer.endswith(b"short"):
                cut.add(b"/metrics")  # the body is cut off: the server closes
            with trio.fail_after(10):
                await s.scrape_one(state)
            assert state.last_error is not None and state.last_error.startswith(error), (
                state.last_error
            )
            assert state.sample is first
            await s.client.aclose()
            nursery.cancel_scope.cancel()


async def test_llama_cpp_slots_are_read_over_plain_http_too() -> None:
    answers = {
        b"/metrics": ok(LLAMA_PAGE),
        b"/props": ok(json.dumps({"total_slots": 6}).encode()),
    }
    async with trio.open_nursery() as nursery:
        port = await nursery.start(RawEngine(answers).serve)
        s = _native(port)
        (state,) = s.endpoints.all()
        await s.scrape_one(state)
        assert state.reported_capacity == 6
        await s.client.aclose()
        nursery.cancel_scope.cancel()
