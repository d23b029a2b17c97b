"""Adoption after a server restart: the placements of the replicas agents report
running, rebuilt from their shards.

Which reported shards to keep and which to stop is the reconciler's fencing rule
(:meth:`~llmgw.control.reconciler.Reconciler.shard_reported`): it keeps only the
shards of placements it holds, at their exact epoch, rank and node. A restarted
server holds no placements, so by that rule it would stop every running replica. It
first rebuilds them with :func:`placement_from_reports`, from the shards *all* agents
report, and adopts them: a replica is rebuilt from its highest reported epoch when
every rank 0..n-1 is reported exactly once, each on its own node, live, with the same
model, profile and node count; otherwise it is refused with a reason (and its shards
are then stopped by the rule above, and the replica placed again). Agents reconnect
with jittered backoff, so the caller must wait for them to settle (e.g. one
`unreachable_after` after start) before rebuilding; a replica whose rank 1 has not
re-registered yet is partial. Rebuilding needs what the agent was told when the shard
started (profile, node count, GPU indices, ports), carried by :class:`ShardReport`.

The reconciler's pass does it (:meth:`~llmgw.control.reconciler.Reconciler.adopt_reported`),
from the shards the inventory holds for each node (:func:`unheld`); what is left
(refused, of a model no longer wanted, or ranks missing) is stopped, :class:`Strays`
saying when.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable

import attrs

from llmgw.domain.fleet import Placement, ShardAssignment, ShardState
from llmgw.transport.messages import ShardStatus

__all__ = [
    "LIVE_SHARD_STATES",
    "Rebuilt",
    "RefusedReplica",
    "ShardReport",
    "Strays",
    "placement_from_reports",
    "unheld",
]

#: Shard states with a running process (something to stop).
LIVE_SHARD_STATES = frozenset({ShardState.STARTING, ShardState.READY, ShardState.DRAINING})


@attrs.frozen
class ShardReport:
    """A shard as one agent reports it, with what the agent was told when the shard
    started — everything a restarted server needs to rebuild its Placement.

    :class:`~llmgw.transport.messages.ShardStatus` does not carry the launch
    parameters yet; the caller fills them in from wherever the agent reports them."""

    node_id: str
    status: ShardStatus
    profile: str
    node_count: int
    gpu_indices: tuple[int, ...]
    port: int
    dist_port: int | None = None


@attrs.frozen
class RefusedReplica:
    replica_id: str
    epoch: int
    reason: str


@attrs.frozen
class Rebuilt:
    placements: tuple[Placement, ...] = ()  # sorted by replica id
    refused: tuple[RefusedReplica, ...] = ()

    def by_replica(self) -> dict[str, Placement]:
        return {p.replica_id: p for p in self.placements}


def placement_from_reports(reports: Iterable[ShardReport]) -> Rebuilt:
    """Rebuild the Placements of the replicas agents report running, from the reports
    of all nodes (the rule is in the module docstring). Reports of an older epoch than
    a replica's highest are left out: the reconciler stops them."""
    by_replica: dict[str, list[ShardReport]] = {}
    for r in reports:
        by_replica.setdefault(r.status.replica_id, []).append(r)
    placements: list[Placement] = []
    refused: list[RefusedReplica] = []
    for replica_id in sorted(by_replica):
        epoch = max(r.status.epoch for r in by_replica[replica_id])
        current = [r for r in by_replica[replica_id] if r.status.epoch == epoch]
        result = _rebuild(replica_id, epoch, current)
        if isinstance(result, Placement):
            placements.append(result)
        else:
            refused.append(RefusedReplica(replica_id, epoch, result))
    return Rebuilt(tuple(placements), tuple(refused))


