"""The reconciler's values (llmgw.control.reconciler): replicas as it holds them
(:class:`Replica`) and shows them (:class:`ReplicaInfo`), nodes as it reads them
(:class:`NodeView`), what it decides (:class:`Actions`) and what the router is to
hold (:class:`Routes`)."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from llmgw.control.placement import NodeCapacity
from llmgw.domain.fleet import NodeState, Placement, ReplicaState, ShardState
from llmgw.transport.messages import ServerMessage, ShardStatus

__all__ = [
    "Actions",
    "Command",
    "NodeView",
    "Published",
    "Replica",
    "ReplicaInfo",
    "Routes",
]


@attrs.frozen
class Published:
    """A ready replica as the router is to hold it: it may send it requests."""

    replica_id: str
    model: str
    url: str
    # Sequences the engine runs at once, as its agent launched it (None: unknown).
    capacity: int | None = None
    # Sent with every request to it (its profile's API key).
    headers: tuple[tuple[bytes, bytes], ...] = attrs.field(default=(), repr=False)
    # Idle this long, the router puts it to sleep (its profile's sleep_after, for the
    # engines the router sleeps: llmgw.domain.engines).
    sleep_after: float | None = None


@attrs.frozen
class Routes:
    """What the router is to hold now (:meth:`Reconciler.routes`): the replicas that
    serve, by id, and those that served and drain (no new requests; those in flight
    finish). Any other replica it holds is to go."""

    serving: Mapping[str, Published]
    draining: frozenset[str]

    def __contains__(self, replica_id: object) -> bool:
        return replica_id in self.serving or replica_id in self.draining


@attrs.frozen
class Command:
    node_id: str
    message: ServerMessage


@attrs.frozen
class Actions:
    commands: tuple[Command, ...] = ()

    def __add__(self, other: Actions) -> Actions:
        return Actions(self.commands + other.commands)


class _Placed:
    """A replica's model and id, as its placement says (both records below)."""

    __slots__ = ()
    placement: Placement

    @property
    def model(self) -> str:
        return self.placement.model

    @property
    def replica_id(self) -> str:
        return self.placement.replica_id


@attrs.define
class Replica(_Placed):
    """The reconciler's record of one replica (mutable; owned by the Reconciler)."""

    placement: Placement
    state: ReplicaState
    since: float
    shards: dict[int, ShardStatus] = attrs.field(factory=dict)
    url: str | None = None
    # The head node's registered address when placed (or adopted): with the head's
    # port, the URL the router is given (llmgw.control.addresses), never a reported one.
    address: str | None = None
    # What the router sends the engine with each request (its profile's API key).
    headers: tuple[tuple[bytes, bytes], ...] = attrs.field(default=(), repr=False)
    sleep_after: float | None = None  # see Published
    # Sequences the head's engine runs at once, as its agent said when it was ready.
    capacity: int | None = None
    # What each rank was last told (StartShard, DrainShard or StopShard) and when: sent
    # again while its agent's reports disagree (level-triggered, see _resend).
    told: dict[int, tuple[ServerMessage, float]] = attrs.field(factory=dict, repr=False)


@attrs.frozen
class ReplicaInfo(_Placed):
    """One replica as the reconciler last left it: a frozen copy for the views and the
    fleet metrics, which never hold the reconciler's own records."""

    placement: Placement
    state: ReplicaState
    since: float
    url: str | None
    # (rank, state) as each rank's agent last reported it; a rank not heard from is absent.
    shard_states: tuple[tuple[int, ShardState], ...] = ()

    def shard_state(self, rank: int) -> ShardState | None:
        return next((state for r, state in self.shard_states if r == rank), None)


@attrs.frozen
class NodeView:
    """What the reconciler needs to know of a node, from the inventory."""

    node_id: str
    state: NodeState
    capacity: NodeCapacity
    # When cordoned: move its replicas elsewhere (a drain); False keeps them (a plain
    # cordon only keeps new shards off).
    drain: bool = True
    address: str | None = None  # as registered: where an adopted replica is published
    # Every shard it reports, as the inventory holds them: what adoption reads.
    shards: tuple[ShardStatus, ...] = ()
