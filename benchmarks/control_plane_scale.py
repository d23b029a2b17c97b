"""The control plane at fleet scale: the real Controller over the in-memory stub transport.

    python benchmarks/control_plane_scale.py [--quick] [--json]
                                             [--nodes 1000] [--fabrics 16] [--models 200]

One process, one trio run, no network (every message crosses a ``StubNetwork``).
A fleet of N nodes x 8 GPUs (H100, 80 GB) in F fabrics, each node a *light agent*:
it registers, heartbeats, and answers every StartShard with a STARTING then a READY
status (rank 0 with a made-up endpoint URL) without starting anything. M models mix
1-, 2-, 4- and 8-GPU replicas and 16-GPU ones (2 nodes x 8 GPUs in one fabric); the
replica counts are drawn, then nudged until the catalog needs ``--fill`` (85%) of
the fleet's GPUs. The sink is a counter (no router). Every wait is bounded
(``trio.fail_after``), every loop by a count or a deadline.

Measured, each in its own controller (or baseline) run:

1. ``controller.reconcile()`` timed directly: the *initial* pass (every node
   registered, nothing placed: a fresh Reconciler each repetition, agents ignore
   the commands) and the *steady* pass (everything placed and ready, nothing to do);
   min / median / max of ``--repeat``, also without the garbage collections that
   ran inside the calls (``gc.callbacks``).
2. *Burst*: all N agents connect at once; time to every node registered, to every
   shard's StartShard received, and to every replica published ready to the sink.
   Into a *running* controller (``settle=0``: it reconciles as nodes arrive, as
   after a network outage), and into a *just-started* one (the default settle,
   2 x the heartbeat interval: nodes register first, then one pass places all).
   Every pass the controller's own loop runs is timed by wrapping the instance's
   ``reconcile``.
3. *Reconnect storm* (after the heartbeat windows): every connection cut at once,
   every agent reconnects at once and registers with the shards it runs; time to
   all registered again, and what the controller did meanwhile (inventory events
   from its log, commands, sink calls).
4. *Heartbeat CPU*: every agent heartbeats every second at a fixed phase (N/s in
   all), with its 8 GPU readings (and, in the second variant, a summary of its
   shards). Process CPU (``time.process_time``) over a ``--hb-seconds`` window with
   the controller, minus the same window with the same agents sending the same
   heartbeats to a listener that reads and discards every message (the baseline:
   agents, stub transport, trio and the receive loop). The difference is the
   controller's: inventory updates, shard-report handling, its periodic reconcile
   passes (every ``control.interval``), expiry loop and the GC work its heap adds.
5. *Memory*: ``tracemalloc`` in a separate run (it slows everything): Python heap
   with the agents connected to the discarding listener, then to a controller
   (registered; then with the catalog placed), then after the agents left (what
   the controller keeps); per node.

``--quick`` skips the burst into a running controller (~25 s at 1,000 nodes) and
the storm, does one heartbeat variant, and uses fewer repetitions. ``--storm-only``
runs just a burst into a just-started controller, the steady pass and the storm
(e.g. ``--storm-only --nodes 2000``). Nothing is asserted: the design targets are
printed beside the numbers.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import logging
import math
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from llmgw.catalog.rules import Catalog
from llmgw.config import Bytes, ControlConfig, DeploymentProfile, ModelConfig, Seconds
from llmgw.control.controller import Controller
from llmgw.control.reconciler import Reconciler
from llmgw.domain.fleet import EngineInfo, Gpu, NodeInfo, ShardState
from llmgw.router.endpoints import Endpoint
from llmgw.transport.base import AgentConnection, ConnectFailed, ConnectionClosed
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c

GB = 10**9
GPUS_PER_NODE = 8
GPU_NAME = "NVIDIA H100 80GB HBM3"
HEARTBEAT_INTERVAL = 1.0  # seconds; what the controller tells agents in Registered
RESTART_SETTLE = 2 * HEARTBEAT_INTERVAL  # the Controller's default settle
TARGET_PASS_MS = 100.0
TARGET_HB_CORE = 0.25  # share of one core per 1,000 heartbeats/s

# -- the catalog ---------------------------------------------------------------------


def _profile(name: str, tp: int, pp: int = 1, per_node: int | None = None) -> DeploymentProfile:
    return DeploymentProfile(
        name=name,
        engine="vllm",
        weights=f"org/{name}",
        tensor_parallel=tp,
        pipeline_parallel=pp,
        gpus_per_node=per_node,
        min_gpu_memory=Bytes(40 * GB),
        gpu_name="H100|H200",
    )


# (share of the models, GPUs per replica, replica count range, profile)
SHAPES: list[tuple[float, int, tuple[int, int], DeploymentProfile]] = [
    (0.40, 1, (2, 14), _profile("tp1", 1)),
    (0.25, 2, (2, 10), _profile("tp2", 2)),
    (0.175, 4, (1, 8), _profile("tp4", 4)),
    (0.125, 8, (4, 20), _profile("tp8", 8)),
    (0.05, 16, (6, 24), _profile("2x8", 8, 2, 8)),
]


def catalog(models: int, nodes: int, fill: float, seed: int) -> Catalog:
    """`models` models of the SHAPES mix whose replicas need `fill` of the fleet's GPUs."""
    rng = random.Random(seed)
    shapes: list[tuple[int, tuple[int, int], DeploymentProfile]] = []
    for share, gpus, span, profile in SHAPES:
        shapes += [(gpus, span, profile)] * max(1, round(share * models))
    shapes = shapes[:models]
    rng.shuffle(shapes)
    replicas = [rng.randint(*span) for _, span, _ in shapes]
    target = int(fill * nodes * GPUS_PER_NODE)

    def used() -> int:
        return sum(r * s[0] for r, s in zip(replicas, shapes, strict=True))

    for _ in range(100_000):  # nudge one model at a time towards the target
        gap = target - used()
        i = rng.randrange(len(shapes))
        gpus = shapes[i][0]
        if gap < 0 and replicas[i] > 1:
            replicas[i] -= 1
        elif gap >= gpus:
            replicas[i] += 1
        elif 0 <= gap < 8:
            break
    return Catalog(
        tuple(
            ModelConfig(name=f"model-{i:03d}", replicas=r, profiles=(profile,))
            for i, (r, (_, _, profile)) in enumerate(zip(replicas, shapes, strict=True))
        )
    )


