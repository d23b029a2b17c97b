"""Putting a gateway together: every part made once, each given its collaborators when
it is made, nothing assigned afterwards. :func:`llmgw.server.serve` runs the result.

The order has no cycle because what the two planes exchange is made before either:

1. the store, the listening sockets, the model registry (runtime models read back);
2. what both planes share and neither owns: the activity tracker (usage records in,
   idleness out) and the wakes (requests waiting for a model at zero in, taken by the
   controller);
3. the data plane: the :class:`~llmgw.router.core.Router`, or with workers the
   :class:`~llmgw.workers.pool.WorkerPool` in front of this process's router; it is
   what the controller publishes endpoints to, reads demand from and tells, after each
   pass, why a model cannot be placed; the endpoint sources over it (the
   configuration's, the store's runtime ones, the discovery file's: one set, applied);
4. with deployable models, the control plane: on a shared PostgreSQL store first the
   leadership, the shared endpoints (the controller's sink) and the shared demand,
   then the :class:`~llmgw.control.controller.Controller`;
5. the admin API and the dashboards, over all of the above.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs
import trio

from llmgw import extras, units
from llmgw.catalog.live import ModelRegistry
from llmgw.config import Config, ConfigError, ControlConfig
from llmgw.control.activity import ActivityTracker
from llmgw.control.controller import Controller
from llmgw.control.fleet_metrics import register_fleet_metrics
from llmgw.control.instances import SharedDemand, SharedEndpoints
from llmgw.control.leadership import Leadership, wall_clock
from llmgw.control.scaler import router_demand
from llmgw.domain.usage import UsageSink
from llmgw.domain.wakes import Wakes
from llmgw.endpoint_sources import EndpointSources
from llmgw.http.asgi import App, split, under
from llmgw.router.auth import Authenticator
from llmgw.router.core import Router, catalog_for
from llmgw.router.limits import SharedLimits
from llmgw.router.scheduling import Scheduler
from llmgw.router.scheduling import registry as plugins
from llmgw.store import open_store
from llmgw.store.base import Store
from llmgw.store.usage import UsageBatcher
from llmgw.transport.base import AgentListener
from llmgw.workers.pool import WorkerPool

if TYPE_CHECKING:
    from llmgw.admin.api import AdminApp
    from llmgw.dashboard import TrafficRing
    from llmgw.discovery import FileDiscovery

__all__ = [
    "ControlPlane",
    "Gateway",
    "Shared",
    "Timings",
    "Workers",
    "assemble",
    "control_timings",
    "shared_limits",
]

log = logging.getLogger("llmgw.server")

#: How often agents heartbeat unless `control.unreachable_after` needs it more often.
HEARTBEAT_INTERVAL = 5.0


@attrs.frozen
class Timings:
    """The controller's heartbeat interval (what agents are told) and its settle
    period after a start (seconds)."""

    heartbeat: float
    settle: float


def control_timings(control: ControlConfig) -> Timings:
    """The controller's timings for `control`.

    Agents heartbeat at least three times per `unreachable_after` (a fixed 5 s made
    every node flap to unreachable with `unreachable_after = "2s"`, and go lost before
    its next heartbeat with `lost_after = "5s"`). After a start the controller waits
    one `unreachable_after` for agents that still run replicas to reconnect (a node
    not heard from by then would be unreachable anyway), at most 10 s as before."""
    heartbeat = min(HEARTBEAT_INTERVAL, control.unreachable_after / 3)
    return Timings(heartbeat, min(2 * HEARTBEAT_INTERVAL, float(control.unreachable_after)))


@attrs.frozen
class Workers:
    """The client API served by `count` worker processes (llmgw.workers) on the
    `reserved` client sockets (bound, not listening: llmgw.workers.sockets.reserve);
    their logs as the control process's."""

    count: int
    reserved: Sequence[socket.socket]
    log_level: str = "info"
    log_format: str = "text"


@attrs.frozen
class Shared:
    """Instances on one PostgreSQL store: they lead the control plane in turn, and the
    data plane routes to what the leader publishes (llmgw.control.leadership,
    llmgw.control.instances)."""

    leadership: Leadership
    endpoints: SharedEndpoints
    demand: SharedDemand


@attrs.frozen
class ControlPlane:
    controller: Controller
    agents: AgentListener  # where agents connect
    shared: Shared | None


