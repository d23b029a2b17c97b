"""Waiting on a condition: the one place where tests poll.

A test waits on the event or the state itself. Where the thing under test offers no
notification to wait on (another process's HTTP API or metrics, a kernel's process
table, a fake's counters), it polls through these two helpers: bounded by a timeout,
and failing with what it waited for, the last value seen and any context asked for.
Their poll interval is the only sleep here that stands for no behaviour of its own:
it spaces the checks.

* :func:`wait_for`: blocking, for tests that drive processes from plain threads;
* :func:`wait_until`: in a trio run (on a MockClock the interval is virtual time).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

import httpx
import trio

__all__ = ["wait_for", "wait_until"]

T = TypeVar("T")

# What a check may raise while the thing it looks at is (re)starting: kept as the last
# value seen, and the wait goes on.
TRANSIENT = (httpx.HTTPError, OSError, ValueError)


def _timed_out(what: str, timeout: float, last: object, context: Callable[[], str] | None) -> str:
    extra = f"\n{context()}" if context is not None else ""
    return f"{what}: not within {timeout:g}s; last: {last!r}{extra}"


def wait_for(
    check: Callable[[], T | None],
    what: str,
    timeout: float = 20.0,
    *,
    interval: float = 0.1,
    context: Callable[[], str] | None = None,
    transient: tuple[type[BaseException], ...] = TRANSIENT,
) -> T:
    """Poll `check()` until it returns something truthy and return that; on timeout fail
    with `what`, the last value seen, and `context()` (e.g. a process's output). An
    exception of a `transient` kind counts as a value not there yet; any other fails."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            found = check()
        except transient as exc:  # e.g. a server (re)starting
            last = exc
        else:
            if found:
                return found
            last = found
        if time.monotonic() >= deadline:
            raise TimeoutError(_timed_out(what, timeout, last, context))
        time.sleep(interval)  # the poll interval


async def wait_until(
    check: Callable[[], T | Awaitable[T | None] | None],
    what: str,
    timeout: float = 10.0,  # noqa: ASYNC109 (its own bound, named in the failure)
    *,
    interval: float = 0.02,
    context: Callable[[], str] | None = None,
    transient: tuple[type[BaseException], ...] = TRANSIENT,
) -> T:
    """:func:`wait_for` in a trio run: `check` may be a plain or an async function (one
    still running at the deadline is cancelled)."""
    deadline = trio.current_time() + timeout
    last: object = None
    while True:
        with trio.move_on_at(deadline):
            try:
                value = check()
                found = cast("T | None", await value if inspect.isawaitable(value) else value)
            except transient as exc:
                last = exc
            else:
                if found:
                    return found
                last = found
        if trio.current_time() >= deadline:
            raise TimeoutError(_timed_out(what, timeout, last, context))
        await trio.sleep(interval)  # the poll interval
