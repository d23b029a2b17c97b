"""A day of traffic on a GPU fleet: llmgw's autoscaler against static provisioning.

    python benchmarks/autoscale.py            # about 30 s of CPU
    python benchmarks/autoscale.py --quick    # autoscale and static peak only, ~15 s
    python benchmarks/autoscale.py --timeline # also every scale decision of the day
    python benchmarks/autoscale.py --json     # every number as JSON on stdout

A discrete-event simulation on a virtual clock (24 h of traffic take seconds), in
one run, one model (a Llama-3.1-8B-sized one, one GPU per replica), the same seeded
request trace replayed for every policy:

* ``autoscale``: llmgw's autoscaler with its DEFAULT settings (docs/autoscaling.md):
  only ``min_replicas = 0`` and ``max_replicas`` (the static-at-peak count) are set;
* ``autoscale min=1``: the same with ``min_replicas = 1`` (never a cold start from zero);
* ``static peak``: ``replicas = N`` enough for the burst peak at the target saturation;
* ``static mean``: ``replicas = N`` enough for the day's mean load at that saturation.

Reported per policy: GPU-hours (every second a GPU is held, from the start command to
the engine's exit: starting and draining included), TTFT p50 / p99 of the requests
served, the requests that waited for a cold start (no replica ready when they came)
with their wait p99, 503 ``model_starting`` (a cold wait past ``cold_start_timeout``),
429s (admission: ``queue_ttl`` passed or queue full), served; ratios against static at
the peak. Then the bursts alone, and hour by hour.

What is real llmgw code, and what is modelled
---------------------------------------------
REAL (imported and run unchanged): the control plane. One
:class:`llmgw.control.controller.Controller` per policy, built without a network as
tests/test_scaler.py builds it (a fake clock, a demand feed): its ``reconcile()`` runs
the real :class:`~llmgw.control.scaler.Scaler` (demand history, sampling at most once
a second, :func:`llmgw.control.autoscale.decide`), the real
:class:`~llmgw.control.reconciler.Reconciler` (a surplus drains starting replicas
first, then the youngest ready one) and real placement on two 8 x H100 nodes. Agent
messages go in through the controller's own handler (``_on_message``: inventory,
shard reports, the pass it pokes) and its commands come out of its outbox; the
controller's :class:`~llmgw.control.activity.ActivityTracker` gets a usage record for
every finished or refused request, as the router's usage sinks do; a request that
finds no replica calls ``Controller.wake`` as the router's cold-start path does. The
demand samples' saturation is the router's own arithmetic
(:meth:`llmgw.router.scheduling.state.Saturation.pool` over candidates with the
engines' slot count as capacity); the admission ceiling, ``queue_ttl`` and queue size
are :class:`llmgw.config.AdmissionConfig`'s defaults (the default band, gold).

RE-ENACTED (this file, on the virtual clock, to llmgw's rules): the controller's loop
(a pass every ``control.interval``, 5 s, and ``MIN_PASS_GAP`` after a poke; the
pass itself takes no virtual time) and the router's admission: a request is admitted
while the pool's saturation is under the band's ceiling and nobody queues before it,
else it queues (FIFO, one band, one tenant) for ``queue_ttl`` (30 s), or, when no
replica serves the model at all, for the model's ``cold_start_timeout`` (wake on
request); admitted requests go to the replica with the fewest requests in flight (the
real scheduler scores more than that; with identical replicas and no prefix reuse
this is what it comes to).

MODELLED (assumptions, not measurements):

* **Replica**: one GPU, ``--max-num-seqs 16`` (vLLM's flag; llmgw reads it as the
  replica's capacity). A request holds one slot for its service time (prefill +
  decode): lognormal, median 4 s, sigma 0.6 (mean 4.8 s; ~200 tokens at ~50 tokens/s
  per sequence), capped at 60 s. Its TTFT is the time it waited (admission queue or
  cold start) plus a prefill time: lognormal, median 0.12 s, sigma 0.5. Neither grows
  with the batch (no interference between sequences): queueing is the only load
  effect, which flatters every policy alike.
* **Cold start**: uniform 60-180 s from the start command to ready, per start: a
  ``vllm serve`` of an 8B model on one GPU with the weights already on the node
  (process and CUDA start, ~16 GB of weights, torch.compile and CUDA graph capture;
  vLLM ships ``vllm bench startup`` to measure exactly this). Node provisioning and
  weight downloads are not in it (they would make it minutes more). NOT the
  llama-server cold start measured here by benchmarks/cold_start.py: that one loads
  a tiny generated GGUF on a CPU and is healthy in well under a second, llmgw's own
  share ~0.04 s (commit ee11134): llmgw's part is negligible next to either.
* **Drain and stop**: a draining engine stops once nothing runs on it, seen by the
  agent's 1 s drain poll, then exits in 5 s; a starting one told to stop exits in 5 s.
* **Trace**: a piecewise-linear day (:data:`DAY_SHAPE`): nights down to 0.01 req/s,
  a morning ramp, a day at 3.5-4.5 req/s, three bursts of 3-5x for 3-10 minutes
  (:data:`BURSTS`), an evening decline; Poisson arrivals (seeded). One hour of the
  previous evening runs first as a warm-up (every policy starts the day in its steady
  state); the counts are for the 24 h after it, and requests that arrived in them are
  followed to their end.

Nothing is asserted; the numbers are printed. Nothing is sent over any network.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import heapq
import json
import logging
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import log, machine, print_table, revision

from llmgw.catalog.rules import Catalog
from llmgw.config import (
    AdmissionConfig,
    AutoscaleConfig,
    ControlConfig,
    DeploymentProfile,
    ModelConfig,
    ScoringConfig,
)
from llmgw.control.autoscale import Sample
from llmgw.control.controller import MIN_PASS_GAP, Controller
from llmgw.domain.fleet import EngineInfo, Gpu, NodeInfo, ShardState
from llmgw.domain.usage import Usage, UsageRecord
from llmgw.router.endpoints import Endpoint
from llmgw.router.scheduling.state import Candidate, Saturation
from llmgw.transport.messages import (
    DrainShard,
    Register,
    ServerMessage,
    ShardStatus,
    StartShard,
    StopShard,
)

MODEL = "llama-8b"
DAY = 86400.0
WARMUP = 3600.0  # the previous day's last hour, before the counted day
GB = 10**9

# -- the model's numbers (see the module docstring) -------------------------------------

SLOTS = 16  # --max-num-seqs
SERVICE_MEDIAN, SERVICE_SIGMA, SERVICE_CAP = 4.0, 0.6, 60.0
PREFILL_MEDIAN, PREFILL_SIGMA = 0.12, 0.5
COLD_START = (60.0, 180.0)  # uniform, seconds from the start command to ready
DRAIN_POLL = 1.0  # the agent's drain_interval
EXIT_SECONDS = 5.0  # SIGTERM to exit
NODES, GPUS_PER_NODE = 2, 8

PROFILE = DeploymentProfile(
    "vllm", "vllm", "meta-llama/Llama-3.1-8B-Instruct", args=("--max-num-seqs", str(SLOTS))
)

# The day: (hour, requests per second), linear in between.
DAY_SHAPE: tuple[tuple[float, float], ...] = (
    (0, 0.30),
    (1, 0.12),
    (2, 0.04),
    (3, 0.003),
    (5, 0.003),
    (6, 0.05),
    (7, 0.40),
    (8, 1.50),
    (9, 3.50),
    (11, 4.50),
    (12, 4.00),
    (13, 3.50),
    (14, 4.50),
    (16, 4.50),
    (18, 3.00),
    (20, 1.50),
    (22, 0.80),
    (24, 0.30),
)
# (start hour, minutes, multiplier of the day's rate then)
BURSTS: tuple[tuple[float, float, float], ...] = (
    (10.5, 5.0, 4.0),
    (15.0, 10.0, 3.0),
    (19.5, 3.0, 5.0),
)
BURST_TAIL = 300.0  # seconds after a burst still counted as its aftermath


def rate(t: float) -> float:
    """Requests per second at `t` seconds into the day (periodic)."""
    h = (t % DAY) / 3600.0
    i = bisect.bisect_right([k[0] for k in DAY_SHAPE], h) - 1
    (h0, r0), (h1, r1) = DAY_SHAPE[i], DAY_SHAPE[min(i + 1, len(DAY_SHAPE) - 1)]
    base = r0 if h1 == h0 else r0 + (r1 - r0) * (h - h0) / (h1 - h0)
    for start, minutes, mult in BURSTS:
        if start * 3600 <= t % DAY < start * 3600 + minutes * 60:
            return base * mult
    return base


def mean_service() -> float:
    return SERVICE_MEDIAN * math.exp(SERVICE_SIGMA**2 / 2)


@attrs.frozen
class Trace:
    arrival: list[float]
    service: list[float]
    prefill: list[float]
    peak_rate: float
    mean_rate: float


def make_trace(seed: int) -> Trace:
    """Non-homogeneous Poisson arrivals by thinning, from -WARMUP to DAY."""
    rng = random.Random(seed)
    step = 10.0
    peak = max(rate(t) for t in _grid(-WARMUP, DAY, step))
    mean = statistics.fmean(rate(t) for t in _grid(0.0, DAY, step))
    arrival, service, prefill = [], [], []
    t = -WARMUP
    while True:
        t += rng.expovariate(peak)
        if t >= DAY:
            break
        if rng.random() * peak <= rate(t):
            arrival.append(t)
            service.append(
                min(SERVICE_CAP, rng.lognormvariate(math.log(SERVICE_MEDIAN), SERVICE_SIGMA))
            )
            prefill.append(rng.lognormvariate(math.log(PREFILL_MEDIAN), PREFILL_SIGMA))
    return Trace(arrival, service, prefill, peak, mean)


def _grid(start: float, end: float, step: float) -> list[float]:
    return [start + i * step for i in range(int((end - start) / step))]


# -- one policy's run --------------------------------------------------------------------


@attrs.frozen
class Policy:
    name: str
    replicas: int
    autoscale: AutoscaleConfig | None


class Request:
    __slots__ = ("admitted", "arrival", "cold", "i", "outcome", "prefill", "service")

    def __init__(self, i: int, arrival: float, service: float, prefill: float) -> None:
        self.i = i
        self.arrival = arrival
        self.service = service
        self.prefill = prefill
        self.cold = False  # came when no replica served: waited for a cold start
        self.admitted: float | None = None
        self.outcome = ""  # "" while queued; served, expired, queue_full, starting


class Engine:
    """One replica: the agent's shard (GPU held from `started` to `stopped`) and the
    router's endpoint (published, draining, requests in flight)."""

    __slots__ = (
        "draining",
        "epoch",
        "inflight",
        "node",
        "port",
        "published",
        "replica_id",
        "started",
        "stopped",
        "stopping",
    )

    def __init__(self, cmd: StartShard, node: str, now: float) -> None:
        self.replica_id = cmd.replica_id
        self.epoch = cmd.epoch
        self.port = cmd.port
        self.node = node
        self.started = now
        self.stopped: float | None = None
        self.stopping = False  # told to stop or drain (no ready report any more)
        self.published = False
        self.draining = False
        self.inflight = 0


