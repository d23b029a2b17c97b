"""Running an assembled gateway (llmgw.assembly): the listeners in one trio process,
signals, graceful drain."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from llmgw import config as cfg
from llmgw import extras, units
from llmgw.assembly import Gateway
from llmgw.config import Config, ConfigError
from llmgw.http.server import serve_listeners
from llmgw.router.core import Router
from llmgw.router.listener import client_listener_config, hypercorn_listener_config
from llmgw.store.base import StoreError
from llmgw.workers.pool import WorkerPool, trust_forwarded_client

if TYPE_CHECKING:
    from llmgw.http.hyper import ReloadableTls

log = logging.getLogger("llmgw.server")
# httpx logs every request at INFO: far too much on a proxy's hot path.
logging.getLogger("httpx").setLevel(logging.WARNING)


#: What :func:`serve` hands `on_listening` once every listener is bound: for each
#: listener, by its configuration key (``listen``, ``admin_listen``, and
#: ``agent_listen`` when agents connect over gRPC), the addresses it is bound to as
#: ``HOST:PORT`` (``[HOST]:PORT`` for IPv6), with the port the kernel picked for port 0.
Listening = dict[str, list[str]]


async def serve(
    gateway: Gateway,
    *,
    on_listening: Callable[[Listening], None] | None = None,
    shutdown: trio.Event | None = None,
    handle_signals: bool = True,
    reload_config: Callable[[], Config] | None = None,
    task_status: trio.TaskStatus[Router] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `gateway` (:func:`llmgw.assembly.assemble`) until SIGINT/SIGTERM (or
    `shutdown`); in-flight streams get `router.drain_timeout` to finish.

    SIGHUP reads the listeners' TLS files again and, with `reload_config` (what reads
    the configuration the gateway was made from, again), applies its [[endpoints]]
    and logs the other keys that changed, which take a restart.

    Once every listener is bound, `on_listening` gets their addresses
    (:data:`Listening`), then `task_status` the router."""
    # The admin listener, and every TLS one, are hypercorn's (llmgw[server]).
    extras.require("llmgw.serve (the admin and TLS listeners)", "server")
    from llmgw.http.hyper import ReloadableTls, TlsFiles

    config = gateway.config
    listening: Listening = {
        "listen": _addresses(gateway.client_sockets),
        "admin_listen": _addresses(gateway.admin_sockets),
    }
    stop = shutdown if shutdown is not None else trio.Event()
    async with trio.open_nursery() as background:
        if handle_signals:
            background.start_soon(_watch_signals, stop)
        await _start_background(gateway, background, listening)
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
                background.start_soon(
                    _reload_on_sighup, tls, gateway.pool, partial(_reload, gateway, reload_config)
                )
            await _start_listeners(gateway, listeners, background, stop, tls, listening)
            log.info("client API listening on %s", ", ".join(listening["listen"]))
            log.info(
                "admin (metrics, API, dashboard) listening on %s",
                ", ".join(listening["admin_listen"]),
            )
            # Said once at the start: a scraper refused with 421 shows only the status.
            log.info(
                "admin listener answers to Host %s (any other: 421; admin_hosts adds names)",
                ", ".join(sorted(gateway.admin.hosts or ())),
            )
            if on_listening is not None:
                on_listening(listening)
            task_status.started(gateway.router)
        background.cancel_scope.cancel()


async def _start_background(
    gateway: Gateway, background: trio.Nursery, listening: Listening
) -> None:
    """The gateway's background work: scrapes, traffic, usage, the control plane."""
    router, pool, control = gateway.router, gateway.pool, gateway.control
    await background.start(router.run)
    await background.start(gateway.traffic.run, (pool or router).admission_view)
    if gateway.batcher is not None:
        await background.start(gateway.batcher.run)
    await background.start(gateway.endpoints.run)
    if gateway.discovery is not None:
        await background.start(gateway.discovery.run)
    if gateway.store is not None and _postgres(gateway.config):
        # Instances on one PostgreSQL: what another added or removed reaches this one.
        background.start_soon(_refresh_stored, "runtime endpoints", gateway.endpoints.refresh)
    if control is None:
        return
    await background.start(control.controller.run, control.agents)
    # A network listener (gRPC) knows its bound addresses; the stub has none.
    agent_addresses = getattr(control.agents, "addresses", None)
    if agent_addresses is not None:
        listening["agent_listen"] = list(agent_addresses)
        log.info("control plane: listening for agents on %s", ", ".join(agent_addresses))
    if control.shared is not None:
        # After the agent listener is bound: the lease names its address.
        await background.start(control.shared.leadership.run)
        await background.start(control.shared.endpoints.run)
        await background.start(control.shared.demand.run)
        background.start_soon(_refresh_stored, "runtime models", gateway.models.refresh)


