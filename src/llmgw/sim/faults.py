"""Fault injection: the misbehaviour a simulated replica is told to show (flags or
``POST /sim/faults``), and running a request under it. Faults apply to the chat,
completion and embedding routes only, so health checks and scrapes keep passing on a
sick replica."""

from __future__ import annotations

import math
import os
import random
import sys
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import attrs
import trio

from llmgw.sim.wire import HTTPError, Receive, Send, start_stream, watch_disconnect

FAULT_EXIT_CODE = 1


def _rate(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number between 0 and 1")
    return float(value)


def _optional_count(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer or null")
    return value


@attrs.frozen
class Faults:
    """Misbehaviour to inject; replaced as a whole when changed at runtime.

    * error_rate/error_status: answer that fraction of requests with an OpenAI-shaped
      error of that status, before doing anything else.
    * hang_rate: that fraction never produces anything (a stream gets its 200 headers
      first, as from a real engine) until the client gives up; no KV is held.
    * first_token_delay: every request waits this long in the engine's queue (counted
      in num_requests_waiting) before it may be scheduled, so TTFT grows by as much.
    * abort_after_chunks: a stream is cut after this many SSE events (role chunk
      included) by closing the connection, without [DONE]; non-streaming requests are
      not affected.
    * exit_after: the process exits with status 1, like a crash, once this many
      requests have been answered (counted from startup, or from when it was set at
      runtime).
    * kv_events_paused: the KV-cache event publisher (``--kv-events-endpoint``) drops
      every batch, using up its sequence number, as a publisher that died would; set
      back, the next batch shows subscribers the gap.
    """

    error_rate: float = 0.0  # fraction of requests answered with error_status
    error_status: int = 500
    hang_rate: float = 0.0  # fraction of requests that never produce a token
    first_token_delay: float = 0.0  # seconds a request waits before it may be scheduled
    abort_after_chunks: int | None = None  # close a stream after this many SSE events
    exit_after: int | None = None  # exit the process after this many requests
    kv_events_paused: bool = False  # publish no KV-cache events (a dead publisher)

    FIELDS = (
        "error_rate",
        "error_status",
        "hang_rate",
        "first_token_delay",
        "abort_after_chunks",
        "exit_after",
        "kv_events_paused",
    )

    def __attrs_post_init__(self) -> None:
        _rate("error_rate", self.error_rate)
        _rate("hang_rate", self.hang_rate)
        if not 400 <= self.error_status <= 599:
            raise ValueError("error_status must be an HTTP error status (400-599)")
        if self.first_token_delay < 0 or not math.isfinite(self.first_token_delay):
            raise ValueError("first_token_delay must be a non-negative number of seconds")
        _optional_count("abort_after_chunks", self.abort_after_chunks)
        _optional_count("exit_after", self.exit_after)

    def merged(self, changes: Any) -> Faults:
        """These faults with the fields in `changes` replaced; ValueError if invalid."""
        if not isinstance(changes, dict):
            raise ValueError("expected a JSON object")
        unknown = sorted(set(changes) - set(self.FIELDS))
        if unknown:
            raise ValueError(f"unknown fault field(s): {', '.join(unknown)}")
        values: dict[str, Any] = dict(changes)
        for name in ("error_rate", "hang_rate"):
            if name in values:
                values[name] = _rate(name, values[name])
        status = values.get("error_status", self.error_status)
        if isinstance(status, bool) or not isinstance(status, int):
            raise ValueError("error_status must be an integer")
        delay = values.get("first_token_delay", self.first_token_delay)
        if isinstance(delay, bool) or not isinstance(delay, int | float):
            raise ValueError("first_token_delay must be a number")
        values["first_token_delay"] = float(delay)
        for name in ("abort_after_chunks", "exit_after"):
            if name in values:
                values[name] = _optional_count(name, values[name])
        if not isinstance(values.get("kv_events_paused", False), bool):
            raise ValueError("kv_events_paused must be true or false")
        return attrs.evolve(self, **values)

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.FIELDS}


class FaultInjector:
    """The faults in force, their random draws, and the requests counted towards
    ``exit_after``."""

    def __init__(self, faults: Faults, seed: int) -> None:
        self.current = faults
        self._rng = random.Random(seed)
        self._served = 0

    def change(self, changes: Any) -> Faults:
        """Replace the fields in `changes`; ValueError or TypeError if invalid."""
        faults = self.current.merged(changes)
        if "exit_after" in changes:
            self._served = 0  # count from now, so a running replica can be told to die soon
        self.current = faults
        return faults

    def _roll(self, rate: float) -> bool:
        return rate > 0 and self._rng.random() < rate

    def count_served(self) -> None:
        limit = self.current.exit_after
        self._served += 1
        if limit is not None and self._served >= limit:
            _fault_exit(self._served)

    async def run(
        self, receive: Receive, send: Send, work: Callable[[], Awaitable[None]], stream: bool
    ) -> None:
        """Run `work` under the injected faults, cancelling it if the client disconnects."""
        faults = self.current
        if self._roll(faults.error_rate):
            raise HTTPError(
                faults.error_status,
                f"injected fault: HTTP {faults.error_status}",
                code="injected_fault",
            )
        error: HTTPError | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_disconnect, receive, nursery.cancel_scope)
            try:
                if self._roll(faults.hang_rate):
                    if stream:  # a real engine has sent its headers by then
                        await start_stream(send)
                    await trio.sleep_forever()
                await work()
            except HTTPError as e:
                error = e  # raised outside the nursery, so it is not wrapped in a group
            finally:
                nursery.cancel_scope.cancel()
        if error is not None:
            raise error


def _fault_exit(served: int) -> NoReturn:
    print(f"llmgw-sim: fault injected: exiting after {served} requests", file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    # Like a crash: no graceful shutdown, in-flight requests lose their connections.
    os._exit(FAULT_EXIT_CODE)
