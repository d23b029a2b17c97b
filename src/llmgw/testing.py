"""A whole llmgw fleet in one process, for tests of code built on llmgw.

The router and the controller are the real ones; agents are :class:`FakeAgent`s on
the in-memory stub transport, with pretended GPUs, whose shards are simulated
engines (:mod:`llmgw.sim`) served in the same process on loopback. Every listener
(the client and admin ports, each engine) is bound on port 0, so fleets run side by
side without ever contending for a port. The README's example
(tests/test_readme_example.py runs it and checks it matches this one)::

    import trio

    import llmgw.testing


    async def main() -> None:
        models = [{"name": "m", "replicas": 2, "profiles": [llmgw.testing.SIM_PROFILE]}]
        async with llmgw.testing.fleet(models) as f:
            with trio.fail_after(30):
                await f.wait_ready("m", 2)
            r = await f.client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
            r.raise_for_status()
            print(r.json()["choices"][0]["text"])


    trio.run(main)

Everything runs in the caller's trio run and is cancelled when the block ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

import attrs
import httpx
import trio

from llmgw import config as cfg
from llmgw import server, units
from llmgw.agent.discovery import fake_gpus
from llmgw.catalog import Catalog
from llmgw.control.controller import Controller
from llmgw.control.fleet import EngineInfo, NodeInfo, ShardState
from llmgw.errors import first_line
from llmgw.router.core import Router
from llmgw.router.scrape import parse_metrics
from llmgw.sim.server import SimConfig
from llmgw.sim.server import serve as serve_sim
from llmgw.transport.base import ConnectFailed, ConnectionClosed
from llmgw.transport.messages import (
    DrainShard,
    Heartbeat,
    Register,
    Registered,
    ShardStatus,
    StartShard,
    StopShard,
)
from llmgw.transport.stub import StubNetwork

#: A deployment profile that runs the simulator on one (pretended) GPU.
SIM_PROFILE: dict[str, Any] = {"name": "sim", "engine": "sim", "weights": "sim"}


async def until(predicate: Callable[[], bool], interval: float = 0.05) -> None:
    """Wait until `predicate()` holds; bound it with `trio.fail_after`. For state that
    has no change notification (fleet state seen from a test)."""
    while not predicate():  # noqa: ASYNC110
        await trio.sleep(interval)


@attrs.define
class _Shard:
    command: StartShard
    scope: trio.CancelScope
    status: ShardStatus


class FakeAgent:
    """An agent that pretends to have GPUs and runs simulators in-process.

    It speaks the real protocol over a transport: registers (with the shards it
    still runs), heartbeats, starts and stops shards, and reconnects when cut off.
    Unlike a real agent it serves each engine on a port of its own choosing (port 0 on
    its `address`), not the one the command assigns: its status still names the
    assigned port, and its endpoint URL the port it got.
    """

    def __init__(
        self,
        network: StubNetwork,
        node_id: str,
        *,
        gpus: str = "4x80GB",
        fabrics: Sequence[str] = (),
        labels: Mapping[str, str] | None = None,
        address: str = "127.0.0.1",
        reconnect_delay: float = 0.2,
    ) -> None:
        self.network = network
        self.node = NodeInfo(
            node_id=node_id,
            hostname=node_id,
            address=address,
            agent_version="fake",
            labels=dict(labels or {}),
            fabrics=tuple(fabrics),
            gpus=fake_gpus(gpus, node_id=node_id) if gpus else (),
            engines=(EngineInfo("sim", "fake"),),
        )
        self.reconnect_delay = reconnect_delay
        self.shards: dict[tuple[str, int], _Shard] = {}
        self.connections = 0
        self._heartbeat = 1.0
        self._send: trio.MemorySendChannel[Any] | None = None

    @property
    def node_id(self) -> str:
        return self.node.node_id

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, serve, and reconnect forever; shards outlive connections."""
        async with trio.open_nursery() as shards:
            task_status.started()
            while True:
                try:
                    await self._session(shards)
                except* (ConnectionClosed, ConnectFailed):
                    pass  # cut off: reconnect after a pause
                self._send = None
                await trio.sleep(self.reconnect_delay)

    async def _session(self, shards: trio.Nursery) -> None:
        async with self.network.connector(self.node_id).connect() as conn:
            self.connections += 1
            await conn.send(Register(self.node, tuple(s.status for s in self.shards.values())))
            first = await conn.receive()
            if isinstance(first, Registered):
                self._heartbeat = first.heartbeat_interval
            send, receive = trio.open_memory_channel[Any](256)
            self._send = send
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._heartbeats)

                async def sender() -> None:
                    async for message in receive:
                        await conn.send(message)

                nursery.start_soon(sender)
                while True:
                    command = await conn.receive()
                    if isinstance(command, StartShard):
                        shards.start_soon(self._run_shard, command)
                    elif isinstance(command, StopShard | DrainShard):
                        shard = self.shards.get((command.replica_id, command.rank))
                        if shard is not None and shard.command.epoch == command.epoch:
                            if isinstance(command, DrainShard):
                                shards.start_soon(self._drain, shard, command.deadline)
                            else:
                                shard.scope.cancel()

    async def _drain(self, shard: _Shard, deadline: float) -> None:
        """Stop once the engine has nothing running or waiting (or at the deadline)."""
        url = shard.status.endpoint_url
        with trio.move_on_after(deadline):
            async with httpx.AsyncClient() as client:
                while url is not None:
                    with suppress(httpx.HTTPError):
                        sample = parse_metrics((await client.get(f"{url}/metrics")).content)
                        if not (sample.running or 0) and not (sample.waiting or 0):
                            break
                    await trio.sleep(0.05)
        shard.scope.cancel()

    async def _heartbeats(self) -> None:
        seq = 0
        while True:
            await trio.sleep(self._heartbeat)
            seq += 1
            self._report(Heartbeat(seq, self.node.gpus))

    def _report(self, message: Any) -> None:
        if self._send is not None:
            # When it cannot be sent, the next registration carries the state anyway.
            with suppress(trio.WouldBlock, trio.ClosedResourceError):
                self._send.send_nowait(message)

    def _status(self, command: StartShard, state: ShardState, **extra: Any) -> ShardStatus:
        return ShardStatus(
            replica_id=command.replica_id,
            rank=command.rank,
            epoch=command.epoch,
            state=state,
            model=command.model,
            profile=command.profile.name,
            node_count=command.node_count,
            gpu_indices=command.gpu_indices,
            port=command.port,
            **extra,
        )

    async def _run_shard(self, command: StartShard) -> None:
        key = (command.replica_id, command.rank)
        scope = trio.CancelScope()
        shard = _Shard(command, scope, self._status(command, ShardState.STARTING))
        self.shards[key] = shard
        self._report(shard.status)
        # Port 0: nothing else can hold the port between choosing and binding it.
        config = SimConfig(host=self.node.address, port=0, models=(command.model,))
        try:
            with scope:
                if command.rank == 0:
                    async with trio.open_nursery() as nursery:
                        (url, *_) = await nursery.start(serve_sim, config)
                        shard.status = self._status(command, ShardState.READY, endpoint_url=url)
                        self._report(shard.status)
                        await trio.sleep_forever()
                else:
                    shard.status = self._status(command, ShardState.READY)
                    self._report(shard.status)
                    await trio.sleep_forever()
        except (OSError, ExceptionGroup) as exc:
            shard.status = self._status(command, ShardState.FAILED, message=first_line(exc))
            self._report(shard.status)
            del self.shards[key]
            return
        shard.status = self._status(command, ShardState.STOPPED)
        self._report(shard.status)
        del self.shards[key]


