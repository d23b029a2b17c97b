"""The reconciler: desired replicas (the catalog, or the autoscaler) against actual
ones, and what to do.

Level-triggered and free of I/O: the controller calls :meth:`Reconciler.step` every
`control.interval` and after every event, and :meth:`Reconciler.shard_reported`
for each shard status, passing `now`. Each returns :class:`Actions` (commands for
agents), which the controller sends. What the router should hold is derived, not
announced: :meth:`Reconciler.routes` says it from the replicas as they are (the
ready ones serve, the drained ones that served drain), and after every pass the
controller applies the difference from what it last applied. Each pass first adopts
the whole replicas of an earlier run that nodes report (:meth:`Reconciler.adopt_reported`,
reading the inventory's shards through :class:`~llmgw.control.replicas.NodeView`).

Shard state is still kept twice (issue #35): the inventory's record of what each node
reports is what adoption reads, while a replica's own ranks are judged from the
reports handed to :meth:`Reconciler.shard_reported` and :meth:`Reconciler.node_reported`
and kept in ``Replica.shards``. That record is also the memory the transitions need
(a failure counted once, a rank heard running that a registration no longer
lists); reading ranks from the views instead means re-deriving those in the pass,
and stopping mis-fenced shards at most once per interval, as
:class:`~llmgw.control.adoption.Strays` does for an earlier run's.

Replica lifecycle::

    (placed) starting --all shards ready--> ready --surplus/removed--> draining --> stopped
        \\--any shard failed / node lost--> failed (model backs off)

A replica is published at the server's URL for it: its head node's registered address
and the port placement gave it (:mod:`llmgw.control.addresses`); a ready report naming
another URL is refused, and the replica stopped as a failed start.

A failed start backs the model off, doubling from `control.base_backoff` to
`control.max_backoff`; a replica reaching ready resets it. Surplus replicas are
drained (no new requests, in-flight ones finish) before they stop. Replicas on an
unreachable node keep serving; on a lost node they are dropped and placed again, and
so is a replica one of whose shards its node stops reporting
(:meth:`Reconciler.node_reported`): what a node does not report it does not run.

Fencing
-------
Every placement gets a new epoch (replica ids are ``{model}-r{epoch}``), counted up
from `first_epoch`. :meth:`Reconciler.shard_reported` accepts a shard only when the
reconciler holds its replica with the same epoch, has that rank on the reporting
node, and (when the status names one) serves the same model. Any other shard that
still runs (starting, ready, draining) is stopped: an unknown or removed replica, an
older or newer epoch, a rank placed elsewhere or not at all. One that already failed
or stopped has nothing to stop and is ignored.

So a node that comes back after being lost, still running a replica that was placed
again elsewhere meanwhile, has that shard stopped: the reconciler dropped the replica
and never takes back an epoch it gave out (:meth:`Reconciler.minted`). It adopts only
replicas of an earlier server run (:meth:`Reconciler.adopt`), whose epochs are below
`first_epoch` (the controller starts epochs from the wall clock in milliseconds).
"""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence

import attrs

from llmgw.config import ControlConfig
from llmgw.control.addresses import engine_url, same_url
from llmgw.control.adoption import LIVE_SHARD_STATES, Strays, placement_from_reports, unheld
from llmgw.control.durations import Durations
from llmgw.control.placement import (
    HintCode,
    NodeCapacity,
    PlaceRequest,
    PlanResult,
    Unplaceable,
    plan,
)
from llmgw.control.replicas import (
    Actions,
    Command,
    NodeView,
    Published,
    Replica,
    ReplicaInfo,
    Routes,
)
from llmgw.domain.catalog import ModelConfig
from llmgw.domain.engines import ENGINES
from llmgw.domain.fleet import (
    EngineExit,
    NodeState,
    Placement,
    ReplicaState,
    ShardState,
    StartFailure,
)
from llmgw.transport.messages import (
    DrainShard,
    ShardStatus,
    StartShard,
    StopShard,
)

log = logging.getLogger("llmgw.control")

