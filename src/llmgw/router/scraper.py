"""The scrape loop: polls every endpoint's /metrics and stores what it learns."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import trio

from llmgw.router.endpoints import EndpointRegistry, EndpointState
from llmgw.router.metrics import RouterMetrics
from llmgw.router.scrape import parse_metrics


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
        interval: float,
        timeout: float,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.metrics = metrics
        self.interval = interval
        self.timeout = timeout
        self.client = client or httpx.AsyncClient(timeout=None)
        self._wake = trio.Event()
        # Called after every pass, so admission re-reads saturation from fresh numbers.
        self.on_pass: Callable[[], None] | None = None

    def poke(self) -> None:
        """Scrape now (e.g. right after a new endpoint was added)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self.scrape_all()
            if self.on_pass is not None:
                self.on_pass()
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
        try:
            with trio.fail_after(self.timeout):
                response = await self.client.get(state.endpoint.url.rstrip("/") + "/metrics")
            response.raise_for_status()
            sample = parse_metrics(response.content, previous=state.sample)
        except trio.TooSlowError:
            self._failed(state, f"scrape timed out after {self.timeout:g}s")
            return
        except httpx.HTTPStatusError as exc:
            self._failed(state, f"/metrics answered {exc.response.status_code}")
            return
        except httpx.HTTPError as exc:
            self._failed(state, f"scrape failed: {str(exc) or type(exc).__name__}")
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

    def _failed(self, state: EndpointState, message: str) -> None:
        self.metrics.scrape_errors.labels(state.endpoint.id).inc()
        state.last_error = message