@attrs.frozen
class Gateway:
    """Every part of one llmgw server, made and connected by :func:`assemble`."""

    config: Config
    store: Store | None
    models: ModelRegistry
    # Where the endpoints come from: the configuration, the admin API, the discovery file.
    endpoints: EndpointSources
    discovery: FileDiscovery | None
    # With workers this process's router serves no client: it scrapes the engines for
    # the views and puts idle ones to sleep, and `pool` is the data plane.
    router: Router
    pool: WorkerPool | None
    workers: Workers | None
    control: ControlPlane | None
    batcher: UsageBatcher | None  # usage records to the store
    traffic: TrafficRing  # the dashboard's last minutes of traffic
    admin: AdminApp
    admin_app: App  # the admin listener's: API, dashboard, /metrics
    client_app: App  # the client port's: the router, and /admin behind a login
    client_sockets: Sequence[trio.SocketListener]  # none with workers
    admin_sockets: Sequence[trio.SocketListener]

    @property
    def controller(self) -> Controller | None:
        return self.control.controller if self.control is not None else None


def shared_limits(config: Config, workers: Workers | None) -> bool:
    """Whether keys' rate limits are counted in the store (llmgw.router.limits): when
    other processes serve the same keys (workers; instances on one PostgreSQL), not
    when this process is alone on its SQLite file (counted here: exact, no I/O)."""
    return workers is not None or _postgres(config)


def _postgres(config: Config) -> bool:
    return config.store.url.startswith(("postgres://", "postgresql://"))


@contextlib.asynccontextmanager
async def assemble(
    config: Config,
    *,
    store: Store | None = None,
    client_listeners: Sequence[trio.SocketListener] | None = None,
    admin_listeners: Sequence[trio.SocketListener] | None = None,
    workers: Workers | None = None,
    agents: AgentListener | None = None,
    timings: Timings | None = None,
    schedulers: Mapping[str, Scheduler] | None = None,
    usage_sinks: Sequence[UsageSink] = (),
) -> AsyncIterator[Gateway]:
    """The gateway `config` describes, its parts made in the module docstring's order.

    The client API listens on `listen` and the admin listener on `admin_listen` (port
    0: one the kernel picks), or on `client_listeners` / `admin_listeners`, sockets
    the caller bound already; either way they are closed on the way out, as is the
    store `store.url` names (a `store` given stays the caller's). With `workers` the
    client API is served by worker processes on their reserved sockets. With
    deployable models, or `agents` given (an AgentListener: the in-memory stub, say),
    the control plane runs, accepting agents there (default: gRPC on `agent_listen`),
    with `timings` (default: :func:`control_timings`). `schedulers` replaces routing
    profiles' schedulers in this process's router (llmgw.router.core.Router), and
    every request's usage record goes to `usage_sinks` too (workers' included)."""
    if workers is not None and client_listeners is not None:
        raise ValueError("workers bind the client port themselves: no client_listeners")
    # Every gateway has an admin listener (admin API, dashboard): a Router alone does
    # not need one (docs/library.md).
    extras.require("llmgw.assemble (the admin API and dashboard)", "server")
    # Before anything is opened: every plugin a routing profile names resolves (in
    # the worker processes too, when there are any).
    if wrong := plugins.problems(config.router.profiles, portable=workers is not None):
        raise ConfigError(wrong)
    async with contextlib.AsyncExitStack() as owned:
        if store is None and config.store.url:
            store = await open_store(config.store.url, clock=wall_clock)
            owned.push_async_callback(_close_shielded, store)
        client = [] if workers else await _listeners(config.listen, client_listeners, owned)
        admin = await _listeners(config.admin_listen, admin_listeners, owned)
        yield await _parts(
            config, store, client, admin, workers, agents, timings, schedulers, usage_sinks
        )


