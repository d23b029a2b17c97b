"""`Controller`: the control plane's I/O edge around the pure inventory and reconciler.

It accepts agent connections from a transport, feeds what agents say into the
:class:`~llmgw.control.inventory.Inventory`, runs the
:class:`~llmgw.control.reconciler.Reconciler` every `control.interval` and after
every event, sends the commands it decides on, and publishes ready replicas to an
:class:`~llmgw.router.endpoints.EndpointSink` (the router). The router then talks
to engines directly: they keep serving while the control plane restarts.

After a start it waits one `settle` period before placing anything, so agents that
still run replicas can reconnect and have them adopted instead of duplicated; whole
replicas are adopted (and routed, and shown) as their agents arrive meanwhile.

The operator's cordons (and drains) are kept in the `store` when one is given
(:mod:`llmgw.control.cordons`): read back before the first agent is accepted, so a
node cordoned before a restart is cordoned when its agent reconnects. Without a store
they live in memory only.

With a :class:`~llmgw.control.leadership.Leadership` (several instances on one store)
it acts only while this instance leads: each term starts from nothing (a fresh
inventory and reconciler whose epochs carry the term's fencing token), adopts what
agents report as after a restart, and ends when the lease is lost, closing every
agent connection; meanwhile agents are refused with the leader's address, and no
command leaves once this instance's lease may have expired.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import trio

from llmgw.catalog.rules import Catalog
from llmgw.config import ControlConfig
from llmgw.control.activity import ActivityTracker
from llmgw.control.autoscale import ReplicaSample, initial
from llmgw.control.cordons import CordonChange, Cordons, CordonStore
from llmgw.control.inventory import (
    Event,
    InvalidRegistration,
    Inventory,
    InventoryError,
    NodeBecameUnreachable,
    NodeLost,
    NodeRemoved,
    UnknownNode,
)
from llmgw.control.leadership import Leadership, epoch_floor
from llmgw.control.placement import NodeCapacity
from llmgw.control.reconciler import Reconciler
from llmgw.control.replicas import Actions, NodeView, Published
from llmgw.control.scaler import DemandFeed, Scaler
from llmgw.domain.catalog import ModelConfig
from llmgw.domain.endpoints import Endpoint, EndpointSink
from llmgw.domain.fleet import NodeState, ReplicaState, ShardState
from llmgw.domain.wakes import ColdSide, Wakes
from llmgw.logs import fields
from llmgw.store.base import StoreError
from llmgw.transport import limits
from llmgw.transport.base import AgentConnection, AgentListener, ConnectionClosed
from llmgw.transport.limits import MAX_LOST_NODES, MAX_NAME
from llmgw.transport.messages import (
    CommandResult,
    DrainShard,
    Heartbeat,
    Refused,
    Register,
    Registered,
    ServerMessage,
    ShardStatus,
    StartShard,
    StopShard,
)

log = logging.getLogger("llmgw.control")

#: Of the output tail an agent reports with a failed engine, the lines logged.
LOGGED_TAIL = 20
#: The least settle period of a term (seconds): agents looking for a new leader retry
#: at least every 2 s (llmgw.agent.agent.SEARCH_BACKOFF), twice over and some.
TAKEOVER_SETTLE = 5.0


def _log_expired(event: Event) -> None:
    """A node that fell silent (Inventory.expire's events), as a readable line."""
    if isinstance(event, NodeBecameUnreachable):
        log.warning(
            "node %s unreachable: silent for %.1fs",
            event.node_id,
            event.silent_for,
            extra=fields(node_id=event.node_id, silent_for=round(event.silent_for, 3)),
        )
    elif isinstance(event, NodeLost):
        replicas = sorted({s.replica_id for s in event.shards})
        log.warning(
            "node %s lost: silent for %.1fs; its shards are gone%s",
            event.node_id,
            event.silent_for,
            f" (replicas {', '.join(replicas)})" if replicas else "",
            extra=fields(
                node_id=event.node_id, silent_for=round(event.silent_for, 3), replicas=replicas
            ),
        )
    elif isinstance(event, NodeRemoved):
        log.info(
            "forgetting node %s: more than %d nodes are lost, and it the longest",
            event.node_id,
            MAX_LOST_NODES,
            extra=fields(node_id=event.node_id),
        )
    else:  # pragma: no cover - expire makes only the three above
        log.warning("node %s: %s", getattr(event, "node_id", "?"), type(event).__name__)


def _log_failed(node_id: str, status: ShardStatus) -> None:
    """An engine that exited or failed to start, as its agent reported it: what the
    agent said and the end of the engine's output."""
    tail = list(status.output_tail[-LOGGED_TAIL:])
    log.warning(
        "replica %s of %s (rank %d) on node %s failed: %s",
        status.replica_id,
        status.model or "?",
        status.rank,
        node_id,
        status.message or "no reason given",
        extra=fields(
            node_id=node_id,
            replica_id=status.replica_id,
            model=status.model or None,
            rank=status.rank,
            epoch=status.epoch,
            exit_code=status.exit_code,
            output_tail=tail,
        ),
    )


OUTBOX_SIZE = 1024
# Between two event-driven passes: at least this long, and this many times the
# previous pass's duration (so passes use at most ~1/(1+PASS_SPACING) of the loop).
MIN_PASS_GAP = 0.02
PASS_SPACING = 4.0

#: The kinds of command the controller sends agents, as `Controller.commands` counts them.
COMMAND_KINDS = ("start", "drain", "stop")
_COMMAND_KIND: dict[type, str] = {StartShard: "start", DrainShard: "drain", StopShard: "stop"}


async def _send_all(
    conn: AgentConnection, pending: trio.MemoryReceiveChannel[ServerMessage]
) -> None:
    async with pending:
        async for message in pending:
            await conn.send(message)


class ProtocolViolation(Exception):
    """An agent broke the protocol (e.g. did not register first)."""


class NodeInUse(InventoryError):
    """A node the operator asked to forget is not gone: its agent is connected, or
    replicas are still placed on it."""


class Controller:
    def __init__(
        self,
        control: ControlConfig,
        catalog: Catalog,
        sink: EndpointSink,
        *,
        heartbeat_interval: float = 5.0,
        settle: float | None = None,
        clock: Callable[[], float] = trio.current_time,
        store: CordonStore | None = None,
        demand: DemandFeed | None = None,
        last_request: Callable[[str], float | None] | None = None,
        activity: ActivityTracker | None = None,
        wakes: Wakes | None = None,
        cold: ColdSide | None = None,
        leadership: Leadership | None = None,
        inventory: Inventory | None = None,
        reconciler: Reconciler | None = None,
    ) -> None:
        """Replicas the reconciler makes ready, drains and stops go to `sink`.
        Autoscaled models' counts follow `demand` (the data plane's) and idleness
        `last_request` (default: the last request `activity` saw); requests waiting
        for a model at zero are taken from `wakes`, and after every pass `cold` hears
        why any model cannot be placed (llmgw.router.coldstart). `activity` is what
        the data plane's usage records feed (default: a fresh one, fed by nothing).
        `inventory` and `reconciler` are where it starts (default: empty ones); a
        leader's every term starts from empty ones (llmgw.control.leadership)."""
        self.control = control
        self.store = store
        self.cordons = Cordons(store)
        self.catalog = catalog
        self.sink = sink
        self.heartbeat_interval = heartbeat_interval
        # Long enough for every agent that survived a server restart to reconnect.
        self.settle = 2 * heartbeat_interval if settle is None else settle
        self.clock = clock
        self.inventory = inventory or Inventory(control)
        self.activity = activity or ActivityTracker(clock=clock)
        # Autoscaled models' counts follow the router's demand (llmgw.control.autoscale),
        # and idleness the last request for each (the fleet's, when instances share a
        # store: llmgw.control.instances).
        self.demand = demand
        self.last_request = last_request or (lambda name: self.activity.get(name).last_request)
        self.wakes = wakes
        self.cold = cold
        self.scaler = Scaler()
        # Epochs start from the wall clock, so a restarted server's new placements can
        # never be mistaken for its predecessor's (agents may report those late).
        # An earlier run's multi-node replica waits as long for its ranks to be adopted.
        self.reconciler = reconciler or Reconciler(
            control, first_epoch=int(time.time() * 1000), adopt_wait=self.settle
        )
        self.epoch = secrets.token_hex(4)  # tells agents the server restarted
        self.leadership = leadership
        # This term's fencing token (0: one server, no terms) and whether agents are
        # accepted (from the start of a term, once cordons are read back).
        self.token = 0
        self._accepting = leadership is None
        self._term_connections: set[trio.CancelScope] = set()
        self._outboxes: dict[str, trio.MemorySendChannel[ServerMessage]] = {}
        # What the sink was last given (_route): the replicas serving, and those
        # drained there that have not gone yet.
        self._routed: dict[str, Published] = {}
        self._drained: set[str] = set()
        self._wake = trio.Event()
        self._settled = False
        self.started_at: float | None = None
        # What it decided, as counts an operator can watch (the fleet metrics): passes
        # run, and commands issued by kind (counted whether or not they could be sent).
        # Counts that stay put over passes and heartbeats say it chose to do nothing.
        self.passes = 0
        self._passed = trio.Event()  # set at the end of each pass, then replaced
        self.commands: dict[str, int] = dict.fromkeys(COMMAND_KINDS, 0)

    # -- the catalog ---------------------------------------------------------------

    def set_catalog(self, catalog: Catalog) -> None:
        """Swap the whole catalog at once; the reconciler acts on it right away."""
        self.catalog = catalog
        self.poke()

    def drain_node(self, node_id: str, *, on: bool = True) -> CordonChange:
        """Cordon a node (no new shards) and move its replicas elsewhere, each one
        drained only once its replacement is ready; `on=False` uncordons it. Raises
        UnknownNode. Returns the store write, queued (see :meth:`cordon_node`)."""
        return self.cordon_node(node_id, on, drain=True)

    def cordon_node(self, node_id: str, on: bool = True, *, drain: bool = False) -> CordonChange:
        """Cordon a node (no new shards), with `drain` moving its replicas elsewhere too;
        `on=False` uncordons it (new shards may go there again). Uncordoning a draining
        node stops the drain: its replicas count again, so replacements not yet needed
        are scaled down (those still starting first); replicas already drained stay
        gone. Raises UnknownNode. Applies now; the store write is queued: await
        :meth:`persisted` with what this returns to know it is stored."""
        self._changed(self.inventory.cordon(node_id, on, drain=drain))
        return self.cordons.queue(node_id, drain if on else None)

    def forget_node(self, node_id: str) -> CordonChange:
        """Remove a node that is gone from the inventory (and its cordon). Refused with
        :class:`NodeInUse` while its agent is connected and the node is not lost (it
        would only register again) or while replicas are placed on it (an unreachable
        node not lost yet: forgetting it would drop replicas that may still serve).
        A node that has not registered since a restart but has a stored cordon loses
        that cordon. Raises UnknownNode."""
        if node_id not in self.inventory and self.inventory.drop_stored_cordon(node_id):
            return self.cordons.queue(node_id, None)
        refusal = self.forget_refusal(node_id)
        if refusal is not None:
            raise NodeInUse(refusal)
        self._changed(self.inventory.remove(node_id))
        return self.cordons.queue(node_id, None)

    def forget_refusal(self, node_id: str) -> str | None:
        """Why :meth:`forget_node` would refuse `node_id` now, or None. Raises
        UnknownNode."""
        record = self.inventory.get(node_id)
        if record is None:
            raise UnknownNode(node_id)
        # A lost node's stream may still be open (a hung agent): its next message is
        # refused anyway, so only a live connection is a reason to refuse.
        if record.connected and record.state is not NodeState.LOST:
            return (
                f"node {node_id!r} is connected: stop its agent first (a connected agent "
                "would only register again); drain it to move its replicas"
            )
        holding = sorted(
            r.placement.replica_id
            for r in self.reconciler.replicas.values()
            if r.state is not ReplicaState.STOPPED and node_id in r.placement.nodes
        )
        if holding:
            return (
                f"node {node_id!r} still holds replicas {', '.join(holding)} (it is "
                f"{record.state.value}, not lost): wait until it is lost "
                "(control.lost_after) or drain it first"
            )
        return None

    async def persisted(self, change: CordonChange) -> StoreError | None:
        """Wait until `change` is in the store (at once without one); the
        :class:`~llmgw.store.base.StoreError` it failed with, else None. The change is
        made either way: only a restart would undo a failed one."""
        return await self.cordons.persisted(change)

    def deployable(self) -> list[ModelConfig]:
        return [m for m in self.catalog.models if m.profiles]

    def desired(self, model: ModelConfig) -> int:
        """The count the reconciler is to reach: `replicas`, or for an autoscaled
        model the autoscaler's last decision (its initial count before the first)."""
        if model.autoscale is None:
            return model.replicas
        decision = self.scaler.decided(model.name)
        return initial(model) if decision is None else decision.desired

    # -- running -------------------------------------------------------------------

    @property
    def settled(self) -> bool:
        """Whether the settle period after the start (or the term's) is over: what
        agents run has been adopted and placement has begun."""
        return self._settled

    def poke(self) -> None:
        """Reconcile soon (an event happened)."""
        self._wake.set()

    async def next_pass(self) -> None:
        """Wait for the end of a pass that starts after this call (a pass runs without
        a checkpoint: one that ends after the call began after it)."""
        await self._passed.wait()

    def _changed(self, events: Sequence[Event]) -> None:
        """The inventory changed (`events` say how): all they are for is waking the
        loop, since every pass re-derives from the inventory itself."""
        if events:
            self.poke()

    # -- cold starts (llmgw.domain.wakes) ----------------------------------------------

    def wake(self, model: str) -> None:
        """A request waits for `model`, which has no replica serving: the autoscaler
        sees a request now (its wake rule) and a pass runs soon."""
        self.activity.seen(model)
        self.poke()

    def unplaceable(self, model: str) -> str | None:
        """Why `model` cannot be placed, while nothing of it is starting or ready."""
        why = self.reconciler.unplaced.get(model)
        if not why:
            return None
        live = (ReplicaState.STARTING, ReplicaState.READY)
        if any(r.model == model and r.state in live for r in self.reconciler.replicas.values()):
            return None
        return why[0].summary

    async def run(
        self,
        listener: AgentListener,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        self.started_at = self.clock()
        if self.leadership is None and self.store is not None:
            await self.cordons.restore(self.inventory)  # before any agent registers
        async with trio.open_nursery() as nursery:
            if self.store is not None:
                nursery.start_soon(self.cordons.run)
            if self.wakes is not None:
                nursery.start_soon(self._take_wakes, self.wakes)
            await nursery.start(listener.serve, self._serve_agent)
            task_status.started()
            if self.leadership is None:
                nursery.start_soon(self._expiry_loop)
                nursery.start_soon(self._reconcile_loop)
                return
            while True:
                await self._term(await self.leadership.wait_leading())

    async def _take_wakes(self, wakes: Wakes) -> None:
        while True:
            for model in await wakes.taken():
                self.wake(model)

    async def _term(self, token: int) -> None:
        """Lead from a fresh start until the lease is lost (module docstring)."""
        assert self.leadership is not None
        self.token = token
        self.started_at = self.clock()
        self.inventory = Inventory(self.control)
        self.scaler = Scaler()
        self.reconciler = Reconciler(
            self.control,
            first_epoch=max(int(time.time() * 1000), epoch_floor(token)),
            adopt_wait=self.settle,
        )
        # The term's sink starts from nothing too (llmgw.control.instances).
        self._routed, self._drained = {}, set()
        self._settled = False
        self.epoch = secrets.token_hex(4)
        if self.store is not None:
            await self.cordons.restore(self.inventory)
        self._accepting = True
        try:
            async with trio.open_nursery() as term:
                term.start_soon(self._expiry_loop)
                term.start_soon(self._reconcile_loop)
                term.start_soon(self._keepalive)
                await self.leadership.wait_not_leading()
                term.cancel_scope.cancel()
        finally:
            self._accepting = False
            for scope in list(self._term_connections):
                scope.cancel()  # agents go to the next leader
            self._term_connections.clear()
            # What this term knew is the next leader's to find out: a follower shows
            # no fleet of its own.
            self.inventory = Inventory(self.control)
            self.reconciler = Reconciler(self.control, first_epoch=epoch_floor(token + 1))
            self._settled = False

    async def _keepalive(self) -> None:
        """Registered again every heartbeat interval: agents of a leader that falls
        silent (paused, cut off) hear nothing and go elsewhere."""
        while True:
            await trio.sleep(self.heartbeat_interval)
            registered = Registered(self.heartbeat_interval, self.epoch, self.token)
            for outbox in list(self._outboxes.values()):
                with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
                    outbox.send_nowait(registered)

    async def _reconcile_loop(self) -> None:
        # A term after a takeover waits for agents still looking for the new leader
        # (they retry every agent.SEARCH_BACKOFF at most): adopted, not placed again.
        settle = self.settle if self.leadership is None else max(self.settle, TAKEOVER_SETTLE)
        with trio.move_on_after(settle):
            while True:  # adopt as agents arrive (the views show them), place nothing yet
                await self._wake.wait()
                self._wake = trio.Event()
                self._adopt()
                self._route()
        self._adopt(quiet=False)
        self._catch_up()
        self._settled = True
        if self.leadership is not None:
            self.leadership.mark_settled(self.token)
        while True:
            started = trio.current_time()
            self.reconcile()
            spent = trio.current_time() - started
            with trio.move_on_after(self.control.interval):
                await self._wake.wait()
            # Coalesce bursts: events keep arriving (a thousand agents reconnecting),
            # but a pass runs at most every PASS_SPACING x its own duration, so passes
            # take a bounded share of the loop and registrations are not starved
            # (one pass per event made a reconnect storm outlast lost_after).
            await trio.sleep(max(MIN_PASS_GAP, PASS_SPACING * spent))
            self._wake = trio.Event()

    async def _expiry_loop(self) -> None:
        while True:
            deadline = self.inventory.next_deadline()
            if deadline is None:
                await trio.sleep(self.control.unreachable_after)
            else:
                await trio.sleep_until(max(deadline, trio.current_time()))
            events = self.inventory.expire(self.clock())
            for event in events:
                _log_expired(event)
            self._changed(events)

    def reconcile(self) -> None:
        """One reconciler pass with the current inventory; carries out its actions."""
        now = self.clock()
        models = self.deployable()
        self._apply(self.reconciler.step(now, models, self._views(), self._scale(models, now)))
        self._route()
        self.passes += 1
        self._passed.set()
        self._passed = trio.Event()
        if self.cold is not None:
            self.cold.check(self.unplaceable)

    def _scale(self, models: list[ModelConfig], now: float) -> dict[str, int]:
        """The autoscaled models' desired counts now (one demand sample each)."""
        replicas: dict[str, list[ReplicaSample]] = {}
        for r in self.reconciler.replicas.values():
            if r.state is not ReplicaState.STOPPED:
                replicas.setdefault(r.model, []).append(ReplicaSample(r.state, r.since))
        return self.scaler.step(
            models,
            now,
            demand=self.demand,
            last_request=self.last_request,
            replicas=replicas,
        )

    def _views(self) -> list[NodeView]:
        """The inventory's nodes as the reconciler reads them."""
        return [
            NodeView(
                record.node_id,
                record.state,
                NodeCapacity.from_info(
                    record.info, record.state, since=record.since, cordoned=record.cordoned
                ),
                drain=record.draining,
                address=record.info.address,
                shards=record.shards,
            )
            for record in self.inventory.nodes()
        ]

    def _adopt(self, *, quiet: bool = True) -> None:
        """Adopt what agents run of an earlier server run (Reconciler.adopt_reported),
        as the settle period does before any pass."""
        now = self.clock()
        self._apply(
            self.reconciler.adopt_reported(now, self.deployable(), self._views(), quiet=quiet)
        )

    def _catch_up(self) -> None:
        """At the end of the settle period: what agents reported meanwhile about the
        replicas adopted during it (a shard that failed, a node that registered again
        without one), which was only recorded in the inventory."""
        now = self.clock()
        for record in self.inventory.nodes():
            if record.state is NodeState.LOST:
                continue
            for status in record.shards:
                if status.replica_id in self.reconciler.replicas:
                    self._apply(self.reconciler.shard_reported(record.node_id, status, now))
            self._apply(self.reconciler.node_reported(record.node_id, record.shards, now))

    def _report_shards(
        self, node_id: str, statuses: Iterable[ShardStatus], now: float, *, whole: bool = False
    ) -> None:
        """Hand shard reports to the reconciler, but those of an earlier run's replicas
        it does not hold: the pass adopts or stops them, from the inventory. `whole`:
        the node's every shard (a registration; a heartbeat's summary need not be
        whole), so a shard the reconciler has heard run there that is missing is lost
        (Reconciler.node_reported)."""
        statuses = list(statuses)
        for status in statuses:
            if status.replica_id in self.reconciler.replicas or self.reconciler.minted(
                status.epoch
            ):
                self._apply(self.reconciler.shard_reported(node_id, status, now))
        if whole:
            # The registration itself wakes the loop, which places the lost ones again.
            self._apply(self.reconciler.node_reported(node_id, statuses, now))

    # -- agents --------------------------------------------------------------------

    async def _serve_agent(self, conn: AgentConnection) -> None:
        first = await conn.receive()
        if not isinstance(first, Register):
            raise ProtocolViolation(f"expected register first, got {type(first).__name__}")
        if not self._accepting:
            leader = self.leadership.current_leader() if self.leadership is not None else None
            hint = leader.agent_address if leader is not None and leader.token else ""
            await conn.send(Refused("this server does not lead the control plane", hint))
            return
        with trio.CancelScope() as scope:
            self._term_connections.add(scope)
            try:
                await self._serve_registered(conn, first)
            finally:
                self._term_connections.discard(scope)

    async def _serve_registered(self, conn: AgentConnection, first: Register) -> None:
        node_id = first.node.node_id
        now = self.clock()
        try:
            if (found := limits.problem(first)) is not None:
                raise InvalidRegistration(f"over the agent protocol's bounds: {found}")
            registered = self.inventory.register(
                first, now, identity=conn.peer_identity, peer=conn.peer_address
            )
        except InventoryError as exc:
            shown = node_id[:MAX_NAME]  # it may be over the bounds
            log.warning("refused registration of %r: %s", shown, exc)
            await conn.send(Refused(f"registration of {shown!r} refused: {exc}"))
            return  # the listener closes the connection
        record = self.inventory.get(node_id)
        session = record.session if record is not None else None
        address = record.info.address if record is not None else first.node.address
        log.info("node %s registered with %d GPUs at %s", node_id, len(first.node.gpus), address)
        if conn.peer_identity is not None and conn.peer_address not in (None, address):
            # Taken on its certificate's word (llmgw.control.addresses): said once.
            log.info(
                "node %s: address %s is not %s, where it connects from",
                node_id,
                address,
                conn.peer_address,
            )
        # Commands go through an outbox per connection, so the reconciler (which runs
        # synchronously) never waits on a slow agent; the sender task drains it.
        outbox, pending = trio.open_memory_channel[ServerMessage](OUTBOX_SIZE)
        previous = self._outboxes.get(node_id)
        if previous is not None:
            previous.close()  # a newer connection of the same node wins
        self._outboxes[node_id] = outbox
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_send_all, conn, pending)
                outbox.send_nowait(Registered(self.heartbeat_interval, self.epoch, self.token))
                if self._settled:
                    self._report_shards(node_id, first.shards, now, whole=True)
                self._changed(registered)
                try:
                    while True:
                        message = await conn.receive()
                        self._on_message(node_id, session, message)
                except ConnectionClosed:
                    log.info("node %s: connection closed", node_id)
                except (InventoryError, ProtocolViolation) as exc:
                    # Ends this connection only; the agent reconnects and registers anew.
                    log.warning("node %s: %s; closing its connection", node_id, exc)
                nursery.cancel_scope.cancel()
        finally:
            if self._outboxes.get(node_id) is outbox:
                del self._outboxes[node_id]
                self._changed(self.inventory.disconnected(node_id, self.clock(), session=session))

    def _on_message(self, node_id: str, session: int | None, message: Any) -> None:
        if (found := limits.problem(message)) is not None:
            raise ProtocolViolation(f"a message over the agent protocol's bounds: {found}")
        now = self.clock()
        if isinstance(message, Heartbeat):
            events = self.inventory.heartbeat(node_id, message, now, session=session)
            if self._settled:
                self._report_shards(node_id, message.shards, now)
            self._changed(events)
        elif isinstance(message, ShardStatus):
            if message.state is ShardState.FAILED:
                _log_failed(node_id, message)
            events = self.inventory.shard_status(node_id, message, now, session=session)
            if self._settled:
                self._report_shards(node_id, (message,), now)
            self._changed(events)
        elif isinstance(message, CommandResult):
            if not message.ok:
                log.warning(
                    "node %s: command %s failed: %s", node_id, message.command_id, message.message
                )
        else:
            raise ProtocolViolation(f"unexpected {type(message).__name__} from {node_id}")

    def _leading(self) -> bool:
        """Whether anything may leave: without the lease another instance may lead
        now, and the next leader decides anew from what agents report."""
        return self.leadership is None or self.leadership.leading()

    def _route(self) -> None:
        """Bring the sink to what the replicas say now (Reconciler.routes), applying
        only the difference from what was last applied: after a pass that changed
        nothing, nothing reaches the router."""
        if not self._leading():
            return
        routes = self.reconciler.routes()
        for replica_id, p in routes.serving.items():
            if self._routed.get(replica_id) == p:
                continue
            if replica_id not in self._routed:
                log.info("replica %s of %s ready at %s", replica_id, p.model, p.url)
            endpoint = Endpoint(
                replica_id,
                p.url,
                (p.model,),
                capacity=p.capacity,
                headers=p.headers,
                sleep_after=p.sleep_after,
            )
            self.sink.upsert(endpoint)
        applied = self._routed.keys() | self._drained
        for replica_id in sorted(applied - routes.serving.keys()):
            if replica_id not in routes.draining:
                self.sink.remove(replica_id)
            elif replica_id not in self._drained:
                self.sink.drain(replica_id)  # requests in flight finish
        self._routed = dict(routes.serving)
        self._drained = set(routes.draining & applied)

    def _apply(self, actions: Actions) -> None:
        if not self._leading():
            if actions.commands:
                log.warning("not leading any more: %d commands not sent", len(actions.commands))
            return
        for command in actions.commands:
            self.commands[_COMMAND_KIND[type(command.message)]] += 1
            outbox = self._outboxes.get(command.node_id)
            try:
                if outbox is None:
                    raise trio.ClosedResourceError
                outbox.send_nowait(command.message)
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                # Not lost for good: the reconciler sends a command again while the
                # agent's reports disagree with it (Reconciler._resend).
                log.warning(
                    "node %s unreachable: %s not sent",
                    command.node_id,
                    type(command.message).__name__,
                )