# event kinds
_FINISH, _EXPIRE, _READY, _STOPPED = range(4)


class Sim:
    """One policy on the virtual clock: the router's side and the agents' side are
    re-enacted here; the controller in the middle is llmgw's (module docstring)."""

    def __init__(self, policy: Policy, trace: Trace, seed: int) -> None:
        self.policy = policy
        self.trace = trace
        self.rng = random.Random(seed)  # cold-start durations
        self.now = -WARMUP - 60.0
        admission = AdmissionConfig()
        band = next(b for b in admission.bands if b.name == admission.default_band)
        self.ceiling = band.saturation_ceiling
        self.queue_ttl = float(admission.queue_ttl)
        self.queue_capacity = admission.queue_capacity_per_band
        self.saturation = Saturation(ScoringConfig(), stale_after=10.0)
        self.control = ControlConfig()
        model = ModelConfig(
            MODEL, replicas=policy.replicas, profiles=(PROFILE,), autoscale=policy.autoscale
        )
        self.cold_timeout = float(policy.autoscale.cold_start_timeout) if policy.autoscale else 0.0
        self.controller = Controller(
            self.control, Catalog((model,)), self, clock=self.clock, demand=self.demand
        )
        self.controller._settled = True  # its loop's settle period is over
        self.outbox, self.commands = trio.open_memory_channel[ServerMessage](math.inf)
        self.sessions: dict[str, int | None] = {}
        for n in range(NODES):
            node = f"gpu-{n}"
            gpus = tuple(
                Gpu(i, f"GPU-{n}-{i}", "NVIDIA H100 80GB HBM3", 80 * GB)
                for i in range(GPUS_PER_NODE)
            )
            info = NodeInfo(node, node, f"10.0.0.{n + 1}", gpus=gpus, engines=(EngineInfo("vllm"),))
            self.controller.inventory.register(Register(info), self.now)
            record = self.controller.inventory.get(node)
            self.sessions[node] = record.session if record is not None else None
            # One outbox for all nodes; each command names its replica, whose node we keep.
            self.controller._outboxes[node] = self.outbox
        self.engines: dict[str, Engine] = {}
        self.serving: list[Engine] = []  # published and not draining, in publish order
        self.queue: collections.deque[Request] = collections.deque()
        self.queued = 0
        self.events: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.next_pass = self.now
        self.requests: list[Request] = []
        self.passes = 0
        self.starts = 0
        self.max_ready = 0
        self.max_queued = 0
        self.decisions: list[tuple[float, str]] = []  # the controller's scale log lines

    # -- the controller's view of time and demand ----------------------------------------

    def clock(self) -> float:
        return self.now

    def demand(self, model: str, now: float) -> Sample:
        """router_demand (control/scaler.py): in flight at the model's serving
        endpoints, waiting in its admission queue, and the router's pool saturation."""
        candidates = [
            Candidate(e.replica_id, None, None, None, e.inflight, None, capacity=SLOTS)
            for e in self.serving
        ]
        inflight = sum(e.inflight for e in self.serving)
        return Sample(
            now, inflight, self.queued, self.saturation.pool(candidates), len(self.serving)
        )

    # -- EndpointSink: what the controller publishes to the router -----------------------

    def upsert(self, endpoint: Endpoint) -> None:
        engine = self.engines[endpoint.id]
        if not engine.published:
            engine.published = True
            self.serving.append(engine)
            self.max_ready = max(self.max_ready, len(self.serving))
        self.dispatch()  # a new endpoint pokes admission

    def drain(self, endpoint_id: str) -> None:
        engine = self.engines.get(endpoint_id)
        if engine is not None and not engine.draining:
            engine.draining = True
            if engine in self.serving:
                self.serving.remove(engine)

    def remove(self, endpoint_id: str) -> None:
        engine = self.engines.get(endpoint_id)
        if engine is not None:
            self.drain(endpoint_id)
            engine.published = False

    # -- events ---------------------------------------------------------------------------

    def push(self, at: float, kind: int, what: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, what))

    def run(self) -> None:
        trace = self.trace
        n = len(trace.arrival)
        i = 0
        while True:
            t_arrival = trace.arrival[i] if i < n else math.inf
            t_event = self.events[0][0] if self.events else math.inf
            t = min(t_arrival, t_event, self.next_pass)
            if t == math.inf or (t > DAY and i >= n and self._idle()):
                break
            self.now = t
            if t == self.next_pass:
                self.reconcile()
            elif t == t_event:
                _, _, kind, what = heapq.heappop(self.events)
                self.handle(kind, what)
            else:
                self.arrive(Request(i, t, trace.service[i], trace.prefill[i]))
                i += 1
            if self.controller._wake.is_set() and self.next_pass > self.now + MIN_PASS_GAP:
                # Poked (a shard report, a wake): the loop runs a pass after its gap.
                self.next_pass = self.now + MIN_PASS_GAP
        # GPUs still held at the end of the day are counted to its end.

    def _idle(self) -> bool:
        return self.queued == 0 and all(e.inflight == 0 for e in self.engines.values())

    def reconcile(self) -> None:
        # Controller._reconcile_loop: a fresh wake event, a pass, the next in `interval`.
        self.controller._wake = trio.Event()
        self.controller.reconcile()
        self.passes += 1
        self.next_pass = self.now + float(self.control.interval)
        self.agents()

    def agents(self) -> None:
        """The agents carry out the commands the controller sent."""
        while True:
            try:
                message = self.commands.receive_nowait()
            except trio.WouldBlock:
                return
            if isinstance(message, StartShard):
                node = self._node_of(message)
                engine = Engine(message, node, self.now)
                self.engines[message.replica_id] = engine
                self.starts += 1
                self.report(engine, ShardState.STARTING)
                self.push(self.now + self.rng.uniform(*COLD_START), _READY, engine)
            elif isinstance(message, DrainShard):
                engine = self.engines[message.replica_id]
                engine.stopping = True
                if engine.inflight == 0:
                    self.push(self.now + DRAIN_POLL + EXIT_SECONDS, _STOPPED, engine)
            elif isinstance(message, StopShard):
                engine = self.engines[message.replica_id]
                if engine.stopped is None and not (engine.stopping and engine.inflight == 0):
                    engine.stopping = True
                    self.push(self.now + EXIT_SECONDS, _STOPPED, engine)

    def _node_of(self, cmd: StartShard) -> str:
        replica = self.controller.reconciler.replicas[cmd.replica_id]
        return replica.placement.shards[cmd.rank].node_id

    def report(self, engine: Engine, state: ShardState) -> None:
        status = ShardStatus(
            engine.replica_id,
            0,
            engine.epoch,
            state,
            model=MODEL,
            endpoint_url=f"http://{engine.node}:{engine.port}"
            if state is ShardState.READY
            else None,
            capacity=SLOTS if state is ShardState.READY else None,
        )
        self.controller._on_message(engine.node, self.sessions[engine.node], status)
        self.agents()

    def handle(self, kind: int, what: Any) -> None:
        if kind == _FINISH:
            engine, request = what
            engine.inflight -= 1
            self.record(request, 200)
            if engine.stopping and engine.inflight == 0 and engine.stopped is None:
                self.push(self.now + DRAIN_POLL + EXIT_SECONDS, _STOPPED, engine)
            self.dispatch()
        elif kind == _EXPIRE:
            request = what
            if request.outcome == "":
                request.outcome = "starting" if request.cold else "expired"
                self.queued -= 1
                self.record(request, 503 if request.cold else 429)
        elif kind == _READY:
            engine = what
            if not engine.stopping:
                self.report(engine, ShardState.READY)
        elif kind == _STOPPED:
            engine = what
            if engine.stopped is None:
                engine.stopped = self.now
                self.report(engine, ShardState.STOPPED)

    # -- the router's side ----------------------------------------------------------------

    def arrive(self, request: Request) -> None:
        self.requests.append(request)
        if not self.serving:
            if self.policy.autoscale is None:
                request.outcome = "unavailable"  # a static model with no replica: 503
                self.record(request, 503)
                return
            request.cold = True
            self.controller.wake(MODEL)  # router.cold.wait -> Fleet.wake
            self.enqueue(request, self.cold_timeout)
            return
        if self.queued == 0 and self.pool_saturation() < self.ceiling:
            self.admit(request)
        else:
            self.enqueue(request, self.queue_ttl)

    def enqueue(self, request: Request, ttl: float) -> None:
        if self.queued >= self.queue_capacity:
            request.outcome = "queue_full"
            self.record(request, 429)
            return
        self.queue.append(request)
        self.queued += 1
        if request.arrival >= 0.0:
            self.max_queued = max(self.max_queued, self.queued)
        self.push(self.now + ttl, _EXPIRE, request)

    def pool_saturation(self) -> float:
        """Saturation.pool for these candidates (no scraped numbers, known capacity:
        each replica's level is min(1, inflight / slots); the mean over replicas)."""
        if not self.serving:
            return 1.0
        return sum(min(1.0, e.inflight / SLOTS) for e in self.serving) / len(self.serving)

    def dispatch(self) -> None:
        while self.queue and self.serving:
            head = self.queue[0]
            if head.outcome != "":
                self.queue.popleft()
                continue
            if self.pool_saturation() >= self.ceiling:
                return
            self.queue.popleft()
            self.queued -= 1
            self.admit(head)

    def admit(self, request: Request) -> None:
        engine = min(self.serving, key=lambda e: e.inflight)
        engine.inflight += 1
        request.admitted = self.now
        request.outcome = "served"
        self.push(self.now + request.service, _FINISH, (engine, request))

    def record(self, request: Request, status: int) -> None:
        """The router's usage sinks include the controller's activity tracker."""
        self.controller.activity.record(
            UsageRecord(MODEL, None, status, Usage(), self.now - request.arrival)
        )


