"""Several instances on one store: the endpoints the leader publishes, and every
instance's demand.

Only the leading instance runs the control plane (llmgw.control.leadership); every
instance serves the data plane. Two things cross between them through the store:

* :class:`SharedEndpoints` is the controller's endpoint sink in every instance. While
  this instance leads it passes the controller's changes to the local data plane and
  writes the whole set it publishes to the store (``published_endpoints``, only while
  its token holds the lease), at most every SYNC_EVERY seconds and only once the
  term has settled (adopted what agents run: before that its set is partial). While
  it follows, it reads that set every SYNC_EVERY seconds and applies the difference
  to the local data plane. So a follower routes to what the leader published, a
  second or so after it did, and keeps routing to it while no leader is there (the
  engines keep serving). When a follower becomes the leader, what it had applied
  stays until its own term settles; then whatever its controller did not adopt goes.
* :class:`SharedDemand` writes this instance's demand per model (requests in flight
  and queued, pool saturation, replicas serving, seconds since the last request)
  every SYNC_EVERY seconds and reads everyone's: the leader's autoscaler sees the
  whole fleet's demand (:meth:`SharedDemand.feed`), and a model busy on any instance
  is not idle (:meth:`SharedDemand.last_request`). A request that waits for a cold
  start on a follower is queued demand there, which is what wakes the model.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

import msgspec
import trio

from llmgw.catalog.rules import Catalog
from llmgw.control.autoscale import Sample
from llmgw.control.leadership import LEASE, Leadership
from llmgw.control.scaler import DemandFeed
from llmgw.domain.endpoints import Endpoint, EndpointSink
from llmgw.store.base import Store, StoreError

__all__ = ["FRESH", "SYNC_EVERY", "SharedDemand", "SharedEndpoints"]

log = logging.getLogger("llmgw.control")

#: Seconds between writes and reads of the shared endpoints and demand.
SYNC_EVERY = 0.5
#: Another instance's demand older than this (seconds) is not counted: it has stopped.
FRESH = 5.0

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Endpoint).decode


class SharedEndpoints:
    """The controller's endpoint sink when instances share a store (module docstring)."""

    def __init__(
        self,
        store: Store,
        sink: EndpointSink,
        leadership: Leadership,
        *,
        knows: Callable[[str], bool] = lambda model: True,
        refresh_models: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """`knows` says whether the local catalog has a model; for an endpoint of one it
        has not, `refresh_models` reads the catalog again first (a model just added
        through another instance), so a request for it is never refused as unknown
        while its replica is routed to."""
        self.store = store
        self.sink = sink
        self.leadership = leadership
        self.knows = knows
        self.refresh_models = refresh_models
        # What this instance's controller publishes in its current term, and what was
        # applied from the store while following: id -> (endpoint, draining).
        self.published: dict[str, tuple[Endpoint, bool]] = {}
        self.fed: dict[str, tuple[Endpoint, bool]] = {}
        self._term: int | None = None
        self._written: dict[str, tuple[Endpoint, bool]] | None = None

    # -- EndpointSink: the controller's changes (while leading) --

    def upsert(self, endpoint: Endpoint) -> None:
        self.sink.upsert(endpoint)
        self.published[endpoint.id] = (endpoint, False)

    def drain(self, endpoint_id: str) -> None:
        self.sink.drain(endpoint_id)
        held = self.published.get(endpoint_id)
        if held is not None:
            self.published[endpoint_id] = (held[0], True)

    def remove(self, endpoint_id: str) -> None:
        self.sink.remove(endpoint_id)
        self.published.pop(endpoint_id, None)

    # -- the loop --

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            try:
                if self.leadership.leading():
                    await self._lead()
                else:
                    await self._follow()
            except StoreError as exc:
                # What was applied stays: the engines keep serving without the store.
                log.warning("shared endpoints: the store failed: %s", exc)
            await trio.sleep(SYNC_EVERY)

    async def _lead(self) -> None:
        token = self.leadership.token
        assert token is not None
        if token != self._term:  # a new term: the controller starts from nothing
            self._term, self.published, self._written = token, {}, None
        if not self.leadership.settled():
            return
        if self.fed:
            # What the previous leader published and this one's controller did not
            # adopt is gone.
            for ident in set(self.fed) - set(self.published):
                self.sink.remove(ident)
            self.fed = {}
        if self.published == self._written:
            return
        snapshot = dict(self.published)
        rows = [(ident, _encode(e).decode(), d) for ident, (e, d) in snapshot.items()]
        if await self.store.publish_endpoints(LEASE, token, rows, full=True):
            self._written = snapshot

    async def _follow(self) -> None:
        if self._term is not None:
            # Was leading: what it published is what the data plane has; the next
            # leader's set replaces it as it comes.
            self.fed, self.published = dict(self.published), {}
            self._term, self._written = None, None
        wanted = {
            ident: (_decode(body), draining)
            for ident, body, draining in await self.store.published_endpoints()
        }
        if self.refresh_models is not None and any(
            not self.knows(m) for e, _ in wanted.values() for m in e.models
        ):
            await self.refresh_models()
        for ident in set(self.fed) - set(wanted):
            self.sink.remove(ident)
        for ident, (endpoint, draining) in wanted.items():
            if self.fed.get(ident) == (endpoint, draining):
                continue
            self.sink.upsert(endpoint)
            if draining:
                self.sink.drain(ident)
        self.fed = wanted


class SharedDemand:
    """Every instance's demand through the store (module docstring)."""

    def __init__(
        self,
        store: Store,
        instance: str,
        local: DemandFeed,
        last_request: Callable[[str], float | None],
        catalog: Callable[[], Catalog],
        *,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.store = store
        self.instance = instance
        self.local = local
        self.local_last_request = last_request
        self.catalog = catalog
        self.clock = clock
        # model -> the other instances' rows, as read: (inflight, queued, saturation,
        # serving, when their last request was on our clock or None)
        self._others: dict[str, list[tuple[int, int, float, int, float | None]]] = {}

    def feed(self, model: str, now: float) -> Sample:
        """The autoscaler's demand sample: this instance's and the others' added up
        (saturation and serving replicas: the highest any saw)."""
        mine = self.local(model, now)
        inflight, queued = mine.inflight, mine.queued
        saturation, serving = mine.saturation, mine.serving or 0
        for o_inflight, o_queued, o_saturation, o_serving, _ in self._others.get(model, ()):
            inflight += o_inflight
            queued += o_queued
            saturation = max(saturation, o_saturation)
            serving = max(serving, o_serving)
        return Sample(now, inflight, queued, saturation, serving)

    def last_request(self, model: str) -> float | None:
        """When a request for `model` was last seen on any instance (this clock)."""
        times = [t for *_, t in self._others.get(model, ()) if t is not None]
        mine = self.local_last_request(model)
        if mine is not None:
            times.append(mine)
        return max(times, default=None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            try:
                await self._sync()
            except StoreError as exc:
                log.warning("shared demand: the store failed: %s", exc)
            await trio.sleep(SYNC_EVERY)

    async def _sync(self) -> None:
        now = self.clock()
        rows = []
        for model in self.catalog().models:
            s = self.local(model.name, now)
            last = self.local_last_request(model.name)
            idle = None if last is None else max(0.0, now - last)
            if s.busy or idle is not None:
                rows.append((model.name, s.inflight, s.queued, s.saturation, s.serving or 0, idle))
        await self.store.put_demand(self.instance, rows)
        others: dict[str, list[tuple[int, int, float, int, float | None]]] = {}
        # Ages by the store's clock (PostgreSQL's): another host's skew does not enter.
        for row in await self.store.read_demand(FRESH):
            instance, model, inflight, queued, saturation, serving, idle, age = row
            if instance == self.instance:
                continue
            last = None if idle is None else now - float(age) - float(idle)
            if inflight or queued:
                last = now  # busy there now
            others.setdefault(str(model), []).append(
                (int(inflight), int(queued), float(saturation), int(serving), last)
            )
        self._others = others

    def models(self) -> Iterable[str]:
        return self._others.keys()
