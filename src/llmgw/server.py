"""Running llmgw-server: the listeners in one trio process, signals, graceful drain."""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import shutil
import signal
import socket
import ssl
import tempfile
from collections.abc import Callable, Sequence
from functools import partial

import attrs
import trio

from llmgw import units
from llmgw.admin.api import AdminApp
from llmgw.admin.hosts import allowed_hosts, machine_names, wildcard
from llmgw.admin.leader import LeaderTls, ToLeader
from llmgw.admin.web import asgi, build_app, mount
from llmgw.config import Config, ControlConfig
from llmgw.control.controller import Controller
from llmgw.control.fleet_metrics import register_fleet_metrics
from llmgw.control.instances import SharedDemand, SharedEndpoints
from llmgw.control.leadership import Leadership, wall_clock
from llmgw.control.scaler import router_demand
from llmgw.dashboard import DashboardApp, TrafficRing
from llmgw.domain.endpoints import Endpoint, EndpointSink
from llmgw.domain.usage import UsageSink
from llmgw.http.asgi import split, under
from llmgw.http.hyper import ReloadableTls, TlsFiles, serve_hypercorn
from llmgw.http.server import serve_listeners
from llmgw.models import ModelRegistry
from llmgw.router.auth import Authenticator
from llmgw.router.core import Router, catalog_for
from llmgw.router.limits import SharedLimits
from llmgw.router.listener import client_listener_config, hypercorn_listener_config
from llmgw.store import open_store
from llmgw.store.base import Store, StoreError
from llmgw.store.usage import UsageBatcher
from llmgw.transport.base import AgentListener
from llmgw.workers.pool import WorkerPool, trust_forwarded_client

log = logging.getLogger("llmgw.server")
# httpx logs every request at INFO: far too much on a proxy's hot path.
logging.getLogger("httpx").setLevel(logging.WARNING)


#: How often agents heartbeat unless `control.unreachable_after` needs it more often.
HEARTBEAT_INTERVAL = 5.0


def control_timings(control: ControlConfig) -> tuple[float, float]:
    """The controller's (heartbeat interval, settle) for `control`.

    Agents heartbeat at least three times per `unreachable_after` (a fixed 5 s made
    every node flap to unreachable with `unreachable_after = "2s"`, and go lost before
    its next heartbeat with `lost_after = "5s"`). After a start the controller waits
    one `unreachable_after` for agents that still run replicas to reconnect (a node
    not heard from by then would be unreachable anyway), at most 10 s as before."""
    heartbeat = min(HEARTBEAT_INTERVAL, control.unreachable_after / 3)
    return heartbeat, min(2 * HEARTBEAT_INTERVAL, float(control.unreachable_after))


#: What :func:`serve` hands `on_listening` once every listener is bound: for each
#: listener, by its configuration key (``listen``, ``admin_listen``, and
#: ``agent_listen`` when agents connect over gRPC), the addresses it is bound to as
#: ``HOST:PORT`` (``[HOST]:PORT`` for IPv6), with the port the kernel picked for port 0.
Listening = dict[str, list[str]]


@attrs.frozen
class Workers:
    """The client API served by `count` worker processes (llmgw.workers) on the
    `reserved` client sockets (bound, not listening: llmgw.workers.sockets.reserve);
    their logs as the control process's."""

    count: int
    reserved: Sequence[socket.socket]
    log_level: str = "info"
    log_format: str = "text"


