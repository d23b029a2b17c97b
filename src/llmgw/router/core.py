"""`Router`: the data plane assembled from its parts.

The router owns the endpoint registry (the sink the control plane or static
configuration feeds), the scrape loop, scoring with session and prefix affinity,
breakers, the upstream client, usage accounting and metrics. Its client API is
an ASGI app (:attr:`Router.app`); :meth:`Router.run` drives its background work.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio
from prometheus_client import generate_latest

from llmgw.catalog import Catalog
from llmgw.config import Config, EndpointConfig
from llmgw.domain.catalog import ModelConfig
from llmgw.domain.endpoints import Endpoint
from llmgw.domain.engine_metrics import EngineSample
from llmgw.domain.usage import Caller, Usage, UsageRecord, UsageSink
from llmgw.domain.wakes import WakeSink
from llmgw.http.engine_client import EngineClient
from llmgw.router.access import AccessLog
from llmgw.router.admission import AdmissionController
from llmgw.router.affinity import PrefixIndex, Probe, SessionTable
from llmgw.router.app import ClientApp
from llmgw.router.auth import Authenticator
from llmgw.router.breaker import Outcome, Ticket
from llmgw.router.coldstart import ColdStarts
from llmgw.router.endpoints import EndpointRegistry, EndpointState
from llmgw.router.kv_events import Exact, KVEvents
from llmgw.router.metrics import KeyMetrics, RouterMetrics
from llmgw.router.proxy import AttemptFailed, Delivery, Upstream
from llmgw.router.responses import ResponseHomes
from llmgw.router.scheduling import Candidate, Decision, Saturation, Scheduler
from llmgw.router.scheduling import registry as plugins
from llmgw.router.scraper import Scraper
from llmgw.router.sleep import Sleeper
from llmgw.router.tracing import Tracing
from llmgw.router.usage import NO_USAGE

if TYPE_CHECKING:
    import httpx

NOBODY = Caller()


def catalog_for(config: Config) -> Catalog:
    """The configured models, plus a bare entry for each model only an endpoint names."""
    models = list(config.models)
    known = {m.name for m in models} | {a for m in models for a in m.aliases}
    for endpoint in config.endpoints:
        for name in endpoint.models:
            if name not in known:
                models.append(ModelConfig(name=name))
                known.add(name)
    return Catalog(tuple(models))


def endpoint_from_config(e: EndpointConfig) -> Endpoint:
    headers = [(k.lower().encode(), v.encode()) for k, v in e.headers.items()]
    if e.api_key is not None:
        headers.append((b"authorization", b"Bearer " + e.api_key.encode()))
    return Endpoint(e.id, e.url, e.models, e.pool, e.weight, e.priority, e.capacity, tuple(headers))


class Router:
    """The data plane: an OpenAI-compatible ASGI app in front of engine replicas."""

    def __init__(
        self,
        config: Config,
        *,
        catalog: Catalog | None = None,
        usage_sinks: Sequence[UsageSink] = (),
        rng: random.Random | None = None,
        upstream: httpx.AsyncClient | None = None,
        schedulers: Mapping[str, Scheduler] | None = None,
        auth: Authenticator | None = None,
        wakes: WakeSink | None = None,
        sleep_idle: bool = True,
        on_woke: Callable[[EndpointState], None] | None = None,
        rendezvous: bool = False,
        scrape: bool = True,
    ) -> None:
        """`schedulers` replaces the schedulers of routing profiles by name (a profile
        a model can select is one ``[router.profiles]`` names): compositions of
        filters, scorers and a picker (llmgw.router.scheduling; docs/scheduling.md).
        `auth` checks API keys (default: none exist unless `auth.required`); `wakes` is
        where a control plane hears of requests for an autoscaled model at zero, which
        then wait for its first replica (None: no control plane, they are refused at
        once). With `sleep_idle` False idle engines are not put to
        sleep here (a worker: the control process decides), only woken, and
        `on_woke` hears of each wake. With `rendezvous` a session or prompt this
        router has not routed goes to the home its key hashes to (routers that share
        no tables agree: scheduling.plugins.Rendezvous). With `scrape` False the
        engines' state comes from elsewhere (a worker: the control process scrapes and
        passes it on, :meth:`take_samples`)."""
        r = config.router
        self.config = config
        self.catalog = catalog or catalog_for(config)
        self.metrics = RouterMetrics(key_metrics=config.auth.key_metrics)
        self.endpoints = EndpointRegistry(
            failure_threshold=r.failure_threshold, cooldown=r.cooldown
        )
        self.metrics.watch_endpoints(self.endpoints, trio.current_time)
        for e in config.endpoints:
            self.endpoints.upsert(endpoint_from_config(e))
        # Every exchange with an engine, through one client (`upstream`: a caller's
        # httpx client to carry them all).
        self.engine_client = EngineClient(r.timeouts.dial, upstream)
        self.upstream = Upstream(
            r.timeouts,
            self.engine_client,
            max_response_bytes=r.max_response_bytes,
            max_event_bytes=r.max_event_bytes,
            max_buffered_bytes=r.max_buffered_bytes,
        )
        # Which replica holds each stored response (Responses API follow-ups).
        self.responses = ResponseHomes()
        # How full replicas are by their engines' account: admission and the views.
        self.saturation = Saturation(r.scoring, r.stale_after)
        self.schedulers = plugins.build(r.scoring, r.profiles, r.stale_after)
        if unknown := set(schedulers or ()) - set(self.schedulers):
            raise ValueError(
                f"schedulers for profiles the configuration does not name: "
                f"{', '.join(sorted(unknown))} (router.profiles has "
                f"{', '.join(sorted(self.schedulers))})"
            )
        self.schedulers.update(schedulers or {})
        a = r.affinity
        self.sessions = SessionTable(a.session_table_size, a.session_ttl)
        self.prefixes = (
            PrefixIndex(
                a.prefix_block_chars, a.prefix_max_blocks, a.prefix_table_size, a.prefix_ttl
            )
            if a.prefix_table_size
            else None
        )
        # The engines' own prefix-cache indexes, where endpoints publish KV-cache
        # events (None otherwise: nothing on the request path then).
        kv_addresses = {e.id: e.kv_events for e in config.endpoints if e.kv_events}
        self.kv_events = (
            KVEvents(
                kv_addresses,
                self.metrics.registry,
                client=self.engine_client,
                replays={e.id: e.kv_events_replay for e in config.endpoints if e.kv_events_replay},
                timeout=a.kv_events_timeout,
                max_blocks=a.kv_events_max_blocks,
            )
            if kv_addresses
            else None
        )
        self.session_header = r.session_header.lower().encode()
        self.band_header = r.admission.band_header.lower().encode()
        self.tenant_header = r.admission.tenant_header.lower().encode()
        self.usage_sinks = list(usage_sinks)
        # Fed like the other sinks, and directly with the refusals no sink records.
        self.access_log = AccessLog() if config.log.access else None
        if self.access_log is not None:
            self.usage_sinks.append(self.access_log)
        if config.auth.key_metrics:  # opt-in: series per key (cardinality)
            self.usage_sinks.append(KeyMetrics(self.metrics.registry))
        self.rng = rng or random.Random()
        self.rendezvous = rendezvous
        self.scrape = scrape
        # Keys come from the store, when there is one (llmgw.assembly).
        self.auth = auth or Authenticator(
            None, None, required=config.auth.required, cache_ttl=config.auth.cache_ttl
        )
        self.admission = AdmissionController(
            r.admission, self.pool_saturation, on_wait=self._observe_wait
        )
        self.scraper = Scraper(
            self.endpoints,
            self.metrics,
            client=self.engine_client,
            interval=r.scrape_interval,
            timeout=r.scrape_timeout,
            scoring=r.scoring,
            # Admission re-reads saturation from fresh numbers after every pass.
            on_pass=self.admission.poke_all,
        )
        # Idle engines with sleep_after go to sleep; an attempt wakes them.
        self.sleeper = Sleeper(
            self.endpoints, self.metrics, client=self.engine_client, on_woke=on_woke
        )
        self.sleep_idle = sleep_idle
        # Requests waiting for an autoscaled model's first replica.
        self.cold = ColdStarts(wakes)
        # Off (None) unless configured: then a request pays one `is None` check.
        self.tracing = Tracing(config.tracing) if config.tracing.endpoint else None
        self.metrics.watch_admission(self.admission.stats, self.pool_saturation)
        self.app = ClientApp(self)

    def set_catalog(self, catalog: Catalog) -> None:
        """Swap the models this router serves (a whole new value, never half a change)."""
        self.catalog = catalog

    # -- EndpointSink, forwarded so the control plane can hold the Router itself --

    def upsert(self, endpoint: Endpoint) -> None:
        self.endpoints.upsert(endpoint)
        self.scraper.poke()
        self.admission.poke_all()

    def take_samples(
        self,
        scraped: Iterable[tuple[str, EngineSample | None, float | None, str | None, int | None]],
    ) -> None:
        """The engines' state as another router scraped it: (endpoint id, sample, seconds
        since its last good scrape, the last error, llama.cpp's reported capacity)."""
        now = trio.current_time()
        for ident, sample, age, error, capacity in scraped:
            state = self.endpoints.get(ident)
            if state is None:
                continue
            if sample is not None and sample is not state.sample:
                state.sample = sample
                state.inflight_at_scrape = state.inflight  # this router's, at the sample
            state.last_scrape = None if age is None else now - age
            state.last_error = error
            if capacity is not None:
                state.reported_capacity = capacity
        self.admission.poke_all()

    def drain(self, endpoint_id: str) -> None:
        self.endpoints.drain(endpoint_id)
        self.admission.poke_all()

    def remove(self, endpoint_id: str) -> None:
        self.endpoints.remove(endpoint_id)
        self.admission.poke_all()
        self.sessions.forget(endpoint_id)
        if self.prefixes is not None:
            self.prefixes.table.forget(endpoint_id)

    # -- background work --------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Scrape endpoints until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                if self.scrape:
                    nursery.start_soon(self.scraper.run)
                await nursery.start(self.admission.run)
                await nursery.start(self.auth.limits.run)
                if self.sleep_idle:
                    await nursery.start(self.sleeper.run)
                if self.kv_events is not None:
                    await nursery.start(self.kv_events.run)
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                await self.engine_client.aclose()
                if self.tracing is not None:
                    await self.tracing.aclose()  # the last spans, bounded by its timeout

    # -- decisions (called by the client app) -----------------------------------

    def pool_saturation(self, pool: str) -> float:
        """How full a model's usable replicas are, 0..1 (see Saturation.pool)."""
        now = trio.current_time()
        return self.saturation.pool(
            [s.candidate(now) for s in self.endpoints.serving(pool) if s.breaker.allows(now)]
        )

    def _observe_wait(self, pool: str, band: str, outcome: str, seconds: float) -> None:
        self.metrics.queue_wait.labels(band, outcome).observe(seconds)

    def scheduler_for(self, model: ModelConfig) -> Scheduler:
        profile = model.routing_profile or self.config.router.default_profile
        return self.schedulers[profile]

    def choose(
        self,
        model: ModelConfig,
        usable: Iterable[EndpointState],
        session_key: str | None,
        prefix: tuple[int, ...] | None,
        now: float,
        prompt_tokens: float = 0.0,
        exact: Exact | None = None,
    ) -> Decision | None:
        """`prompt_tokens` is the request's estimated prompt size (its prefill work
        where nothing is cached); `exact`, what the engines' own indexes say the
        endpoints they cover hold of it (in place of the estimated table's guess)."""
        candidates = [s.candidate(now) for s in usable]
        sticky = self.sessions.lookup(session_key, now) if session_key else None
        matches: dict[str, float] = {}
        cached: dict[str, float] = {}
        if self.prefixes is not None and prefix:
            matches, cached = self.prefixes.lookup(prefix, now)
        if exact is not None:
            matches, cached = exact.overlay(matches, cached)
        home_key = None
        if self.rendezvous:
            home_key = hash(("session", session_key)) if session_key else (prefix or (None,))[0]
        decision = self.scheduler_for(model).pick(
            candidates,
            session_endpoint=sticky,
            prefix_matches=matches,
            rng=self.rng,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            home_key=home_key,
        )
        if decision is not None:
            # Remembered at once, not when the answer is complete: a burst of requests
            # from a new session or tenant must not scatter before the first finishes.
            if session_key:
                self.sessions.record(session_key, decision.endpoint_id, now)
            if prefix and self.prefixes is not None:
                probe = self.prefixes.probe(
                    prefix,
                    decision.endpoint_id,
                    now,
                    prompt_tokens,
                    cached.get(decision.endpoint_id, 0.0),
                )
                self.prefixes.table.record(prefix, decision.endpoint_id, now)
                decision = attrs.evolve(decision, probe=probe)
        return decision

    def record_attempt(
        self, state: EndpointState, ticket: Ticket, outcome: Outcome, failure: AttemptFailed | None
    ) -> None:
        now = trio.current_time()
        ident = state.endpoint.id
        if failure is not None:
            self.metrics.upstream_errors.labels(ident, failure.kind).inc()
            if failure.phase is not None:
                self.metrics.timeouts.labels(ident, failure.phase).inc()
        new_state = state.breaker.record(ticket, outcome, now)
        if new_state is not None:
            self.metrics.breaker_transitions.labels(ident, new_state.value).inc()

    def finish(
        self,
        model: ModelConfig,
        state: EndpointState,
        delivery: Delivery,
        *,
        session_key: str | None,
        latency: float,
        caller: Caller = NOBODY,
        status: int | None = None,
        retries: int = 0,
        request_id: str | None = None,
        path: str | None = None,
        queue_wait: float | None = None,
        probe: Probe | None = None,
        spills: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """Account a request that reached the client (after `retries` attempts on
        other endpoints). `probe` is what the prefix table said `state` held of the
        prompt when it was picked: weighed against the engine's cached tokens.
        `spills` are the request's routing decisions' (already counted in the metrics):
        they go on its usage record, with the prediction's outcome, for the dashboard."""
        now = trio.current_time()
        ident = state.endpoint.id
        m = self.metrics
        code = status if status is not None else delivery.status
        m.requests.labels(model.name, ident, str(code)).inc()
        m.duration.labels(model.name).observe(latency)
        if delivery.ttft is not None:
            m.ttft.labels(model.name).observe(delivery.ttft)
        if delivery.itl:
            m.itl.observe_all(model.name, delivery.itl)
        usage = delivery.usage
        outcome: str | None = None
        if usage is not None:
            m.prompt_tokens.labels(model.name, ident).inc(usage.prompt_tokens)
            m.completion_tokens.labels(model.name, ident).inc(usage.completion_tokens)
            if usage.cached_tokens:
                m.cached_tokens.labels(model.name, ident).inc(usage.cached_tokens)
            if usage.estimated:
                m.estimated_usage.labels(model.name).inc()
            elif (
                probe is not None
                and usage.cached_tokens is not None  # absent is not 0: nothing to learn
                and code == 200
                and delivery.failure is None
                and self.prefixes is not None
            ):
                # Blocks marked less than this request's own wait for its first token
                # before it was picked may have been in their first prefill then.
                settle = delivery.ttft if delivery.ttft is not None else latency
                outcome = self.prefixes.observe(
                    ident, probe, usage.cached_tokens, usage.prompt_tokens, settle
                )
                if outcome is not None:
                    m.prefix_predictions.labels(model.name, outcome).inc()
        # A retry may have served elsewhere than the pick: the session follows it.
        if (
            session_key
            and code < 400
            and delivery.failure is None
            and self.sessions.lookup(session_key, now) != ident
        ):
            self.sessions.record(session_key, ident, now)
        if caller.key_id is not None and usage is not None:
            self.auth.used(caller.key_id, usage.prompt_tokens + usage.completion_tokens)
        # Every request that reached an engine is recorded, failures without a usage
        # block too (with no tokens): usage reports and the dashboard count errors.
        self._record_usage(
            model.name,
            ident,
            code,
            usage if usage is not None else NO_USAGE,
            latency,
            caller,
            ttft=delivery.ttft,
            retries=retries,
            request_id=request_id,
            path=path,
            queue_wait=queue_wait,
            prediction=outcome,
            spills=spills,
        )

    def refused(
        self,
        model: str,
        status: int,
        latency: float,
        caller: Caller,
        *,
        retries: int = 0,
        request_id: str | None = None,
        path: str | None = None,
        queue_wait: float | None = None,
        error: str | None = None,
        spills: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """Account a request for `model` that llmgw answered with an error itself (no
        endpoint served it): usage records and the dashboard count it as a failure."""
        self._record_usage(
            model,
            None,
            status,
            NO_USAGE,
            latency,
            caller,
            retries=retries,
            request_id=request_id,
            path=path,
            queue_wait=queue_wait,
            error=error,
            spills=spills,
        )

    def _record_usage(
        self,
        model: str,
        endpoint: str | None,
        status: int,
        usage: Usage,
        latency: float,
        caller: Caller,
        *,
        ttft: float | None = None,
        retries: int,
        request_id: str | None,
        path: str | None,
        queue_wait: float | None,
        error: str | None = None,
        prediction: str | None = None,
        spills: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """One request's record, with who sent it, to every usage sink."""
        if self.usage_sinks:
            record = UsageRecord(
                model=model,
                endpoint=endpoint,
                status=status,
                usage=usage,
                latency=latency,
                ttft=ttft,
                key_id=caller.key_id,
                band=caller.band,
                tenant=caller.tenant,
                retries=retries,
                request_id=request_id,
                path=path,
                queue_wait=queue_wait,
                error=error,
                prediction=prediction,
                spills=spills,
            )
            for sink in self.usage_sinks:
                sink.record(record)

    # -- views (llmgw.admin.context.Traffic) ---------------------------------------

    def admission_view(self) -> dict[str, Any]:
        return self.admission.snapshot()

    def cold_waiting(self, model: str) -> int:
        """Requests waiting for a first replica of `model` (wake on request)."""
        return self.cold.waiting(model)

    async def metrics_text(self) -> bytes:
        """The Prometheus exposition of this router's registry."""
        return generate_latest(self.metrics.registry)

    def endpoint_views(self) -> list[dict[str, Any]]:
        """Every endpoint with its live numbers and scores, for the admin API."""
        now = trio.current_time()
        views = []
        for state in self.endpoints.all():
            candidate: Candidate = state.candidate(now)
            s = state.sample
            views.append(
                {
                    "id": state.endpoint.id,
                    "name": state.public,
                    "url": state.endpoint.url,
                    "models": list(state.endpoint.models),
                    "pool": state.endpoint.pool,
                    "weight": state.endpoint.weight,
                    "priority": state.endpoint.priority,
                    "capacity": state.capacity,
                    "capacity_source": state.capacity_source,
                    "draining": state.draining,
                    "asleep": state.asleep,
                    "engine": None if s is None else s.engine,
                    "waiting": None if s is None else s.waiting,
                    "running": None if s is None else s.running,
                    "kv_usage": None if s is None else s.kv_usage,
                    "prefix_hit_rate": None if s is None else s.prefix_hit_rate,
                    "inflight": state.inflight,
                    "scrape_age_seconds": state.age(now),
                    "stale": candidate.age is None
                    or candidate.age > self.config.router.stale_after,
                    "scrape_error": state.last_error,
                    "breaker": state.breaker.state(now).value,
                    "saturation": self.saturation.level(candidate),
                    "scores": {
                        name: sched.score(candidate) for name, sched in self.schedulers.items()
                    },
                }
            )
        return views
