"""The fleet converges when the network loses messages (issue #20: level-triggered
commands). A router, the controller and two real agents (llmgw.testing.fleet) on the
stub transport, which loses half of the commands to agents and half of the agents'
shard reports: every count the catalog asks for is reached anyway, by commands sent
again while the agents' reports disagree, and by the reports heartbeats carry (the end
of a shard too, whose own report may be the one lost).
"""

from __future__ import annotations

import random

import trio

from llmgw.catalog.rules import Catalog
from llmgw.config import DeploymentProfile, ModelConfig
from llmgw.domain.fleet import ReplicaState, ShardState
from llmgw.testing import SIM_PROFILE, Fleet, fleet, until
from llmgw.transport.messages import DrainShard, ShardStatus, StartShard, StopShard

LOST = (StartShard, DrainShard, StopShard, ShardStatus)


def states(f: Fleet) -> list[ReplicaState]:
    return [r.state for r in f.controller.reconciler.replicas.values()]


async def converged(f: Fleet, count: int) -> None:
    """`count` replicas of m serving, and nothing else held (no drain left hanging)."""
    await until(lambda: f.ready("m") == count and states(f) == [ReplicaState.READY] * count)


async def test_the_fleet_converges_when_half_the_commands_and_reports_are_lost() -> None:
    rng = random.Random(11)
    profile = DeploymentProfile(**SIM_PROFILE)

    def catalog(replicas: int) -> Catalog:
        return Catalog((ModelConfig(name="m", replicas=replicas, profiles=(profile,)),))

    async with fleet([{"name": "m", "replicas": 1, "profiles": [SIM_PROFILE]}], nodes=2) as f:
        with trio.fail_after(30):
            await converged(f, 1)
        f.network.drop = lambda node_id, message: isinstance(message, LOST) and rng.random() < 0.5
        for count in (3, 1, 2):
            f.set_catalog(catalog(count))
            with trio.fail_after(60):
                await converged(f, count)
        assert f.network.stats.dropped > 0
        assert f.controller.reconciler.resent > 0  # what was lost was sent again
        # The agents run exactly the replicas the controller holds, no stray engine.
        running = {s.command.replica_id for a in f.agents for s in a.supervisor.live()}
        assert running == set(f.controller.reconciler.replicas)


async def test_a_drained_replica_ends_when_every_report_of_an_end_is_lost() -> None:
    # Once the server has heard a shard drain, only a report of its end settles it: no
    # command is sent again while the agent agrees it drains. The agent's heartbeats
    # carry that end too, so losing the ShardStatus costs an interval, not the drain.
    def ended(_node: str, message: object) -> bool:
        return isinstance(message, ShardStatus) and message.state in (
            ShardState.STOPPED,
            ShardState.FAILED,
        )

    profile = DeploymentProfile(**SIM_PROFILE)
    async with fleet([{"name": "m", "replicas": 2, "profiles": [SIM_PROFILE]}], nodes=1) as f:
        with trio.fail_after(30):
            await converged(f, 2)
        f.network.drop = ended
        f.set_catalog(Catalog((ModelConfig(name="m", replicas=1, profiles=(profile,)),)))
        with trio.fail_after(30):
            await converged(f, 1)
        assert f.network.stats.dropped > 0
        running = {s.command.replica_id for a in f.agents for s in a.supervisor.live()}
        assert running == set(f.controller.reconciler.replicas)
