"""Wake on request: requests for an autoscaled model with no replica wait for one.

A request whose model (or fallbacks) has no replica that can take it is answered 503
at once, except when a chain model is autoscaled and a control plane runs in the same
process: then the request waits in its band's admission queue for that model, for up
to the model's `cold_start_timeout`, while the control plane is told there is demand
(:meth:`Fleet.wake`) and starts a replica. The admission queue admits it as soon as a
replica serves (the new endpoint pokes it), in band order, like any other wait.

The wait ends early when the control plane's pass finds the model cannot be placed:
then waiting longer cannot help, and the client hears why at once. These are
:meth:`ColdStarts.check`'s business, which the control plane calls after each pass.

Without a control plane (router-only, or a library user's router) nothing can start a
replica, and nothing waits.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

import trio

from llmgw.domain.catalog import ModelConfig

__all__ = ["ColdStarts", "ColdWait", "Fleet"]


class Fleet(Protocol):
    """What the router asks of the control plane for a cold start
    (:class:`~llmgw.control.controller.Controller` is one)."""

    def wake(self, model: str) -> None:
        """A request waits for `model`, which has no replica serving: start one."""

    def unplaceable(self, model: str) -> str | None:
        """Why no replica of `model` can be placed now (None: it can, or one is
        starting or ready)."""


class ColdWait:
    """One request's wait: cancelled, with `refused` set, when the model cannot be
    placed."""

    __slots__ = ("model", "refused", "scope")

    def __init__(self, model: str) -> None:
        self.model = model
        self.scope = trio.CancelScope()
        self.refused: str | None = None


class ColdStarts:
    def __init__(self, fleet: Fleet | None = None) -> None:
        self.fleet = fleet
        self._waits: dict[str, set[ColdWait]] = {}

    def model_for(self, chain: Sequence[ModelConfig]) -> ModelConfig | None:
        """The chain's first autoscaled model, when a fleet can start it."""
        if self.fleet is None:
            return None
        return next((m for m in chain if m.autoscale is not None), None)

    def waiting(self, model: str) -> int:
        """Requests waiting for a replica of `model` to start."""
        return len(self._waits.get(model, ()))

    @contextmanager
    def wait(self, model: str) -> Iterator[ColdWait]:
        """Register a request waiting for `model` and tell the fleet; run the wait
        inside ``with w.scope``."""
        assert self.fleet is not None
        w = ColdWait(model)
        self._waits.setdefault(model, set()).add(w)
        try:
            self.fleet.wake(model)
            yield w
        finally:
            waits = self._waits[model]
            waits.discard(w)
            if not waits:
                del self._waits[model]

    def check(self) -> None:
        """After a control-plane pass: end the waits for models that cannot be placed."""
        if self.fleet is None:
            return
        for model, waits in list(self._waits.items()):
            why = self.fleet.unplaceable(model)
            if why is None:
                continue
            for w in waits:
                w.refused = why
                w.scope.cancel()