def _rebuild(replica_id: str, epoch: int, reports: list[ShardReport]) -> Placement | str:
    first = reports[0]
    for what, values in (
        ("model", {r.status.model for r in reports}),
        ("profile", {r.profile for r in reports}),
        ("node count", {str(r.node_count) for r in reports}),
    ):
        if len(values) != 1:
            shown = ", ".join(sorted(values))
            return f"its shards disagree on the {what} ({shown})"
    if not first.status.model:
        return "its shards do not name their model"
    count = first.node_count
    ranks: dict[int, ShardReport] = {}
    for r in sorted(reports, key=lambda r: (r.status.rank, r.node_id)):
        if r.status.state not in LIVE_SHARD_STATES:
            return f"rank {r.status.rank} on {r.node_id!r} is {r.status.state.value}"
        if not 0 <= r.status.rank < count:
            return f"rank {r.status.rank} on {r.node_id!r} is outside 0..{count - 1}"
        if r.status.rank in ranks:
            return (
                f"rank {r.status.rank} is reported by both {ranks[r.status.rank].node_id!r} "
                f"and {r.node_id!r}"
            )
        ranks[r.status.rank] = r
    missing = [rank for rank in range(count) if rank not in ranks]
    if missing:
        shown = ", ".join(str(m) for m in missing)
        return f"rank {shown} of {count} not reported (node down, or not reconnected yet)"
    nodes = [r.node_id for r in ranks.values()]
    if len(set(nodes)) != len(nodes):
        return "two ranks are reported by the same node"
    shards = tuple(
        ShardAssignment(r.node_id, rank, r.gpu_indices, r.port, r.dist_port)
        for rank, r in sorted(ranks.items())
    )
    return Placement(replica_id, first.status.model, first.profile, epoch, shards)


def unheld(
    nodes: Iterable[tuple[str, Iterable[ShardStatus]]],
    held: Container[str],
    minted: Callable[[int], bool],
) -> list[ShardReport]:
    """The live shards `nodes` report (node id, its shards) of replicas not `held`, at
    epochs of an earlier run (not `minted`): what is adopted, or else stopped. Those
    of this run's epochs were superseded: the reconciler's fencing stops them."""
    return [
        ShardReport(
            node_id,
            s,
            s.profile,
            s.node_count or 1,
            s.gpu_indices,
            s.port or 0,
            s.dist_port,
        )
        for node_id, shards in nodes
        for s in shards
        if s.state in LIVE_SHARD_STATES and s.replica_id not in held and not minted(s.epoch)
    ]


class Strays:
    """When to stop the shards adoption left: at once, and again every `every` seconds
    while they are reported (a stop may be lost too); a shard of a multi-node replica
    only after `wait` seconds from its first report, for its other ranks (agents come
    back one by one after an outage). What it remembers is what was reported last, so
    it holds no more than the inventory does (reports may name any replica ids)."""

    def __init__(self, wait: float, every: float) -> None:
        self.wait = wait
        self.every = every
        self._first: dict[tuple[str, int], float] = {}  # (replica id, epoch) -> seen
        self._stopped: dict[tuple[str, str, int, int], float] = {}  # shard -> stop sent

    def due(self, now: float, left: Iterable[ShardReport]) -> list[ShardReport]:
        """Of the shards `left` unadopted now, those to stop now."""
        first: dict[tuple[str, int], float] = {}
        stopped: dict[tuple[str, str, int, int], float] = {}
        due: list[ShardReport] = []
        for r in left:
            s = r.status
            seen = first[s.replica_id, s.epoch] = self._first.get((s.replica_id, s.epoch), now)
            if r.node_count > 1 and now - seen < self.wait:
                continue
            key = (r.node_id, s.replica_id, s.rank, s.epoch)
            last = self._stopped.get(key)
            if last is not None and now - last < self.every:
                stopped[key] = last
                continue
            stopped[key] = now
            due.append(r)
        self._first, self._stopped = first, stopped
        return due

    def __len__(self) -> int:
        """Replicas remembered (waiting for their other ranks, or stopped)."""
        return len(self._first)
