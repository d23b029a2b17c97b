"""Admission: priority bands queue in front of a saturated model pool (DESIGN §4 step 4).

Each model pool has a saturation in [0, 1], read from a callable the router passes in
(``Router.pool_saturation``: ``Saturation.pool`` over the pool's usable replicas). A
request of band B for pool P is admitted at once while::

    saturation(P) < B.saturation_ceiling
    and no request of priority >= B.priority waits for P (no overtaking a queue)
    and no dispatched request of P is still on its way to its slot (see the handoff)

Otherwise it waits in B's queue for P. A waiting request leaves the queue exactly once:
admitted, expired (``queue_ttl`` passed), or abandoned (its task was cancelled, e.g.
the client went away). A full band queue refuses at once (``queue_full``).

Dispatch (:meth:`AdmissionController.run`, one task in the router's nursery)
----------------------------------------------------------------------------
Strict priority: only the highest-priority non-empty band of a pool is served, and
only while the pool's saturation is below that band's ceiling; lower bands wait
behind it even if their own ceiling would allow them. Inside a band, deficit
round-robin across tenants weighted by the declared cost (tokens), FIFO within a
tenant, so a flood from one tenant delays another tenant of the same band by about
one request per turn, not by the flood.

One request is dispatched at a time per pool, and the next is chosen only after the
previous one's task has resumed and run to its next checkpoint (the *handoff*): the
router raises its in-flight count there, so the next saturation read sees the request
just admitted. A synchronous loop in ``poke()`` could not see it (the woken task has
not run yet) and would let a whole queue through at once; that is why dispatch is a
task. The router therefore must not await anything between :meth:`admit` returning
and counting the request in flight.

The dispatcher re-checks a pool when poked (:meth:`~AdmissionController.poke`,
:meth:`~AdmissionController.poke_all`; every :meth:`Ticket.release` pokes its pool),
when a request is queued, when a handoff completes, and every ``interval`` while
anything waits, as a fallback for saturation that changes without a poke.

Cost: an unsaturated pool with an empty queue admits with one dict lookup, one
saturation read and one small :class:`Ticket`; no checkpoint. With admission
disabled, :meth:`admit` returns a shared no-op ticket.

Time is trio's (``trio.current_time()``); tests drive it with
``trio.testing.MockClock``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Literal

import attrs
import trio

from llmgw.config import AdmissionConfig, Band

__all__ = [
    "AdmissionController",
    "AdmissionRejected",
    "AdmissionStats",
    "BandStats",
    "PoolStats",
    "Ticket",
    "UnknownBand",
    "WaitHook",
]

RejectReason = Literal["queue_full", "expired"]
WaitOutcome = Literal["admitted", "expired", "abandoned"]
# (pool, band, outcome, seconds waited): called once per request that was queued.
WaitHook = Callable[[str, str, WaitOutcome, float], None]

# Time constant of the per-queue dispatch-rate estimate behind Retry-After.
RATE_TAU = 10.0
# Weight of a new cost in the running mean that sets a band's DRR quantum.
QUANTUM_ALPHA = 0.125
# The quantum never reaches 0, so a positive cost always gets served eventually.
MIN_QUANTUM = 1e-9

_WAITING, _ADMITTED, _GONE = 0, 1, 2


class UnknownBand(ValueError):
    """A band name that the configuration does not define (the router answers 400)."""

    def __init__(self, name: str, valid: Iterable[str]) -> None:
        self.name = name
        self.valid = tuple(valid)
        super().__init__(f"unknown band {name!r}; valid bands: {', '.join(self.valid)}")


class AdmissionRejected(Exception):
    """The request was not admitted: answer 429 with ``Retry-After: retry_after``."""

    def __init__(
        self, reason: RejectReason, retry_after: float, pool: str, band: str, waited: float = 0.0
    ) -> None:
        self.reason: RejectReason = reason
        self.retry_after = retry_after  # whole seconds, >= 1
        self.pool = pool
        self.band = band
        self.waited = waited
        what = "its queue is full" if reason == "queue_full" else "it waited too long"
        super().__init__(
            f"{pool!r} is saturated for band {band!r} and {what}; retry in {retry_after:g}s"
        )


class Ticket:
    """An admitted request. Release it (or leave its ``with`` block) when the request ends.

    Releasing is idempotent, counts the request out of the controller's in-flight gauge
    and pokes its pool, since a finished request usually frees room.
    """

    __slots__ = ("_controller", "_queue", "band", "queued", "waited")

    def __init__(
        self,
        controller: AdmissionController | None,
        queue: _BandQueue | None,
        band: str,
        queued: bool,
        waited: float,
    ) -> None:
        self._controller = controller
        self._queue = queue
        self.band = band  # "" when admission is disabled
        self.queued = queued  # False when admitted at once
        self.waited = waited  # seconds spent queued

    def release(self) -> None:
        q = self._queue
        if q is None:
            return
        self._queue = None
        q.inflight -= 1
        if self._controller is not None and q.pool.waiting:
            self._controller._mark(q.pool)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


# Shared by every request while admission is disabled: nothing to count or release.
PASS_THROUGH = Ticket(None, None, "", False, 0.0)


@attrs.frozen
class BandStats:
    band: str
    priority: int
    saturation_ceiling: float
    depth: int  # waiting now
    tenants: int  # distinct tenants waiting now
    inflight: int  # admitted, not yet released
    admitted_immediate: int
    admitted_queued: int
    rejected_queue_full: int
    expired: int
    abandoned: int


@attrs.frozen
class PoolStats:
    pool: str
    saturation: float  # the last value read (by an admission or the dispatcher)
    waiting: int
    bands: tuple[BandStats, ...]


@attrs.frozen
class AdmissionStats:
    enabled: bool
    pools: tuple[PoolStats, ...]


class _Rate:
    """Exponentially decaying event rate (events per second), for Retry-After."""

    __slots__ = ("_at", "_value")

    def __init__(self) -> None:
        self._value = 0.0
        self._at = 0.0

    def tick(self, now: float) -> None:
        self._value = self.get(now) + 1.0 / RATE_TAU
        self._at = now

    def get(self, now: float) -> float:
        return self._value * math.exp(-max(0.0, now - self._at) / RATE_TAU)


class _Waiter:
    __slots__ = ("cost", "queue", "since", "state", "task", "tenant")

    def __init__(
        self, queue: _BandQueue, tenant: str, cost: float, since: float, task: trio.lowlevel.Task
    ) -> None:
        self.queue = queue
        self.tenant = tenant
        self.cost = cost
        self.since = since
        self.state = _WAITING
        self.task = task

    def abort(self, _raise_cancel: object) -> trio.lowlevel.Abort:
        # Cancelled or expired while queued: leave the queue now, so the dispatcher
        # can never pick a request nobody waits for.
        self.queue.remove(self)
        self.state = _GONE
        return trio.lowlevel.Abort.SUCCEEDED


class _Tenant:
    __slots__ = ("deficit", "name", "waiters")

    def __init__(self, name: str) -> None:
        self.name = name
        # An ordered set: FIFO pops and O(1) removal of a cancelled waiter.
        self.waiters: OrderedDict[_Waiter, None] = OrderedDict()
        self.deficit = 0.0


class _BandQueue:
    """One band's queue for one pool: deficit round-robin over tenants, FIFO within one.

    The tenant ring is the insertion order of ``tenants``; the first tenant is the one
    whose turn it is. A turn grants ``quantum`` once; the tenant is served while its
    head fits its deficit, then goes to the back. ``quantum`` follows the mean cost of
    this band's requests, so a turn is about one typical request.
    """

    __slots__ = (
        "abandoned",
        "admitted_immediate",
        "admitted_queued",
        "ahead",
        "band",
        "depth",
        "expired",
        "granted",
        "inflight",
        "last_arrival",
        "pool",
        "quantum",
        "rate",
        "rejected",
        "tenants",
    )

    def __init__(self, pool: _Pool, band: Band) -> None:
        self.pool = pool
        self.band = band
        self.tenants: OrderedDict[str, _Tenant] = OrderedDict()
        self.depth = 0
        self.granted = False  # the front tenant has had its quantum for this turn
        self.quantum = 0.0  # 0 until the first request sets it
        self.rate = _Rate()  # dispatches from this queue
        self.ahead: tuple[_BandQueue, ...] = ()  # queues of priority >= this band's, itself too
        self.inflight = 0
        self.last_arrival = -math.inf  # trio time of this band's latest request here
        self.admitted_immediate = 0
        self.admitted_queued = 0
        self.rejected = 0
        self.expired = 0
        self.abandoned = 0

    def push(self, w: _Waiter) -> None:
        t = self.tenants.get(w.tenant)
        if t is None:
            t = self.tenants[w.tenant] = _Tenant(w.tenant)
        t.waiters[w] = None
        self.depth += 1
        self.pool.waiting += 1
        q = self.quantum
        q = w.cost if q == 0.0 else q + (w.cost - q) * QUANTUM_ALPHA
        self.quantum = max(q, MIN_QUANTUM)

    def remove(self, w: _Waiter) -> None:
        t = self.tenants[w.tenant]
        del t.waiters[w]
        self.depth -= 1
        self.pool.waiting -= 1
        if not t.waiters:
            self._drop(t)

    def pop(self) -> _Waiter:
        """The next waiter by DRR; the queue must not be empty."""
        tenants = self.tenants
        misses = 0
        while True:
            t = next(iter(tenants.values()))
            if not self.granted:
                t.deficit += self.quantum
                self.granted = True
            w = next(iter(t.waiters))
            if w.cost <= t.deficit:
                t.deficit -= w.cost
                self.remove(w)
                return w
            tenants.move_to_end(t.name)
            self.granted = False
            misses += 1
            if misses >= len(tenants):
                self._skip_rounds()
                misses = 0

    def _skip_rounds(self) -> None:
        # A whole round served nobody (requests far above the quantum). Grant at once
        # the rounds in which still nobody would fit, instead of looping through them:
        # the order of service is exactly what those rounds would have produced.
        q = self.quantum
        rounds = min(
            math.ceil((next(iter(t.waiters)).cost - t.deficit) / q) for t in self.tenants.values()
        )
        if rounds > 1:
            extra = (rounds - 1) * q
            for t in self.tenants.values():
                t.deficit += extra

    def _drop(self, t: _Tenant) -> None:
        if next(iter(self.tenants)) == t.name:
            self.granted = False
        # DRR forgets the deficit of a tenant that has nothing queued.
        del self.tenants[t.name]

    def oldest(self) -> float | None:
        return min((next(iter(t.waiters)).since for t in self.tenants.values()), default=None)

    def retry_after(self, now: float, ttl: float) -> float:
        """Seconds until this queue has likely drained what is in it now, in [1, ttl]."""
        rate = self.rate.get(now)
        guess = (self.depth + 1) / rate if rate > 0.0 else ttl
        return float(max(1, math.ceil(min(guess, ttl))))

    def stats(self) -> BandStats:
        b = self.band
        return BandStats(
            band=b.name,
            priority=b.priority,
            saturation_ceiling=b.saturation_ceiling,
            depth=self.depth,
            tenants=len(self.tenants),
            inflight=self.inflight,
            admitted_immediate=self.admitted_immediate,
            admitted_queued=self.admitted_queued,
            rejected_queue_full=self.rejected,
            expired=self.expired,
            abandoned=self.abandoned,
        )


class _Pool:
    """One model pool: its band queues in dispatch order and its handoff."""

    __slots__ = ("by_band", "handoff", "name", "queues", "saturation", "waiting")

    def __init__(self, name: str, bands: tuple[Band, ...]) -> None:
        self.name = name
        self.queues = tuple(_BandQueue(self, b) for b in bands)
        self.by_band = {q.band.name: q for q in self.queues}
        for q in self.queues:
            q.ahead = tuple(x for x in self.queues if x.band.priority >= q.band.priority)
        self.waiting = 0
        # A dispatched waiter whose task has not resumed yet; see the module docstring.
        self.handoff: _Waiter | None = None
        self.saturation = 0.0

    def head(self) -> _BandQueue | None:
        for q in self.queues:
            if q.depth:
                return q
        return None

    def stats(self) -> PoolStats:
        return PoolStats(
            pool=self.name,
            saturation=self.saturation,
            waiting=self.waiting,
            bands=tuple(q.stats() for q in self.queues),
        )


class AdmissionController:
    """Priority-band admission in front of model pools.

    ``saturation(pool)`` must be cheap, synchronous and must not raise; values outside
    [0, 1] are clamped and NaN counts as 1 (full). Pool state is created on a pool's
    first :meth:`admit` and kept for the controller's lifetime (pools are models).
    """

    def __init__(
        self,
        config: AdmissionConfig,
        saturation: Callable[[str], float],
        *,
        on_wait: WaitHook | None = None,
    ) -> None:
        self.config = config
        self.enabled = config.enabled
        self._read_saturation = saturation
        self._on_wait = on_wait
        # Dispatch order: priority descending; equal priorities keep configuration order.
        self.bands = tuple(sorted(config.bands, key=lambda b: -b.priority))
        self._band_by_name = {b.name: b for b in config.bands}
        self._band_by_folded = {b.name.casefold(): b for b in config.bands}
        self._ttl = float(config.queue_ttl)
        self._capacity = config.queue_capacity_per_band
        self._interval = float(config.interval)
        self._window = float(config.reserve_window)
        default = self._band_by_name.get(config.default_band)
        self._default_priority = default.priority if default is not None else -math.inf
        self._pools: dict[str, _Pool] = {}
        self._dirty: dict[_Pool, None] = {}  # ordered set of pools to re-check
        self._lot = trio.lowlevel.ParkingLot()
        self._running = False

    # -- per request --------------------------------------------------------------

    def select_band(self, header_value: str | None, key_band: str | None = None) -> Band:
        """The band of a request: the API key's band when it has one, else the band
        header, else ``default_band``; blank counts as absent. Pass ``header_value=None``
        when headers are not trusted (API keys exist). Exact names first, then
        case-insensitive. Raises :class:`UnknownBand`."""
        name = (key_band or "").strip() or (header_value or "").strip()
        if not name:
            return self._band_by_name[self.config.default_band]
        band = self._band_by_name.get(name) or self._band_by_folded.get(name.casefold())
        if band is None:
            raise UnknownBand(name, (b.name for b in self.bands))
        return band

    async def admit(
        self, pool: str, band: Band, tenant: str, cost: float, *, ttl: float | None = None
    ) -> Ticket:
        """Wait until `pool` has room for `band`; raise :class:`AdmissionRejected` when
        the band's queue is full or ``queue_ttl`` (or this request's `ttl`) passes first.

        `tenant` groups requests for fairness inside a band ("" is one shared anonymous
        tenant); `cost` is the request's estimated tokens (prompt + max output). Returns
        without a checkpoint when admitted at once. Cancelling the caller while it waits
        removes it from the queue at once.
        """
        if not self.enabled:
            return PASS_THROUGH
        if not cost >= 0.0:  # also NaN
            raise ValueError(f"cost must be a number >= 0, got {cost!r}")
        p = self._pools.get(pool)
        if p is None:
            p = self._pools[pool] = _Pool(pool, self.bands)
        q = p.by_band.get(band.name)
        if q is None:
            raise UnknownBand(band.name, (b.name for b in self.bands))
        now = trio.current_time()
        q.last_arrival = now
        s = self._read(p)
        if (
            (s < q.band.saturation_ceiling or s < self._ceiling(q, now))
            and p.handoff is None
            and (p.waiting == 0 or not any(x.depth for x in q.ahead))
        ):
            q.inflight += 1
            q.admitted_immediate += 1
            return Ticket(self, q, q.band.name, False, 0.0)
        return await self._wait(p, q, tenant, cost, self._ttl if ttl is None else ttl)

    async def _wait(self, p: _Pool, q: _BandQueue, tenant: str, cost: float, ttl: float) -> Ticket:
        now = trio.current_time()
        if q.depth >= self._capacity:
            q.rejected += 1
            raise AdmissionRejected(
                "queue_full", q.retry_after(now, self._ttl), p.name, q.band.name
            )
        if not self._running:
            raise RuntimeError("AdmissionController.run() must be running to queue requests")
        w = _Waiter(q, tenant, cost, now, trio.lowlevel.current_task())
        q.push(w)
        self._mark(p)
        expiry = trio.CancelScope(deadline=now + ttl)
        try:
            with expiry:
                await trio.lowlevel.wait_task_rescheduled(w.abort)
                # Only the dispatcher reschedules us: we are admitted.
                waited = trio.current_time() - w.since
                p.handoff = None
                self._mark(p)
                q.inflight += 1
                q.admitted_queued += 1
                self._observe(p, q, "admitted", waited)
                return Ticket(self, q, q.band.name, True, waited)
        finally:
            if w.state == _GONE and not expiry.cancelled_caught:
                q.abandoned += 1
                self._observe(p, q, "abandoned", trio.current_time() - w.since)
        waited = trio.current_time() - w.since
        q.expired += 1
        self._observe(p, q, "expired", waited)
        raise AdmissionRejected(
            "expired", q.retry_after(trio.current_time(), self._ttl), p.name, q.band.name, waited
        )

    # -- signals from the router ----------------------------------------------------

    def poke(self, pool: str) -> None:
        """The pool's saturation may have dropped (a scrape, a finished request): re-check."""
        p = self._pools.get(pool)
        if p is not None and p.waiting:
            self._mark(p)

    def poke_all(self) -> None:
        for p in self._pools.values():
            if p.waiting:
                self._mark(p)

    # -- dispatcher -----------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Dispatch queued requests until cancelled; start it in the router's nursery
        (``await nursery.start(controller.run)``). Returns at once when disabled."""
        if self._running:
            raise RuntimeError("AdmissionController.run() is already running")
        self._running = True
        try:
            task_status.started()
            if not self.enabled:
                return
            next_tick = math.inf
            while True:
                now = trio.current_time()
                if now >= next_tick:
                    self.poke_all()
                    next_tick = math.inf
                while self._dirty:
                    self._step(self._dirty.popitem()[0])
                if next_tick == math.inf and any(p.waiting for p in self._pools.values()):
                    next_tick = now + self._interval
                with trio.move_on_at(next_tick):
                    await self._lot.park()
        finally:
            self._running = False

    def _step(self, p: _Pool) -> None:
        """Admit the next waiter of `p` if there is room for it; at most one per handoff."""
        if p.handoff is not None:
            return  # its resumption re-marks the pool
        q = p.head()
        if q is None:
            return
        if self._read(p) >= self._ceiling(q, trio.current_time()):
            return  # strict priority: lower bands wait behind a blocked higher one
        w = q.pop()
        w.state = _ADMITTED
        p.handoff = w
        q.rate.tick(trio.current_time())
        trio.lowlevel.reschedule(w.task)

    def _ceiling(self, q: _BandQueue, now: float) -> float:
        """The saturation `q`'s band is admitted below. Its configured ceiling, except
        for the default band and those above it while no higher band has had a request
        for this pool within ``reserve_window``: headroom is kept for a band in use,
        and traffic nobody ranked lower than the default may use all of a replica."""
        c = q.band.saturation_ceiling
        if c >= 1.0 or q.band.priority < self._default_priority:
            return c
        higher = [x for x in q.ahead if x.band.priority > q.band.priority]
        if not higher:  # the top band: its ceiling is all there is
            return c
        window = self._window
        return c if any(now - x.last_arrival <= window for x in higher) else 1.0

    def _mark(self, p: _Pool) -> None:
        self._dirty[p] = None
        self._lot.unpark_all()

    def _read(self, p: _Pool) -> float:
        s = self._read_saturation(p.name)
        s = 1.0 if s != s else min(1.0, max(0.0, s))  # NaN: unknown counts as full
        p.saturation = s
        return s

    def _observe(self, p: _Pool, q: _BandQueue, outcome: WaitOutcome, seconds: float) -> None:
        if self._on_wait is not None:
            self._on_wait(p.name, q.band.name, outcome, seconds)

    # -- views ----------------------------------------------------------------------

    def stats(self) -> AdmissionStats:
        """Counters and gauges per pool and band, for Prometheus; no saturation reads."""
        return AdmissionStats(
            enabled=self.enabled, pools=tuple(p.stats() for p in self._pools.values())
        )

    def snapshot(self) -> dict[str, Any]:
        """Live queues and a fresh saturation per pool, JSON-able (``GET /api/v1/admission``)."""
        now = trio.current_time()
        pools = []
        for p in self._pools.values():
            s = self._read(p)
            bands = []
            for q in p.queues:
                oldest = q.oldest()
                entry: dict[str, Any] = attrs.asdict(q.stats())
                entry["open"] = s < self._ceiling(q, now)
                entry["oldest_wait_seconds"] = None if oldest is None else now - oldest
                bands.append(entry)
            pools.append(
                {
                    "pool": p.name,
                    "saturation": s,
                    "waiting": p.waiting,
                    "admitting": [q.band.name for q in p.queues if s < self._ceiling(q, now)],
                    "bands": bands,
                }
            )
        return {
            "enabled": self.enabled,
            "default_band": self.config.default_band,
            "queue_ttl_seconds": self._ttl,
            "queue_capacity_per_band": self._capacity,
            "bands": [
                {"name": b.name, "priority": b.priority, "saturation_ceiling": b.saturation_ceiling}
                for b in self.bands
            ],
            "pools": pools,
        }
