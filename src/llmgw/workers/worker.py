"""A worker process: one data plane on the shared client port.

Started by the control process (:mod:`llmgw.workers.pool`) as
``python -m llmgw.workers.worker --fd N``, with one end of a socket pair as fd N. It
reads :class:`~llmgw.workers.wire.Hello`, builds a :class:`~llmgw.router.core.Router`
from the configuration and the catalog in it, binds the client addresses with
SO_REUSEPORT and serves until told to stop, its control process goes away, or
SIGTERM/SIGINT; then requests in flight get `router.drain_timeout`.

It sends its usage records in batches (at most every USAGE_EVERY seconds), a report
every REPORT_EVERY seconds, and its metrics when asked; it applies the endpoint,
catalog, sleep and cold-start messages as they come. The /admin pages on the client
port are forwarded to the control process's unix socket (:mod:`llmgw.http.forward`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import trio

from llmgw import config as cfg
from llmgw import logs
from llmgw.catalog.rules import Catalog
from llmgw.domain.catalog import ModelConfig
from llmgw.domain.usage import UsageRecord
from llmgw.http.asgi import App, split, under
from llmgw.http.forward import Forward
from llmgw.http.server import serve_listeners
from llmgw.router.auth import Authenticator
from llmgw.router.core import Router
from llmgw.router.limits import SharedLimits
from llmgw.router.listener import client_listener_config, hypercorn_listener_config
from llmgw.store import open_store
from llmgw.store.base import Store
from llmgw.workers import sockets, wire
from llmgw.workers.merge import families

if TYPE_CHECKING:
    from llmgw.http.hyper import ReloadableTls

log = logging.getLogger("llmgw.workers")

#: Seconds between reports (demand, in-flight counts, admission queues).
REPORT_EVERY = 0.5
#: Usage records are sent at most this late (seconds), or when this many wait.
USAGE_EVERY = 0.1
USAGE_BATCH = 512


def models_of(data: Sequence[dict[str, object]]) -> Catalog:
    return Catalog(tuple(cfg.structure_as(m, ModelConfig) for m in data))


class _RemoteWakes:
    """Where a worker's router says a request waits for a cold start (a WakeSink): to
    the control process, whose control plane hears it."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    def wake(self, model: str) -> None:
        self._worker.post(wire.Wake(model))


class _UsageOut:
    """A usage sink that hands records to the control process in batches."""

    def __init__(self) -> None:
        self.pending: list[UsageRecord] = []
        self.ready = trio.Event()

    def record(self, record: UsageRecord) -> None:
        self.pending.append(record)
        if len(self.pending) >= USAGE_BATCH:
            self.ready.set()