def shard_count(cat: Catalog) -> int:
    """Shards (nodes) of all replicas: one per node a replica spans."""
    total = 0
    for m in cat.models:
        p = m.profiles[0]
        gpus = p.tensor_parallel * p.pipeline_parallel
        total += m.replicas * (gpus // (p.gpus_per_node or gpus))
    return total


def gpus_wanted(cat: Catalog) -> int:
    return sum(
        m.replicas * m.profiles[0].tensor_parallel * m.profiles[0].pipeline_parallel
        for m in cat.models
    )


# -- the sink ------------------------------------------------------------------------


class CountingSink:
    """An EndpointSink that only counts (no router)."""

    def __init__(self, expect: int) -> None:
        self.upserts = 0
        self.drains = 0
        self.removes = 0
        self.ready: set[str] = set()
        self.expect = expect
        self.all_ready = trio.Event()
        self.all_ready_at: float | None = None

    def upsert(self, endpoint: Endpoint) -> None:
        self.upserts += 1
        self.ready.add(endpoint.id)
        if len(self.ready) >= self.expect and not self.all_ready.is_set():
            self.all_ready_at = time.perf_counter()
            self.all_ready.set()

    def drain(self, endpoint_id: str) -> None:
        self.drains += 1
        self.ready.discard(endpoint_id)

    def remove(self, endpoint_id: str) -> None:
        self.removes += 1
        self.ready.discard(endpoint_id)

    def calls(self) -> int:
        return self.upserts + self.drains + self.removes


# -- the light agent -----------------------------------------------------------------


@attrs.define
class Fleet:
    """What the agents of one run share: counters, events and the heartbeat clock."""

    size: int
    expect_starts: int = 0
    registered: int = 0
    starts: int = 0
    stops: int = 0  # StopShard and DrainShard commands received
    heartbeats: int = 0
    reconnect: bool = False  # reconnect at once when the connection is cut
    obey: bool = True  # False: ignore commands (for timing the initial pass)
    shard_summaries: bool = False  # heartbeats carry a summary of the agent's shards
    beat: bool = True
    all_registered: trio.Event = attrs.field(factory=trio.Event)
    all_registered_at: float | None = None
    all_started: trio.Event = attrs.field(factory=trio.Event)
    all_started_at: float | None = None
    t0: float = 0.0  # trio time the heartbeat phases count from

    def expect_registrations(self) -> None:
        self.registered = 0
        self.all_registered = trio.Event()
        self.all_registered_at = None

    def on_registered(self) -> None:
        self.registered += 1
        if self.registered >= self.size and not self.all_registered.is_set():
            self.all_registered_at = time.perf_counter()
            self.all_registered.set()

    def on_start(self) -> None:
        self.starts += 1
        done = self.expect_starts and self.starts >= self.expect_starts
        if done and not self.all_started.is_set():
            self.all_started_at = time.perf_counter()
            self.all_started.set()


# (replica_id, rank, epoch, model, profile, node_count, gpu_indices, port, state, url)
_ShardRow = tuple[str, int, int, str, str, int, tuple[int, ...], int, ShardState, str | None]


class LightAgent:
    """Registers, heartbeats on a fixed phase, and answers StartShard with STARTING then
    READY (rank 0 with a made-up URL) without starting anything.

    It keeps no message it sent (only small rows per shard) and builds each message
    fresh, so what the server retains is the server's own."""

    def __init__(self, index: int, fabrics: int) -> None:
        self.index = index
        self.node_id = f"gpu-{index:04d}"
        self.fabric = f"ib-{index % fabrics:02d}"
        self.address = f"10.{index // 65536}.{index // 256 % 256}.{index % 256}"
        self.shards: dict[tuple[str, int], _ShardRow] = {}
        self.seq = 0

    def node(self) -> NodeInfo:
        return NodeInfo(
            node_id=self.node_id,
            hostname=self.node_id,
            address=self.address,
            agent_version="bench",
            labels={"rack": f"r{self.index // 32}"},
            fabrics=(self.fabric,),
            gpus=tuple(
                Gpu(i, f"GPU-{self.index:04d}-{i}", GPU_NAME, 80 * GB, memory_used=0)
                for i in range(GPUS_PER_NODE)
            ),
            engines=(EngineInfo("vllm", "0.6"), EngineInfo("sglang", "0.4")),
        )

    def readings(self) -> tuple[Gpu, ...]:
        busy = {g for row in self.shards.values() for g in row[6]}
        return tuple(
            Gpu(
                i,
                f"GPU-{self.index:04d}-{i}",
                GPU_NAME,
                80 * GB,
                memory_used=(70 if i in busy else 1) * GB,
                utilization=0.5 if i in busy else 0.0,
                ecc_errors=0,
            )
            for i in range(GPUS_PER_NODE)
        )

    @staticmethod
    def status(row: _ShardRow, *, summary: bool = False) -> ShardStatus:
        rid, rank, epoch, model, profile, count, gpus, port, state, url = row
        if summary:
            return ShardStatus(rid, rank, epoch, state, model=model)
        return ShardStatus(
            rid,
            rank,
            epoch,
            state,
            model=model,
            endpoint_url=url,
            profile=profile,
            node_count=count,
            gpu_indices=gpus,
            port=port,
        )

    async def run(self, network: StubNetwork, fleet: Fleet) -> None:
        """One connection; while `fleet.reconnect`, a new one at once when it is cut."""
        while True:
            try:
                await self._session(network, fleet)
            except* (ConnectionClosed, ConnectFailed):
                pass  # cut off, or the server went away (the run is over)
            if not fleet.reconnect:
                return
            await trio.lowlevel.checkpoint()

    async def _session(self, network: StubNetwork, fleet: Fleet) -> None:
        async with network.connector(self.node_id).connect() as conn:
            # A reconnecting agent registers with the shards it runs (DESIGN section 5).
            shards = tuple(self.status(r) for r in self.shards.values())
            await conn.send(Register(self.node(), shards))
            first = await conn.receive()
            interval = (
                first.heartbeat_interval if isinstance(first, Registered) else HEARTBEAT_INTERVAL
            )
            fleet.on_registered()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._heartbeats, conn, fleet, interval)
                while True:
                    command = await conn.receive()
                    if not fleet.obey:
                        continue
                    if isinstance(command, StartShard):
                        fleet.on_start()
                        await self._start(conn, command)
                    elif isinstance(command, StopShard | DrainShard):
                        fleet.stops += 1
                        row = self.shards.pop((command.replica_id, command.rank), None)
                        if row is not None:
                            stopped = (*row[:8], ShardState.STOPPED, None)
                            await conn.send(self.status(stopped))

    async def _start(self, conn: Any, command: StartShard) -> None:
        url = f"http://{self.address}:{command.port}" if command.rank == 0 else None
        row: _ShardRow = (
            command.replica_id,
            command.rank,
            command.epoch,
            command.model,
            command.profile.name,
            command.node_count,
            command.gpu_indices,
            command.port,
            ShardState.STARTING,
            None,
        )
        await conn.send(self.status(row))
        row = (*row[:8], ShardState.READY, url)
        self.shards[(command.replica_id, command.rank)] = row
        await conn.send(self.status(row))

    async def _heartbeats(self, conn: Any, fleet: Fleet, interval: float) -> None:
        """Every `interval` at this agent's phase of it: N agents make N/interval per s."""
        phase = interval * self.index / fleet.size
        k = math.floor((trio.current_time() - fleet.t0 - phase) / interval) + 1
        while True:
            await trio.sleep_until(fleet.t0 + phase + k * interval)
            # Late (a busy loop)? Skip the missed slots: the rate stays fixed.
            k = max(k + 1, math.floor((trio.current_time() - fleet.t0 - phase) / interval) + 1)
            if not fleet.beat:
                continue
            self.seq += 1
            shards = (
                tuple(self.status(r, summary=True) for r in self.shards.values())
                if fleet.shard_summaries
                else ()
            )
            await conn.send(Heartbeat(self.seq, self.readings(), shards))
            fleet.heartbeats += 1


