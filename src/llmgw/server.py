"""Running llmgw-server: the listeners in one trio process, signals, graceful drain."""

from __future__ import annotations

import logging
import signal
from collections.abc import Sequence
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from llmgw import units
from llmgw.admin.api import AdminApp
from llmgw.config import Config, ControlConfig
from llmgw.control.controller import Controller
from llmgw.control.fleet_metrics import register_fleet_metrics
from llmgw.router.core import Router
from llmgw.transport.base import AgentListener

log = logging.getLogger("llmgw.server")
# httpx logs every request at INFO: far too much on a proxy's hot path.
logging.getLogger("httpx").setLevel(logging.WARNING)


def hypercorn_config(bind: str, *, graceful: float) -> HypercornConfig:
    hc = HypercornConfig()
    address = units.parse_address(bind)
    host = address.bind_host
    hc.bind = [f"[{host}]:{address.port}" if ":" in host else f"{host}:{address.port}"]
    hc.graceful_timeout = graceful
    # Streams last minutes: no read or write timeout on the connection; the proxy
    # bounds each phase itself. Idle keep-alive connections are closed after 75s.
    hc.keep_alive_timeout = 75
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    return hc


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


async def serve(
    config: Config,
    *,
    router: Router | None = None,
    controller: Controller | None = None,
    listener: AgentListener | None = None,
    shutdown: trio.Event | None = None,
    handle_signals: bool = True,
    task_status: trio.TaskStatus[Router] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until SIGINT/SIGTERM (or `shutdown`); in-flight streams get
    `router.drain_timeout` to finish.

    With deployable models (or a `controller` given) the control plane runs too,
    accepting agents on `listener` (default: gRPC on `agent_listen`)."""
    router = router or Router(config)
    stop = shutdown if shutdown is not None else trio.Event()
    if controller is None and config.control_plane:
        heartbeat, settle = control_timings(config.control)
        controller = Controller(
            config.control, router.catalog, router, heartbeat_interval=heartbeat, settle=settle
        )
    if controller is not None:
        router.usage_sinks.append(controller.activity)
        register_fleet_metrics(router.metrics.registry, controller, controller.clock)
        if listener is None:
            from llmgw.transport.grpc import GrpcListener

            listener = GrpcListener(config.agent_listen, tls=config.agent_tls)
    admin = AdminApp(router, controller=controller)
    drain = config.router.drain_timeout

    async def trigger() -> None:
        await stop.wait()

    async with trio.open_nursery() as background:
        if handle_signals:
            background.start_soon(_watch_signals, stop)
        await background.start(router.run)
        if controller is not None and listener is not None:
            await background.start(controller.run, listener)
            log.info("control plane: agents connect on %s", config.agent_listen)
        # The listeners return once `stop` is set and their streams have drained
        # (hypercorn's graceful_timeout); then the background work is cancelled.
        async with trio.open_nursery() as listeners:
            client_binds: Any = await listeners.start(
                _serve_app, router.app, hypercorn_config(config.listen, graceful=drain), trigger
            )
            admin_binds: Any = await listeners.start(
                _serve_app, admin, hypercorn_config(config.admin_listen, graceful=drain), trigger
            )
            log.info(
                "client API on %s, admin on %s", ", ".join(client_binds), ", ".join(admin_binds)
            )
            task_status.started(router)
        background.cancel_scope.cancel()


async def _serve_app(
    app: Any,
    hc: HypercornConfig,
    trigger: Any,
    *,
    task_status: trio.TaskStatus[Sequence[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    await hypercorn_serve(app, hc, shutdown_trigger=trigger, task_status=task_status)


async def _watch_signals(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.warning("received %s: draining", signal.Signals(signum).name)
            stop.set()
            return