#: Replicas moved to make room at one time (Reconciler._make_room): one, so that a
#: pass never reshuffles the fleet and each move is seen through before the next.
MOVES_AT_ONCE = 1
#: A port a node reported held by another process is not given out there for this
#: long (seconds); then it is tried again, as that process may have gone.
REFUSED_PORT_TTL = 600.0
#: A command whose agent has not reported the state it asks for is sent again after
#: the longer of this and `control.interval` (seconds): long enough for the agent's
#: answer to come back, short enough that a lost command costs seconds, not the
#: start timeout.
RESEND_AFTER = 1.0


@attrs.define
class _Backoff:
    failures: int = 0
    until: float = 0.0


class Reconciler:
    def __init__(
        self,
        control: ControlConfig,
        *,
        mgmt_interface: str | None = None,
        first_epoch: int = 1,
        adopt_wait: float = 0.0,
    ) -> None:
        """`adopt_wait`: how long a reported shard of an earlier run's multi-node
        replica waits for its other ranks to be reported before it is stopped."""
        self.control = control
        self.mgmt_interface = mgmt_interface or control.mgmt_interface
        self.replicas: dict[str, Replica] = {}
        self.unplaced: dict[str, tuple[Unplaceable, ...]] = {}
        self._backoff: dict[str, _Backoff] = {}
        # Since this reconciler started, by (model, reason): the fleet metrics' counters.
        self.start_failures: collections.Counter[tuple[str, StartFailure]] = collections.Counter()
        self.engine_exits: collections.Counter[tuple[str, EngineExit]] = collections.Counter()
        # Seconds from placement to ready of the replicas that got there, by model and
        # whether it was a cold start (llmgw_fleet_replica_start_seconds).
        self.starts: dict[tuple[str, bool], Durations] = {}
        # Replicas being moved to make room (replica id -> the model it makes room
        # for): they stop counting, a replacement is placed elsewhere, and they drain
        # once it is ready, as on a draining node (make before break).
        self.evicting: dict[str, str] = {}
        self.moves = 0  # moves begun since this reconciler started
        # Ports nodes reported held by another process: node id -> port -> when.
        self.refused_ports: dict[str, dict[int, float]] = {}
        self.resent = 0  # commands sent again since this reconciler started
        self.refused_urls = 0  # ready reports refused for naming another engine URL
        self.first_epoch = first_epoch
        self._strays = Strays(adopt_wait, max(RESEND_AFTER, control.interval))
        self._epochs = itertools.count(first_epoch)
        self._commands = itertools.count(1)

    # -- queries ------------------------------------------------------------------

    def snapshot(self) -> tuple[ReplicaInfo, ...]:
        """Every replica now, as frozen values (what the views read)."""
        return tuple(
            ReplicaInfo(
                r.placement,
                r.state,
                r.since,
                r.url,
                tuple((rank, s.state) for rank, s in sorted(r.shards.items())),
            )
            for r in self.replicas.values()
        )

    def routes(self) -> Routes:
        """What the router is to hold now, derived from the replicas (see Routes): a
        replica has a URL from the moment it is ready, so a draining one with a URL is
        one that served."""
        serving: dict[str, Published] = {}
        draining: set[str] = set()
        for r in self.replicas.values():
            if r.url is None:
                continue
            if r.state is ReplicaState.READY:
                serving[r.replica_id] = Published(
                    r.replica_id, r.model, r.url, r.capacity, r.headers, r.sleep_after
                )
            elif r.state is ReplicaState.DRAINING:
                draining.add(r.replica_id)
        return Routes(serving, frozenset(draining))

    def active(self, model: str) -> list[Replica]:
        """Replicas that count towards the model's desired number."""
        return [
            r
            for r in self.replicas.values()
            if r.model == model and r.state in (ReplicaState.STARTING, ReplicaState.READY)
        ]

    def minted(self, epoch: int) -> bool:
        """Whether `epoch` is this reconciler's to give out. A replica of such an epoch
        that it no longer holds was dropped (its node lost, it failed or it stopped) and
        is never adopted back: its shards are stale."""
        return epoch >= self.first_epoch

    def backoff_until(self, model: str) -> float | None:
        b = self._backoff.get(model)
        return b.until if b and b.failures else None

    def failed_starts(self, model: str) -> int:
        """Starts of `model` that failed since one of its replicas was last ready."""
        b = self._backoff.get(model)
        return b.failures if b else 0

    # -- the pass -------------------------------------------------------------------

    def leaving(self, placement: Placement, draining: Collection[str]) -> bool:
        """Whether the replica placed as `placement` is being moved (evicted, or on a
        node in `draining`): it serves until its replacement is ready, but no longer
        counts."""
        return placement.replica_id in self.evicting or any(n in draining for n in placement.nodes)

    def step(
        self,
        now: float,
        models: Sequence[ModelConfig],
        nodes: Sequence[NodeView],
        desired: Mapping[str, int] | None = None,
    ) -> Actions:
        """One pass. A model's desired count is its `replicas`, or its entry in
        `desired` (the autoscaler's decision, for models that have one)."""
        # What nodes run that this reconciler does not hold: adopted, else stopped below.
        actions = self.adopt_reported(now, models, nodes)
        desired = desired or {}
        by_node = {n.node_id: n for n in nodes}
        # Replicas on lost nodes are gone: unroute them and place them again.
        for replica in list(self.replicas.values()):
            lost = [
                n
                for n in replica.placement.nodes
                if n not in by_node or by_node[n].state is NodeState.LOST
            ]
            if lost and replica.state is not ReplicaState.STOPPED:
                actions += self._drop(replica, f"node {lost[0]} lost", failed=False, now=now)

        # Replicas that never came up within start_timeout failed to start.
        for replica in list(self.replicas.values()):
            if (
                replica.state is ReplicaState.STARTING
                and now - replica.since > self.control.start_timeout
            ):
                self.start_failures[replica.model, StartFailure.TIMED_OUT] += 1
                actions += self._drop(replica, "start timed out", failed=True, now=now)

        wanted = {m.name: m for m in models if m.profiles}
        cordoned = {n.node_id for n in nodes if n.capacity.cordoned and n.drain}
        # A move ends when its replica drains, stops or is dropped.
        self.evicting = {
            r: m
            for r, m in self.evicting.items()
            if r in self.replicas
            and self.replicas[r].state in (ReplicaState.STARTING, ReplicaState.READY)
        }
        requests: list[PlaceRequest] = []
        # Active replicas by model, once per pass (per-model scans were O(models x
        # replicas) and most of a steady pass).
        active_by_model: dict[str, list[Replica]] = {}
        for replica in self.replicas.values():
            if replica.state in (ReplicaState.STARTING, ReplicaState.READY):
                active_by_model.setdefault(replica.model, []).append(replica)
        for model in wanted.values():
            count = desired.get(model.name, model.replicas)
            # Make before break: replicas on draining nodes keep serving but no longer
            # count, so replacements are placed elsewhere; they drain once enough
            # replacements are ready.
            active: list[Replica] = []
            moving: list[Replica] = []
            for replica in active_by_model.get(model.name, ()):
                (moving if self.leaving(replica.placement, cordoned) else active).append(replica)
            ready_elsewhere = sum(r.state is ReplicaState.READY for r in active)
            surplus_moving = len(moving) if ready_elsewhere >= count else 0
            for replica in moving[:surplus_moving]:
                actions += self._drain(replica, now)
            if len(active) >= count:
                self.unplaced.pop(model.name, None)  # nothing is missing any more
            if len(active) > count:
                actions += self._scale_down(active, len(active) - count, now)
            elif len(active) < count:
                if (until := self.backoff_until(model.name)) is not None and now < until:
                    continue
                for _ in range(count - len(active)):
                    epoch = next(self._epochs)
                    requests.append(
                        PlaceRequest(
                            model=model.name,
                            replica_id=f"{model.name}-r{epoch}",
                            epoch=epoch,
                            profiles=model.profiles,
                        )
                    )
        for replica in list(self.replicas.values()):
            if replica.model not in wanted and replica.state in (
                ReplicaState.STARTING,
                ReplicaState.READY,
            ):
                actions += self._drain(replica, now)

        self.unplaced = {m: u for m, u in self.unplaced.items() if m in wanted}
        if requests:
            result = plan(
                [self._capacity(n, now) for n in nodes],
                requests,
                [r.placement for r in self.replicas.values()],
                self.control.port_range,
                now,
                policy=self.control.placement,
            )
            placed_models = {p.model for p in result.placed}
            for placement in result.placed:
                actions += self._start(placement, wanted[placement.model], by_node, now)
            unplaced: dict[str, list[Unplaceable]] = {}
            for u in result.unplaced:
                unplaced.setdefault(u.request.model, []).append(u)
            for model_name in {r.model for r in requests}:
                if model_name in unplaced:
                    self.unplaced[model_name] = tuple(unplaced[model_name])
                elif model_name in placed_models:
                    self.unplaced.pop(model_name, None)
            # A move whose replacement found no place after all (the fleet changed
            # since it began) is called off: the replica counts and serves again.
            self.evicting = {
                r: m
                for r, m in self.evicting.items()
                if r in self.replicas and self.replicas[r].model not in unplaced
            }
            self._make_room(result, wanted, now)
        return actions + self._stop_strays(now, nodes) + self._resend(now, by_node)

    # -- adoption (llmgw.control.adoption) ------------------------------------------------

    def adopt_reported(
        self,
        now: float,
        models: Sequence[ModelConfig],
        nodes: Sequence[NodeView],
        *,
        quiet: bool = True,
    ) -> Actions:
        """Adopt the whole replicas of an earlier server run (after a restart, or agents
        back late) that `nodes` report and this reconciler does not hold, of the models
        in `models`; `quiet=False` logs why the others are not. Every pass does it
        first; the controller also does it alone while it settles."""
        reports = [
            r
            for r in unheld(self._reported(nodes), self.replicas, self.minted)
            if r.status.state in (ShardState.STARTING, ShardState.READY)
        ]
        if not reports:
            return Actions()
        rebuilt = placement_from_reports(reports)
        wanted = {m.name for m in models if m.profiles}
        addresses = {n.node_id: n.address for n in nodes}
        actions = Actions()
        for placement in rebuilt.placements:
            if placement.model not in wanted:
                continue
            shards = [r.status for r in reports if r.status.replica_id == placement.replica_id]
            log.info("adopting replica %s (epoch %d)", placement.replica_id, placement.epoch)
            address = addresses.get(placement.head.node_id)
            actions += self.adopt(placement, shards, now, address=address)
        if not quiet:
            for refused in rebuilt.refused:
                log.warning("not adopting %s: %s", refused.replica_id, refused.reason)
        return actions

    def _stop_strays(self, now: float, nodes: Sequence[NodeView]) -> Actions:
        """Stop what adoption left of an earlier run's replicas (adoption.Strays)."""
        left = unheld(self._reported(nodes), self.replicas, self.minted)
        return Actions(
            tuple(
                Command(
                    r.node_id,
                    StopShard(
                        f"c{next(self._commands)}",
                        r.status.replica_id,
                        r.status.rank,
                        r.status.epoch,
                    ),
                )
                for r in self._strays.due(now, left)
            )
        )

    @staticmethod
    def _reported(nodes: Sequence[NodeView]) -> list[tuple[str, tuple[ShardStatus, ...]]]:
        """What the nodes that are not lost report (a lost node's shards are gone)."""
        return [(n.node_id, n.shards) for n in nodes if n.state is not NodeState.LOST]

    def _capacity(self, node: NodeView, now: float) -> NodeCapacity:
        """The node's capacity with the ports it refused lately held."""
        refused = self.refused_ports.get(node.node_id)
        if not refused:
            return node.capacity
        for port, when in list(refused.items()):
            if now - when >= REFUSED_PORT_TTL:
                del refused[port]
        return attrs.evolve(node.capacity, used_ports=node.capacity.used_ports | set(refused))

    def _resend(self, now: float, nodes: Mapping[str, NodeView]) -> Actions:
        """Level-triggered commands: each shard of a starting replica should be reported
        starting or ready, each of a draining one draining or ended; while its agent's
        last report says otherwise (a command lost in a disconnect, an outbox full, a
        report that crossed it), what it was told is sent again, once per
        RESEND_AFTER. Agents take a repeated command of the same epoch as already done."""
        every = max(RESEND_AFTER, self.control.interval)
        commands: list[Command] = []
        for replica in self.replicas.values():
            agrees: tuple[ShardState, ...]
            if replica.state is ReplicaState.STARTING:
                agrees = (ShardState.STARTING, ShardState.READY)
            elif replica.state is ReplicaState.DRAINING:
                agrees = (ShardState.DRAINING, ShardState.STOPPED, ShardState.FAILED)
            else:
                continue
            for shard in replica.placement.shards:
                told = replica.told.get(shard.rank)
                status = replica.shards.get(shard.rank)
                node = nodes.get(shard.node_id)
                if (
                    told is None
                    or (status is not None and status.state in agrees)
                    or node is None
                    or node.state is not NodeState.READY  # cannot be reached now
                    or now - told[1] < every
                ):
                    continue
                replica.told[shard.rank] = (told[0], now)
                commands.append(Command(shard.node_id, told[0]))
        self.resent += len(commands)
        return Actions(commands=tuple(commands))

    def _make_room(self, result: PlanResult, wanted: Mapping[str, ModelConfig], now: float) -> None:
        """Move a replica that stands in the way of one that cannot be placed: when the
        explanation says the unplaced one would fit if replica R were drained, and R's
        model would fit elsewhere with everything placed now held, R is evicted (a
        replacement is started elsewhere, then R drains: no stream is cut). At most
        MOVES_AT_ONCE moves run at a time, so a pass never reshuffles the fleet."""
        if len(self.evicting) >= MOVES_AT_ONCE:
            return
        held = [r.placement for r in self.replicas.values()] + list(result.placed)
        for stuck in result.unplaced:
            for hint in stuck.hints:
                r = self.replicas.get(hint.replica_id or "")
                if (
                    hint.code is not HintCode.DRAIN
                    or r is None
                    or r.state is not ReplicaState.READY
                    or r.replica_id in self.evicting
                    or r.model == stuck.model
                    or r.model not in wanted
                ):
                    continue
                probe = PlaceRequest.for_model(wanted[r.model], f"{r.model}-move", 0)
                probed = plan(
                    result.nodes,
                    [probe],
                    held,
                    self.control.port_range,
                    now,
                    policy=self.control.placement,
                )
                if not probed.placed:
                    continue  # it fits nowhere else: moving it would only swap who waits
                self.evicting[r.replica_id] = stuck.model
                self.moves += 1
                log.info(
                    "moving replica %s of %s to make room for %s: %s",
                    r.replica_id,
                    r.model,
                    stuck.model,
                    hint.message,
                )
                return

    def _start(
        self, placement: Placement, model: ModelConfig, nodes: Mapping[str, NodeView], now: float
    ) -> Actions:
        profile = next(p for p in model.profiles if p.name == placement.profile)
        headers: tuple[tuple[bytes, bytes], ...] = ()
        key = profile.api_key
        if key is not None:
            # In the engine's environment, not its argv (which any user can list).
            env = ENGINES[profile.engine].api_key_env
            assert env is not None  # the catalog refuses an api_key for the others
            profile = attrs.evolve(profile, env={**profile.env, env: key})
            headers = ((b"authorization", b"Bearer " + key.encode()),)
        head = placement.head
        master = nodes[head.node_id].capacity.address if head.node_id in nodes else None
        commands = tuple(
            Command(
                shard.node_id,
                StartShard(
                    command_id=f"c{next(self._commands)}",
                    replica_id=placement.replica_id,
                    rank=shard.rank,
                    epoch=placement.epoch,
                    model=model.name,
                    profile=profile,
                    gpu_indices=shard.gpu_indices,
                    port=shard.port,
                    node_count=len(placement.shards),
                    master_address=master if len(placement.shards) > 1 else None,
                    master_port=head.dist_port if len(placement.shards) > 1 else None,
                    mgmt_interface=self.mgmt_interface,
                ),
            )
            for shard in placement.shards
        )
        engine = ENGINES.get(profile.engine)
        sleep = profile.sleep_after if engine is not None and engine.sleeps == "router" else None
        self.replicas[placement.replica_id] = Replica(
            placement,
            ReplicaState.STARTING,
            now,
            address=master,
            headers=headers,
            sleep_after=sleep,
            told={
                shard.rank: (c.message, now)
                for shard, c in zip(placement.shards, commands, strict=True)
            },
        )
        return Actions(commands=commands)

    def _scale_down(self, active: list[Replica], surplus: int, now: float) -> Actions:
        # Starting replicas go first (they serve nothing yet), then the youngest ready.
        order = sorted(
            active, key=lambda r: (r.state is ReplicaState.READY, r.since), reverse=False
        )
        order = [r for r in order if r.state is ReplicaState.STARTING] + sorted(
            (r for r in order if r.state is ReplicaState.READY), key=lambda r: -r.since
        )
        actions = Actions()
        for replica in order[:surplus]:
            actions += self._drain(replica, now)
        return actions

    def _drain(self, replica: Replica, now: float) -> Actions:
        was_ready = replica.state is ReplicaState.READY
        replica.state = ReplicaState.DRAINING
        replica.since = now
        p = replica.placement
        commands = tuple(
            Command(
                s.node_id,
                DrainShard(f"c{next(self._commands)}", p.replica_id, s.rank, p.epoch)
                if was_ready
                else StopShard(f"c{next(self._commands)}", p.replica_id, s.rank, p.epoch),
            )
            for s in p.shards
        )
        replica.told = {s.rank: (c.message, now) for s, c in zip(p.shards, commands, strict=True)}
        return Actions(commands)

    def _drop(self, replica: Replica, why: str, *, failed: bool, now: float) -> Actions:
        """Forget a replica (so it is routed no more): stop whatever of it still runs."""
        p = replica.placement
        del self.replicas[p.replica_id]
        if failed:
            b = self._backoff.setdefault(p.model, _Backoff())
            b.failures += 1
            delay = min(self.control.base_backoff * 2 ** (b.failures - 1), self.control.max_backoff)
            b.until = now + delay
        commands = tuple(
            Command(s.node_id, StopShard(f"c{next(self._commands)}", p.replica_id, s.rank, p.epoch))
            for s in p.shards
            if replica.shards.get(s.rank) is None
            or replica.shards[s.rank].state not in (ShardState.STOPPED, ShardState.FAILED)
        )
        return Actions(commands)

    def _count_failure(self, replica: Replica, status: ShardStatus) -> None:
        """A shard of `replica` failed: a failed start while the replica starts, else an
        engine exit (the supervisor reports an exit code once it launched a process)."""
        if replica.state is ReplicaState.STARTING:
            launched = status.exit_code is not None
            reason = StartFailure.EXITED if launched else StartFailure.NOT_LAUNCHED
            self.start_failures[replica.model, reason] += 1
        else:
            self.engine_exits[replica.model, EngineExit.of(status.exit_code)] += 1

    # -- events ------------------------------------------------------------------------

    def shard_reported(self, node_id: str, status: ShardStatus, now: float) -> Actions:
        """A shard's status from `node_id`: recorded if it is fenced in (see the module
        docstring), else stopped when it still runs."""
        replica = self.replicas.get(status.replica_id)
        if replica is not None and not any(
            s.rank == status.rank and s.node_id == node_id for s in replica.placement.shards
        ):
            # Same id and epoch, but not where the placement put that rank: a replica of
            # a previous server run (ids and epochs restart with the server) on a node
            # that came back late. Not ours: taking its reports would publish the wrong
            # engine, or drop our healthy replica when that one fails.
            replica = None
        if replica is not None and status.model and status.model != replica.model:
            replica = None  # the same id serving another model is not this replica
        if replica is None or status.epoch != replica.placement.epoch:
            # Not ours (anymore): a superseded placement or a replica we dropped.
            if status.state in (ShardState.STARTING, ShardState.READY, ShardState.DRAINING):
                stop = StopShard(
                    f"c{next(self._commands)}", status.replica_id, status.rank, status.epoch
                )
                return Actions(commands=(Command(node_id, stop),))
            return Actions()
        previous = replica.shards.get(status.rank)
        replica.shards[status.rank] = status
        ranks = {s.rank for s in replica.placement.shards}
        states = {replica.shards[r].state for r in ranks if r in replica.shards}
        if status.state is ShardState.FAILED and (
            previous is None or previous.state is not ShardState.FAILED  # reported again
        ):
            self._count_failure(replica, status)
        if status.state is ShardState.FAILED and replica.state is not ReplicaState.DRAINING:
            refused = replica.state is ReplicaState.STARTING and bool(status.busy_ports)
            if refused:
                # Another process holds the ports: not the model's fault, so no backoff;
                # the next pass places it again on ports of the node that are free.
                held = self.refused_ports.setdefault(node_id, {})
                held.update(dict.fromkeys(status.busy_ports, now))
            why = status.message or "shard failed"
            return self._drop(replica, why, failed=not refused, now=now)
        if (
            replica.state is ReplicaState.STARTING
            and states == {ShardState.READY}
            and len(replica.shards) >= len(ranks)
        ):
            head = replica.shards.get(0)
            if replica.address is None:
                return Actions()  # nowhere known to send requests (adopted without one)
            url = engine_url(replica.address, replica.placement.head.port)
            reported = head.endpoint_url if head else None
            if reported is not None and not same_url(reported, url):
                # The server's URL or none: a node must not have client requests sent
                # to an address or port of its choosing (docs/transport.md).
                log.warning(
                    "replica %s of %s on node %s: its agent reports the engine at %r, not the "
                    "URL it was assigned (%s): report refused, replica stopped",
                    replica.replica_id,
                    replica.model,
                    replica.placement.head.node_id,
                    reported[:200],
                    url,
                )
                self.refused_urls += 1
                return self._drop(
                    replica, "reported a URL it was not assigned", failed=True, now=now
                )
            # A cold start: nothing else served the model while this one started.
            cold = not any(
                r.model == replica.model and r.state is ReplicaState.READY
                for r in self.replicas.values()
            )
            self.starts.setdefault((replica.model, cold), Durations()).observe(now - replica.since)
            replica.state = ReplicaState.READY
            replica.since = now
            replica.url = url
            replica.capacity = head.capacity if head else None
            self._backoff.pop(replica.model, None)
            return Actions()
        if (
            replica.state is ReplicaState.DRAINING
            and states
            <= {
                ShardState.STOPPED,
                ShardState.FAILED,
            }
            and len(replica.shards) >= len(ranks)
        ):
            del self.replicas[replica.replica_id]
            return Actions()
        return Actions()

    def node_reported(self, node_id: str, shards: Iterable[ShardStatus], now: float) -> Actions:
        """`node_id` reported every shard it runs (a registration carries the agent's
        whole set). A shard this reconciler has heard run there
        (its last status starting, ready or draining) that is not among them is lost:
        its engine is gone (it died with its agent, or a new agent found it unhealthy).
        Its replica is dropped as on a lost node, unrouted at once and placed again by
        the next pass, instead of staying published at a dead port until the node
        itself is lost (which a node that reconnects at once never is). A shard
        reported in any state counts as reported (:meth:`shard_reported` judges it)."""
        reported = {(s.replica_id, s.rank, s.epoch) for s in shards}
        actions = Actions()
        for replica in list(self.replicas.values()):
            p = replica.placement
            for shard in p.shards:
                status = replica.shards.get(shard.rank)
                if (
                    shard.node_id == node_id
                    and status is not None
                    and status.state in LIVE_SHARD_STATES
                    and (p.replica_id, shard.rank, p.epoch) not in reported
                ):
                    why = f"node {node_id} no longer reports its rank {shard.rank}"
                    log.warning("replica %s of %s lost: %s", p.replica_id, p.model, why)
                    actions += self._drop(replica, why, failed=False, now=now)
                    break
        return actions

    def adopt(
        self,
        placement: Placement,
        shards: Iterable[ShardStatus],
        now: float,
        *,
        address: str | None = None,
    ) -> Actions:
        """Take over a replica of an earlier server run that agents report running;
        `address` is its head node's registered address (without one it is never
        published).

        Raises ValueError for an epoch this reconciler gives out (:meth:`minted`): such
        a replica, when it does not hold it, was superseded. Adopted epochs are thus
        below every epoch it places, so new placements fence them out."""
        if self.minted(placement.epoch):
            raise ValueError(
                f"replica {placement.replica_id!r} epoch {placement.epoch} is not from an "
                f"earlier run (epochs from {self.first_epoch} are this reconciler's)"
            )
        replica = Replica(placement, ReplicaState.STARTING, now, address=address)
        self.replicas[placement.replica_id] = replica
        nodes = {s.rank: s.node_id for s in placement.shards}
        actions = Actions()
        for status in shards:
            actions += self.shard_reported(nodes.get(status.rank, ""), status, now)
        return actions