async def _start_listeners(
    gateway: Gateway,
    listeners: trio.Nursery,
    background: trio.Nursery,
    stop: trio.Event,
    tls: dict[str, ReloadableTls],
    listening: Listening,
) -> None:
    """The client port (llmgw's own server, or the workers) and the admin listeners
    (hypercorn), each returning once `stop` is set and its streams have drained."""
    from llmgw.http.hyper import serve_hypercorn  # llmgw[server], checked by serve

    config, pool = gateway.config, gateway.pool

    async def trigger() -> None:
        await stop.wait()

    served = [(gateway.admin_app, gateway.admin_sockets, "admin")]
    if pool is not None and gateway.workers is not None:
        # The workers serve the client port; its /admin pages come here over a
        # private unix socket (llmgw.http.forward).
        private = background_dir(background)
        uds = await _unix_listener(os.path.join(private, "admin.sock"))
        await listeners.start(
            partial(
                serve_hypercorn,
                trust_forwarded_client(gateway.client_app),
                [uds],
                hypercorn_listener_config(config, admin=True),
                shutdown_trigger=trigger,
            )
        )
        listening["listen"] = await listeners.start(
            partial(
                pool.run,
                list(gateway.workers.reserved),
                shutdown=stop,
                dashboard=os.path.join(private, "admin.sock"),
            )
        )
    else:
        served.insert(0, (gateway.client_app, gateway.client_sockets, "client"))
    for app, socks, name in served:
        # The operator surface, and any TLS listener, on hypercorn; the plain client
        # port on llmgw's own server (the hot path).
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
                list(socks),
                client_listener_config(config, gateway.router, name),
                shutdown_trigger=trigger,
            )
        )


def _addresses(listeners: Sequence[trio.SocketListener]) -> list[str]:
    return [str(units.Address(*listener.socket.getsockname()[:2])) for listener in listeners]


async def _refresh_stored(what: str, refresh: Callable[[], Awaitable[bool]]) -> None:
    """`what` (runtime models, runtime endpoints) changed through another instance
    sharing the store: read again every STORED_EVERY."""
    while True:
        await trio.sleep(STORED_EVERY)
        try:
            await refresh()
        except StoreError as exc:
            log.warning("%s not read again: %s", what, exc)


#: Seconds between reads of what instances sharing a store change at runtime.
STORED_EVERY = 2.0


def _postgres(config: Config) -> bool:
    return config.store.url.startswith(("postgres://", "postgresql://"))


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


def _reload(gateway: Gateway, read: Callable[[], Config] | None) -> None:
    """The configuration read again: its [[endpoints]] applied (llmgw.endpoint_sources),
    the other keys that changed since the start logged as taking a restart. A
    configuration that does not load changes nothing, logged."""
    if read is None:
        log.info("SIGHUP: no configuration file to read again (a library caller's gateway)")
        return
    try:
        config = read()
    except ConfigError as exc:
        log.error(
            "SIGHUP: the configuration not reloaded, nothing changed: %s", "; ".join(exc.problems)
        )
        return
    gateway.endpoints.set_configured(config.endpoints)
    log.info(
        "SIGHUP: [[endpoints]] reloaded (%s)",
        ", ".join(e.id for e in config.endpoints) or "none",
    )
    changed = changed_keys(gateway.config, config) - {"endpoints"}
    if changed:
        log.warning(
            "SIGHUP: these changed keys take a restart to apply: %s", ", ".join(sorted(changed))
        )


def changed_keys(old: Config, new: Config) -> set[str]:
    """The dotted keys whose values differ between two configurations (a list, such as
    [[endpoints]] or [[models]], counts as one key)."""
    return set(_differ(cfg.converter.unstructure(old), cfg.converter.unstructure(new), ""))


def _differ(old: Any, new: Any, key: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            found
            for name in sorted(set(old) | set(new))
            for found in _differ(old.get(name), new.get(name), f"{key}.{name}" if key else name)
        ]
    return [] if old == new else [key]


async def _reload_on_sighup(
    contexts: dict[str, ReloadableTls],
    pool: WorkerPool | None = None,
    reload: Callable[[], None] = lambda: None,
) -> None:
    """SIGHUP: read every listener's certificate and key again (renewed certificates
    without a restart); a file that does not load keeps the old one, logged. Workers
    are told to do the same. Then `reload` (the configuration's endpoints)."""
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            reload()
            if pool is not None:
                pool.reload()
            if not contexts:
                log.info("SIGHUP: no TLS listener to reload")
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