async def discard(conn: AgentConnection) -> None:
    """The baseline's server: accept the registration, then read and drop everything."""
    await conn.receive()
    await conn.send(Registered(HEARTBEAT_INTERVAL, "baseline"))
    while True:
        await conn.receive()


# -- measuring -----------------------------------------------------------------------


class GcMeter:
    """Every garbage collection's generation and duration (gc.callbacks)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._start))

    def mark(self) -> int:
        return len(self.pauses)

    def since(self, mark: int) -> dict[str, float]:
        pauses = self.pauses[mark:]
        return {
            "collections": len(pauses),
            "gen2": sum(1 for g, _ in pauses if g == 2),
            "gc_s": sum(d for _, d in pauses),
            "longest_ms": max((d for _, d in pauses), default=0.0) * 1e3,
        }


class LogCounter(logging.Handler):
    """Counts the controller's warnings by kind (and keeps them off stderr)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: collections.Counter[str] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        # An inventory event (NodeBecameUnreachable, ...) by its type, else the format.
        key = type(args[0]).__name__ if record.msg == "%s" and args else str(record.msg)
        self.counts[key] += 1

    def since(self, mark: collections.Counter[str]) -> dict[str, int]:
        return {k: v for k, v in (self.counts - mark).items() if v}


GC = GcMeter()
WARNINGS = LogCounter()


