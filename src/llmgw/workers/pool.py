"""The control process's side of the workers (see :mod:`llmgw.workers`).

:class:`WorkerPool` starts N workers, gives each the state it routes by, keeps them
in step (it is the control plane's endpoint sink, and the catalog's listener), starts
a worker again when one dies, and answers for them all: their usage records go to the
sinks it was given, their reports make the demand the autoscaler reads and the
admission view, their metrics are merged into one ``/metrics``.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import trio
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from llmgw import config as cfg
from llmgw.catalog.rules import Catalog
from llmgw.config import Config
from llmgw.control.autoscale import Sample
from llmgw.domain.endpoints import Endpoint
from llmgw.domain.usage import UsageSink
from llmgw.domain.wakes import Unplaceable, WakeSink
from llmgw.http.asgi import App, Receive, Scope, Send
from llmgw.http.forward import CLIENT_HEADER
from llmgw.router.core import Router
from llmgw.workers import merge, sockets, wire

__all__ = ["WorkerPool", "trust_forwarded_client", "worker_count"]

log = logging.getLogger("llmgw.workers")

#: Messages queued for one worker; a worker that far behind is restarted (its fresh
#: start brings it the whole state again).
OUTBOX = 4096
#: How long /metrics waits for the workers' answers (seconds).
METRICS_TIMEOUT = 2.0
#: How often the engines the control process holds asleep are sent (seconds).
SLEEP_SYNC_EVERY = 0.25
#: A worker dead within this long after its start doubles the pause before the next.
STEADY_AFTER = 60.0
FIRST_BACKOFF, MAX_BACKOFF = 0.5, 10.0
#: How long the workers get to come up at start (seconds).
START_TIMEOUT = 60.0


def worker_count(config: Config) -> int:
    """Workers to run: `workers`, or with 0 one per core this process may run on."""
    if config.workers:
        return config.workers
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@attrs.define
class _Slot:
    index: int
    process: trio.Process
    outbox: trio.MemorySendChannel[wire.ToWorker]
    report: wire.Report | None = None
    addresses: list[str] = attrs.field(factory=list)
    metrics: dict[int, list[wire.Family]] = attrs.field(factory=dict)


class _PoolCollector(Collector):
    def __init__(self, pool: WorkerPool) -> None:
        self._pool = pool

    def describe(self) -> list[Metric]:
        return []  # computed at collection

    def collect(self) -> Iterator[Metric]:
        workers = GaugeMetricFamily(
            "llmgw_workers",
            "Worker processes serving the client port now (llmgw-server --workers).",
        )
        workers.add_metric([], len(self._pool.slots))
        restarts = CounterMetricFamily(
            "llmgw_worker_restarts",
            "Worker processes started again after they ended unasked.",
        )
        restarts.add_metric([], self._pool.restarts)
        yield from (workers, restarts)


class _Merged:
    """generate_latest's view of the control process's families merged with the
    workers'."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def trust_forwarded_client(app: App) -> App:
    """The control process's /admin app on its unix socket: the client address a
    worker forwarded (:data:`~llmgw.http.forward.CLIENT_HEADER`) becomes the
    request's."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            forwarded = next((v for k, v in scope["headers"] if k == CLIENT_HEADER), None)
            if forwarded is not None:
                scope = {**scope, "client": (forwarded.decode("latin-1"), 0)}
        await app(scope, receive, send)

    return wrapped


class WorkerPool:
    """N workers serving the client port (module docstring)."""

    def __init__(
        self,
        config: Config,
        count: int,
        router: Router,
        *,
        sinks: Sequence[UsageSink] = (),
        wakes: WakeSink | None = None,
        log_level: str = "info",
        log_format: str = "text",
    ) -> None:
        self.config = config
        self.count = count
        self.router = router  # the control process's: scrapes, views, sleeps
        self.sinks = list(sinks)
        self.wakes = wakes
        self.log_level = log_level
        self.log_format = log_format
        self.catalog = router.catalog
        self.slots: dict[int, _Slot] = {}
        self.restarts = 0
        self.stopping = False
        self.dashboard: str | None = None  # the unix socket /admin is forwarded to
        self.client: list[str] = []
        self._woken: dict[str, float] = {}  # model -> when a worker last asked
        self._asleep_sent: list[str] = []
        self._metrics_seq = 0
        # One hash seed for every worker: Python's hash() then agrees across them, which
        # the prefix table's chains and rendezvous homes rely on (a fresh one per start:
        # hash flooding stays as hard as with a random seed per process).
        self.hash_seed = secrets.randbelow(2**32 - 1) + 1
        router.metrics.registry.register(_PoolCollector(self))
        self._metrics_answered = trio.Event()

    # -- the control plane's endpoint sink and the catalog's listener ---------------------

    def upsert(self, endpoint: Endpoint) -> None:
        self.router.upsert(endpoint)
        self._broadcast(wire.Upsert(endpoint))

    def drain(self, endpoint_id: str) -> None:
        self.router.drain(endpoint_id)
        self._broadcast(wire.Drain(endpoint_id))

    def remove(self, endpoint_id: str) -> None:
        self.router.remove(endpoint_id)
        self._broadcast(wire.Remove(endpoint_id))

    def set_catalog(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.router.set_catalog(catalog)
        self._broadcast(wire.Catalog(self._models()))

    def check(self, unplaceable: Unplaceable) -> None:
        """After a control-plane pass (a ColdSide): why the models requests wait for
        cannot be placed, to the workers holding those requests."""
        if self.wakes is None or not self._woken:
            return
        now = trio.current_time()
        reasons: dict[str, str] = {}
        for model, asked in list(self._woken.items()):
            limit = self._cold_limit(model)
            if now - asked > limit:
                del self._woken[model]
                continue
            why = unplaceable(model)
            if why is not None:
                reasons[model] = why
        self._broadcast(wire.Passed(reasons))

    def _cold_limit(self, model: str) -> float:
        found = self.catalog.resolve(model)
        if found is None or found.autoscale is None:
            return 0.0
        return float(found.autoscale.cold_start_timeout)

    # -- what the control process reads of the workers ------------------------------------

    def demand(self, model: str, now: float) -> Sample:
        """The autoscaler's demand sample (control.scaler.DemandFeed), over workers."""
        inflight = queued = serving = 0
        saturation = 0.0
        for report in self._reports():
            d = report.models.get(model)
            if d is not None:
                inflight += d.inflight
                queued += d.queued
                saturation = max(saturation, d.saturation)
                serving = max(serving, d.serving)
        if not serving:
            serving = len(self.router.endpoints.serving(model))
        return Sample(now, inflight, queued, saturation, serving)

    def cold_waiting(self, model: str) -> int:
        return sum(
            d.cold_waiting for r in self._reports() if (d := r.models.get(model)) is not None
        )

    def admission_view(self) -> dict[str, Any]:
        merged = merge.admission([r.admission for r in self._reports()])
        return merged if merged is not None else self.router.admission_view()

    async def metrics_text(self) -> bytes:
        """The exposition of the control process's metrics and the workers' merged."""
        self._metrics_seq += 1
        seq = self._metrics_seq
        asked = list(self.slots.values())
        for slot in asked:
            self._send(slot, wire.MetricsAsk(seq))
        with trio.move_on_after(METRICS_TIMEOUT):
            while not all(seq in s.metrics or s.index not in self.slots for s in asked):
                await self._metrics_answered.wait()
        answers = [s.metrics.pop(seq) for s in asked if seq in s.metrics]
        for slot in asked:
            slot.metrics.clear()
        own = list(self.router.metrics.registry.collect())
        return generate_latest(_Merged(list(merge.metrics(own, answers))))

    def _samples(self) -> wire.Samples:
        now = trio.current_time()
        return wire.Samples(
            [
                wire.Scraped(
                    s.endpoint.id,
                    s.sample,
                    None if s.last_scrape is None else now - s.last_scrape,
                    s.last_error,
                    s.reported_capacity,
                )
                for s in self.router.endpoints.all()
            ]
        )

    def _reports(self) -> list[wire.Report]:
        return [s.report for s in self.slots.values() if s.report is not None]

    def _models(self) -> list[dict[str, Any]]:
        return [cfg.converter.unstructure(m) for m in self.catalog.models]

    # -- running --------------------------------------------------------------------------

    async def run(
        self,
        reserved: list[socket.socket],
        *,
        shutdown: trio.Event,
        dashboard: str | None = None,
        task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run the workers on the `reserved` client sockets until `shutdown`; then they
        drain (router.drain_timeout) and this returns. `task_status` gets the client
        addresses once every worker listens."""
        self.client = sockets.addresses(reserved)
        self.dashboard = dashboard
        ready = [trio.Event() for _ in range(self.count)]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sync_sleep)
            nursery.start_soon(self._relay_samples)
            async with trio.open_nursery() as keepers:
                for index in range(self.count):
                    keepers.start_soon(self._keep, index, ready[index])
                with trio.fail_after(START_TIMEOUT):
                    for event in ready:
                        await event.wait()
                log.info(
                    "%d workers serve the client port on %s", self.count, ", ".join(self.client)
                )
                task_status.started(self.client)
                await shutdown.wait()
                self.stopping = True
                for slot in list(self.slots.values()):
                    self._send(slot, wire.Stop())
                # Each _keep returns once its worker has drained and exited; past
                # this, those still running are killed (_run_one).
                keepers.cancel_scope.deadline = (
                    trio.current_time() + self.config.router.drain_timeout + 10.0
                )
            nursery.cancel_scope.cancel()

    async def _keep(self, index: int, ready: trio.Event) -> None:
        """Worker `index`, started again whenever it ends, until the pool stops."""
        backoff = FIRST_BACKOFF
        while True:
            started = trio.current_time()
            try:
                code = await self._run_one(index, ready)
            except OSError as exc:
                code = None
                log.error("worker %d could not start: %s", index, exc)
            if self.stopping:
                return
            self.restarts += 1
            if trio.current_time() - started > STEADY_AFTER:
                backoff = FIRST_BACKOFF
            log.warning(
                "worker %d ended (exit code %s); starting it again in %gs", index, code, backoff
            )
            await trio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    async def _run_one(self, index: int, ready: trio.Event) -> int | None:
        parent, child = socket.socketpair()
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "llmgw.workers.worker", "--fd", str(child.fileno())],
                pass_fds=(child.fileno(),),
                env={**os.environ, "PYTHONHASHSEED": str(self.hash_seed)},
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(parent))
        channel = wire.Channel(stream, wire.FromWorker)
        outbox, pending = trio.open_memory_channel[wire.ToWorker](OUTBOX)
        slot = _Slot(index, process, outbox)
        # The snapshot and the slot in one step: every change after it is queued behind.
        outbox.send_nowait(self._hello(index))
        self.slots[index] = slot
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._send_all, channel, pending)
                nursery.start_soon(self._receive_all, slot, channel, ready)
                await process.wait()
                nursery.cancel_scope.cancel()
        finally:
            del self.slots[index]
            with trio.CancelScope(shield=True):
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                await channel.aclose()
            self._metrics_answered.set()
            self._metrics_answered = trio.Event()
        return process.returncode

    def _hello(self, index: int) -> wire.Hello:
        states = self.router.endpoints.all()
        return wire.Hello(
            worker=index,
            config=cfg.converter.unstructure(self.config),
            models=self._models(),
            endpoints=[s.endpoint for s in states],
            draining=[s.endpoint.id for s in states if s.draining],
            client=self.client,
            dashboard=self.dashboard,
            log_level=self.log_level,
            log_format=self.log_format,
        )

    async def _send_all(
        self, channel: wire.Channel, pending: trio.MemoryReceiveChannel[wire.ToWorker]
    ) -> None:
        try:
            async for message in pending:
                await channel.send(message)
        except (wire.WireError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the worker is gone; _run_one sees it exit

    async def _receive_all(self, slot: _Slot, channel: wire.Channel, ready: trio.Event) -> None:
        while True:
            try:
                message = await channel.receive()
            except wire.WireError:
                return  # it is exiting (or dead): _run_one waits for that
            self._handle(slot, message, ready)

    def _handle(self, slot: _Slot, message: wire.FromWorker, ready: trio.Event) -> None:
        if isinstance(message, wire.Usage):
            for record in message.records:
                for sink in self.sinks:
                    sink.record(record)
        elif isinstance(message, wire.Report):
            slot.report = message
            self._endpoints_from_reports()
        elif isinstance(message, wire.Wake):
            if self.wakes is not None:
                self._woken[message.model] = trio.current_time()
                self.wakes.wake(message.model)
        elif isinstance(message, wire.Woke):
            state = self.router.endpoints.get(message.endpoint_id)
            if state is not None:
                state.asleep = False
                state.used_at = trio.current_time()
        elif isinstance(message, wire.Metrics):
            slot.metrics[message.seq] = message.families
            self._metrics_answered.set()
            self._metrics_answered = trio.Event()
        elif isinstance(message, wire.Listening):
            slot.addresses = message.addresses
            ready.set()

    def _endpoints_from_reports(self) -> None:
        """The control process's endpoints carry the workers' in-flight counts and last
        use: its views show them, and its sleeper decides by them."""
        now = trio.current_time()
        inflight: dict[str, int] = {}
        idle: dict[str, float] = {}
        for report in self._reports():
            for endpoint_id, (count, idle_for) in report.endpoints.items():
                inflight[endpoint_id] = inflight.get(endpoint_id, 0) + count
                if idle_for is not None:
                    idle[endpoint_id] = min(idle.get(endpoint_id, math.inf), idle_for)
        for state in self.router.endpoints.all():
            ident = state.endpoint.id
            state.inflight = inflight.get(ident, 0)
            if ident in idle:
                used = now - idle[ident]
                if state.used_at is None or used > state.used_at:
                    state.used_at = used

    async def _relay_samples(self) -> None:
        """One scrape of each engine for all: after each pass, its findings to every
        worker (N workers scraping each engine themselves cost each of them as much
        CPU as this process spends: benchmarks/README.md, "workers")."""
        while True:
            await self.router.scraper.next_pass()
            self._broadcast(self._samples())

    async def _sync_sleep(self) -> None:
        """Send the workers the engines the control process holds asleep, on change."""
        while True:
            asleep = sorted(s.endpoint.id for s in self.router.endpoints.all() if s.asleep)
            if asleep != self._asleep_sent:
                self._asleep_sent = asleep
                self._broadcast(wire.Asleep(asleep))
            await trio.sleep(SLEEP_SYNC_EVERY)

    def reload(self) -> None:
        """SIGHUP: the workers read their TLS files again."""
        self._broadcast(wire.Reload())

    def _broadcast(self, message: wire.ToWorker) -> None:
        for slot in list(self.slots.values()):
            self._send(slot, message)

    def _send(self, slot: _Slot, message: wire.ToWorker) -> None:
        try:
            slot.outbox.send_nowait(message)
        except trio.WouldBlock:
            log.error("worker %d is %d messages behind: restarting it", slot.index, OUTBOX)
            slot.process.kill()
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
