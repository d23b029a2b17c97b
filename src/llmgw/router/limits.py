"""An API key's requests-per-minute and tokens-per-minute limits.

Two ways to count, one rule: at most `rpm` requests admitted, and at most `tpm`
tokens used, in any 60 seconds.

* :class:`LocalLimits` counts in this process: exact, and free of I/O. Right for one
  process alone on its store.
* :class:`SharedLimits` counts in the store, so every worker process and every
  instance on one PostgreSQL draws on the same minute. Requests are granted in small
  leases (:func:`lease_size`, a hundredth of the limit): a process takes a lease from
  the store, admits from it locally, and takes the next when it is spent, so the
  store is asked once per lease, not per request. A grant counts in the window from
  when it was taken whether or not its requests come, and a lease is used for at
  most LEASE_TTL seconds, so the requests admitted in any minute stay within the
  limit, and the leases left unspent by quiet processes cost at most a lease each
  (1% of the limit per process). Tokens are known only once a request ends: each
  process adds what its requests used to the store every FLUSH_EVERY seconds and
  reads the window's total at most once per TOKENS_FRESH seconds, so the tpm limit
  holds to within what all processes use in about a second. While the store cannot
  be reached (a restart, a failover) each process counts on its own, as
  LocalLimits does, until it is back: a key's limit then holds per process.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

import attrs
import trio

from llmgw.domain.keys import KeyRecord
from llmgw.store.base import Store, StoreError

__all__ = [
    "FLUSH_EVERY",
    "LEASE_TTL",
    "TOKENS_FRESH",
    "WINDOW",
    "LimitExceeded",
    "Limits",
    "LocalLimits",
    "SharedLimits",
    "lease_size",
]

log = logging.getLogger("llmgw.auth")

WINDOW = 60.0
#: Seconds a lease of requests may be admitted from.
LEASE_TTL = 5.0
#: Seconds between writes of the tokens used to the store.
FLUSH_EVERY = 0.5
#: Seconds a read of the store's token total is used for.
TOKENS_FRESH = 1.0
#: Seconds between removals of grants no window counts.
PRUNE_EVERY = 60.0


class LimitExceeded(Exception):
    """A request over its key's limit: `code` rpm_exceeded or tpm_exceeded, the
    seconds until it may pass (`retry_after`), or a store that could not say (503)."""

    def __init__(self, status: int, message: str, code: str, retry_after: float) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after


class Limits(Protocol):
    async def admit(self, key: KeyRecord, expected_tokens: int) -> None:
        """Count a request against `key`'s limits; LimitExceeded when over."""

    def used(self, key_id: str, tokens: int) -> None:
        """Tokens a finished request of the key used."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Background work until cancelled."""


def _over(limit: int | None, what: str, code: str, wait: float) -> LimitExceeded:
    return LimitExceeded(
        429,
        f"rate limit of {limit} {what} per minute reached for this API key",
        code,
        max(1.0, math.ceil(wait)),
    )


def _rpm(key: KeyRecord, wait: float) -> LimitExceeded:
    return _over(key.rpm, "requests", "rpm_exceeded", wait)


def _tpm(key: KeyRecord, wait: float) -> LimitExceeded:
    return _over(key.tpm, "tokens", "tpm_exceeded", wait)


@attrs.define
class _Window:
    """A key's requests and tokens over the last minute."""

    requests: deque[float] = attrs.field(factory=deque)
    tokens: deque[tuple[float, int]] = attrs.field(factory=deque)
    token_sum: int = 0

    def trim(self, now: float) -> None:
        cutoff = now - WINDOW
        while self.requests and self.requests[0] <= cutoff:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= cutoff:
            self.token_sum -= self.tokens.popleft()[1]