async def serve(
    config: Config,
    *,
    router: Router | None = None,
    controller: Controller | None = None,
    listener: AgentListener | None = None,
    store: Store | None = None,
    client_listeners: Sequence[trio.SocketListener] | None = None,
    admin_listeners: Sequence[trio.SocketListener] | None = None,
    workers: Workers | None = None,
    on_listening: Callable[[Listening], None] | None = None,
    shutdown: trio.Event | None = None,
    handle_signals: bool = True,
    task_status: trio.TaskStatus[Router] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until SIGINT/SIGTERM (or `shutdown`); in-flight streams get
    `router.drain_timeout` to finish.

    The client API listens on `listen` and the admin listener on `admin_listen` (port 0:
    one the kernel picks), or on `client_listeners` / `admin_listeners`, sockets the
    caller bound already (say on port 0, to know the port before serving without a
    race); either way they are closed when this returns. Once every listener is bound,
    `on_listening` gets their addresses (:data:`Listening`), then `task_status` the
    router. With deployable models (or a `controller` given) the control plane runs
    too, accepting agents on `listener` (default: gRPC on `agent_listen`). With
    `store.url` (or a `store` given) API keys, usage records and runtime models
    persist there. With `workers` the client API is served by worker processes
    instead, and this process runs the rest (llmgw.workers)."""
    if workers is not None and client_listeners is not None:
        raise ValueError("workers bind the client port themselves: no client_listeners")
    owned = store is None and bool(config.store.url)
    if owned:
        store = await open_store(config.store.url, clock=wall_clock)
    try:
        bound: list[trio.SocketListener] = []
        try:
            client = [] if workers else await _listeners(config.listen, client_listeners, bound)
            admin = await _listeners(config.admin_listen, admin_listeners, bound)
            await _serve(
                config,
                router,
                controller,
                listener,
                store,
                (client, admin),
                workers,
                on_listening,
                shutdown,
                handle_signals,
                task_status,
            )
        finally:
            for sock in bound:
                sock.socket.close()
    finally:
        if owned and store is not None:
            with trio.CancelScope(shield=True):
                await store.aclose()


async def _listeners(
    address: str,
    given: Sequence[trio.SocketListener] | None,
    bound: list[trio.SocketListener],
) -> list[trio.SocketListener]:
    """`given`, or new sockets listening on `address`; either way added to `bound` (to
    be closed by the caller)."""
    if given is not None:
        sockets = list(given)
    else:
        parsed = units.parse_address(address)
        sockets = await trio.open_tcp_listeners(parsed.port, host=parsed.bind_host)
    bound.extend(sockets)
    return sockets


def _addresses(listeners: Sequence[trio.SocketListener]) -> list[str]:
    return [str(units.Address(*listener.socket.getsockname()[:2])) for listener in listeners]


async def admin_hosts(config: Config, bound: Sequence[str], loopback: bool) -> frozenset[str]:
    """The Host names the admin listener answers to (llmgw.admin.hosts says which and
    why). Off loopback too: there the API wants an admin key, but /metrics, the health
    checks and the login page do not, and a rebound page could still read them."""
    machine: set[str] = set()
    if not loopback:
        machine = await machine_names(any(wildcard(a) for a in bound))
    return allowed_hosts(config.admin_hosts, config.admin_listen, bound, machine)


async def _refresh_models(registry: ModelRegistry) -> None:
    """Runtime models changed through another instance: read every MODELS_EVERY."""
    while True:
        await trio.sleep(MODELS_EVERY)
        try:
            await registry.refresh()
        except StoreError as exc:
            log.warning("runtime models not read again: %s", exc)


#: Seconds between reads of the runtime models when instances share a store.
MODELS_EVERY = 2.0


class _Later:
    """An endpoint sink named after it is needed: the control plane is made before the
    router it publishes to, which takes it at construction (its cold-start fleet, and
    a usage sink), and this is bound to that router or the worker pool before the
    controller runs."""

    def __init__(self) -> None:
        self.target: EndpointSink | None = None

    def _sink(self) -> EndpointSink:
        assert self.target is not None, "bound before the controller runs"
        return self.target

    def upsert(self, endpoint: Endpoint) -> None:
        self._sink().upsert(endpoint)

    def drain(self, endpoint_id: str) -> None:
        self._sink().drain(endpoint_id)

    def remove(self, endpoint_id: str) -> None:
        self._sink().remove(endpoint_id)


def _postgres(config: Config) -> bool:
    return config.store.url.startswith(("postgres://", "postgresql://"))


def _advertised(address: str) -> str:
    """`address` as other hosts reach it: the host name for every interface."""
    parsed = units.parse_address(address)
    if parsed.host in ("", "0.0.0.0", "::"):
        return str(units.Address(socket.getfqdn(), parsed.port))
    return address


def shared_limits(config: Config, workers: Workers | None) -> bool:
    """Whether keys' rate limits are counted in the store (llmgw.router.limits): when
    other processes serve the same keys (workers; instances on one PostgreSQL), not
    when this process is alone on its SQLite file (counted here: exact, no I/O)."""
    return workers is not None or _postgres(config)


def _all_loopback(addresses: Sequence[str]) -> bool:
    return all(ipaddress.ip_address(units.parse_address(a).host).is_loopback for a in addresses)


async def _serve(
    config: Config,
    router: Router | None,
    controller: Controller | None,
    listener: AgentListener | None,
    store: Store | None,
    sockets: tuple[list[trio.SocketListener], list[trio.SocketListener]],
    workers: Workers | None,
    on_listening: Callable[[Listening], None] | None,
    shutdown: trio.Event | None,
    handle_signals: bool,
    task_status: trio.TaskStatus[Router],
) -> None:
    client_sockets, admin_sockets = sockets
    listening: Listening = {
        "listen": _addresses(client_sockets),
        "admin_listen": _addresses(admin_sockets),
    }
    stop = shutdown if shutdown is not None else trio.Event()
    configured = {m.name for m in config.models}
    registry = ModelRegistry(
        config.models,
        config.router.profiles,
        store=store,
        extra=[
            m
            for m in (router.catalog if router is not None else catalog_for(config)).models
            if m.name not in configured
        ],
    )
    await registry.load()  # runtime models from the store; invalid ones are skipped, logged
    auth = None
    batcher = None
    if store is not None:
        auth = Authenticator(
            store.lookup_key,
            store.count_keys,
            required=config.auth.required,
            cache_ttl=config.auth.cache_ttl,
            limits=SharedLimits(store) if shared_limits(config, workers) else None,
        )
        batcher = UsageBatcher(store)
    # The dashboard (DESIGN §8) sees the last 15 minutes of traffic.
    traffic = TrafficRing()
    # Instances on one PostgreSQL store lead the control plane in turn, and the data
    # plane routes to what the leader publishes (llmgw.control.leadership, .instances).
    leadership: Leadership | None = None
    endpoints: SharedEndpoints | None = None
    # What this server's controller publishes to: the router, or the worker pool; both
    # are made after it (the router takes it at construction), and named here then.
    publish = _Later()
    own_controller = controller is None and any(m.profiles for m in registry.catalog.models)
    if own_controller:
        heartbeat, settle = control_timings(config.control)
        if store is not None and _postgres(config):
            leadership = Leadership(
                store,
                instance=f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}",
                agent_address="",  # once the agent listener is bound (below)
                admin_address="",
                ttl=config.control.lease,
            )
            endpoints = SharedEndpoints(
                store,
                publish,
                leadership,
                lambda: made.settled,
                knows=lambda name: registry.catalog.resolve(name) is not None,
                refresh_models=registry.refresh,
            )
        controller = made = Controller(
            config.control,
            registry.catalog,
            endpoints or publish,
            heartbeat_interval=heartbeat,
            settle=settle,
            store=store,
            leadership=leadership,
        )
    # What every request's usage record goes to besides the router's own (access log,
    # per-key metrics): from this router, or from the workers through the pool.
    sinks: list[UsageSink] = [
        *([batcher] if batcher is not None else []),
        *([controller.activity] if controller is not None else []),
        traffic,
    ]
    if router is None:
        # With workers this process's router serves no client: it scrapes the engines
        # for the views and puts idle ones to sleep; the pool takes the usage records
        # and stands in for it as the control plane's fleet.
        router = Router(
            config,
            catalog=registry.catalog,
            auth=auth,
            usage_sinks=sinks if workers is None else (),
            fleet=controller if workers is None else None,
        )
    else:
        # A caller's own router (llmgw.testing's) was made before the store was open.
        if auth is not None:
            router.auth = auth
        if workers is None:
            router.usage_sinks.extend(sinks)
            if controller is not None:
                router.cold.fleet = controller
    pool = (
        WorkerPool(
            config,
            workers.count,
            router,
            sinks=sinks,
            fleet=controller,
            log_level=workers.log_level,
            log_format=workers.log_format,
        )
        if workers is not None
        else None
    )
    sink: Router | WorkerPool = pool or router
    publish.target = sink
    sink.set_catalog(registry.catalog)
    registry.listeners.append(sink.set_catalog)
    shared: tuple[Leadership, SharedEndpoints, SharedDemand] | None = None
    if leadership is not None and endpoints is not None:
        assert store is not None and controller is not None
        local = pool.demand if pool is not None else router_demand(router)
        demand = SharedDemand(
            store,
            leadership.instance,
            local,
            lambda name: made.activity.get(name).last_request,
            lambda: registry.catalog,
        )
        controller.demand = demand.feed
        controller.last_request = demand.last_request
        shared = (leadership, endpoints, demand)
    if controller is not None:
        controller.set_catalog(registry.catalog)
        registry.listeners.append(controller.set_catalog)
        if controller.demand is None:  # autoscaled models follow this router's demand
            controller.demand = pool.demand if pool is not None else router_demand(router)
        # Requests for an autoscaled model with no replica wait for this controller.
        if pool is not None:
            if not own_controller:
                controller.sink = pool  # a caller's controller was given the router
            controller.on_pass.append(pool.after_pass)
        else:
            controller.on_pass.append(router.cold.check)
        register_fleet_metrics(router.metrics.registry, controller, controller.clock)
        if listener is None:
            from llmgw.transport.grpc import GrpcListener

            listener = GrpcListener(config.agent_listen, tls=config.agent_tls)
            if (warning := config.insecure_agents_warning()) is not None:
                log.warning("%s", warning)
    admin_bound = listening["admin_listen"]
    loopback = _all_loopback(admin_bound)
    admin = AdminApp(
        router,
        controller=controller,
        store=store,
        models=registry,
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
    if shared is not None:
        # A follower's fleet is the leader's, over https when admin listeners speak it.
        files = config.admin_tls
        admin_app = ToLeader(
            admin_app,
            shared[0],
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

    async def trigger() -> None:
        await stop.wait()

    async with trio.open_nursery() as background:
        if handle_signals:
            background.start_soon(_watch_signals, stop)
        await background.start(router.run)
        await background.start(traffic.run, (pool or router).admission_view)
        if batcher is not None:
            await background.start(batcher.run)
        if controller is not None and listener is not None:
            await background.start(controller.run, listener)
            # A network listener (gRPC) knows its bound addresses; the stub has none.
            agent_addresses = getattr(listener, "addresses", None)
            if agent_addresses is not None:
                listening["agent_listen"] = list(agent_addresses)
                log.info("control plane: listening for agents on %s", ", ".join(agent_addresses))
            if shared is not None:
                leadership, endpoints, demand = shared
                leadership.agent_address = config.control.advertise or _advertised(
                    listening.get("agent_listen", [config.agent_listen])[0]
                )
                leadership.admin_address = _advertised(listening["admin_listen"][0])
                await background.start(leadership.run)
                await background.start(endpoints.run)
                await background.start(demand.run)
                background.start_soon(_refresh_models, registry)
        # The listeners return once `stop` is set and their streams have drained
        # (`router.drain_timeout`); then the background work is cancelled (the
        # usage batcher flushes what it holds on the way out).
        async with trio.open_nursery() as listeners:
            tls = {
                name: ReloadableTls(TlsFiles(files.cert, files.key, files.client_ca))
                for name, files in (("client", config.listen_tls), ("admin", config.admin_tls))
                if files is not None
            }
            if handle_signals:
                # Even with nothing to reload: SIGHUP's default action would end the
                # process, and service managers send it to reload (systemd's ExecReload
                # in deploy/systemd).
                background.start_soon(_reload_on_sighup, tls, pool)
            served = [(admin_app, admin_sockets, "admin")]
            if pool is not None and workers is not None:
                # The workers serve the client port; its /admin pages come here over a
                # private unix socket (llmgw.http.forward).
                private = background_dir(background)
                uds = await _unix_listener(os.path.join(private, "admin.sock"))
                await listeners.start(
                    partial(
                        serve_hypercorn,
                        trust_forwarded_client(client_app),
                        [uds],
                        hypercorn_listener_config(config, admin=True),
                        shutdown_trigger=trigger,
                    )
                )
                listening["listen"] = await listeners.start(
                    partial(
                        pool.run,
                        list(workers.reserved),
                        shutdown=stop,
                        dashboard=os.path.join(private, "admin.sock"),
                    )
                )
            else:
                served.insert(0, (client_app, client_sockets, "client"))
            for app, socks, name in served:
                # The operator surface, and any TLS listener, on hypercorn; the plain
                # client port on llmgw's own server (the hot path).
                if name == "admin" or name in tls:
                    await listeners.start(
                        partial(
                            serve_hypercorn,
                            app,
                            socks,
                            hypercorn_listener_config(config, admin=name == "admin"),
                            tls=tls.get(name),
                            shutdown_trigger=trigger,
                        )
                    )
                    continue
                await listeners.start(
                    partial(
                        serve_listeners,
                        app,
                        socks,
                        client_listener_config(config, router, name),
                        shutdown_trigger=trigger,
                    )
                )
            log.info("client API listening on %s", ", ".join(listening["listen"]))
            log.info(
                "admin (metrics, API, dashboard) listening on %s",
                ", ".join(listening["admin_listen"]),
            )
            # Said once at the start: a scraper refused with 421 shows only the status.
            log.info(
                "admin listener answers to Host %s (any other: 421; admin_hosts adds names)",
                ", ".join(sorted(admin.hosts or ())),
            )
            if on_listening is not None:
                on_listening(listening)
            task_status.started(router)
        background.cancel_scope.cancel()


def background_dir(nursery: trio.Nursery) -> str:
    """A private directory (mode 0700) removed when `nursery`'s scope ends."""
    path = tempfile.mkdtemp(prefix="llmgw-")

    async def remove() -> None:
        try:
            await trio.sleep_forever()
        finally:
            shutil.rmtree(path, ignore_errors=True)

    nursery.start_soon(remove)
    return path


async def _unix_listener(path: str) -> trio.SocketListener:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.bind(path)
        sock.listen()
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)


async def _reload_on_sighup(
    contexts: dict[str, ReloadableTls], pool: WorkerPool | None = None
) -> None:
    """SIGHUP: read every listener's certificate and key again (renewed certificates
    without a restart); a file that does not load keeps the old one, logged. Workers
    are told to do the same."""
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            if pool is not None:
                pool.reload()
            if not contexts:
                log.info("SIGHUP: no TLS listener, nothing to reload")
            for name, tls in contexts.items():
                try:
                    tls.reload()
                except (OSError, ssl.SSLError) as exc:
                    log.error("SIGHUP: %s TLS not reloaded, keeping the old: %s", name, exc)
                else:
                    log.info("SIGHUP: %s TLS reloaded from %s", name, tls.files.cert)


async def _watch_signals(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.warning("received %s: draining", signal.Signals(signum).name)
            stop.set()
            return
