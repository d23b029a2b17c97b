"""Usage records into the store in batches, off the hot path.

:class:`UsageBatcher` is the router's :class:`~llmgw.domain.usage.UsageSink`:
``record()`` stamps the wall-clock time and appends to a bounded in-memory
buffer (no I/O, no await), and ``run()`` writes the buffer to the store in
transactions of up to `max_batch` records, every `flush_interval` seconds and
as soon as a full batch is waiting.

What can be lost, and how it is counted:

* **A crash** (kill -9, power loss) loses what is still buffered: at most one
  flush interval of records while the store keeps up (more only while it is
  failing, up to `max_buffer`).
* **A full buffer** (the store is down or slower than the traffic) drops the
  *oldest* records first and counts them in `dropped`.
* **A failed write** (the transaction rolled back) puts its batch back at the
  front of the buffer and is retried at the next interval (`failed_writes`). An
  outage is logged as one line when it starts and at most one every
  :attr:`UsageBatcher.LOG_EVERY` seconds after (each counting the failures it stands
  for; no traceback: the cause is the store's, said in its message), and one line
  when writes succeed again.
* **A write that outlives `write_timeout`** may still commit later, so its batch
  is not retried (it would count twice); it is counted in `lost`.
* **Graceful shutdown** (cancelling ``run()``) finishes the write in flight and
  flushes the rest in a shielded scope bounded by `shutdown_timeout`; whatever
  is left after that is counted in `lost`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

import trio

from llmgw.domain.usage import UsageRecord
from llmgw.store.base import TimedUsage

__all__ = ["UsageBatcher", "UsageWriter"]

log = logging.getLogger(__name__)


class UsageWriter(Protocol):
    """The one method of a Store the batcher needs."""

    async def record_usage(self, batch: Sequence[TimedUsage]) -> None: ...


class UsageBatcher:
    """A bounded buffer of finished requests, written to `store` in batches by :meth:`run`."""

    #: Seconds between lines about failing writes while the store stays away.
    LOG_EVERY = 30.0

    def __init__(
        self,
        store: UsageWriter,
        *,
        max_batch: int = 500,
        flush_interval: float = 1.0,
        max_buffer: int = 50_000,
        write_timeout: float = 30.0,
        shutdown_timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_batch < 1 or max_buffer < max_batch:
            raise ValueError("need 1 <= max_batch <= max_buffer")
        if not flush_interval > 0:
            raise ValueError("flush_interval must be positive")
        self.store = store
        self.max_batch = max_batch
        self.flush_interval = flush_interval
        self.max_buffer = max_buffer
        self.write_timeout = write_timeout
        self.shutdown_timeout = shutdown_timeout
        self._clock = clock
        self._buffer: deque[TimedUsage] = deque()
        self._batch_ready = trio.Event()
        # Counters (records, except failed_writes and batches).
        self.recorded = 0
        self.written = 0
        self.dropped = 0
        self.lost = 0
        self.batches = 0
        self.failed_writes = 0
        # The current run of failed writes, and those of it not logged yet (and when
        # the last line was, on trio's clock).
        self._streak = 0
        self._unlogged = 0
        self._logged_at = -float("inf")

    @property
    def pending(self) -> int:
        """Records waiting in the buffer."""
        return len(self._buffer)

    def record(self, record: UsageRecord) -> None:
        """Buffer one finished request (never blocks; drops the oldest when full).

        Call it from the trio thread (as the router does), like any trio object.
        """
        buffer = self._buffer
        if len(buffer) >= self.max_buffer:
            buffer.popleft()
            self.dropped += 1
        buffer.append((self._clock(), record))
        self.recorded += 1
        if len(buffer) >= self.max_batch:
            self._batch_ready.set()

    def _take(self) -> list[TimedUsage]:
        buffer = self._buffer
        n = min(self.max_batch, len(buffer))
        return [buffer.popleft() for _ in range(n)]

    def _put_back(self, batch: list[TimedUsage]) -> None:
        """Return a batch that was not written to the front, oldest records first to go."""
        self._buffer.extendleft(reversed(batch))
        excess = len(self._buffer) - self.max_buffer
        for _ in range(max(0, excess)):
            self._buffer.popleft()
            self.dropped += 1

    async def _write(self, batch: list[TimedUsage], *, shield: bool) -> bool:
        """Write one batch; False when it failed (back in the buffer) or was cut off (lost).

        Cut off (by `write_timeout`, or by the shutdown deadline when not shielded),
        the write may still commit on the store's thread, so the batch is not retried.
        """
        settled = False
        try:
            with trio.move_on_after(self.write_timeout, shield=shield):
                try:
                    await self.store.record_usage(batch)
                except Exception as exc:
                    settled = True
                    self.failed_writes += 1
                    self._put_back(batch)
                    self._failed(len(batch), exc)
                    return False
                settled = True
                self.written += len(batch)
                self.batches += 1
                if self._streak:
                    log.info("usage records written again after %d failed writes", self._streak)
                    self._streak = self._unlogged = 0
                    self._logged_at = -float("inf")
                return True
            return False
        finally:
            if not settled:
                self.lost += len(batch)
                log.error(
                    "writing %d usage records was cut off (may still commit): not retried",
                    len(batch),
                )

    def _failed(self, size: int, exc: Exception) -> None:
        """Say a write failed: at once when the store was fine, then once per LOG_EVERY
        (a failing store is retried every interval: a line each, with a traceback, was
        hundreds of lines a minute saying the same)."""
        self._streak += 1
        self._unlogged += 1
        now = trio.current_time()
        if now - self._logged_at < self.LOG_EVERY:
            return
        text = str(exc).strip()
        cause = type(exc).__name__ + (f": {text.splitlines()[0]}" if text else "")
        if self._streak == 1:
            log.warning(
                "writing %d usage records failed (%s); %d held, retried every %gs",
                size,
                cause[:300],
                len(self._buffer),
                self.flush_interval,
            )
        else:
            log.warning(
                "usage records still not written: %d failed writes in the last %.0fs (%s); %d held",
                self._unlogged,
                now - self._logged_at,
                cause[:300],
                len(self._buffer),
            )
        self._unlogged = 0
        self._logged_at = now

    async def flush(self, *, shield: bool = True) -> bool:
        """Write everything buffered now, batch by batch; False at the first failure."""
        while self._buffer:
            if not await self._write(self._take(), shield=shield):
                return False
            await trio.lowlevel.checkpoint_if_cancelled()  # shutdown lands between batches
        return True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Flush every `flush_interval` and whenever a batch fills, until cancelled.

        Cancelling is the graceful shutdown: the write in flight finishes (it is
        shielded), then the rest is flushed within `shutdown_timeout`.
        """
        task_status.started()
        try:
            while True:
                with trio.move_on_after(self.flush_interval):
                    await self._batch_ready.wait()
                self._batch_ready = trio.Event()
                # Each write is shielded: cancellation lands between batches, never inside one.
                if not await self.flush(shield=True):
                    await trio.sleep(self.flush_interval)  # the store is failing: don't spin
        finally:
            with trio.move_on_after(self.shutdown_timeout, shield=True):
                await self.flush(shield=False)
            if self._buffer:
                self.lost += len(self._buffer)
                log.error(
                    "%d usage records not written at shutdown (store too slow or failing)",
                    len(self._buffer),
                )
                self._buffer.clear()