class Worker:
    def __init__(self, channel: wire.Channel, hello: wire.Hello, store: Store | None) -> None:
        self.channel = channel
        self.hello = hello
        self.config = cfg.load(data=hello.config, environ={})
        auth = None
        if store is not None:
            auth = Authenticator(
                store.lookup_key,
                store.count_keys,
                required=self.config.auth.required,
                cache_ttl=self.config.auth.cache_ttl,
                # Every worker serves the same keys: they count in the store.
                limits=SharedLimits(store),
            )
        self.usage = _UsageOut()
        self.router = Router(
            self.config,
            catalog=models_of(hello.models),
            auth=auth,
            usage_sinks=[self.usage],
            wakes=_RemoteWakes(self),
            sleep_idle=False,
            rendezvous=True,
            scrape=False,  # the control process scrapes once for all (wire.Samples)
            on_woke=lambda state: self.post(wire.Woke(state.endpoint.id)),
        )
        for endpoint in hello.endpoints:
            self.router.upsert(endpoint)
        # The control process's set is the whole truth: a configured endpoint a reload
        # (SIGHUP) removed is still in the configuration the router was made with.
        known = {e.id for e in hello.endpoints}
        for state in self.router.endpoints.all():
            if state.endpoint.id not in known:
                self.router.remove(state.endpoint.id)
        for endpoint_id in hello.draining:
            self.router.drain(endpoint_id)
        self.stop = trio.Event()
        self.tls: ReloadableTls | None = None
        self._outbox_send, self._outbox = trio.open_memory_channel[wire.FromWorker](1024)

    def post(self, message: wire.FromWorker) -> None:
        """Send `message` soon, from synchronous code (the router's callbacks)."""
        try:
            self._outbox_send.send_nowait(message)
        except trio.WouldBlock:
            log.warning("worker %d: outbox full, %s not sent", self.hello.worker, message)

    async def run(self) -> None:
        config = self.config
        listeners = sockets.listen(self.hello.client)
        if config.listen_tls is not None:
            # hypercorn serves TLS only; a plaintext worker need not load it.
            from llmgw.http.hyper import ReloadableTls, TlsFiles

            files = config.listen_tls
            self.tls = ReloadableTls(TlsFiles(files.cert, files.key, files.client_ca))
        app: App = self.router.app
        if self.hello.dashboard is not None:
            app = split(under("/admin"), Forward(uds=self.hello.dashboard), app)

        async def trigger() -> None:
            await self.stop.wait()

        async with trio.open_nursery() as background:
            background.start_soon(self._signals)
            background.start_soon(self._send_loop)
            background.start_soon(self._receive_loop)
            background.start_soon(self._report_loop)
            background.start_soon(self._usage_loop)
            await background.start(self.router.run)
            async with trio.open_nursery() as serving:
                if self.tls is not None:
                    from llmgw.http.hyper import serve_hypercorn

                    await serving.start(
                        partial(
                            serve_hypercorn,
                            app,
                            listeners,
                            hypercorn_listener_config(config, admin=False),
                            tls=self.tls,
                            shutdown_trigger=trigger,
                        )
                    )
                else:
                    await serving.start(
                        partial(
                            serve_listeners,
                            app,
                            listeners,
                            client_listener_config(config, self.router, "client"),
                            shutdown_trigger=trigger,
                        )
                    )
                await self.channel.send(wire.Listening(sockets.addresses_of(listeners)))
            # Served out: the last usage records, then done.
            await self._flush_usage()
            background.cancel_scope.cancel()

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                self.stop.set()
                return

    async def _send_loop(self) -> None:
        async for message in self._outbox:
            await self.channel.send(message)

    async def _receive_loop(self) -> None:
        router = self.router
        try:
            while True:
                message = await self.channel.receive()
                if isinstance(message, wire.Upsert):
                    router.upsert(message.endpoint)
                elif isinstance(message, wire.Drain):
                    router.drain(message.endpoint_id)
                elif isinstance(message, wire.Remove):
                    router.remove(message.endpoint_id)
                elif isinstance(message, wire.Catalog):
                    router.set_catalog(models_of(message.models))
                elif isinstance(message, wire.Asleep):
                    asleep = set(message.endpoint_ids)
                    for state in router.endpoints.all():
                        state.asleep = state.endpoint.id in asleep
                elif isinstance(message, wire.Passed):
                    router.cold.check(dict(message.unplaceable).get)
                elif isinstance(message, wire.Samples):
                    router.take_samples(
                        (s.endpoint_id, s.sample, s.age, s.error, s.reported_capacity)
                        for s in message.endpoints
                    )
                elif isinstance(message, wire.MetricsAsk):
                    collected = families(router.metrics.registry.collect())
                    self.post(wire.Metrics(message.seq, collected))
                elif isinstance(message, wire.Reload):
                    self._reload()
                elif isinstance(message, wire.Stop):
                    self.stop.set()
                else:
                    log.warning("worker %d: unexpected %s", self.hello.worker, message)
        except wire.WireError as exc:
            # The control process is gone: nobody restarts or reports for this worker.
            log.warning("worker %d: %s; draining", self.hello.worker, exc)
            self.stop.set()

    def _reload(self) -> None:
        if self.tls is None:
            return
        try:
            self.tls.reload()
        except (OSError, ValueError) as exc:
            log.error("worker %d: TLS not reloaded, keeping the old: %s", self.hello.worker, exc)

    async def _report_loop(self) -> None:
        while True:
            self.post(self.report())
            await trio.sleep(REPORT_EVERY)

    def report(self) -> wire.Report:
        router = self.router
        now = trio.current_time()
        waiting = {p.pool: p.waiting for p in router.admission.stats().pools}
        models: dict[str, wire.ModelDemand] = {}
        for model in router.catalog.models:
            serving = router.endpoints.serving(model.name)
            cold = router.cold.waiting(model.name)
            inflight = sum(s.inflight for s in serving)
            queued = waiting.get(model.name, 0)
            if not (inflight or queued or cold or serving):
                continue
            models[model.name] = wire.ModelDemand(
                inflight, queued, router.pool_saturation(model.name), len(serving), cold
            )
        endpoints = {
            s.endpoint.id: (s.inflight, None if s.used_at is None else now - s.used_at)
            for s in router.endpoints.all()
        }
        return wire.Report(models, endpoints, router.admission_view())

    async def _usage_loop(self) -> None:
        while True:
            with trio.move_on_after(USAGE_EVERY):
                await self.usage.ready.wait()
            await self._flush_usage()

    async def _flush_usage(self) -> None:
        if self.usage.pending:
            records, self.usage.pending = self.usage.pending, []
            self.usage.ready = trio.Event()
            await self.channel.send(wire.Usage(records))


async def _main(fd: int) -> None:
    sock = trio.socket.fromfd(fd, socket.AF_UNIX, socket.SOCK_STREAM)
    os.close(fd)
    channel = wire.Channel(trio.SocketStream(sock), wire.ToWorker)
    hello = await channel.receive()
    if not isinstance(hello, wire.Hello):
        raise SystemExit(f"llmgw worker: expected hello, got {type(hello).__name__}")
    logs.setup(hello.log_level, hello.log_format)
    url = hello.config.get("store", {}).get("url") or ""
    store = await open_store(url) if url else None
    try:
        await Worker(channel, hello, store).run()
    finally:
        if store is not None:
            with trio.CancelScope(shield=True):
                await store.aclose()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmgw-worker", description=__doc__)
    p.add_argument("--fd", type=int, required=True, help="the control process's socket")
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):  # SIGINT drains; a second one ends it
        trio.run(_main, args.fd)


if __name__ == "__main__":
    main()
