"""The scrape loop: polls every endpoint's /metrics and stores what it learns.

An engine whose registry entry says where it reports its capacity (llama.cpp: ``GET
/props``, ``total_slots``) has that read too, for an endpoint whose capacity nothing
configured, at most every :data:`CAPACITY_EVERY` seconds until it answers, and it
becomes the endpoint's capacity.
Where nothing says a replica's capacity, none is guessed: its queue says when it is
full (:mod:`llmgw.router.scheduling.state`).
Both pages are read up to a bound (:data:`MAX_METRICS_BYTES`, :data:`MAX_CAPACITY_BYTES`):
an engine cannot make the router hold an unbounded page. Pages come through the
Router's engine client (:mod:`llmgw.http.engine_client`).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import trio

from llmgw.config import ScoringConfig
from llmgw.domain.engine_metrics import parse_metrics
from llmgw.domain.engines import DIALECT_ENTRIES
from llmgw.http.client import BodyTooLarge, UpstreamError
from llmgw.http.engine_client import EngineClient
from llmgw.router.endpoints import EndpointRegistry, EndpointState
from llmgw.router.metrics import RouterMetrics

# A vLLM page is ~100 KB (histograms, a few label sets); far more is not a metrics page.
MAX_METRICS_BYTES = 8 * 1024 * 1024
MAX_CAPACITY_BYTES = 1024 * 1024
CAPACITY_EVERY = 60.0


class PageTooLarge(Exception):
    pass


class FetchFailed(Exception):
    """A page could not be read: a non-2xx `status`, or else the message says why
    (no URL in it)."""

    def __init__(self, why: str, status: int | None = None) -> None:
        super().__init__(why)
        self.status = status


def capacity_in(body: bytes, field: str) -> int | None:
    """The integer `field` of the JSON object `body` (llama.cpp's ``/props``
    ``total_slots``, say); None unless a positive integer."""
    try:
        page = json.loads(body)
    except ValueError:
        return None
    count = page.get(field) if isinstance(page, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None


class Scraper:
    """Scrapes all endpoints every `interval`, each bounded by `timeout`.

    A failed scrape keeps the last sample: its age grows until scoring treats it
    as stale, which scores the endpoint down without dropping it.
    """

    def __init__(
        self,
        endpoints: EndpointRegistry,
        metrics: RouterMetrics,
        *,
        client: EngineClient,
        interval: float,
        timeout: float,
        scoring: ScoringConfig | None = None,
        on_pass: Callable[[], None] | None = None,
    ) -> None:
        """`on_pass` is called after every pass, before :meth:`next_pass` returns."""
        self.endpoints = endpoints
        self.scoring = scoring or ScoringConfig()
        self.metrics = metrics
        self.interval = interval
        self.timeout = timeout
        self.client = client
        self._wake = trio.Event()
        self.on_pass = on_pass
        self._passed = trio.Event()

    async def fetch(
        self, url: str, limit: int, headers: tuple[tuple[bytes, bytes], ...] = ()
    ) -> bytes:
        """GET `url`'s body, at most `limit` bytes: PageTooLarge past it (stopping
        there), FetchFailed for a non-2xx answer or a broken exchange."""
        try:
            async with self.client.request("GET", url, headers) as response:
                if not 200 <= response.status_code < 300:
                    raise FetchFailed("not 2xx", response.status_code)
                return await response.aread(limit)
        except BodyTooLarge:
            raise PageTooLarge(f"larger than {limit} bytes") from None
        except UpstreamError as exc:
            raise FetchFailed(str(exc)) from None

    def poke(self) -> None:
        """Scrape now (e.g. right after a new endpoint was added)."""
        self._wake.set()

    async def next_pass(self) -> None:
        """Wait until the pass running now, or else the next one, has ended."""
        await self._passed.wait()

    async def run(self) -> None:
        while True:
            await self.scrape_all()
            if self.on_pass is not None:
                self.on_pass()
            self._passed.set()
            self._passed = trio.Event()
            with trio.move_on_after(self.interval):
                await self._wake.wait()
            self._wake = trio.Event()

    async def scrape_all(self) -> None:
        async with trio.open_nursery() as nursery:
            for state in self.endpoints.all():
                nursery.start_soon(self.scrape_one, state)

    async def scrape_one(self, state: EndpointState) -> None:
        ident = state.endpoint.id
        self.metrics.scrapes.labels(ident).inc()
        started = trio.current_time()
        state.last_scrape_attempt = started
        base = state.endpoint.url.rstrip("/")
        try:
            with trio.fail_after(self.timeout):
                page = await self.fetch(
                    base + "/metrics", MAX_METRICS_BYTES, state.endpoint.headers
                )
            sample = parse_metrics(page, previous=state.sample)
        except PageTooLarge:
            self._failed(state, f"the /metrics page is larger than {MAX_METRICS_BYTES} bytes")
            return
        except trio.TooSlowError:
            self._failed(state, f"scrape timed out after {self.timeout:g}s")
            return
        except FetchFailed as exc:
            if exc.status is not None:
                self._failed(state, f"/metrics answered {exc.status}")
            else:
                self._failed(state, f"scrape failed: {exc}")
            return
        now = trio.current_time()
        self.metrics.scrape_duration.observe(now - started)
        if not sample.known:
            self._failed(state, "the /metrics page has no metrics of a known engine")
            return
        state.sample = sample
        state.inflight_at_scrape = state.inflight
        state.last_scrape = now
        state.last_error = None
        entry = DIALECT_ENTRIES.get(sample.engine)
        probe = entry.api.capacity if entry is not None else None
        if (
            probe is not None
            and state.endpoint.capacity is None
            and state.reported_capacity is None
            and (state.capacity_tried is None or now - state.capacity_tried >= CAPACITY_EVERY)
        ):
            state.capacity_tried = now
            await self._read_capacity(state, base, *probe)

    async def _read_capacity(self, state: EndpointState, base: str, path: str, field: str) -> None:
        try:
            with trio.fail_after(self.timeout):
                body = await self.fetch(base + path, MAX_CAPACITY_BYTES, state.endpoint.headers)
        except (trio.TooSlowError, FetchFailed, PageTooLarge):
            return  # unknown until a later try: its queue still says when it is full
        state.reported_capacity = capacity_in(body, field)

    def _failed(self, state: EndpointState, message: str) -> None:
        self.metrics.scrape_errors.labels(state.endpoint.id).inc()
        state.last_error = message
