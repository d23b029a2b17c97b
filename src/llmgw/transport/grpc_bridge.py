"""trio ⇄ asyncio, for grpcio's ``grpc.aio`` under a trio program (DESIGN §11).

grpcio's asyncio API runs in **one** asyncio event loop in **one** daemon thread for
the whole process, started lazily on first use and shared by every listener and
connector; no thread is made per stream. Two primitives cross between the loops,
both aware of cancellation on either side:

* :func:`run`: trio awaits a coroutine run on the asyncio loop. Cancelling the
  trio caller cancels the asyncio task; a result that arrives after the caller gave
  up is handed to ``discard`` so that nothing it owns (a stream, a channel) leaks.
  (Not ``asyncio.run_coroutine_threadsafe``'s future: it silently drops a result
  that races with a cancel.)
* :class:`Pipe`: a bounded FIFO between a trio task and the asyncio loop, one
  direction each, closable from either side. Each side waits on an event of its
  own loop and is woken by the other with ``TrioToken.run_sync_soon`` or
  ``loop.call_soon_threadsafe``, only when it is actually waiting. Taking an item
  is synchronous under the pipe's lock, so a cancelled ``trio_get`` never loses
  one; a full pipe makes the producer wait (flow control).

Nothing here blocks either loop: no ``trio.from_thread.run`` from the asyncio
thread, no ``Future.result()`` from the trio thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

import trio

__all__ = [
    "Pipe",
    "PipeClosed",
    "call_soon",
    "loop",
    "run",
    "running_task_count",
    "spawn",
    "wake_trio",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

THREAD_NAME = "llmgw-grpc-asyncio"


class _LoopThread:
    """The process's asyncio event loop, running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.tasks: set[asyncio.Task[Any]] = set()  # strong references (the loop keeps weak)
        started = threading.Event()
        self.thread = threading.Thread(
            target=self._main, args=(started,), name=THREAD_NAME, daemon=True
        )
        self.thread.start()
        started.wait()

    def _main(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        self.loop.run_forever()


_thread: _LoopThread | None = None
_thread_lock = threading.Lock()


def _the_thread() -> _LoopThread:
    global _thread
    with _thread_lock:
        if _thread is None:
            _thread = _LoopThread()
        return _thread


def loop() -> asyncio.AbstractEventLoop:
    """The shared asyncio loop (started on first use)."""
    return _the_thread().loop


def call_soon(fn: Callable[..., object], *args: Any) -> None:
    """Run ``fn(*args)`` on the asyncio loop soon; callable from any thread."""
    loop().call_soon_threadsafe(fn, *args)


def spawn(coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Start `coro` as a task on the asyncio loop, holding a reference until it ends.

    Call from the asyncio thread only."""
    thread = _the_thread()
    task = thread.loop.create_task(coro)
    thread.tasks.add(task)
    task.add_done_callback(thread.tasks.discard)
    return task


def wake_trio(token: trio.lowlevel.TrioToken, fn: Callable[[], object]) -> bool:
    """``fn()`` on the trio thread of `token` soon; False if that trio run is over."""
    try:
        token.run_sync_soon(fn)
    except trio.RunFinishedError:
        return False
    return True


async def run(
    fn: Callable[..., Coroutine[Any, Any, T]],
    *args: Any,
    discard: Callable[[T], object] | None = None,
) -> T:
    """``await fn(*args)`` on the asyncio loop, from trio, without a thread of trio's.

    Cancelling the caller cancels the asyncio task (promptly, without waiting for
    it to finish). If the task had already produced a result by then, ``discard``
    gets it on the asyncio thread.
    """
    the_loop = loop()
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    box: list[asyncio.Task[T]] = []

    def finished(_: asyncio.Task[T]) -> None:
        wake_trio(token, done.set)

    def start() -> None:
        task = spawn(fn(*args))
        box.append(task)
        task.add_done_callback(finished)

    def abandon() -> None:
        task = box[0]
        task.cancel()

        def dispose(t: asyncio.Task[T]) -> None:
            if t.cancelled():
                return
            exc = t.exception()  # retrieved, so asyncio does not warn about it
            if exc is not None:
                log.debug(
                    "abandoned %s failed: %s: %s",
                    getattr(fn, "__name__", fn),
                    type(exc).__name__,
                    exc,
                )
            elif discard is not None:
                discard(t.result())

        task.add_done_callback(dispose)

    the_loop.call_soon_threadsafe(start)
    try:
        await done.wait()
    except BaseException:
        # FIFO: `start` has run (or runs) before `abandon` on the loop.
        the_loop.call_soon_threadsafe(abandon)
        raise
    return box[0].result()


async def running_task_count() -> int:
    """How many asyncio tasks the shared loop has besides this question's own."""

    async def count() -> int:
        return len(asyncio.all_tasks()) - 1

    return await run(count)


class PipeClosed(Exception):
    """The pipe is closed (and, for a consumer, drained); the argument says why."""

    @property
    def reason(self) -> str:
        return str(self.args[0]) if self.args else "closed"


class Pipe(Generic[T]):
    """A bounded FIFO between trio and the asyncio loop, in one direction.

    The producer calls ``trio_put`` (trio → asyncio) or ``aio_put`` (asyncio →
    trio), the consumer the matching ``aio_get``/``trio_get``. ``close(reason)``,
    from either thread, ends it: the consumer still gets what is buffered (unless
    ``discard``), then ``PipeClosed(reason)``; the producer gets PipeClosed at once.
    The first close's reason is kept.
    """

    def __init__(
        self,
        capacity: int,
        token: trio.lowlevel.TrioToken,
        aio_loop: asyncio.AbstractEventLoop,
    ) -> None:
        if capacity < 1:
            raise ValueError("a pipe holds at least one item")
        self._capacity = capacity
        self._token = token
        self._loop = aio_loop
        self._items: collections.deque[T] = collections.deque()
        self._lock = threading.Lock()
        self._reason: str | None = None
        # Whoever waits on a side waits on that side's one event; waking sets and
        # forgets it, and every waiter looks again.
        self._trio_waiter: trio.Event | None = None
        self._aio_waiter: asyncio.Event | None = None

    @property
    def closed(self) -> bool:
        return self._reason is not None

    def __len__(self) -> int:
        return len(self._items)

    # -- waking (under the lock) ------------------------------------------------------

    def _wake_trio(self) -> None:
        event, self._trio_waiter = self._trio_waiter, None
        if event is not None:
            wake_trio(self._token, event.set)

    def _wake_aio(self) -> None:
        event, self._aio_waiter = self._aio_waiter, None
        if event is not None:
            # RuntimeError: the loop is closed, so nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(event.set)

    # -- what both sides do without waiting (under the lock) ------------------------------

    def _put_now(self, item: T, wake_consumer: Callable[[], None]) -> bool:
        """Buffer `item` if there is room (True); PipeClosed once closed."""
        if self._reason is not None:
            raise PipeClosed(self._reason)
        if len(self._items) < self._capacity:
            self._items.append(item)
            wake_consumer()
            return True
        return False

    def _take_now(self, wake_producer: Callable[[], None]) -> tuple[T] | None:
        """The next item, boxed (an item may be None), or None when there is none yet;
        PipeClosed once closed and drained."""
        if self._items:
            item = self._items.popleft()
            wake_producer()
            return (item,)
        if self._reason is not None:
            raise PipeClosed(self._reason)
        return None

    # -- either side ---------------------------------------------------------------------

    def close(self, reason: str, *, discard: bool = False) -> None:
        """No more items; ``discard`` also drops the buffered ones. Any thread."""
        with self._lock:
            if self._reason is None:
                self._reason = reason
            if discard:
                self._items.clear()
            self._wake_trio()
            self._wake_aio()

    # -- trio side -------------------------------------------------------------------------

    async def trio_put(self, item: T) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            with self._lock:
                if self._put_now(item, self._wake_aio):
                    break
                if self._trio_waiter is None:
                    self._trio_waiter = trio.Event()
                event = self._trio_waiter
            await event.wait()  # cancellable: the item was not put
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def trio_get(self) -> T:
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            with self._lock:
                taken = self._take_now(self._wake_aio)
                if taken is not None:
                    break
                if self._trio_waiter is None:
                    self._trio_waiter = trio.Event()
                event = self._trio_waiter
            await event.wait()  # cancellable: nothing was taken
        # Shielded: once taken, the item is returned, never lost to a cancel.
        await trio.lowlevel.cancel_shielded_checkpoint()
        return taken[0]

    # -- asyncio side -----------------------------------------------------------------------

    async def aio_put(self, item: T) -> None:
        while True:
            with self._lock:
                if self._put_now(item, self._wake_trio):
                    return
                if self._aio_waiter is None:
                    self._aio_waiter = asyncio.Event()
                event = self._aio_waiter
            await event.wait()

    async def aio_get(self) -> T:
        while True:
            with self._lock:
                taken = self._take_now(self._wake_trio)
                if taken is not None:
                    return taken[0]
                if self._aio_waiter is None:
                    self._aio_waiter = asyncio.Event()
                event = self._aio_waiter
            await event.wait()