async def _parts(
    config: Config,
    store: Store | None,
    client: Sequence[trio.SocketListener],
    admin_sockets: Sequence[trio.SocketListener],
    workers: Workers | None,
    agents: AgentListener | None,
    timings: Timings | None,
    schedulers: Mapping[str, Scheduler] | None,
    usage_sinks: Sequence[UsageSink],
) -> Gateway:
    # The `server` extra's (quart, jinja2), checked by assemble.
    from llmgw.dashboard import TrafficRing

    configured = {m.name for m in config.models}
    models = ModelRegistry(
        config.models,
        config.router.profiles,
        store=store,
        extra=[m for m in catalog_for(config).models if m.name not in configured],
    )
    await models.load()  # runtime models from the store; invalid ones are skipped, logged
    auth, batcher = _keys(config, store, workers)
    # The dashboard (DESIGN §8) sees the last 15 minutes of traffic.
    traffic = TrafficRing()
    controlled = agents is not None or any(m.profiles for m in models.catalog.models)
    activity = ActivityTracker() if controlled else None
    wakes = Wakes() if controlled else None
    sinks: list[UsageSink] = [
        *([batcher] if batcher is not None else []),
        *([activity] if activity is not None else []),
        traffic,
        *usage_sinks,
    ]
    router = Router(
        config,
        catalog=models.catalog,
        auth=auth,
        usage_sinks=sinks if workers is None else (),
        wakes=wakes if workers is None else None,
        schedulers=schedulers,
    )
    pool = (
        WorkerPool(
            config,
            workers.count,
            router,
            sinks=sinks,
            wakes=wakes,
            log_level=workers.log_level,
            log_format=workers.log_format,
        )
        if workers is not None
        else None
    )
    models.subscribe((pool or router).set_catalog)
    endpoints = EndpointSources(
        config.endpoints,
        pool or router,
        router.endpoints,
        models=models,
        store=store,
        drain_timeout=config.router.drain_timeout,
    )
    await endpoints.load()  # runtime endpoints from the store; invalid ones skipped, logged
    discovery = _discovery(config, endpoints)
    control = None
    if activity is not None and wakes is not None:
        control = _control_plane(
            config, store, models, router, pool, activity, wakes, agents, timings, admin_sockets
        )
        models.subscribe(control.controller.set_catalog)
    admin, admin_app, client_app = await _apps(
        config, store, models, endpoints, router, pool, control, traffic, admin_sockets
    )
    return Gateway(
        config=config,
        store=store,
        models=models,
        endpoints=endpoints,
        discovery=discovery,
        router=router,
        pool=pool,
        workers=workers,
        control=control,
        batcher=batcher,
        traffic=traffic,
        admin=admin,
        admin_app=admin_app,
        client_app=client_app,
        client_sockets=client,
        admin_sockets=admin_sockets,
    )


def _discovery(config: Config, endpoints: EndpointSources) -> FileDiscovery | None:
    """The discovery file's watcher, its first look taken (the set is there before the
    first request; a file missing or invalid now is logged, and looked at again)."""
    from llmgw.discovery import FileDiscovery

    d = config.discovery
    if not d.file:
        return None
    discovery = FileDiscovery(d.file, d.interval, endpoints)
    discovery.poll()
    return discovery


def _keys(
    config: Config, store: Store | None, workers: Workers | None
) -> tuple[Authenticator | None, UsageBatcher | None]:
    """API keys and the usage batcher, where there is a store to keep them."""
    if store is None:
        return None, None
    auth = Authenticator(
        store.lookup_key,
        store.count_keys,
        required=config.auth.required,
        cache_ttl=config.auth.cache_ttl,
        limits=SharedLimits(store) if shared_limits(config, workers) else None,
    )
    return auth, UsageBatcher(store)


async def _apps(
    config: Config,
    store: Store | None,
    models: ModelRegistry,
    endpoints: EndpointSources,
    router: Router,
    pool: WorkerPool | None,
    control: ControlPlane | None,
    traffic: TrafficRing,
    admin_sockets: Sequence[trio.SocketListener],
) -> tuple[AdminApp, App, App]:
    """The admin API, and the ASGI apps of the admin listeners and the client port."""
    # The `server` extra's (quart, jinja2), checked by assemble.
    from llmgw.admin.api import AdminApp
    from llmgw.admin.leader import LeaderTls, ToLeader
    from llmgw.admin.web import asgi, build_app, mount
    from llmgw.dashboard import DashboardApp

    admin_bound = _addresses(admin_sockets)
    loopback = _all_loopback(admin_bound)
    admin = AdminApp(
        router,
        controller=control.controller if control is not None else None,
        store=store,
        models=models,
        endpoint_sources=endpoints,
        # Off loopback, the admin API wants an admin key.
        admin_auth=not loopback,
        # The whole body, not each chunk: the login is on the public client port.
        body_timeout=config.router.timeouts.client_body,
        hosts=await admin_hosts(config, admin_bound, loopback),
        traffic=pool,
    )
    # The dashboard (DESIGN §8): on the admin listener beside the API, and on the client
    # port under /admin behind a login.
    admin_app = asgi(
        build_app(
            admin,
            dashboard=DashboardApp(
                admin,
                traffic=traffic,
                login_required=admin.admin_auth,
                session_ttl=config.auth.session_ttl,
            ),
        )
    )
    if control is not None and control.shared is not None:
        # A follower's fleet is the leader's, over https when admin listeners speak it.
        files = config.admin_tls
        admin_app = ToLeader(
            admin_app,
            control.shared.leadership,
            tls=None if files is None else LeaderTls(files.cert, files.key, files.client_ca),
        )
    client_dashboard = DashboardApp(
        admin,
        prefix="/admin",
        traffic=traffic,
        login_required=True,
        session_ttl=config.auth.session_ttl,
    )
    client_app = split(
        under("/admin"),
        mount(build_app(admin, api=False, dashboard=client_dashboard), "/admin"),
        router.app,
    )
    return admin, admin_app, client_app