def ms_stats(times: list[float]) -> dict[str, float]:
    return {
        "n": len(times),
        "min_ms": round(min(times) * 1e3, 2),
        "median_ms": round(statistics.median(times) * 1e3, 2),
        "max_ms": round(max(times) * 1e3, 2),
    }


def timed_pass(reconcile: Callable[[], None]) -> tuple[float, float]:
    """Seconds one call took, and seconds of garbage collection inside it."""
    mark = GC.mark()
    start = time.perf_counter()
    reconcile()
    elapsed = time.perf_counter() - start
    return elapsed, GC.since(mark)["gc_s"]


class PassTimer:
    """Wraps a Controller instance's `reconcile` to time every pass its loop runs."""

    def __init__(self, controller: Controller) -> None:
        self.times: list[float] = []
        self.first = trio.Event()
        self.original = original = controller.reconcile

        def timed() -> None:
            start = time.perf_counter()
            original()
            self.times.append(time.perf_counter() - start)
            self.first.set()

        controller.reconcile = timed  # type: ignore[method-assign]


def control_config() -> ControlConfig:
    return ControlConfig(
        interval=Seconds(5.0),
        unreachable_after=Seconds(15.0),
        lost_after=Seconds(60.0),
        port_range=(20000, 20999),
    )


async def start_agents(
    nursery: trio.Nursery, agents: list[LightAgent], network: StubNetwork, fleet: Fleet
) -> None:
    for agent in agents:
        nursery.start_soon(agent.run, network, fleet)


async def hb_window(fleet: Fleet, seconds: float) -> dict[str, float]:
    """Process CPU and heartbeats sent over the next `seconds`."""
    beats0, cpu0, wall0 = fleet.heartbeats, time.process_time(), time.perf_counter()
    await trio.sleep(seconds)
    cpu1, wall1 = time.process_time(), time.perf_counter()
    wall = wall1 - wall0
    return {
        "wall_s": wall,
        "cpu_s": cpu1 - cpu0,
        "heartbeats": fleet.heartbeats - beats0,
        "rate": (fleet.heartbeats - beats0) / wall,
    }


# -- the runs ------------------------------------------------------------------------


async def run_initial_passes(args: argparse.Namespace, cat: Catalog) -> dict[str, Any]:
    """Every node registered, nothing placed: reconcile() with a fresh Reconciler."""
    network = StubNetwork()
    fleet = Fleet(args.nodes, obey=False, beat=False)
    sink = CountingSink(expect=sum(m.replicas for m in cat.models))
    control = control_config()
    # settle=inf: the controller's own loop never reconciles; only our calls do.
    controller = Controller(control, cat, sink, heartbeat_interval=HEARTBEAT_INTERVAL, settle=1e9)
    agents = [LightAgent(i, args.fabrics) for i in range(args.nodes)]
    times: list[float] = []
    no_gc: list[float] = []
    placed = unplaced = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(controller.run, network.listener())
        await start_agents(nursery, agents, network, fleet)
        with trio.fail_after(120):
            await fleet.all_registered.wait()
        for i in range(args.repeat + 1):
            controller.reconciler = Reconciler(control)
            gc.collect()
            elapsed, in_gc = timed_pass(controller.reconcile)
            if i:  # the first is a warm-up (imports, regex and attrs caches)
                times.append(elapsed)
                no_gc.append(elapsed - in_gc)
            placed = len(controller.reconciler.replicas)
            unplaced = sum(len(u) for u in controller.reconciler.unplaced.values())
            await trio.sleep(0.2)  # let the agents take (and ignore) the commands
        nursery.cancel_scope.cancel()
    return {
        "initial": ms_stats(times),
        "initial_without_gc": ms_stats(no_gc),
        "placed": placed,
        "unplaced": unplaced,
    }