class _Decisions(logging.Handler):
    """The controller's "model m: a -> b replicas (why)" lines, on the virtual clock."""

    def __init__(self, sim: Sim) -> None:
        super().__init__(logging.INFO)
        self.sim = sim

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if " replicas (" in message:
            self.sim.decisions.append((self.sim.now, message.split(": ", 1)[1]))


# -- results ---------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def gpu_seconds(sim: Sim, start: float, end: float) -> float:
    total = 0.0
    for e in sim.engines.values():
        stop = e.stopped if e.stopped is not None else math.inf
        total += max(0.0, min(stop, end) - max(e.started, start))
    return total


def summarise(sim: Sim) -> dict[str, Any]:
    day = [r for r in sim.requests if 0.0 <= r.arrival < DAY]
    served = [r for r in day if r.outcome == "served"]
    ttft = [r.admitted - r.arrival + r.prefill for r in served if r.admitted is not None]
    cold = [r for r in day if r.cold]
    cold_wait = [r.admitted - r.arrival for r in cold if r.admitted is not None]
    outcomes = collections.Counter(r.outcome for r in day)
    bursts = []
    for start, minutes, _ in BURSTS:
        t0, t1 = start * 3600, start * 3600 + minutes * 60 + BURST_TAIL
        rs = [r for r in day if t0 <= r.arrival < t1]
        b_ttft = [r.admitted - r.arrival + r.prefill for r in rs if r.admitted is not None]
        bursts.append(
            {
                "requests": len(rs),
                "ttft_p99": pct(b_ttft, 0.99),
                "refused": sum(r.outcome not in ("served", "") for r in rs),
                "gpu_hours": gpu_seconds(sim, t0, t1) / 3600,
            }
        )
    in_burst = [
        (start * 3600, start * 3600 + minutes * 60 + BURST_TAIL) for start, minutes, _ in BURSTS
    ]
    calm = [
        r.admitted - r.arrival + r.prefill
        for r in served
        if r.admitted is not None and not any(t0 <= r.arrival < t1 for t0, t1 in in_burst)
    ]
    hourly = []
    by_hour: dict[int, list[float]] = collections.defaultdict(list)
    for r in served:
        if r.admitted is not None:
            by_hour[int(r.arrival // 3600)].append(r.admitted - r.arrival + r.prefill)
    for h in range(24):
        hourly.append(
            {
                "gpus": gpu_seconds(sim, h * 3600.0, (h + 1) * 3600.0) / 3600,
                "ttft_p99": pct(by_hour[h], 0.99),
                "requests": sum(1 for r in day if h * 3600 <= r.arrival < (h + 1) * 3600),
            }
        )
    events = {
        f"{direction} {cause}": n
        for (_, direction, cause), n in sorted(sim.controller.scaler.events.items())
    }
    return {
        "policy": sim.policy.name,
        "gpu_hours": gpu_seconds(sim, 0.0, DAY) / 3600,
        "requests": len(day),
        "served": len(served),
        "ttft_p50": pct(ttft, 0.50),
        "ttft_p99": pct(ttft, 0.99),
        "ttft_max": max(ttft, default=None),
        "ttft_p99_outside_bursts": pct(calm, 0.99),
        "cold_waited": len(cold),
        "cold_wait_p50": pct(cold_wait, 0.50),
        "cold_wait_p99": pct(cold_wait, 0.99),
        "starting_503": outcomes["starting"],
        "unavailable_503": outcomes["unavailable"],
        "expired_429": outcomes["expired"],
        "queue_full_429": outcomes["queue_full"],
        "replica_starts": sim.starts,
        "max_ready": sim.max_ready,
        "max_queued": sim.max_queued,
        "scale_events": events,
        "passes": sim.passes,
        "decisions": [(t, m) for t, m in sim.decisions if t >= 0.0],
        "bursts": bursts,
        "hourly": hourly,
    }


def policies(peak_n: int, mean_n: int) -> list[Policy]:
    return [
        Policy("autoscale", 1, AutoscaleConfig(min_replicas=0, max_replicas=peak_n)),
        Policy("static peak", peak_n, None),
        Policy("autoscale min=1", 1, AutoscaleConfig(min_replicas=1, max_replicas=peak_n)),
        Policy("static mean", mean_n, None),
    ]


def _s(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def print_results(out: dict[str, Any]) -> None:
    results = out["results"]
    base = next(r for r in results if r["policy"] == "static peak")
    print(
        f"autoscale  llmgw {out['revision']}  {out['machine']}\n"
        f"trace: seed {out['seed']}, {out['requests']} requests in 24 h (mean "
        f"{out['mean_rate']:.2f} req/s, peak {out['peak_rate']:.2f} req/s); replicas of "
        f"{SLOTS} slots, service {out['mean_service']:.1f} s mean; cold start "
        f"{COLD_START[0]:g}-{COLD_START[1]:g} s; static peak {out['peak_n']}, static mean "
        f"{out['mean_n']} replicas; autoscale max_replicas {out['peak_n']}, every other "
        f"setting its default; simulated in {out['seconds']:.0f} s\n"
    )
    rows = []
    for r in results:
        rows.append(
            [
                r["policy"],
                f"{r['gpu_hours']:.1f}",
                _ratio(r["gpu_hours"], base["gpu_hours"]),
                f"{_s(r['ttft_p50'])} / {_s(r['ttft_p99'])}",
                _ratio(r["ttft_p99"], base["ttft_p99"]),
                f"{r['cold_waited']} ({_s(r['cold_wait_p99'], 0)})",
                str(r["starting_503"] + r["unavailable_503"]),
                str(r["expired_429"] + r["queue_full_429"]),
                f"{r['served']} ({r['served'] / r['requests']:.2%})",
            ]
        )
    print_table(
        "A day (24 h): GPU-hours and latency by policy (ratios against static peak)",
        [
            "policy",
            "GPU-hours",
            "vs peak",
            "TTFT p50 / p99 s",
            "p99 vs peak",
            "waited for cold start (wait p99 s)",
            "503",
            "429",
            "served",
        ],
        rows,
    )
    rows = []
    for r in results:
        b = r["bursts"]
        rows.append(
            [
                r["policy"],
                str(r["replica_starts"]),
                str(r["max_ready"]),
                str(r["max_queued"]),
                ", ".join(f"{k} {v}" for k, v in r["scale_events"].items()) or "-",
                _s(r["ttft_p99_outside_bursts"]),
                " | ".join(f"{_s(x['ttft_p99'], 1)}" for x in b),
                " | ".join(str(x["refused"]) for x in b),
                " | ".join(f"{x['gpu_hours']:.2f}" for x in b),
            ]
        )
    bursts = " | ".join(f"{s:g}h {m:g}min x{k:g}" for s, m, k in BURSTS)
    print_table(
        f"Scaling, and the bursts ({bursts}; each with the {BURST_TAIL / 60:g} min after it)",
        [
            "policy",
            "replica starts",
            "max ready",
            "max queued",
            "scale events",
            "TTFT p99 s outside bursts",
            "burst TTFT p99 s",
            "burst refused",
            "burst GPU-hours",
        ],
        rows,
    )
    rows = []
    for h in range(24):
        row = [f"{h:02d}:00", str(results[0]["hourly"][h]["requests"])]
        for r in results:
            x = r["hourly"][h]
            row.append(f"{x['gpus']:.2f} / {_s(x['ttft_p99'], 2)}")
        rows.append(row)
    print_table(
        "Hour by hour: GPUs held (mean) / TTFT p99 s",
        ["hour", "requests", *(r["policy"] for r in results)],
        rows,
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="autoscale and static peak only")
    p.add_argument(
        "--timeline", action="store_true", help="also print every scale decision of the day"
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    started = time.process_time()
    trace = make_trace(args.seed)
    counted = sum(1 for t in trace.arrival if t >= 0)
    per_replica = SLOTS * AutoscaleConfig(0, 1).target_saturation / mean_service()
    peak_n = math.ceil(trace.peak_rate / per_replica)
    mean_n = max(1, math.ceil(trace.mean_rate / per_replica))
    log(f"trace: {counted} requests; static peak {peak_n}, static mean {mean_n} replicas")
    chosen = policies(peak_n, mean_n)[: 2 if args.quick else None]
    results = []
    control_log = logging.getLogger("llmgw.control")
    control_log.setLevel(logging.INFO)
    control_log.propagate = False
    warnings = logging.StreamHandler()
    warnings.setLevel(logging.WARNING)
    control_log.addHandler(warnings)
    for policy in chosen:
        log(f"simulating {policy.name}")
        sim = Sim(policy, trace, args.seed + 1)
        decisions = _Decisions(sim)
        control_log.addHandler(decisions)
        try:
            sim.run()
        finally:
            control_log.removeHandler(decisions)
        results.append(summarise(sim))
    out = {
        "revision": revision(),
        "machine": machine(),
        "seed": args.seed,
        "requests": counted,
        "mean_rate": trace.mean_rate,
        "peak_rate": trace.peak_rate,
        "mean_service": mean_service(),
        "peak_n": peak_n,
        "mean_n": mean_n,
        "seconds": time.process_time() - started,
        "results": results,
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print_results(out)
    if args.timeline:
        for r in results:
            if r["decisions"]:
                print(f"\n{r['policy']}: scale decisions (virtual time of day)")
                for t, message in r["decisions"]:
                    print(f"  {_hms(t)}  {message}")
    return 0


def _hms(t: float) -> str:
    s = int(t)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


if __name__ == "__main__":
    raise SystemExit(main())
