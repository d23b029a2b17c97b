"""The controller's node operations: what uncordoning a drain in progress does (on the
fleet of `tests.test_fleet_metrics.scenario`, no I/O), and cordons kept in the store
on both backends: written as the operator changes them (a drain too, which its
caller does not await), read back by the next controller before any agent registers
(controllers on the stub transport with llmgw.testing's agents, a real SQLite file or
PostgreSQL database)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from llmgw.agent.agent import Agent
from llmgw.config import Config
from llmgw.control.controller import Controller
from llmgw.domain.fleet import ReplicaState, ShardState
from llmgw.router.core import Router
from llmgw.store import open_store
from llmgw.store.base import Store
from llmgw.testing import run_agent
from llmgw.transport.stub import StubNetwork
from tests.test_fleet_metrics import report, scenario
from tests.waiting import wait_until


def test_uncordoning_a_draining_node_stops_the_replacements_still_starting() -> None:
    s = scenario()
    s.controller.reconcile()
    originals = sorted(s.controller.reconciler.replicas)  # llama's two, on gpu-1
    for port, replica_id in enumerate(originals, 20000):
        report(s, replica_id, ShardState.READY, endpoint_url=f"http://10.0.0.1:{port}")
    replicas = s.controller.reconciler.replicas
    assert [replicas[r].state for r in originals] == [ReplicaState.READY] * 2
    s.controller.drain_node("gpu-1")
    s.controller.reconcile()
    replacements = sorted(set(replicas) - set(originals))
    assert len(replacements) == 2
    assert {replicas[r].placement.nodes for r in replacements} == {("gpu-2",)}
    stops = s.controller.commands["stop"]

    # Uncordoned before they are ready: the originals count again and keep serving;
    # the replacements, now surplus and serving nothing yet, are stopped.
    s.controller.cordon_node("gpu-1", False)
    s.controller.reconcile()
    assert [replicas[r].state for r in originals] == [ReplicaState.READY] * 2
    assert [replicas[r].state for r in replacements] == [ReplicaState.DRAINING] * 2
    assert s.controller.commands["stop"] == stops + 2
    record = s.controller.inventory.get("gpu-1")
    assert record is not None and record.schedulable and not record.draining


class Run(Controller):
    """A controller with the cancel scopes of its agents, by node id."""

    agents: dict[str, trio.CancelScope]


async def _agent(
    network: StubNetwork, node_id: str, scope: trio.CancelScope, task_status: trio.TaskStatus[Agent]
) -> None:
    with scope:
        await run_agent(network, node_id, gpus="1x80GB", task_status=task_status)


@asynccontextmanager
async def controller_with(store: Store, *node_ids: str) -> AsyncIterator[Run]:
    """A running controller on `store` (a server's run) with agents for
    `node_ids`, once they have registered."""
    network = StubNetwork()
    router = Router(Config())
    controller = Run(
        Config().control, router.catalog, router, heartbeat_interval=0.2, settle=0.2, store=store
    )
    controller.agents = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(controller.run, network.listener())
        for node_id in node_ids:
            scope = controller.agents[node_id] = trio.CancelScope()
            await nursery.start(_agent, network, node_id, scope)
        await wait_until(
            lambda: all(n in controller.inventory for n in node_ids), "every agent registered"
        )
        yield controller
        nursery.cancel_scope.cancel()


async def stored(store: Store) -> list[tuple[str, bool]]:
    return [(c.node_id, c.drain) for c in await store.list_cordons()]


async def test_cordons_survive_a_controller_restart_and_go_with_uncordon_and_forget(
    store_url: str,
) -> None:
    store = await open_store(store_url)
    try:
        async with controller_with(store, "a", "b", "c") as first:
            await first.persisted(first.cordon_node("a"))
            for node_id in ("b", "c"):
                first.drain_node(node_id)  # as the drain route calls it: not awaited
            first.cordon_node("c", False)
            # ... and the server stops at once: the shutdown still writes them, in order.
        assert await stored(store) == [("a", False), ("b", True)]

        # The next run: cordoned from the registration on, before any pass could place.
        async with controller_with(store, "a", "b", "c") as second:
            cordons = {r.node_id: (r.cordoned, r.draining) for r in second.inventory.nodes()}
            assert cordons == {"a": (True, False), "b": (True, True), "c": (False, False)}
            await second.persisted(second.cordon_node("a", False))
            assert await stored(store) == [("b", True)]
        # A run where b does not come back: its drain stays stored (it applies if a node
        # of that id registers). A node that is gone and forgotten takes its cordon along.
        async with controller_with(store, "c") as third:
            assert third.inventory.get("b") is None
            await third.persisted(third.cordon_node("c", drain=True))
            assert await stored(store) == [("b", True), ("c", True)]
            assert third.forget_refusal("c") is not None  # connected
            third.agents["c"].cancel()  # the agent goes away
            await wait_until(lambda: third.forget_refusal("c") is None, "c forgettable")
            await third.persisted(third.forget_node("c"))
            assert "c" not in third.inventory
            assert await stored(store) == [("b", True)]
            # b's stored drain, for a node that never came back, goes only this way.
            assert third.inventory.stored_cordon("b") is True
            await third.persisted(third.forget_node("b"))
            assert await stored(store) == []
    finally:
        await store.aclose()
