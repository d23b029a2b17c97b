"""Who leads the control plane when several instances share one store.

Any number of llmgw-server instances may run on one PostgreSQL store; one of them
leads the control plane (accepts agents, places and drains replicas), the others
serve the data plane from what it publishes, and one of them takes over when the
leader is gone. The lease is a row in the store (``leadership``): the leader renews
it every ``ttl / 3``; once it has expired anyone may claim it, and each claim takes
the next **fencing token**. The token is what makes a deposed leader harmless:

* the leader tells agents its token (``Registered.leader_token``), and an agent never
  takes commands on a connection whose leader's token is below one it has seen;
* the epochs of the replicas a leader places start above ``token << 41``, so every
  epoch carries the token of the leader that placed it;
* the endpoints a leader publishes to the store are written only while its token
  still holds the lease (``Store.publish_endpoints``);
* a leader stops acting (no command leaves it) as soon as its own clock says its
  lease may have expired, before any other instance may claim it: it counts from
  *before* its last renewal was sent, on its monotonic clock, and a margin
  (:data:`MARGIN` of the lease) sooner, so a leader paused (SIGSTOP, a long GC, a
  frozen VM) wakes up knowing it may no longer lead.

**One clock.** The lease row is timed by the store's clock: PostgreSQL's own
(``clock_timestamp()``), the one clock instances on several hosts share, so two
instances whose wall clocks disagree still agree on when it expires (with each
instance's own clock, 8 s of skew once made two leaders for most of a second). On
SQLite, one host's file, that host's clock is the store's. And a leader's own
reckoning needs no wall clock at all: the database set the lease's end no earlier
than the renewal was sent, which is where the leader's monotonic count starts, so no
skew can make it act past the moment another instance may claim the lease.

:class:`Leadership` is this instance's part: it claims or renews every ``ttl / 3`` and
says whether this instance leads (:meth:`Leadership.leading`), whom to send agents to
otherwise (:attr:`Leadership.leader`), and wakes those waiting for a change.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable

import attrs
import trio

from llmgw.store.base import Store, StoreError

__all__ = ["LEASE", "Leader", "Leadership", "epoch_floor", "wall_clock"]

log = logging.getLogger("llmgw.control")

#: TEST ONLY: seconds added to this process's wall clock (the store's timestamps), to
#: run instances with skewed clocks on one host (tests/test_instances_e2e.py; faketime
#: is not available). Never set it in production: it skews keys' expiry and usage.
CLOCK_OFFSET_ENV = "_LLMGW_TEST_CLOCK_OFFSET"  # not LLMGW_: those are configuration
_offset = float(os.environ.get(CLOCK_OFFSET_ENV) or 0.0)


def wall_clock() -> float:
    """This instance's wall clock (Unix seconds): time.time(), unless a test skews it."""
    return time.time() + _offset


#: The lease's name in the store.
LEASE = "control"
#: How much sooner than its lease's end (a fraction of the lease) a leader stops
#: acting: room for clocks that run at slightly different rates and for the moment
#: between checking `leading()` and a command leaving.
MARGIN = 0.1


def epoch_floor(token: int) -> int:
    """The lowest replica epoch a leader with `token` gives out."""
    return token << 41


@attrs.frozen
class Leader:
    """The instance that holds the lease, as it advertised itself."""

    instance: str
    agent_address: str  # where agents reach it (HOST:PORT)
    admin_address: str  # its admin listener (HOST:PORT)
    token: int
    # When its lease ends by this instance's clock (Leadership.clock): the lease's
    # remaining time as read from the store, counted from before the read.
    until: float = 0.0