class LocalLimits:
    """Limits counted in this process (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._windows: dict[str, _Window] = {}

    async def admit(self, key: KeyRecord, expected_tokens: int) -> None:
        self.admit_now(key, expected_tokens)

    def admit_now(self, key: KeyRecord, expected_tokens: int) -> None:
        if key.rpm is None and key.tpm is None:
            return
        now = self.clock()
        window = self._windows.setdefault(key.id, _Window())
        window.trim(now)
        if key.rpm is not None and len(window.requests) >= key.rpm:
            raise _rpm(key, window.requests[0] + WINDOW - now)
        if key.tpm is not None and window.token_sum + expected_tokens > key.tpm and window.tokens:
            raise _tpm(key, window.tokens[0][0] + WINDOW - now)
        window.requests.append(now)

    def used(self, key_id: str, tokens: int) -> None:
        window = self._windows.get(key_id)
        if window is not None and tokens > 0:
            window.tokens.append((self.clock(), tokens))
            window.token_sum += tokens

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()


def lease_size(rpm: int) -> int:
    """Requests granted per lease: a hundredth of the limit, at least one."""
    return max(1, rpm // 100)


@attrs.define
class _Lease:
    remaining: int
    until: float  # monotonic


@attrs.define
class _Tokens:
    read_at: float  # monotonic; -inf: never
    used: int  # the window's total in the store at that read
    oldest: float | None  # wall clock of its oldest entry
    pending: int = 0  # used here since, not yet in the store


class SharedLimits:
    """Limits counted in the store across processes and instances (module docstring)."""

    def __init__(self, store: Store, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self._leases: dict[str, _Lease] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._tokens: dict[str, _Tokens] = {}
        self._unflushed: list[tuple[str, str, float, int]] = []
        self._local = LocalLimits(clock)  # while the store is away
        self._degraded = False

    async def admit(self, key: KeyRecord, expected_tokens: int) -> None:
        try:
            if key.rpm is not None:
                await self._take_request(key)
            if key.tpm is not None:
                await self._check_tokens(key, expected_tokens)
        except StoreError as exc:
            # The store is away (a restart, a failover): counted here meanwhile, so
            # each process holds a key to its limit on its own until it is back.
            if not self._degraded:
                log.warning("rate limits: the store failed, counting locally: %s", exc)
            self._degraded = True
            self._local.admit_now(key, expected_tokens)
            return
        if self._degraded:
            log.info("rate limits: counted in the store again")
            self._degraded = False

    async def _take_request(self, key: KeyRecord) -> None:
        assert key.rpm is not None
        lease = self._leases.get(key.id)
        if lease is None or lease.remaining <= 0 or self.clock() > lease.until:
            lock = self._locks.setdefault(key.id, trio.Lock())
            async with lock:  # one refill at a time per key: concurrent ones would waste
                lease = self._leases.get(key.id)
                if lease is None or lease.remaining <= 0 or self.clock() > lease.until:
                    granted, oldest = await self.store.take_rate(
                        key.id, "requests", key.rpm, lease_size(key.rpm)
                    )
                    if not granted:
                        wall = self.store.wall_clock()
                        raise _rpm(key, (oldest or wall) + WINDOW - wall)
                    lease = self._leases[key.id] = _Lease(granted, self.clock() + LEASE_TTL)
        lease.remaining -= 1

    async def _check_tokens(self, key: KeyRecord, expected: int) -> None:
        assert key.tpm is not None
        state = self._tokens.get(key.id)
        now = self.clock()
        if state is None or now - state.read_at > TOKENS_FRESH:
            used, oldest = await self.store.used_rate(key.id, "tokens")
            pending = state.pending if state is not None else 0
            state = self._tokens[key.id] = _Tokens(now, used, oldest, pending)
        total = state.used + state.pending
        if total and total + expected > key.tpm:
            wall = self.store.wall_clock()
            raise _tpm(key, (state.oldest or wall) + WINDOW - wall)

    def used(self, key_id: str, tokens: int) -> None:
        if tokens <= 0:
            return
        self._local.used(key_id, tokens)
        self._unflushed.append((key_id, "tokens", self.store.wall_clock(), tokens))
        state = self._tokens.get(key_id)
        if state is not None:
            state.pending += tokens

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write the tokens used every FLUSH_EVERY seconds; forget old grants."""
        task_status.started()
        pruned = self.clock()
        try:
            while True:
                await trio.sleep(FLUSH_EVERY)
                await self._flush()
                if self.clock() - pruned > PRUNE_EVERY:
                    pruned = self.clock()
                    try:
                        await self.store.prune_rate()
                    except StoreError as exc:
                        log.warning("rate limits: pruning failed: %s", exc)
        finally:
            with trio.CancelScope(shield=True):
                await self._flush()

    async def _flush(self) -> None:
        if not self._unflushed:
            return
        rows, self._unflushed = self._unflushed, []
        try:
            await self.store.add_rate(rows)
        except StoreError as exc:
            # Kept for the next try (bounded: a store down for long loses the oldest).
            log.warning("rate limits: %d token counts not written: %s", len(rows), exc)
            self._unflushed = (rows + self._unflushed)[-100_000:]
            return
        # Now in the store: the next read counts them, pending need not.
        for key_id, _, _, tokens in rows:
            state = self._tokens.get(key_id)
            if state is not None:
                state.pending = max(0, state.pending - tokens)
                state.read_at = -math.inf  # read again, with these in
