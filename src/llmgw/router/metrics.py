"""The router's Prometheus metrics, on a registry of its own (no globals), which is the
one llmgw-server serves: it also carries the process's own families (prometheus-client's
process, platform and GC collectors, ``llmgw_build_info``) and the fleet's.

Per-endpoint engine numbers are not kept in gauges that someone must remember to
update: a collector reads them from the registry at scrape time, and a number the
engine never reported is left out rather than exported as zero.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from llmgw.domain.histogram import Histogram as Buckets
from llmgw.domain.usage import UsageRecord
from llmgw.router.admission import AdmissionStats
from llmgw.router.breaker import BreakerState
from llmgw.router.endpoints import EndpointRegistry
from llmgw.version import __version__

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
# `_created` samples double every family's size for no use to an operator.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Cold starts take seconds (a small model on llama.cpp) to many minutes (a large one
# loading its weights).
COLD_START_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)


class RouterMetrics:
    """Every family the router exports; one instance per Router."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, key_metrics: bool = False
    ) -> None:
        """`key_metrics` (``auth.key_metrics``) adds a ``key`` label to
        ``llmgw_rejected_requests_total``: decided once, so the family keeps one label
        set for the life of the process."""
        r = self.registry = registry or CollectorRegistry(auto_describe=True)
        self.key_metrics = key_metrics
        # The process serving these: CPU, memory, open files, start time (Linux), the
        # interpreter and its garbage collector, and what is running.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        Gauge(
            "llmgw_build_info",
            "Always 1, labelled with the running llmgw's version and Python's.",
            ["version", "python"],
            registry=r,
        ).labels(__version__, platform.python_version()).set(1)
        self.requests = Counter(
            "llmgw_requests_total",
            "Client requests completed, by served model, endpoint, HTTP status and API "
            "operation (chat, text_completion, embeddings, ...).",
            ["model", "endpoint", "status", "route"],
            registry=r,
        )
        self.rejected = Counter(
            "llmgw_rejected_requests_total",
            "Client requests answered with an error by llmgw itself, by reason and the "
            "configured model (empty when the request named none that exists)"
            + (
                ", and the API key's id (empty before a key was accepted; auth.key_metrics)."
                if key_metrics
                else "."
            ),
            ["reason", "model", "key"] if key_metrics else ["reason", "model"],
            registry=r,
        )
        self.in_flight = Gauge(
            "llmgw_requests_in_flight",
            "Client requests being served (after admission), by model.",
            ["model"],
            registry=r,
        )
        self.duration = Histogram(
            "llmgw_request_duration_seconds",
            "End-to-end latency of client requests, by model, API operation and whether "
            "it streamed (a chat stream and an embedding are not one distribution).",
            ["model", "route", "stream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "llmgw_time_to_first_token_seconds",
            "Time from the client's request to the first streamed token event.",
            ["model", "route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = GapHistograms(
            "llmgw_inter_token_latency_seconds",
            "Time between consecutive streamed events.",
            TOKEN_LATENCY_BUCKETS,
        )
        r.register(self.itl)
        self.overhead = Histogram(
            "llmgw_router_overhead_seconds",
            "Time spent in llmgw itself before the request went upstream "
            "(parsing, scoring, body rewriting; queueing excluded).",
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "llmgw_prompt_tokens_total", "Prompt tokens.", ["model", "endpoint"], registry=r
        )
        self.completion_tokens = Counter(
            "llmgw_completion_tokens_total",
            "Completion tokens.",
            ["model", "endpoint"],
            registry=r,
        )
        self.cached_tokens = Counter(
            "llmgw_cached_prompt_tokens_total",
            "Prompt tokens the engine reported as served from its prefix cache.",
            ["model", "endpoint"],
            registry=r,
        )
        self.prefix_predictions = Counter(
            "llmgw_prefix_predictions_total",
            "Answers whose cached prompt tokens (the engine's count) were weighed against "
            "the prefix table's prediction for the replica picked: hit or miss (agreed), "
            "over (predicted held, the engine had evicted it), under (the engine held "
            "more than predicted).",
            ["model", "outcome"],
            registry=r,
        )
        self.estimated_usage = Counter(
            "llmgw_estimated_usage_requests_total",
            "Requests whose token counts were estimated (the stream was cut before usage).",
            ["model"],
            registry=r,
        )
        self.retries = Counter(
            "llmgw_retries_total",
            "Attempts moved to another endpoint before any byte reached the client.",
            ["model", "reason"],
            registry=r,
        )
        self.fallbacks = Counter(
            "llmgw_fallbacks_total",
            "Requests served by a fallback model.",
            ["model", "fallback"],
            registry=r,
        )
        self.timeouts = Counter(
            "llmgw_timeouts_total",
            "Upstream deadlines that expired, by request phase.",
            ["endpoint", "phase"],
            registry=r,
        )
        self.client_timeouts = Counter(
            "llmgw_client_timeouts_total",
            "Requests refused because the client was too slow to send them: its request "
            "head (phase=header, router.timeouts.client_header) or body (phase=body, "
            "router.timeouts.client_body), by listener (client, admin).",
            ["listener", "phase"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "llmgw_upstream_errors_total",
            "Failed upstream attempts, by endpoint and kind.",
            ["endpoint", "kind"],
            registry=r,
        )
        self.disconnects = Counter(
            "llmgw_client_disconnects_total",
            "Clients that went away before their response was complete, by phase.",
            ["model", "phase"],
            registry=r,
        )
        self.breaker_transitions = Counter(
            "llmgw_breaker_transitions_total",
            "Circuit-breaker state changes, by endpoint and new state.",
            ["endpoint", "state"],
            registry=r,
        )
        self.decisions = Counter(
            "llmgw_routing_decisions_total",
            "Endpoint choices, by model and the tier that decided (session, prefix, score).",
            ["model", "tier"],
            registry=r,
        )
        self.spills = Counter(
            "llmgw_affinity_spills_total",
            "Requests with a home (their session's replica, replicas holding their prefix) "
            "sent elsewhere, by model, affinity and reason (work, load, throttled, priority, "
            "gone).",
            ["model", "affinity", "reason"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "llmgw_admission_wait_seconds",
            "Time requests spent queued for admission, by band and how the wait ended "
            "(admitted, expired, abandoned).",
            ["band", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.admission_rejected = Counter(
            "llmgw_admission_rejected_total",
            "Requests refused by admission, by band and reason (queue_full, expired).",
            ["band", "reason"],
            registry=r,
        )
        self.cold_waits = Counter(
            "llmgw_cold_start_requests_total",
            "Requests that found an autoscaled model with no replica and waited for one, "
            "by how the wait ended (admitted, starting: cold_start_timeout passed, "
            "unplaceable, queue_full, disconnected).",
            ["model", "outcome"],
            registry=r,
        )
        self.cold_wait = Histogram(
            "llmgw_cold_start_wait_seconds",
            "Time requests waited for a replica of an autoscaled model to start, by model "
            "(the requests admitted).",
            ["model"],
            buckets=COLD_START_BUCKETS,
            registry=r,
        )
        self.sleeps = Counter(
            "llmgw_engine_sleeps_total",
            "Engines the router put to sleep and woke (Endpoint.sleep_after), by model and "
            "event (sleep, wake, sleep_failed, wake_failed).",
            ["model", "event"],
            registry=r,
        )
        self.wake = Histogram(
            "llmgw_engine_wake_seconds",
            "Time a sleeping engine took to wake, by model.",
            ["model"],
            buckets=COLD_START_BUCKETS,
            registry=r,
        )
        self.scrapes = Counter(
            "llmgw_scrapes_total", "Engine metric scrapes attempted.", ["endpoint"], registry=r
        )
        self.scrape_errors = Counter(
            "llmgw_scrape_errors_total",
            "Engine metric scrapes that failed.",
            ["endpoint"],
            registry=r,
        )
        self.scrape_duration = Histogram(
            "llmgw_scrape_duration_seconds",
            "Time to fetch and parse one engine's metrics.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def reject(self, reason: str, model: str, key_id: str | None) -> None:
        """Count a refusal llmgw answered itself. `key_id` is the id of the key the
        request authenticated with (None before one was accepted, so a 401's presented
        secret never becomes a label); used only with key_metrics on."""
        if self.key_metrics:
            self.rejected.labels(reason, model, key_id or "").inc()
        else:
            self.rejected.labels(reason, model).inc()

    def watch_endpoints(self, endpoints: EndpointRegistry, clock: Callable[[], float]) -> None:
        self.registry.register(_EndpointCollector(endpoints, clock))

    def watch_admission(
        self, stats: Callable[[], AdmissionStats], saturation: Callable[[str], float]
    ) -> None:
        """Export admission queues, counters and each pool's saturation at scrape time.

        `stats` is ``AdmissionController.stats``; `saturation(model)` is read fresh per
        scrape (the controller's last reading can be arbitrarily old on a quiet model).
        """
        self.registry.register(_AdmissionCollector(stats, saturation))


class KeyMetrics:
    """Per-key usage counters, a :class:`~llmgw.domain.usage.UsageSink` (opt-in:
    ``auth.key_metrics``). Every key adds series to each model it uses, so an operator
    with many keys keeps them off and reads usage from the store instead.

    Labelled by the key's id (``key_...``, shown by ``llmgw-ctl keys``), never its
    secret; names are not unique and may repeat. Counted like the store's usage
    records: requests for a configured model, served or refused (429, 503, ...; no
    endpoint). A 401 has no key to count under: it is in
    ``llmgw_rejected_requests_total``; requests without a key are not here.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "llmgw_key_requests_total",
            "Client requests for a configured model, by API key id, model and HTTP "
            "status, refusals included (auth.key_metrics).",
            ["key", "model", "status"],
            registry=registry,
        )
        self.tokens = Counter(
            "llmgw_key_tokens_total",
            "Tokens used, by API key id, served model and kind (prompt, completion) "
            "(auth.key_metrics).",
            ["key", "model", "kind"],
            registry=registry,
        )

    def record(self, record: UsageRecord) -> None:
        key = record.key_id
        if key is None:
            return
        self.requests.labels(key, record.model, str(record.status)).inc()
        usage = record.usage
        # Both kinds always, zeros too, so a key's series appear with its first request.
        self.tokens.labels(key, record.model, "prompt").inc(usage.prompt_tokens)
        self.tokens.labels(key, record.model, "completion").inc(usage.completion_tokens)


_BREAKER_STATES = tuple(BreakerState)


class GapHistograms(Collector):
    """A histogram family by model for values observed by the dozen per request (the
    gaps between a stream's events): prometheus_client's Histogram costs ~1.7 us an
    observation, this ~0.3 us (llmgw.domain.histogram)."""

    def __init__(self, name: str, documentation: str, bounds: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = bounds
        self._by_model: dict[str, Buckets] = {}

    def observe_all(self, model: str, values: list[float]) -> None:
        h = self._by_model.get(model)
        if h is None:
            h = self._by_model[model] = Buckets(self.bounds)
        for value in values:
            h.observe(value)

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=["model"])]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=["model"])
        for model, h in self._by_model.items():
            family.add_metric([model], h.buckets(), h.sum)
        yield family


class _EndpointCollector(Collector):
    def __init__(self, endpoints: EndpointRegistry, clock: Callable[[], float]) -> None:
        self._endpoints = endpoints
        self._clock = clock

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # computed at collection; nothing to pre-declare

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self._clock()
        label = ["endpoint"]
        waiting = GaugeMetricFamily(
            "llmgw_endpoint_waiting_requests",
            "Requests the engine reports as queued.",
            labels=label,
        )
        running = GaugeMetricFamily(
            "llmgw_endpoint_running_requests",
            "Requests the engine reports as running.",
            labels=label,
        )
        kv = GaugeMetricFamily(
            "llmgw_endpoint_kv_cache_usage_ratio",
            "KV-cache usage the engine reports, 0..1.",
            labels=label,
        )
        hit = GaugeMetricFamily(
            "llmgw_endpoint_prefix_cache_hit_ratio",
            "Engine prefix-cache hit rate over the last scrape interval.",
            labels=label,
        )
        inflight = GaugeMetricFamily(
            "llmgw_endpoint_inflight_requests",
            "Requests this router has in flight to the endpoint.",
            labels=label,
        )
        age = GaugeMetricFamily(
            "llmgw_endpoint_scrape_age_seconds",
            "Seconds since the endpoint's metrics were last scraped successfully.",
            labels=label,
        )
        up = GaugeMetricFamily(
            "llmgw_endpoint_up", "1 if the last scrape of the endpoint succeeded.", labels=label
        )
        draining = GaugeMetricFamily(
            "llmgw_endpoint_draining", "1 if the endpoint takes no new requests.", labels=label
        )
        breaker = GaugeMetricFamily(
            "llmgw_breaker_state",
            "1 for the circuit breaker's current state of each endpoint.",
            labels=["endpoint", "state"],
        )
        for state in self._endpoints.all():
            ident = [state.endpoint.id]
            s = state.sample
            if s is not None:
                for family, value in (
                    (waiting, s.waiting),
                    (running, s.running),
                    (kv, s.kv_usage),
                    (hit, s.prefix_hit_rate),
                ):
                    if value is not None:
                        family.add_metric(ident, value)
            inflight.add_metric(ident, state.inflight)
            seconds = state.age(now)
            if seconds is not None:
                age.add_metric(ident, seconds)
            up.add_metric(ident, 1.0 if state.last_error is None and s is not None else 0.0)
            draining.add_metric(ident, 1.0 if state.draining else 0.0)
            current = state.breaker.state(now)
            for bs in _BREAKER_STATES:
                breaker.add_metric([state.endpoint.id, bs.value], 1.0 if bs is current else 0.0)
        yield from (waiting, running, kv, hit, inflight, age, up, draining, breaker)


class _AdmissionCollector(Collector):
    """Per model (pool) and band, from ``AdmissionController.stats()``. A pool appears
    once admission has seen a request for it; with admission disabled, nothing does."""

    def __init__(
        self, stats: Callable[[], AdmissionStats], saturation: Callable[[str], float]
    ) -> None:
        self._stats = stats
        self._saturation = saturation

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # computed at collection; nothing to pre-declare

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._stats()
        if not stats.pools:
            return
        label = ["model", "band"]
        depth = GaugeMetricFamily(
            "llmgw_admission_queue_depth",
            "Requests waiting for admission, by model and band.",
            labels=label,
        )
        tenants = GaugeMetricFamily(
            "llmgw_admission_queue_tenants",
            "Distinct tenants with requests waiting for admission, by model and band.",
            labels=label,
        )
        inflight = GaugeMetricFamily(
            "llmgw_admission_inflight_requests",
            "Requests admitted and not finished yet, by model and band.",
            labels=label,
        )
        saturation = GaugeMetricFamily(
            "llmgw_admission_pool_saturation_ratio",
            "How full the model's usable replicas are, 0..1, as admission compares it "
            "with the band ceilings.",
            labels=["model"],
        )
        admitted = CounterMetricFamily(
            "llmgw_admission_admitted",
            "Requests admitted, by model, band and whether they waited in the queue first.",
            labels=["model", "band", "queued"],
        )
        abandoned = CounterMetricFamily(
            "llmgw_admission_abandoned",
            "Requests whose client went away while they waited for admission.",
            labels=label,
        )
        for pool in stats.pools:
            saturation.add_metric([pool.pool], self._saturation(pool.pool))
            for b in pool.bands:
                ident = [pool.pool, b.band]
                depth.add_metric(ident, b.depth)
                tenants.add_metric(ident, b.tenants)
                inflight.add_metric(ident, b.inflight)
                admitted.add_metric([*ident, "false"], b.admitted_immediate)
                admitted.add_metric([*ident, "true"], b.admitted_queued)
                abandoned.add_metric(ident, b.abandoned)
        yield from (depth, tenants, inflight, saturation, admitted, abandoned)
