"""Wake on request, between the planes: which models requests wait for.

A request for an autoscaled model with no replica serving waits for one
(:mod:`llmgw.router.coldstart`). The data plane says so here, the control plane takes
what was said on its own loop. Both are given the same :class:`Wakes` when they are
made, so neither has to be made before the other or hold it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import trio

__all__ = ["ColdSide", "Unplaceable", "WakeSink", "Wakes"]

#: Why no replica of a model can be placed now (None: it can, or one is starting or
#: ready): the control plane's answer after a pass.
Unplaceable = Callable[[str], "str | None"]


class WakeSink(Protocol):
    """Where the data plane says a request waits for a model with no replica."""

    def wake(self, model: str) -> None: ...


class Wakes:
    """The models woken since the control plane last took them; a set of names from
    the catalog, so bounded by it."""

    def __init__(self) -> None:
        self._models: set[str] = set()
        self._rung = trio.Event()

    def wake(self, model: str) -> None:
        self._models.add(model)
        self._rung.set()

    async def taken(self) -> set[str]:
        """Wait until a model was woken; the models woken since the last call."""
        await self._rung.wait()
        self._rung = trio.Event()
        models, self._models = self._models, set()
        return models


class ColdSide(Protocol):
    """Where the control plane says, after each pass, why the models requests wait for
    cannot be placed (the data plane ends those waits)."""

    def check(self, unplaceable: Unplaceable) -> None: ...