async def run_controller(
    args: argparse.Namespace,
    cat: Catalog,
    agents: list[LightAgent],
    *,
    settle: float,
    more: bool,
) -> dict[str, Any]:
    """The burst; with `more`, then the steady pass, the heartbeat CPU and (unless
    --quick) a reconnect storm."""
    network = StubNetwork()
    replicas = sum(m.replicas for m in cat.models)
    fleet = Fleet(args.nodes, expect_starts=shard_count(cat))
    sink = CountingSink(expect=replicas)
    controller = Controller(
        control_config(), cat, sink, heartbeat_interval=HEARTBEAT_INTERVAL, settle=settle
    )
    passes = PassTimer(controller)
    out: dict[str, Any] = {}
    gc.collect()
    async with trio.open_nursery() as nursery:
        await nursery.start(controller.run, network.listener())
        fleet.t0 = trio.current_time()
        c.log(f"burst: {args.nodes} agents connect at once (settle={settle:g} s)")
        gc_mark, log_mark = GC.mark(), WARNINGS.counts.copy()
        start = time.perf_counter()
        await start_agents(nursery, agents, network, fleet)
        with trio.fail_after(args.burst_timeout):
            await fleet.all_registered.wait()
            await fleet.all_started.wait()
            await sink.all_ready.wait()
        assert fleet.all_registered_at and fleet.all_started_at and sink.all_ready_at
        out["burst"] = b = {
            "settle_s": settle,
            "registered_s": fleet.all_registered_at - start,
            "started_s": fleet.all_started_at - start,
            "ready_s": sink.all_ready_at - start,
            "passes": len(passes.times),
            "pass_total_s": sum(passes.times),
            "pass_times": ms_stats(passes.times),
            "first_pass_ms": round(passes.times[0] * 1e3, 2),
            "largest_pass_ms": round(max(passes.times) * 1e3, 2),
            "replicas": replicas,
            "shards": fleet.expect_starts,
            "unplaced": sum(len(u) for u in controller.reconciler.unplaced.values()),
            "gc": GC.since(gc_mark),
            "gc_tracked_objects": len(gc.get_objects()),  # the whole process, agents too
            "warnings": WARNINGS.since(log_mark),
        }
        c.log(
            f"burst: registered {b['registered_s']:.2f} s, all started {b['started_s']:.2f} s, "
            f"all ready {b['ready_s']:.2f} s; {b['passes']} passes, "
            f"{b['pass_total_s']:.2f} s in them; GC {b['gc']['gc_s']:.2f} s"
        )
        if not more:
            nursery.cancel_scope.cancel()
            return out

        await trio.sleep(1.0)  # the last statuses settle
        # Steady: nothing to do. Direct calls; the controller's own loop keeps running.
        calls, starts = sink.calls(), fleet.starts
        times, no_gc = [], []
        for _ in range(args.repeat):
            elapsed, in_gc = timed_pass(passes.original)  # not counted as the loop's
            times.append(elapsed)
            no_gc.append(elapsed - in_gc)
            await trio.sleep(0.05)
        out["steady"] = ms_stats(times)
        out["steady_without_gc"] = ms_stats(no_gc)
        out["steady_idle"] = sink.calls() == calls and fleet.starts == starts
        c.log(f"steady pass: median {out['steady']['median_ms']} ms")

        out["hb"] = {}
        for variant in args.variants:
            fleet.shard_summaries = variant == "gpus+shards"
            await trio.sleep(args.hb_warmup)
            seq0 = {r.node_id: r.seq or 0 for r in controller.inventory.nodes()}
            npass, gc_mark = len(passes.times), GC.mark()
            window = await hb_window(fleet, args.hb_seconds)
            window["passes"] = len(passes.times) - npass
            window["pass_s"] = sum(passes.times[npass:])
            window["gc"] = GC.since(gc_mark)
            window["controller_seen"] = sum(
                (r.seq or 0) - seq0.get(r.node_id, 0) for r in controller.inventory.nodes()
            )
            out["hb"][variant] = window
            c.log(
                f"heartbeats ({variant}), controller: {window['rate']:.0f}/s, "
                f"CPU {window['cpu_s'] / window['wall_s']:.1%} of a core"
            )
        fleet.shard_summaries = False

        if args.storm:
            # Every connection cut at once (a network blip); every agent reconnects at
            # once and registers again with the shards it runs.
            c.log(f"reconnect storm: {args.nodes} connections cut, agents reconnect at once")
            fleet.expect_registrations()
            fleet.reconnect = True
            starts, stops, calls = fleet.starts, fleet.stops, sink.calls()
            npass, gc_mark, log_mark = len(passes.times), GC.mark(), WARNINGS.counts.copy()
            start = time.perf_counter()
            for agent in agents:
                network.disconnect(agent.node_id)
            with trio.fail_after(args.burst_timeout):
                await fleet.all_registered.wait()
            assert fleet.all_registered_at
            await trio.sleep(1.0)
            fleet.reconnect = False
            out["storm"] = st = {
                "registered_s": fleet.all_registered_at - start,
                "passes": len(passes.times) - npass,
                "pass_s": sum(passes.times[npass:]),
                "start_commands": fleet.starts - starts,
                "stop_commands": fleet.stops - stops,
                "sink_calls": sink.calls() - calls,
                "ready": len(sink.ready),
                "replicas": replicas,
                "gc": GC.since(gc_mark),
                "warnings": WARNINGS.since(log_mark),
            }
            c.log(
                f"reconnect storm: all registered again after {st['registered_s']:.2f} s, "
                f"{st['passes']} passes; warnings {st['warnings']}"
            )
        out["ready_at_end"] = len(sink.ready)
        nursery.cancel_scope.cancel()
    return out


