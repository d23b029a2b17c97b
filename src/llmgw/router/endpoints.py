"""The endpoint registry: which engine replicas serve which models, and their live state.

Writers are the scraper (metrics), the proxy (in-flight counts, breaker outcomes)
and whoever owns the endpoint set (static configuration, or the control plane
through :class:`EndpointSink`, llmgw.domain's). Scoring only reads. Everything runs on the trio
thread, so plain attributes need no locks.
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

from llmgw.domain.endpoints import Endpoint, EndpointSink, public_name
from llmgw.domain.engine_metrics import EngineSample
from llmgw.router.breaker import Breaker
from llmgw.router.scheduling import Candidate

# Endpoint and EndpointSink are the domain's (llmgw.domain.endpoints), named here too
# as the public API documents them.
__all__ = ["Endpoint", "EndpointRegistry", "EndpointSink", "EndpointState"]


class EndpointState:
    """The router's live knowledge of one endpoint."""

    __slots__ = (
        "asleep",
        "breaker",
        "capacity_tried",
        "draining",
        "endpoint",
        "inflight",
        "inflight_at_scrape",
        "lacks_native",
        "last_error",
        "last_scrape",
        "last_scrape_attempt",
        "prefill",
        "public",
        "reported_capacity",
        "sample",
        "sleep_lock",
        "used_at",
    )

    def __init__(self, endpoint: Endpoint, breaker: Breaker) -> None:
        self.endpoint = endpoint
        self.breaker = breaker
        #: Its name as clients see it (x-llmgw-endpoint), made once: the id's stays.
        self.public = public_name(endpoint.id)
        self.sample: EngineSample | None = None
        # Its engine answered 404 to a client API sent natively (router.pipeline.request.Native):
        # it gets the translation from then on.
        self.lacks_native = False
        self.last_scrape: float | None = None  # time of the last successful scrape
        self.last_scrape_attempt: float | None = None
        self.last_error: str | None = None
        self.inflight = 0
        self.inflight_at_scrape = 0  # our in-flight count when the sample was taken
        # Estimated uncached prompt tokens of our requests before their first token.
        self.prefill = 0.0
        self.draining = False
        # What the engine says it runs at once (llama.cpp's /props), when configured
        # nothing; and when the router last asked.
        self.reported_capacity: int | None = None
        self.capacity_tried: float | None = None
        # Sleep (Endpoint.sleep_after; router/sleep.py): whether the engine sleeps or is
        # being put to sleep, the lock its sleep and wake calls take turns on, and when
        # an attempt last ended there (None: none yet).
        self.asleep = False
        self.sleep_lock = trio.Lock()
        self.used_at: float | None = None

    def _capacity(self) -> tuple[float | None, str | None]:
        """Sequences the engine runs at once and where that comes from: configured (or
        from the control plane), else as the engine reports it, else as learned from
        its queue, else unknown."""
        if self.endpoint.capacity is not None:
            return self.endpoint.capacity, "configured"
        if self.reported_capacity is not None:
            return self.reported_capacity, "engine"
        return None, None

    @property
    def capacity(self) -> float | None:
        return self._capacity()[0]

    @property
    def capacity_source(self) -> str | None:
        return self._capacity()[1]

    def age(self, now: float) -> float | None:
        return None if self.last_scrape is None else now - self.last_scrape

    def candidate(self, now: float) -> Candidate:
        s = self.sample
        e = self.endpoint
        capacity = self.capacity
        waiting, running = (None, None) if s is None else (s.waiting, s.running)
        kv = None if s is None else s.kv_usage
        if waiting is not None and running is not None:
            scraped = waiting + running
            waiting, running = self._since_scrape(waiting, running, capacity)
            if kv is not None and waiting + running < scraped:
                # Sequences that finished since the scrape gave their blocks back.
                kv *= (waiting + running) / scraped
        return Candidate(
            endpoint_id=e.id,
            waiting=waiting,
            running=running,
            kv_usage=kv,
            inflight=self.inflight,
            age=self.age(now),
            weight=e.weight,
            priority=e.priority,
            throttled=self.breaker.throttled(now),
            capacity=capacity,
            pool=e.pool,
            prefill=self.prefill,
        )

    def _since_scrape(
        self, waiting: float, running: float, capacity: float | None
    ) -> tuple[float, float]:
        """The scraped queue corrected by what this router sent and saw finish since.

        A scrape is a snapshot: without this, a slot freed by one of our requests
        would look busy until the next scrape, which holds saturation (and so
        admission) up for a whole scrape interval. Finished requests leave the
        running set, and waiting ones move up into it; new ones join the queue when
        there is one. With a known capacity the engine runs what fits in its slots
        (a scrape between two engine steps shows requests waiting only for the next
        step): the total is split at the capacity instead.
        """
        delta = self.inflight - self.inflight_at_scrape
        if capacity is not None and delta:
            total = max(0.0, waiting + running + delta)
            running = min(float(capacity), total)
            return total - running, running
        if delta < 0:
            total = max(0.0, waiting + running + delta)
            running = min(running, total)
            return total - running, running
        if delta > 0:
            return (waiting + delta, running) if waiting > 0 else (waiting, running + delta)
        return waiting, running


class EndpointRegistry:
    """Endpoints by id and by model; implements :class:`EndpointSink`."""

    def __init__(
        self, *, failure_threshold: int, cooldown: float, probe_timeout: float | None = None
    ) -> None:
        self._threshold = failure_threshold
        self._cooldown = cooldown
        self._probe_timeout = probe_timeout
        self._states: dict[str, EndpointState] = {}
        self._by_model: dict[str, list[EndpointState]] = {}
        self.version = 0  # bumped on every change, so watchers can notice

    def upsert(self, endpoint: Endpoint) -> None:
        state = self._states.get(endpoint.id)
        if state is None:
            breaker = Breaker(self._threshold, self._cooldown, probe_timeout=self._probe_timeout)
            state = EndpointState(endpoint, breaker)
            self._states[endpoint.id] = state
        else:
            state.endpoint = endpoint
            state.draining = False
        self._reindex()

    def drain(self, endpoint_id: str) -> None:
        state = self._states.get(endpoint_id)
        if state is not None:
            state.draining = True
            self._reindex()

    def remove(self, endpoint_id: str) -> None:
        if self._states.pop(endpoint_id, None) is not None:
            self._reindex()

    def replace_all(self, endpoints: Iterable[Endpoint]) -> None:
        wanted = {e.id: e for e in endpoints}
        for gone in set(self._states) - set(wanted):
            del self._states[gone]
        for endpoint in wanted.values():
            self.upsert(endpoint)
        self._reindex()

    def _reindex(self) -> None:
        by_model: dict[str, list[EndpointState]] = {}
        for state in self._states.values():
            if state.draining:
                continue
            for model in state.endpoint.models:
                by_model.setdefault(model, []).append(state)
        self._by_model = by_model
        self.version += 1

    def get(self, endpoint_id: str) -> EndpointState | None:
        return self._states.get(endpoint_id)

    def all(self) -> list[EndpointState]:
        return list(self._states.values())

    def serving(self, model: str) -> list[EndpointState]:
        """Endpoints that take new requests for `model` (breakers not considered)."""
        return self._by_model.get(model, [])

    def models(self) -> set[str]:
        return set(self._by_model)
