"""The in-process fleet behind :mod:`llmgw.testing` (its docstring says what it is and
shows it used); import the names from there."""

from __future__ import annotations

import random
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from llmgw import config as cfg
from llmgw import server, units
from llmgw.agent.adapters import SimAdapter
from llmgw.agent.agent import Agent, NodeSettings
from llmgw.agent.discovery import fake_gpus
from llmgw.assembly import Timings, assemble
from llmgw.catalog.rules import Catalog
from llmgw.control.controller import Controller
from llmgw.domain.fleet import Gpu
from llmgw.router.core import Router
from llmgw.testing.launcher import InProcessLauncher
from llmgw.transport.stub import StubNetwork

#: A deployment profile that runs the simulator on one (pretended) GPU.
SIM_PROFILE: dict[str, Any] = {"name": "sim", "engine": "sim", "weights": "sim"}


async def until(predicate: Callable[[], bool], interval: float = 0.05) -> None:
    """Wait until `predicate()` holds; bound it with `trio.fail_after`. For state that
    has no change notification (fleet state seen from a test)."""
    while not predicate():  # noqa: ASYNC110
        await trio.sleep(interval)


async def run_agent(
    network: StubNetwork,
    node_id: str,
    *,
    gpus: str = "4x80GB",
    fabrics: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
    address: str = "127.0.0.1",
    reconnect_delay: float = 0.2,
    task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a real :class:`~llmgw.agent.agent.Agent` for `node_id` on `network`, with
    pretended `gpus` ("" for none) and simulated engines in this process
    (:class:`~llmgw.testing.launcher.InProcessLauncher`), until cancelled; `task_status`
    gets the agent once it runs. `reconnect_delay` bounds its backoff between connect
    attempts. Its state directory is a temporary one, removed when it stops."""
    found = fake_gpus(gpus, node_id=node_id) if gpus else ()

    async def discover() -> tuple[Gpu, ...]:
        return found

    launcher = InProcessLauncher()
    with tempfile.TemporaryDirectory(prefix="llmgw-agent-") as state_dir:
        agent = Agent(
            network.connector(node_id),
            NodeSettings(
                node_id=node_id,
                address=address,
                hostname=node_id,
                labels=dict(labels or {}),
                fabrics=tuple(fabrics),
            ),
            state_dir=Path(state_dir),
            adapters={"sim": SimAdapter()},
            base_backoff=min(0.05, reconnect_delay),
            max_backoff=reconnect_delay,
            health_interval=0.1,
            discover_gpus=discover,
            launcher=launcher,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(launcher.run)
            await nursery.start(agent.run)
            task_status.started(agent)


@attrs.define
class Fleet:
    """A running in-process fleet (see :func:`fleet`)."""

    config: cfg.Config
    router: Router
    controller: Controller
    network: StubNetwork
    agents: list[Agent]
    client: httpx.AsyncClient
    admin: httpx.AsyncClient
    nursery: trio.Nursery
    #: The first three parts of this fleet's node addresses (see :func:`fleet`).
    loopback: str = "127.0.0"

    def set_catalog(self, catalog: Catalog) -> None:
        """Swap the models for the router and the controller at once."""
        self.router.set_catalog(catalog)
        self.controller.set_catalog(catalog)

    def ready(self, model: str) -> int:
        return len(self.router.endpoints.serving(model))

    async def wait_ready(self, model: str, count: int) -> None:
        """Wait until `count` replicas of `model` take requests (bound it with
        `trio.fail_after`)."""
        await until(lambda: self.ready(model) == count)

    async def add_agent(self, node_id: str, **kwargs: Any) -> Agent:
        """Start another agent (:func:`run_agent`'s keywords); its address is the next
        one of the fleet's unless `address` says otherwise."""
        kwargs.setdefault("address", f"{self.loopback}.{10 + len(self.agents)}")
        agent: Agent = await self.nursery.start(partial(run_agent, self.network, node_id, **kwargs))
        self.agents.append(agent)
        return agent


@asynccontextmanager
async def fleet(
    models: Sequence[Mapping[str, Any]],
    *,
    nodes: int = 2,
    gpus: str = "4x80GB",
    fabric: str | None = None,
    config: Mapping[str, Any] | None = None,
    heartbeat_interval: float = 0.2,
) -> AsyncIterator[Fleet]:
    """Router, controller and `nodes` agents with `gpus` each, serving `models`.

    Timings default to fractions of a second so tests run quickly; `config` overlays
    any key (a nested dict in the configuration's shape). There is no store unless
    `config` names one (``{"store": {"url": ...}}``): a harness leaves no files behind.
    The client and admin listeners are sockets bound on port 0 before the server starts,
    at the host `listen` and `admin_listen` name (127.0.0.1 by default; their ports in
    `config` are ignored); ``Fleet.config`` names the addresses they got. Node ``i``
    has the address ``<Fleet.loopback>.<10 + i>``, in a block of 127/8 picked at random
    per fleet: an agent refuses a shard whose port is taken on its address, and fleets
    of other test runs on the machine are given the same ports.
    """
    data: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "models": [dict(m) for m in models],
        "router": {"scrape_interval": "100ms", "scrape_timeout": "100ms"},
        "store": {"url": ""},
        "control": {
            "interval": "200ms",
            "base_backoff": "500ms",
            "max_backoff": "2s",
            "unreachable_after": "1s",
            "lost_after": "3s",
            "port_range": [20000, 20200],
            # The nodes' addresses are on loopback: the interface multi-node shards use.
            "mgmt_interface": "lo",
        },
    }
    conf = cfg.load(data=cfg.merge(data, dict(config or {})), environ={})
    sockets: dict[str, list[trio.SocketListener]] = {}
    try:
        for key, address in (("listen", conf.listen), ("admin_listen", conf.admin_listen)):
            host = units.parse_address(address).bind_host
            sockets[key] = await trio.open_tcp_listeners(0, host=host)
        conf = attrs.evolve(
            conf,
            listen=_bound(sockets["listen"]),
            admin_listen=_bound(sockets["admin_listen"]),
        )
        async with _serving(conf, sockets, nodes, gpus, fabric, heartbeat_interval) as f:
            yield f
    finally:
        for listeners in sockets.values():  # closed already, unless it failed to start
            for listener in listeners:
                listener.socket.close()


def _bound(listeners: list[trio.SocketListener]) -> str:
    return str(units.Address(*listeners[0].socket.getsockname()[:2]))


@asynccontextmanager
async def _serving(
    conf: cfg.Config,
    sockets: dict[str, list[trio.SocketListener]],
    nodes: int,
    gpus: str,
    fabric: str | None,
    heartbeat_interval: float,
) -> AsyncIterator[Fleet]:
    network = StubNetwork()
    # All of 127/8 is local on Linux; 127.0.x.x is left to everything else.
    loopback = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}"
    stop = trio.Event()
    async with (
        assemble(
            conf,
            agents=network.listener(),
            timings=Timings(heartbeat_interval, heartbeat_interval),
            client_listeners=sockets["listen"],
            admin_listeners=sockets["admin_listen"],
        ) as gateway,
        trio.open_nursery() as nursery,
    ):
        router, controller = gateway.router, gateway.controller
        assert controller is not None
        await nursery.start(partial(server.serve, gateway, shutdown=stop, handle_signals=False))
        agents: list[Agent] = []
        for i in range(nodes):
            # Every node gets its own address, as real nodes have.
            run = partial(
                run_agent,
                network,
                f"node-{i}",
                gpus=gpus,
                fabrics=(fabric,) if fabric else (),
                address=f"{loopback}.{10 + i}",
            )
            agents.append(await nursery.start(run))
        listen = units.parse_address(conf.listen)
        admin = units.parse_address(conf.admin_listen)
        async with (
            httpx.AsyncClient(base_url=f"http://{listen.host}:{listen.port}", timeout=30) as client,
            httpx.AsyncClient(
                base_url=f"http://{admin.host}:{admin.port}", timeout=30
            ) as admin_client,
        ):
            yield Fleet(
                conf, router, controller, network, agents, client, admin_client, nursery, loopback
            )
        stop.set()
        nursery.cancel_scope.cancel()