async def run_baseline(args: argparse.Namespace, agents: list[LightAgent]) -> dict[str, Any]:
    """The same agents (with the shards they run) against a listener that discards."""
    network = StubNetwork()
    fleet = Fleet(args.nodes)
    out: dict[str, Any] = {"hb": {}}
    async with trio.open_nursery() as nursery:
        await nursery.start(network.listener().serve, discard)
        fleet.t0 = trio.current_time()
        await start_agents(nursery, agents, network, fleet)
        with trio.fail_after(120):
            await fleet.all_registered.wait()
        for variant in args.variants:
            fleet.shard_summaries = variant == "gpus+shards"
            await trio.sleep(args.hb_warmup)
            window = await hb_window(fleet, args.hb_seconds)
            out["hb"][variant] = window
            c.log(
                f"heartbeats ({variant}), baseline: {window['rate']:.0f}/s, "
                f"CPU {window['cpu_s'] / window['wall_s']:.1%} of a core"
            )
        nursery.cancel_scope.cancel()
    return out


def traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def rows_bytes(agents: list[LightAgent]) -> int:
    """The containers of the agents' own shard rows (their strings are shared)."""
    return sum(
        sys.getsizeof(a.shards)
        + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in a.shards.items())
        for a in agents
    )


async def run_memory(args: argparse.Namespace, cat: Catalog) -> dict[str, Any]:
    """Python heap (tracemalloc, on for this run only: it slows everything down) of the
    agents against the discarding listener, then against a controller, registered and
    then placed, then after the agents left."""
    n = args.nodes
    settle = 3.0  # every agent registers before the first pass (which has nothing to do)
    out: dict[str, Any] = {"settle_s": settle}
    gc.collect()
    tracemalloc.start()
    try:
        m0 = traced()
        network = StubNetwork()
        fleet = Fleet(n)
        agents = [LightAgent(i, args.fabrics) for i in range(n)]
        async with trio.open_nursery() as nursery:
            await nursery.start(network.listener().serve, discard)
            fleet.t0 = trio.current_time()
            await start_agents(nursery, agents, network, fleet)
            with trio.fail_after(120):
                await fleet.all_registered.wait()
            await trio.sleep(0.5)
            out["baseline_connected"] = traced() - m0
            nursery.cancel_scope.cancel()
        del agents, network, fleet

        m1 = traced()
        network = StubNetwork()
        fleet = Fleet(n, expect_starts=shard_count(cat))
        sink = CountingSink(expect=sum(m.replicas for m in cat.models))
        controller = Controller(
            control_config(),
            Catalog(()),
            sink,
            heartbeat_interval=HEARTBEAT_INTERVAL,
            settle=settle,
        )
        passes = PassTimer(controller)
        agents = [LightAgent(i, args.fabrics) for i in range(n)]
        async with trio.open_nursery() as nursery:
            await nursery.start(controller.run, network.listener())
            async with trio.open_nursery() as fleet_nursery:
                fleet.t0 = trio.current_time()
                await start_agents(fleet_nursery, agents, network, fleet)
                with trio.fail_after(120):
                    await fleet.all_registered.wait()
                    await passes.first.wait()  # settled
                await trio.sleep(0.5)
                out["registered"] = traced() - m1
                controller.set_catalog(cat)
                with trio.fail_after(args.burst_timeout):
                    await sink.all_ready.wait()
                await trio.sleep(0.5)
                out["placed"] = traced() - m1
                out["agent_rows"] = rows_bytes(agents)
                fleet_nursery.cancel_scope.cancel()
            del agents
            await trio.sleep(0.5)  # the controller's handlers see the connections close
            out["kept"] = traced() - m1
            out["disconnected"] = sum(not r.connected for r in controller.inventory.nodes())
            out["replicas_kept"] = len(controller.reconciler.replicas)
            nursery.cancel_scope.cancel()
    finally:
        tracemalloc.stop()
    kib = 1024 * n
    c.log(
        f"memory per node: controller run registered {out['registered'] / kib:.1f} KiB, "
        f"placed {out['placed'] / kib:.1f} KiB, kept {out['kept'] / kib:.1f} KiB; "
        f"baseline {out['baseline_connected'] / kib:.1f} KiB"
    )
    return out