@attrs.define
class Fleet:
    """A running in-process fleet (see :func:`fleet`)."""

    config: cfg.Config
    router: Router
    controller: Controller
    network: StubNetwork
    agents: list[FakeAgent]
    client: httpx.AsyncClient
    admin: httpx.AsyncClient
    nursery: trio.Nursery

    def set_catalog(self, catalog: Catalog) -> None:
        """Swap the models for the router and the controller at once."""
        self.router.catalog = catalog
        self.controller.set_catalog(catalog)

    def ready(self, model: str) -> int:
        return len(self.router.endpoints.serving(model))

    async def wait_ready(self, model: str, count: int) -> None:
        """Wait until `count` replicas of `model` take requests (bound it with
        `trio.fail_after`)."""
        await until(lambda: self.ready(model) == count)

    async def add_agent(self, node_id: str, **kwargs: Any) -> FakeAgent:
        agent = FakeAgent(self.network, node_id, **kwargs)
        await self.nursery.start(agent.run)
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
    """Router, controller and `nodes` fake agents with `gpus` each, serving `models`.

    Timings default to fractions of a second so tests run quickly; `config` overlays
    any key (a nested dict in the configuration's shape). There is no store unless
    `config` names one (``{"store": {"url": ...}}``): a harness leaves no files behind.
    The client and admin listeners are sockets bound on port 0 before the server starts,
    at the host `listen` and `admin_listen` name (127.0.0.1 by default; their ports in
    `config` are ignored); ``Fleet.config`` names the addresses they got.
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
            # Bookkeeping only: the fake agents serve their engines on port 0.
            "port_range": [20000, 20200],
        },
    }
    conf = cfg.load(data=cfg._merge(data, dict(config or {})), environ={})
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
    router = Router(conf)
    controller = Controller(
        conf.control,
        router.catalog,
        router,
        heartbeat_interval=heartbeat_interval,
        settle=heartbeat_interval,
    )
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: server.serve(
                conf,
                router=router,
                controller=controller,
                listener=network.listener(),
                client_listeners=sockets["listen"],
                admin_listeners=sockets["admin_listen"],
                shutdown=stop,
                handle_signals=False,
                task_status=task_status,
            )
        )
        agents = []
        for i in range(nodes):
            # Every node gets its own loopback address (all of 127/8 is local on
            # Linux), as real nodes have addresses of their own.
            agent = FakeAgent(
                network,
                f"node-{i}",
                gpus=gpus,
                fabrics=(fabric,) if fabric else (),
                address=f"127.0.0.{10 + i}",
            )
            await nursery.start(agent.run)
            agents.append(agent)
        listen = units.parse_address(conf.listen)
        admin = units.parse_address(conf.admin_listen)
        async with (
            httpx.AsyncClient(base_url=f"http://{listen.host}:{listen.port}", timeout=30) as client,
            httpx.AsyncClient(
                base_url=f"http://{admin.host}:{admin.port}", timeout=30
            ) as admin_client,
        ):
            yield Fleet(conf, router, controller, network, agents, client, admin_client, nursery)
        stop.set()
        nursery.cancel_scope.cancel()
