"""Per-model activity as the router sees it, for the control plane.

The router records every finished request here (it is a
:class:`~llmgw.domain.usage.UsageSink`); the controller's views and fleet metrics
read it to show models that hold GPUs while nobody asks for them. Rates are
exponentially decayed so they need no ticker: a quiet model's rate falls when it
is read, not when a timer fires.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
import trio

from llmgw.domain.usage import UsageRecord


@attrs.frozen
class Activity:
    """A model's recent traffic; rates are per second, decayed over `window` seconds."""

    # Monotonic time of the last request seen: finished, or waiting for a replica.
    last_request: float | None
    idle_seconds: float | None  # None: no request since the server started
    requests_per_second: float
    tokens_per_second: float


@attrs.define
class _Rates:
    at: float
    requests: float = 0.0
    tokens: float = 0.0
    last: float | None = None


class ActivityTracker:
    def __init__(self, window: float = 60.0, clock: Callable[[], float] = trio.current_time):
        self.window = window
        self.clock = clock
        self._models: dict[str, _Rates] = {}

    def _decayed(self, rates: _Rates, now: float) -> None:
        if now > rates.at:
            factor = math.exp(-(now - rates.at) / self.window)
            rates.requests *= factor
            rates.tokens *= factor
            rates.at = now

    def record(self, record: UsageRecord) -> None:
        now = self.clock()
        rates = self._models.setdefault(record.model, _Rates(now))
        self._decayed(rates, now)
        # Each event adds 1/window, so a steady rate r converges to r.
        rates.requests += 1.0 / self.window
        usage = record.usage
        rates.tokens += (usage.prompt_tokens + usage.completion_tokens) / self.window
        rates.last = now

    def seen(self, model: str) -> None:
        """A request for `model` is waiting (for a replica to start): it is not idle.
        Rates count finished requests only."""
        now = self.clock()
        rates = self._models.setdefault(model, _Rates(now))
        rates.last = now

    def get(self, model: str) -> Activity:
        now = self.clock()
        rates = self._models.get(model)
        if rates is None:
            return Activity(None, None, 0.0, 0.0)
        self._decayed(rates, now)
        idle = None if rates.last is None else now - rates.last
        return Activity(rates.last, idle, rates.requests, rates.tokens)