async def run_all(args: argparse.Namespace, cat: Catalog) -> dict[str, Any]:
    logging.getLogger("llmgw.control").addHandler(WARNINGS)
    results: dict[str, Any] = {}
    if args.storm_only:
        agents = [LightAgent(i, args.fabrics) for i in range(args.nodes)]
        results["controller"] = await run_controller(
            args, cat, agents, settle=RESTART_SETTLE, more=True
        )
        return results
    c.log("initial passes (fresh reconciler, all nodes registered, agents ignore commands)")
    results["passes"] = await run_initial_passes(args, cat)
    c.log(f"initial pass: median {results['passes']['initial']['median_ms']} ms")
    agents = [LightAgent(i, args.fabrics) for i in range(args.nodes)]
    # --quick: only the burst into a restarted controller (the running one takes ~25 s).
    main_settle = RESTART_SETTLE if args.quick else 0.0
    results["controller"] = await run_controller(args, cat, agents, settle=main_settle, more=True)
    c.log("baseline: the same agents against a listener that discards")
    results["baseline"] = await run_baseline(args, agents)
    del agents
    if not args.quick:
        agents = [LightAgent(i, args.fabrics) for i in range(args.nodes)]
        results["restart"] = await run_controller(
            args, cat, agents, settle=RESTART_SETTLE, more=False
        )
        del agents
    if not args.no_memory:
        c.log("memory (tracemalloc)")
        results["memory"] = await run_memory(args, cat)
    return results


# -- report --------------------------------------------------------------------------


def _stats(s: dict[str, float]) -> str:
    return f"{s['min_ms']:.1f} / {s['median_ms']:.1f} / {s['max_ms']:.1f} ms (n={s['n']})"


def _gc(g: dict[str, float]) -> str:
    return (
        f"GC {g['gc_s']:.2f} s in {g['collections']:.0f} collections "
        f"({g['gen2']:.0f} full, longest {g['longest_ms']:.0f} ms)"
    )


def _burst_rows(name: str, b: dict[str, Any]) -> list[list[str]]:
    warned = f"; warnings: {b['warnings']}" if b["warnings"] else ""
    return [
        [
            f"burst into a {name}: all agents connect at once -> all registered / "
            "every StartShard received / every replica READY at the sink",
            f"{b['registered_s']:.2f} s / {b['started_s']:.2f} s / {b['ready_s']:.2f} s "
            f"({b['shards']} shards, {b['replicas']} replicas)",
            "",
        ],
        [
            "  of which: reconcile passes run by the controller's loop; GC",
            f"{b['passes']} passes, {b['pass_total_s']:.1f} s in them (median "
            f"{b['pass_times']['median_ms']:.1f} ms, largest {b['largest_pass_ms']:.1f} ms); "
            + _gc(b["gc"])
            + warned,
            "",
        ],
    ]


