"""Wake on request: requests for an autoscaled model with no replica wait for one.

A request whose model (or fallbacks) has no replica that can take it is answered 503
at once, except when a chain model is autoscaled and a control plane runs in the same
process: then the request waits in its band's admission queue for that model, for up
to the model's `cold_start_timeout`, while the control plane is told there is demand
(:mod:`llmgw.domain.wakes`) and starts a replica. The admission queue admits it as
soon as a replica serves (the new endpoint pokes it), in band order, like any other
wait.

The wait ends early when the control plane's pass finds the model cannot be placed:
then waiting longer cannot help, and the client hears why at once. These are
:meth:`ColdStarts.check`'s business (a :class:`~llmgw.domain.wakes.ColdSide`), which
the control plane calls after each pass with its reasons.

Without a control plane (router-only, or a library user's router) nothing can start a
replica, and nothing waits.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import trio

from llmgw.domain.catalog import ModelConfig
from llmgw.domain.wakes import Unplaceable, WakeSink

__all__ = ["ColdStarts", "ColdWait"]


class ColdWait:
    """One request's wait: cancelled, with `refused` set, when the model cannot be
    placed."""

    __slots__ = ("model", "refused", "scope")

    def __init__(self, model: str) -> None:
        self.model = model
        self.scope = trio.CancelScope()
        self.refused: str | None = None


class ColdStarts:
    """The requests waiting for a first replica; `wakes` is where the control plane
    hears of them (None: there is none, and nothing waits)."""

    def __init__(self, wakes: WakeSink | None = None) -> None:
        self.wakes = wakes
        self._waits: dict[str, set[ColdWait]] = {}

    def model_for(self, chain: Sequence[ModelConfig]) -> ModelConfig | None:
        """The chain's first autoscaled model, when a control plane can start it."""
        if self.wakes is None:
            return None
        return next((m for m in chain if m.autoscale is not None), None)

    def waiting(self, model: str) -> int:
        """Requests waiting for a replica of `model` to start."""
        return len(self._waits.get(model, ()))

    @contextmanager
    def wait(self, model: str) -> Iterator[ColdWait]:
        """Register a request waiting for `model` and tell the control plane; run the
        wait inside ``with w.scope``."""
        assert self.wakes is not None
        w = ColdWait(model)
        self._waits.setdefault(model, set()).add(w)
        try:
            self.wakes.wake(model)
            yield w
        finally:
            waits = self._waits[model]
            waits.discard(w)
            if not waits:
                del self._waits[model]

    def check(self, unplaceable: Unplaceable) -> None:
        """After a control-plane pass: end the waits for models that cannot be placed."""
        for model, waits in list(self._waits.items()):
            why = unplaceable(model)
            if why is None:
                continue
            for w in waits:
                w.refused = why
                w.scope.cancel()