def _control_plane(
    config: Config,
    store: Store | None,
    models: ModelRegistry,
    router: Router,
    pool: WorkerPool | None,
    activity: ActivityTracker,
    wakes: Wakes,
    agents: AgentListener | None,
    timings: Timings | None,
    admin_sockets: Sequence[trio.SocketListener],
) -> ControlPlane:
    """The controller over the data plane made before it (module docstring, step 4)."""
    timings = timings or control_timings(config.control)
    if agents is None:
        from llmgw.transport.grpc import GrpcListener

        agents = GrpcListener(config.agent_listen, tls=config.agent_tls)
        if (warning := config.insecure_agents_warning()) is not None:
            log.warning("%s", warning)
    local = pool.demand if pool is not None else router_demand(router)
    sink = pool or router
    shared = None
    if store is not None and _postgres(config):
        listener = agents
        admin_address = _advertised(_addresses(admin_sockets)[0])

        def addresses() -> tuple[str, str]:
            # A network listener knows its bound addresses once it serves; the stub
            # has none.
            bound = getattr(listener, "addresses", None) or [config.agent_listen]
            return config.control.advertise or _advertised(bound[0]), admin_address

        leadership = Leadership(
            store,
            instance=f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}",
            addresses=addresses,
            ttl=config.control.lease,
        )
        shared = Shared(
            leadership,
            SharedEndpoints(
                store,
                sink,
                leadership,
                knows=lambda name: models.catalog.resolve(name) is not None,
                refresh_models=models.refresh,
            ),
            SharedDemand(
                store,
                leadership.instance,
                local,
                lambda name: activity.get(name).last_request,
                lambda: models.catalog,
            ),
        )
    controller = Controller(
        config.control,
        models.catalog,
        shared.endpoints if shared is not None else sink,
        heartbeat_interval=timings.heartbeat,
        settle=timings.settle,
        store=store,
        demand=shared.demand.feed if shared is not None else local,
        last_request=shared.demand.last_request if shared is not None else None,
        activity=activity,
        # Requests for an autoscaled model with no replica wait for this controller.
        wakes=wakes,
        cold=pool or router.cold,
        leadership=shared.leadership if shared is not None else None,
    )
    register_fleet_metrics(router.metrics.registry, controller, controller.clock)
    return ControlPlane(controller, agents, shared)


async def admin_hosts(config: Config, bound: Sequence[str], loopback: bool) -> frozenset[str]:
    """The Host names the admin listener answers to (llmgw.admin.hosts says which and
    why). Off loopback too: there the API wants an admin key, but /metrics, the health
    checks and the login page do not, and a rebound page could still read them."""
    from llmgw.admin.hosts import allowed_hosts, machine_names, wildcard  # llmgw[server]

    machine: set[str] = set()
    if not loopback:
        machine = await machine_names(any(wildcard(a) for a in bound))
    return allowed_hosts(config.admin_hosts, config.admin_listen, bound, machine)


async def _listeners(
    address: str,
    given: Sequence[trio.SocketListener] | None,
    owned: contextlib.AsyncExitStack,
) -> list[trio.SocketListener]:
    """`given`, or new sockets listening on `address`; either way closed when `owned`
    closes."""
    if given is not None:
        sockets = list(given)
    else:
        parsed = units.parse_address(address)
        sockets = await trio.open_tcp_listeners(parsed.port, host=parsed.bind_host)
    for listener in sockets:
        owned.callback(listener.socket.close)
    return sockets


async def _close_shielded(store: Store) -> None:
    with trio.CancelScope(shield=True):
        await store.aclose()


def _addresses(listeners: Sequence[trio.SocketListener]) -> list[str]:
    return [str(units.Address(*listener.socket.getsockname()[:2])) for listener in listeners]


def _advertised(address: str) -> str:
    """`address` as other hosts reach it: the host name for every interface."""
    parsed = units.parse_address(address)
    if parsed.host in ("", "0.0.0.0", "::"):
        return str(units.Address(socket.getfqdn(), parsed.port))
    return address


def _all_loopback(addresses: Sequence[str]) -> bool:
    return all(ipaddress.ip_address(units.parse_address(a).host).is_loopback for a in addresses)