class Leadership:
    def __init__(
        self,
        store: Store,
        *,
        instance: str,
        addresses: Callable[[], tuple[str, str]] = lambda: ("", ""),
        ttl: float = 10.0,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        """`addresses` says, when the lease is claimed, where agents and admin clients
        reach this instance (its agent and admin listeners are bound by then)."""
        self.store = store
        self.instance = instance
        self.addresses = addresses
        self.ttl = ttl
        self.clock = clock
        self.token: int | None = None  # ours, while we lead
        self.leader: Leader | None = None  # whoever leads, as last read
        self._valid_until = -1.0  # when we stop acting, by our clock (monotonic)
        self._changed = trio.Event()
        self.terms = 0  # times this instance became the leader
        self._settled_term: int | None = None

    def mark_settled(self, token: int) -> None:
        """The term of `token` has settled: its controller adopted what agents run, so
        what it publishes is whole (llmgw.control.instances writes it only then)."""
        self._settled_term = token

    def settled(self) -> bool:
        """Whether this instance leads and its term has settled."""
        return self.token is not None and self._settled_term == self.token

    def leading(self) -> bool:
        """Whether this instance leads now: it holds a token and its lease cannot have
        expired yet by its own clock."""
        return self.token is not None and self.clock() < self._valid_until

    async def wait_leading(self) -> int:
        """Until this instance leads; its token."""
        while not self.leading():
            await self._changed.wait()
        assert self.token is not None
        return self.token

    async def wait_not_leading(self) -> None:
        """Until this instance no longer leads (or its lease's end by its clock)."""
        while self.leading():
            with trio.move_on_at(self._valid_until):
                await self._changed.wait()

    def _set(self, token: int | None) -> None:
        if token != self.token:
            if token is not None:
                self.terms += 1
                log.info("leading the control plane (fencing token %d)", token)
            elif self.token is not None:
                log.warning("no longer leading the control plane (token %d)", self.token)
            self.token = token
        self._changed.set()
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Claim or renew every ttl / 3 until cancelled; then let the lease go, so
        another instance takes over at once rather than after ttl."""
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._lapse)
                while True:
                    await self._step()
                    await trio.sleep(self.ttl / 3)
        finally:
            token, self.token = self.token, None
            if token is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(2.0):
                    try:
                        await self.store.resign_leadership(LEASE, self.instance, token)
                        log.info("let the control plane's lease go (token %d)", token)
                    except StoreError as exc:
                        log.warning("the lease was not let go (it expires on its own): %s", exc)

    async def _lapse(self) -> None:
        """Step down the moment our own reckoning ends (a renewal late or failing): said
        then, and waking those waiting, not at the next step."""
        while True:
            if self.token is not None and not self.leading():
                self._set(None)
            changed = self._changed
            with trio.move_on_at(self._valid_until if self.token is not None else math.inf):
                await changed.wait()

    def _until(self, started: float) -> float:
        # A renewal counts from before it was sent, and ends a margin early.
        return started + self.ttl * (1 - MARGIN)

    async def _step(self) -> None:
        started = self.clock()
        try:
            if self.token is not None:
                renewed = await self.store.renew_leadership(
                    LEASE, self.instance, self.token, self.ttl
                )
                if renewed and self.token is not None:  # (not stepped down meanwhile)
                    self._valid_until = self._until(started)
                    self._set(self.token)
                else:
                    self._set(None)
            if self.token is None:
                agent_address, admin_address = self.addresses()
                token = await self.store.claim_leadership(
                    LEASE, self.instance, agent_address, admin_address, self.ttl
                )
                if token is not None:
                    self._valid_until = self._until(started)
                    self._set(token)
            read = self.clock()
            row = await self.store.read_leadership(LEASE)
        except StoreError as exc:
            # Without the store no lease is renewed: this instance leads until its
            # lease's end by its own clock, then no more (the others cannot claim it
            # before then either).
            log.warning("leadership: the store failed: %s", exc)
            if self.token is not None and not self.leading():
                self._set(None)
            return
        if row is not None:
            holder, agents, admin, token, expires, now = row
            # The lease's remaining time by the store's clock, on ours: no skew enters.
            until = read + float(expires) - float(now)
            self.leader = Leader(str(holder), str(agents), str(admin), int(token), until)

    def current_leader(self) -> Leader | None:
        """Whoever leads, as last read, unless its lease has expired since: an instance
        gone (killed) is not named to agents while another takes over."""
        leader = self.leader
        if leader is None or leader.until <= self.clock():
            return None
        return leader
