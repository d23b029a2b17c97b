"""`Router`: the data plane assembled from its parts.

The router builds, once, its parts (the endpoint registry the control plane or static
configuration feeds, the scrape loop, breakers, the upstream client, metrics) and the
request pipeline over them (llmgw.router.pipeline: authenticate, admit, schedule,
attempt, account). Its client API is an ASGI app (:attr:`Router.app`); :meth:`Router.run`
drives its background work; the views are what the admin API shows of it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client import generate_latest

from llmgw.catalog.rules import Catalog
from llmgw.config import Config, EndpointConfig
from llmgw.domain.catalog import ModelConfig
from llmgw.domain.endpoints import Endpoint
from llmgw.domain.engine_metrics import EngineSample
from llmgw.domain.usage import UsageSink
from llmgw.domain.wakes import WakeSink
from llmgw.http.engine_client import EngineClient
from llmgw.router.access import AccessLog
from llmgw.router.admission import AdmissionController
from llmgw.router.affinity import PrefixIndex, SessionTable
from llmgw.router.app import ClientApp
from llmgw.router.auth import Authenticator
from llmgw.router.coldstart import ColdStarts
from llmgw.router.endpoints import EndpointRegistry, EndpointState
from llmgw.router.kv_events import KVEvents
from llmgw.router.metrics import KeyMetrics, RouterMetrics
from llmgw.router.pipeline import Pipeline
from llmgw.router.pipeline.account import Account
from llmgw.router.pipeline.admit import Admit
from llmgw.router.pipeline.attempt import Attempt
from llmgw.router.pipeline.authenticate import Authenticate
from llmgw.router.pipeline.schedule import Schedule
from llmgw.router.proxy import Upstream
from llmgw.router.readiness import Readiness
from llmgw.router.responses import ResponseHomes
from llmgw.router.scheduling import Candidate, Saturation, Scheduler
from llmgw.router.scheduling import registry as plugins
from llmgw.router.scheduling.hooks import hooks_of
from llmgw.router.scheduling.memory import PrefixMemory, SessionMemory
from llmgw.router.scraper import Scraper
from llmgw.router.sleep import Sleeper
from llmgw.router.stored import StoredResponses
from llmgw.router.tracing import Tracing

if TYPE_CHECKING:
    import httpx


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
        self.schedulers = _schedulers(config, schedulers or {})
        # The engines' own prefix-cache indexes, where endpoints publish KV-cache
        # events (None otherwise: nothing on the request path then).
        self.kv_events = _kv_events(config, self.metrics, self.engine_client)
        self.rng = rng or random.Random()
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
        self.readiness = Readiness(self.endpoints, self.cold, lambda: self.catalog)
        # Off (None) unless configured: then a request pays one `is None` check.
        self.tracing = Tracing(config.tracing) if config.tracing.endpoint else None
        self.metrics.watch_admission(self.admission.stats, self.pool_saturation)
        # The scheduling plugins' hooks: the router's memories, then the profiles'.
        self.hooks = hooks_of((*_memories(config, self.metrics), *_plugins(self.schedulers)))
        # Bodies past BIG_BODY are parsed in a worker thread, one at a time.
        self._big_parses = trio.CapacityLimiter(1)
        self.pipeline = self._pipeline(usage_sinks, rendezvous)
        self.app = self._client_app()

    def _client_app(self) -> ClientApp:
        r = self.config.router
        return ClientApp(
            self.pipeline,
            catalog=lambda: self.catalog,
            endpoints=self.endpoints,
            readiness=self.readiness,
            responses=self.responses,
            stored=StoredResponses(
                self.responses,
                self.endpoints,
                self.pipeline.authenticate,
                self.engine_client,
                self.upstream.budget,
                max_bytes=r.max_response_bytes,
                timeout=r.timeouts.total,
            ),
            tracing=self.tracing,
            big_parses=self._big_parses,
            max_body_bytes=r.max_body_bytes,
            session_header=r.session_header,
        )

    def _pipeline(self, usage_sinks: Sequence[UsageSink], rendezvous: bool) -> Pipeline:
        """The request pipeline's stages over this router's parts."""
        config, r = self.config, self.config.router
        access_log = AccessLog() if config.log.access else None
        sinks = [*usage_sinks, *([access_log] if access_log is not None else [])]
        if config.auth.key_metrics:  # opt-in: series per key (cardinality)
            sinks.append(KeyMetrics(self.metrics.registry))
        prefixes = next((h.index for h in self.hooks.prepare if isinstance(h, PrefixMemory)), None)
        return Pipeline(
            Authenticate(self.auth),
            Admit(r.admission, self.admission, self.cold, self.endpoints, self.metrics),
            Schedule(
                self.schedulers,
                r.default_profile,
                self.hooks,
                self.endpoints,
                self.metrics,
                prefixes=prefixes,
                kv_events=self.kv_events,
                big_parses=self._big_parses,
                rng=self.rng,
                rendezvous=rendezvous,
            ),
            Attempt(self.upstream, self.sleeper, self.metrics),
            Account(
                self.metrics,
                sinks,
                access_log=access_log,
                auth=self.auth,
                responses=self.responses,
                hooks=self.hooks,
            ),
            self.endpoints,
            self.metrics,
            retries=r.retries,
            cooldown=r.cooldown,
            inject_usage=r.inject_usage,
        )

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
        for hook in self.hooks.forget:
            hook.forget(endpoint_id)

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

    # -- views (llmgw.admin.context.Traffic) ---------------------------------------

    def admission_view(self) -> dict[str, Any]:
        """The admission queues, each pool with its model's state (a pool at zero is
        not full: it is waking, or waits for a request to wake it)."""
        view = self.admission.snapshot()
        for pool in view["pools"]:
            model = self.catalog.resolve(pool["pool"])
            pool["state"] = "unavailable" if model is None else self.readiness.model(model)
        return view

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


def _kv_events(config: Config, metrics: RouterMetrics, client: EngineClient) -> KVEvents | None:
    """The feeds of the endpoints that publish KV-cache events; None when none does."""
    a = config.router.affinity
    addresses = {e.id: e.kv_events for e in config.endpoints if e.kv_events}
    if not addresses:
        return None
    return KVEvents(
        addresses,
        metrics.registry,
        client=client,
        replays={e.id: e.kv_events_replay for e in config.endpoints if e.kv_events_replay},
        timeout=a.kv_events_timeout,
        max_blocks=a.kv_events_max_blocks,
    )


def _memories(config: Config, metrics: RouterMetrics) -> list[object]:
    """The router's memories of requests: sessions' replicas and, unless the table is
    sized 0, which replicas hold which prompt prefixes."""
    a = config.router.affinity
    found: list[object] = [SessionMemory(SessionTable(a.session_table_size, a.session_ttl))]
    if a.prefix_table_size:
        index = PrefixIndex(
            a.prefix_block_chars, a.prefix_max_blocks, a.prefix_table_size, a.prefix_ttl
        )
        found.append(PrefixMemory(index, metrics.prefix_predictions))
    return found


def _plugins(schedulers: Mapping[str, Scheduler]) -> list[object]:
    """Every plugin object of the schedulers (a profile's may have hooks)."""
    return [
        plugin
        for s in schedulers.values()
        for plugin in (*s.filters, *(scorer for scorer, _ in s.scorers), s.picker)
    ]


def _schedulers(config: Config, given: Mapping[str, Scheduler]) -> dict[str, Scheduler]:
    """A scheduler per routing profile: built from the configuration, or given."""
    r = config.router
    built = plugins.build(r.scoring, r.profiles, r.stale_after)
    if unknown := set(given) - set(built):
        raise ValueError(
            f"schedulers for profiles the configuration does not name: "
            f"{', '.join(sorted(unknown))} (router.profiles has {', '.join(sorted(built))})"
        )
    return built | dict(given)
