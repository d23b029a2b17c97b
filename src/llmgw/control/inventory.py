"""The node inventory (DESIGN §5): what the control plane knows of each node.

A state machine without clocks, I/O or awaits: every method takes `now` (seconds on
the caller's monotonic clock) and returns what changed as a list of event values, so
the controller reacts to them and tests run without time passing. Reads return frozen
:class:`NodeRecord` snapshots.

Node states
-----------
::

    (register) --> ready --no contact for unreachable_after--> unreachable
                     ^  \\                                          |
                     |   \\-------- no contact for lost_after ------+--> lost
                     |                                                   |
                     +-- heartbeat / shard status (from unreachable) ----+
                     +-- register (from any state) <---------------------+

* *Contact* is any message the agent sends on its current connection: the
  registration, a heartbeat or a shard status. `last_heartbeat` is the time of the
  latest one.
* Timer transitions are due at exactly ``last_heartbeat + unreachable_after`` and
  ``last_heartbeat + lost_after`` and happen only in :meth:`Inventory.expire`, which
  the driving loop calls at :meth:`Inventory.next_deadline`. A transition's `since`
  is its deadline, not the time `expire` ran; a late `expire` emits every transition
  it skipped, in order (ready -> unreachable -> lost), each exactly once. Contact
  arriving after a deadline but before `expire` ran is accepted (the node was never
  declared anything).
* A dropped stream (:meth:`Inventory.disconnected`) only clears `connected`: a blip
  must not tear down a multi-node replica, so the state follows time alone.
* Unreachable nodes keep their shards: their replicas keep serving. A heartbeat
  returns the node to ready and emits only :class:`NodeReady`.
* At most `max_lost` lost nodes are kept (:data:`~llmgw.transport.limits.MAX_LOST_NODES`):
  beyond, the longest lost are forgotten (:class:`NodeRemoved`), their cordons kept for
  when they register again. Nodes that left do not hold memory forever.
* Lost is sticky: heartbeats and shard statuses from a lost node are refused with
  :class:`ReregisterRequired` (never silently resurrected); only a registration brings
  it back. Losing a node clears its shards (they are listed in :class:`NodeLost`): its
  replicas are placed elsewhere, and whatever it still runs when it returns is judged
  by the reconciler's fencing (:meth:`~llmgw.control.reconciler.Reconciler.shard_reported`).
* A registration refreshes everything the server knows of the node (inventory,
  fabrics, labels, GPUs, shards); the operator's cordon survives it.

Cordons
-------
An operator's :meth:`~Inventory.cordon` keeps new shards off a node; with
``drain=True`` (a drain) the reconciler also moves its replicas elsewhere, without
(a plain cordon) they stay where they are. :meth:`~Inventory.restore_cordon` sets a
cordon kept in the store, for a node that may not have registered yet (after a
server restart): it applies when the node registers. :meth:`~Inventory.remove`
forgets the node and its cordon.

Connections
-----------
Every registration opens a new *session* (a number, in :class:`NodeRegistered` and
:attr:`NodeRecord.session`). A transport that passes `session=` to
:meth:`~Inventory.heartbeat`, :meth:`~Inventory.shard_status` and
:meth:`~Inventory.disconnected` is safe from the reconnect race: the old stream's
late messages are refused with :class:`StaleConnection` and its late drop is ignored,
instead of marking the live connection disconnected. Messages on a connection that
was dropped (and not re-registered) are refused with :class:`ReregisterRequired`: a
new stream always starts with a registration.

Shards
------
Recorded per (replica_id, rank), fenced by epoch: a status with an older epoch than
the recorded one is stale and ignored. :meth:`~Inventory.shard_status` replaces the
record; a heartbeat's shard summary only updates it when the epoch or state differs,
so a summary does not erase the failure message or output tail of a status. A
registration replaces the whole set. At most
:data:`~llmgw.transport.limits.MAX_SHARDS` are recorded per node: a new one replaces
the ended (stopped, failed) one recorded longest ago, or is not recorded when none
has ended. :class:`ShardChanged` is emitted whenever a
recorded status changes.

Rebuilding the placements of what agents report, to adopt them after a restart, is
:mod:`llmgw.control.adoption`'s.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping

import attrs

from llmgw.config import ControlConfig
from llmgw.control.addresses import AddressRefused, registered_address
from llmgw.domain.fleet import Gpu, NodeInfo, NodeState, ShardState
from llmgw.transport.limits import MAX_LOST_NODES, MAX_SHARDS
from llmgw.transport.messages import Heartbeat, Register, ShardStatus

__all__ = [
    "Event",
    "IdentityMismatch",
    "InvalidRegistration",
    "Inventory",
    "InventoryError",
    "NodeBecameUnreachable",
    "NodeCordoned",
    "NodeDisconnected",
    "NodeLost",
    "NodeReady",
    "NodeRecord",
    "NodeRegistered",
    "NodeRemoved",
    "ReregisterRequired",
    "ShardChanged",
    "StaleConnection",
    "UnknownNode",
]

ShardKey = tuple[str, int]  # (replica_id, rank)

# -- errors ----------------------------------------------------------------------------


class InventoryError(Exception):
    """A request the inventory refuses; nothing changed."""


class InvalidRegistration(InventoryError):
    pass


class IdentityMismatch(InventoryError):
    """The node id an agent registers with is not the one its certificate names."""

    def __init__(self, node_id: str, identity: str) -> None:
        super().__init__(
            f"node id {node_id!r} does not match the connection's verified identity {identity!r}"
        )
        self.node_id = node_id
        self.identity = identity


class ReregisterRequired(InventoryError):
    """The message cannot be applied to what the server knows of the node; the agent
    must register again (the transport tells it so). `reason` is one of ``unknown``,
    ``lost``, ``disconnected``."""

    def __init__(self, node_id: str, reason: str) -> None:
        super().__init__(f"node {node_id!r} is {reason}: it must register again")
        self.node_id = node_id
        self.reason = reason


class StaleConnection(InventoryError):
    """A message from a connection a newer registration of the node has replaced; the
    transport closes that connection (the agent is already on the newer one)."""

    def __init__(self, node_id: str, session: int, current: int) -> None:
        super().__init__(
            f"node {node_id!r}: connection {session} was replaced by connection {current}"
        )
        self.node_id = node_id
        self.session = session
        self.current = current


class UnknownNode(InventoryError, LookupError):
    def __init__(self, node_id: str) -> None:
        super().__init__(f"no node {node_id!r}")
        self.node_id = node_id


# -- snapshots -------------------------------------------------------------------------


@attrs.frozen
class NodeRecord:
    """What the inventory knows of one node at one moment."""

    info: NodeInfo  # as last registered
    state: NodeState
    since: float  # when it entered `state`
    last_heartbeat: float  # last contact: registration, heartbeat or shard status
    connected: bool
    cordoned: bool
    gpus: tuple[Gpu, ...]  # the registered GPUs with the latest readings
    shards: tuple[ShardStatus, ...]  # sorted by (replica_id, rank)
    identity: str | None  # the connection's verified identity, if the transport has one
    session: int  # the registration (connection) the record belongs to
    seq: int | None = None  # last heartbeat sequence number of this session
    draining: bool = False  # cordoned with its replicas moving elsewhere (a drain)

    @property
    def node_id(self) -> str:
        return self.info.node_id

    @property
    def schedulable(self) -> bool:
        """Ready and not cordoned: placement may put new shards here."""
        return self.state is NodeState.READY and not self.cordoned

    def shard(self, replica_id: str, rank: int) -> ShardStatus | None:
        for s in self.shards:
            if s.replica_id == replica_id and s.rank == rank:
                return s
        return None

    def silent_for(self, now: float) -> float:
        return max(0.0, now - self.last_heartbeat)


# -- events ----------------------------------------------------------------------------


@attrs.frozen
class NodeRegistered:
    node_id: str
    info: NodeInfo
    previous: NodeState | None  # None: a node the inventory did not know
    session: int
    # The previous connection was still open: the agent reconnected before the server
    # noticed the drop, or two agents claim the same node id.
    replaced_connection: bool = False

    @property
    def new(self) -> bool:
        return self.previous is None


@attrs.frozen
class NodeReady:
    """The node entered ready (from nothing, unreachable or lost)."""

    node_id: str
    previous: NodeState | None


@attrs.frozen
class NodeBecameUnreachable:
    node_id: str
    at: float  # the deadline: last contact + unreachable_after
    silent_for: float  # since the last contact, when `expire` ran


@attrs.frozen
class NodeLost:
    node_id: str
    at: float  # the deadline: last contact + lost_after
    silent_for: float
    shards: tuple[ShardStatus, ...]  # what it was running; they are gone now


@attrs.frozen
class NodeDisconnected:
    node_id: str
    session: int


@attrs.frozen
class ShardChanged:
    node_id: str
    replica_id: str
    rank: int
    old: ShardStatus | None  # None: newly reported
    new: ShardStatus | None  # None: no longer reported (a registration without it)


@attrs.frozen
class NodeCordoned:
    node_id: str
    cordoned: bool
    drain: bool = True


@attrs.frozen
class NodeRemoved:
    node_id: str
    previous: NodeState


Event = (
    NodeRegistered
    | NodeReady
    | NodeBecameUnreachable
    | NodeLost
    | NodeDisconnected
    | ShardChanged
    | NodeCordoned
    | NodeRemoved
)

# -- the inventory ---------------------------------------------------------------------


@attrs.define
class _Node:
    info: NodeInfo
    state: NodeState
    since: float
    last_heartbeat: float
    session: int
    identity: str | None
    gpus: dict[int, Gpu]
    shards: dict[ShardKey, ShardStatus]
    connected: bool = True
    cordoned: bool = False
    draining: bool = False
    seq: int | None = None

    def snapshot(self) -> NodeRecord:
        return NodeRecord(
            info=self.info,
            state=self.state,
            since=self.since,
            last_heartbeat=self.last_heartbeat,
            connected=self.connected,
            cordoned=self.cordoned,
            gpus=tuple(self.gpus.values()),
            shards=tuple(self.shards[k] for k in sorted(self.shards)),
            identity=self.identity,
            session=self.session,
            seq=self.seq,
            draining=self.draining,
        )


class Inventory:
    """Every node the control plane knows, driven by agent messages and time.

    Not thread-safe; nothing in it awaits, so each call is atomic in a trio program.
    `now` never moves backwards: an earlier `now` than one already seen counts as the
    latest one.
    """

    def __init__(
        self, config: ControlConfig | None = None, *, max_lost: int = MAX_LOST_NODES
    ) -> None:
        config = config or ControlConfig()
        self.max_lost = max_lost
        self.unreachable_after = float(config.unreachable_after)
        self.lost_after = float(config.lost_after)
        if not 0 < self.unreachable_after < self.lost_after:
            raise ValueError(
                "unreachable_after must be positive and shorter than lost_after, got "
                f"{self.unreachable_after} and {self.lost_after}"
            )
        self._nodes: dict[str, _Node] = {}
        # Stored cordons of nodes not registered yet: node id -> drain.
        self._pending_cordons: dict[str, bool] = {}
        self._sessions = itertools.count(1)
        self._now = -math.inf

    # -- reads -----------------------------------------------------------------------

    def get(self, node_id: str) -> NodeRecord | None:
        node = self._nodes.get(node_id)
        return None if node is None else node.snapshot()

    def nodes(self) -> tuple[NodeRecord, ...]:
        """Every node, sorted by id."""
        return tuple(self._nodes[k].snapshot() for k in sorted(self._nodes))

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def next_deadline(self) -> float | None:
        """When the next timer transition is due (`expire` then changes something), or
        None when no node can change with time alone. Only :meth:`register` can make
        it earlier; the driving loop recomputes it after every call."""
        deadlines = [d for n in self._nodes.values() if (d := self._deadline(n)) is not None]
        return min(deadlines, default=None)

    # -- agent messages --------------------------------------------------------------

    def register(
        self,
        msg: Register,
        now: float,
        *,
        identity: str | None = None,
        peer: str | None = None,
    ) -> list[Event]:
        """A node's first message on a connection: new or returning (from any state, even
        lost), it becomes ready and everything known of it is replaced by the message.
        Its address is the registered one (:func:`~llmgw.control.addresses.registered_address`,
        from what it declares and `peer`, the address its connection comes from).

        Raises :class:`IdentityMismatch` when `identity` (the transport's verified peer
        identity) is given and is not the node id, :class:`InvalidRegistration` for an
        empty node id or an address it may not have."""
        info = msg.node
        node_id = info.node_id
        if not node_id:
            raise InvalidRegistration("a node registered without a node id")
        if identity is not None and identity != node_id:
            raise IdentityMismatch(node_id, identity)
        try:
            address = registered_address(info.address, peer, identity)
        except AddressRefused as exc:
            raise InvalidRegistration(str(exc)) from None
        if address != info.address:
            info = attrs.evolve(info, address=address)
        now = self._tick(now)
        session = next(self._sessions)
        shards = _latest_by_key(msg.shards)
        gpus = {g.index: g for g in info.gpus}
        node = self._nodes.get(node_id)
        events: list[Event] = []
        if node is None:
            drain = self._pending_cordons.pop(node_id, None)
            self._nodes[node_id] = _Node(
                info=info,
                state=NodeState.READY,
                since=now,
                last_heartbeat=now,
                session=session,
                identity=identity,
                gpus=gpus,
                shards=shards,
                cordoned=drain is not None,
                draining=bool(drain),
            )
            events.append(NodeRegistered(node_id, info, None, session))
            events.append(NodeReady(node_id, None))
            events.extend(_shard_diff(node_id, {}, shards))
            return events
        previous = node.state
        events.append(NodeRegistered(node_id, info, previous, session, node.connected))
        if previous is not NodeState.READY:
            node.state = NodeState.READY
            node.since = now
            events.append(NodeReady(node_id, previous))
        events.extend(_shard_diff(node_id, node.shards, shards))
        node.info = info
        node.last_heartbeat = now
        node.session = session
        node.identity = identity
        node.gpus = gpus
        node.shards = shards
        node.connected = True
        node.seq = None
        return events

    def heartbeat(
        self, node_id: str, msg: Heartbeat, now: float, *, session: int | None = None
    ) -> list[Event]:
        """Contact: refreshes the GPU readings and shard summaries; an unreachable node is
        ready again (and nothing else changes: its replicas kept serving).

        Raises :class:`ReregisterRequired` for an unknown, lost or disconnected node,
        :class:`StaleConnection` for a replaced session."""
        node = self._accepting(node_id, session)
        now = self._tick(now)
        events = self._contact(node, now)
        node.seq = msg.seq
        for reading in msg.gpus:
            gpu = node.gpus.get(reading.index)
            if gpu is None or (reading.uuid and gpu.uuid and reading.uuid != gpu.uuid):
                continue  # not a GPU the node registered: wait for its next registration
            node.gpus[reading.index] = attrs.evolve(
                gpu,
                memory_used=reading.memory_used,
                utilization=reading.utilization,
                ecc_errors=reading.ecc_errors,
            )
        for status in msg.shards:
            events.extend(self._record_shard(node, status, summary=True))
        return events

    def shard_status(
        self, node_id: str, status: ShardStatus, now: float, *, session: int | None = None
    ) -> list[Event]:
        """A shard's transition; also contact. Errors as for :meth:`heartbeat`."""
        node = self._accepting(node_id, session)
        now = self._tick(now)
        events = self._contact(node, now)
        events.extend(self._record_shard(node, status, summary=False))
        return events

    def disconnected(self, node_id: str, now: float, *, session: int | None = None) -> list[Event]:
        """The node's stream dropped. Only `connected` changes; the state follows time.
        A drop of a replaced session (or of an unknown node) is ignored."""
        self._tick(now)
        node = self._nodes.get(node_id)
        if node is None or not node.connected:
            return []
        if session is not None and session != node.session:
            return []
        node.connected = False
        return [NodeDisconnected(node_id, node.session)]

    # -- time ------------------------------------------------------------------------

    def expire(self, now: float) -> list[Event]:
        """Every timer transition due at `now`, in the order they fell due; then, beyond
        `max_lost` lost nodes, the longest lost are forgotten (:class:`NodeRemoved`)."""
        events = self._expire(now)
        if any(isinstance(e, NodeLost) for e in events):
            events.extend(self._forget_lost())
        return events

    def _forget_lost(self) -> list[Event]:
        """Forget the longest-lost nodes beyond `max_lost`: nodes that left must not hold
        memory forever (each new node id a plaintext agent makes up would stay). A
        forgotten node's cordon is kept for when it registers again."""
        lost = sorted(
            (n for n in self._nodes.values() if n.state is NodeState.LOST),
            key=lambda n: (n.since, n.info.node_id),
        )
        events: list[Event] = []
        for node in lost[: max(0, len(lost) - self.max_lost)]:
            node_id = node.info.node_id
            del self._nodes[node_id]
            if node.cordoned:
                self._pending_cordons[node_id] = node.draining
            events.append(NodeRemoved(node_id, NodeState.LOST))
        return events

    def _expire(self, now: float) -> list[Event]:
        now = self._tick(now)
        due: list[tuple[float, str, Event]] = []
        for node_id, node in self._nodes.items():
            while (deadline := self._deadline(node)) is not None and now >= deadline:
                silent = now - node.last_heartbeat
                event: Event
                if node.state is NodeState.READY:
                    node.state = NodeState.UNREACHABLE
                    event = NodeBecameUnreachable(node_id, deadline, silent)
                else:
                    node.state = NodeState.LOST
                    shards = tuple(node.shards[k] for k in sorted(node.shards))
                    node.shards = {}
                    event = NodeLost(node_id, deadline, silent, shards)
                node.since = deadline
                due.append((deadline, node_id, event))
        due.sort(key=lambda d: (d[0], d[1]))  # stable: a node's own order is kept
        return [event for _, _, event in due]

    # -- operator --------------------------------------------------------------------

    def cordon(self, node_id: str, on: bool, *, drain: bool = True) -> list[Event]:
        """Keep new shards off the node (or allow them again). The inventory only records
        `drain` (the reconciler moves a draining node's replicas); a cordon given again
        with the other `drain` changes it. Raises :class:`UnknownNode`."""
        node = self._known(node_id)
        draining = on and drain
        if node.cordoned == on and node.draining == draining:
            return []
        node.cordoned = on
        node.draining = draining
        return [NodeCordoned(node_id, on, draining)]

    def restore_cordon(self, node_id: str, *, drain: bool) -> list[Event]:
        """A cordon from the store: set now on a known node, else when it registers."""
        if node_id in self._nodes:
            return self.cordon(node_id, True, drain=drain)
        self._pending_cordons[node_id] = drain
        return []

    def stored_cordon(self, node_id: str) -> bool | None:
        """The drain flag of a restored cordon whose node has not registered, else None."""
        return self._pending_cordons.get(node_id)

    def drop_stored_cordon(self, node_id: str) -> bool:
        """Forget the restored cordon of a node that has not registered; False if none."""
        return self._pending_cordons.pop(node_id, None) is not None

    def remove(self, node_id: str) -> list[Event]:
        """Forget a node (decommissioned) and its cordon. If its agent is still connected,
        its next message is refused with :class:`ReregisterRequired` and it comes back as
        new."""
        node = self._known(node_id)
        del self._nodes[node_id]
        return [NodeRemoved(node_id, node.state)]

    # -- internals -------------------------------------------------------------------

    def _tick(self, now: float) -> float:
        if now > self._now:
            self._now = now
        return self._now

    def _deadline(self, node: _Node) -> float | None:
        if node.state is NodeState.READY:
            return node.last_heartbeat + self.unreachable_after
        if node.state is NodeState.UNREACHABLE:
            return node.last_heartbeat + self.lost_after
        return None

    def _known(self, node_id: str) -> _Node:
        node = self._nodes.get(node_id)
        if node is None:
            raise UnknownNode(node_id)
        return node

    def _accepting(self, node_id: str, session: int | None) -> _Node:
        node = self._nodes.get(node_id)
        if node is None:
            raise ReregisterRequired(node_id, "unknown")
        if session is not None and session != node.session:
            raise StaleConnection(node_id, session, node.session)
        if node.state is NodeState.LOST:
            raise ReregisterRequired(node_id, "lost")
        if not node.connected:
            raise ReregisterRequired(node_id, "disconnected")
        return node

    def _contact(self, node: _Node, now: float) -> list[Event]:
        node.last_heartbeat = now
        if node.state is NodeState.UNREACHABLE:
            node.state = NodeState.READY
            node.since = now
            return [NodeReady(node.info.node_id, NodeState.UNREACHABLE)]
        return []

    def _record_shard(self, node: _Node, status: ShardStatus, *, summary: bool) -> list[Event]:
        key = (status.replica_id, status.rank)
        old = node.shards.get(key)
        if old is not None:
            if status.epoch < old.epoch:
                return []  # fenced: a superseded placement's shard
            if summary and (status.epoch, status.state) == (old.epoch, old.state):
                return []  # nothing new, and the summary may lack the details
            if status == old:
                return []
        events: list[Event] = []
        if old is None and len(node.shards) >= MAX_SHARDS:
            # Bounded (reports name any replica ids they like): an ended shard makes
            # room, the one reported longest ago; with none ended the new one is not
            # recorded (more than MAX_SHARDS running on one node is no real node).
            ended = next(
                (k for k, v in node.shards.items() if v.state in _ENDED),
                None,
            )
            if ended is None:
                return []
            events.append(ShardChanged(node.info.node_id, *ended, node.shards.pop(ended), None))
        node.shards[key] = status
        events.append(ShardChanged(node.info.node_id, status.replica_id, status.rank, old, status))
        return events


_ENDED = (ShardState.STOPPED, ShardState.FAILED)


def _latest_by_key(statuses: Iterable[ShardStatus]) -> dict[ShardKey, ShardStatus]:
    """One status per (replica_id, rank): the highest epoch, the last one reported."""
    out: dict[ShardKey, ShardStatus] = {}
    for s in statuses:
        key = (s.replica_id, s.rank)
        if key not in out or s.epoch >= out[key].epoch:
            out[key] = s
    return out


def _shard_diff(
    node_id: str, old: Mapping[ShardKey, ShardStatus], new: Mapping[ShardKey, ShardStatus]
) -> list[Event]:
    return [
        ShardChanged(node_id, key[0], key[1], old.get(key), new.get(key))
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
    ]