def report(args: argparse.Namespace, r: dict[str, Any]) -> list[list[str]]:
    n = args.nodes
    ctl = r["controller"]
    target = f"< {TARGET_PASS_MS:.0f} ms"
    rows = []
    if "passes" in r:
        p = r["passes"]
        rows += [
            [
                "reconcile(), initial pass (places everything): min / median / max",
                _stats(p["initial"]) + f"; {p['placed']} placed, {p['unplaced']} unplaced",
                target,
            ],
            [
                "  the same without the GC pauses inside the calls",
                _stats(p["initial_without_gc"]),
                "",
            ],
        ]
    rows += [
        [
            "reconcile(), steady pass (nothing to do): min / median / max",
            _stats(ctl["steady"]) + ("" if ctl["steady_idle"] else "; NOT idle"),
            target,
        ],
        [
            "  the same without the GC pauses inside the calls",
            _stats(ctl["steady_without_gc"]),
            "",
        ],
    ]

    def name(settle: float) -> str:
        if settle:
            return f"just-started controller (settle {settle:g} s)"
        return "running controller"

    rows += _burst_rows(name(ctl["burst"]["settle_s"]), ctl["burst"])
    if "restart" in r:
        rows += _burst_rows(name(r["restart"]["burst"]["settle_s"]), r["restart"]["burst"])
    if "storm" in ctl:
        st = ctl["storm"]
        rows.append(
            [
                "reconnect storm: every connection cut, agents reconnect at once -> all "
                "registered again",
                f"{st['registered_s']:.2f} s; {st['passes']} passes ({st['pass_s']:.1f} s); "
                f"{st['start_commands']} starts, {st['stop_commands']} stops, "
                f"{st['sink_calls']} sink calls; {st['ready']}/{st['replicas']} ready; "
                f"warnings: {st['warnings'] or 'none'}",
                "",
            ]
        )
    for variant in args.variants:
        w, bw = ctl["hb"][variant], r["baseline"]["hb"][variant]
        core, base_core = w["cpu_s"] / w["wall_s"], bw["cpu_s"] / bw["wall_s"]
        per_k = (core - base_core) / (w["rate"] / 1000) if w["rate"] else math.nan
        what = "8 GPU readings" + (" + shard summaries" if variant == "gpus+shards" else "")
        rows.append(
            [
                f"controller CPU per 1,000 heartbeats/s ({what})",
                f"{per_k:.1%} of a core = process {core:.1%} at {w['rate']:.0f}/s "
                f"- baseline {base_core:.1%} at {bw['rate']:.0f}/s; in the window: "
                f"{w['controller_seen']} heartbeats applied, {w['passes']} periodic passes "
                f"({w['pass_s'] / w['wall_s']:.1%} of a core), " + _gc(w["gc"]),
                f"< {TARGET_HB_CORE:.0%} of a core",
            ]
        )
    if "memory" in r:
        m = r["memory"]
        kib = 1024 * n
        rows += [
            [
                "memory per node, registered (controller run - baseline run)",
                f"{(m['registered'] - m['baseline_connected']) / kib:.1f} KiB "
                f"({m['registered'] / kib:.1f} - {m['baseline_connected'] / kib:.1f})",
                "",
            ],
            [
                "memory per node, registered and catalog placed (same, agents' rows out)",
                f"{(m['placed'] - m['agent_rows'] - m['baseline_connected']) / kib:.1f} KiB",
                "",
            ],
            [
                "memory per node the controller keeps after every agent left",
                f"{m['kept'] / kib:.1f} KiB ({m['replicas_kept']} replicas, "
                f"{m['disconnected']} nodes disconnected)",
                "",
            ],
        ]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats, shorter windows")
    ap.add_argument("--json", action="store_true", help="every number as JSON on stdout")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--fabrics", type=int, default=16)
    ap.add_argument("--models", type=int, default=200)
    ap.add_argument("--fill", type=float, default=0.85, help="share of GPUs the catalog needs")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--hb-seconds", type=float, default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-memory", action="store_true", help="skip the tracemalloc run")
    ap.add_argument(
        "--storm-only",
        action="store_true",
        help="only a burst into a just-started controller, the steady pass and the storm",
    )
    ap.add_argument(
        "--burst-timeout", type=float, default=600.0, help="seconds a burst or storm may take"
    )
    args = ap.parse_args(argv)
    args.repeat = args.repeat or (3 if args.quick else 9)
    args.hb_seconds = args.hb_seconds or (4.0 if args.quick else 10.0)
    args.hb_warmup = 1.0 if args.quick else 2.0
    args.variants = ["gpus"] if args.quick else ["gpus", "gpus+shards"]
    args.storm = not args.quick
    if args.storm_only:
        args.variants, args.storm, args.no_memory = [], True, True

    cat = catalog(args.models, args.nodes, args.fill, args.seed)
    header = (
        f"control_plane_scale  {time.strftime('%Y-%m-%d %H:%M:%S %z')}  "
        f"llmgw {c.revision()}  {c.machine()}"
    )
    shape = {}
    for m in cat.models:
        p = m.profiles[0]
        gpus = p.tensor_parallel * p.pipeline_parallel
        n, reps = shape.get(gpus, (0, 0))
        shape[gpus] = (n + 1, reps + m.replicas)
    fleet_line = (
        f"{args.nodes} nodes x {GPUS_PER_NODE} GPUs in {args.fabrics} fabrics; "
        f"{len(cat.models)} models, {sum(m.replicas for m in cat.models)} replicas, "
        f"{shard_count(cat)} shards, {gpus_wanted(cat)} of {args.nodes * GPUS_PER_NODE} GPUs "
        "wanted; by GPUs per replica: "
        + ", ".join(f"{g}: {n} models/{r} replicas" for g, (n, r) in sorted(shape.items()))
    )
    c.log(fleet_line)
    started = time.perf_counter()
    results = trio.run(run_all, args, cat)
    elapsed = time.perf_counter() - started
    if args.json:
        json.dump(
            {
                "header": header,
                "fleet": fleet_line,
                "args": {k: v for k, v in vars(args).items()},
                "results": results,
                "elapsed_s": elapsed,
            },
            sys.stdout,
            indent=2,
            default=str,
        )
        print()
        return 0
    print(header)
    print(fleet_line)
    c.print_table(
        "control plane at scale (stub transport, one process)",
        ["measure", "value", "target"],
        report(args, results),
    )
    print(f"(run took {elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
