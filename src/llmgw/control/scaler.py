"""What the controller keeps between passes for its autoscaled models.

Per model: its demand history (bounded to the longest window it is judged over), the
count last decided and when it changed. Each pass hands it one demand sample per
autoscaled model and gets back the counts the reconciler is to reach; the decision
itself is :func:`llmgw.control.autoscale.decide`'s. Models without `autoscale` are
not its business: their count is their `replicas`.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from llmgw.control.autoscale import Cause, Decision, Demand, ReplicaSample, Sample, decide, initial
from llmgw.domain.catalog import ModelConfig
from llmgw.domain.fleet import ReplicaState

if TYPE_CHECKING:
    from llmgw.router.core import Router

log = logging.getLogger("llmgw.control")

#: What the router reports of a model's demand now: ``(model, now) -> Sample``.
DemandFeed = Callable[[str, float], Sample]
# Passes run after every event (many a second in a burst); demand is sampled at most
# this often, which bounds the history to a window's length over it.
SAMPLE_EVERY = 1.0


def router_demand(router: Router) -> DemandFeed:
    """The demand feed of a router in the same process: requests in flight at the
    model's endpoints, those waiting in its admission queues (its pool), and the
    pool's saturation (what the bands' ceilings are compared with)."""

    def sample(model: str, now: float) -> Sample:
        waiting = next((p.waiting for p in router.admission.stats().pools if p.pool == model), 0)
        serving = router.endpoints.serving(model)
        inflight = sum(s.inflight for s in serving)
        return Sample(now, inflight, waiting, router.pool_saturation(model), len(serving))

    return sample


@attrs.define
class _State:
    target: int
    since: float
    last_change: float | None = None
    reason: str = "initial count"
    cause: Cause = "hold"
    last_busy: float | None = None  # the last sample with a request in flight or queued
    samples: collections.deque[Sample] = attrs.field(factory=collections.deque)


class Scaler:
    def __init__(self) -> None:
        self._models: dict[str, _State] = {}
        # Count changes since the server started, by model, direction (up, down) and
        # cause (llmgw_fleet_scale_events_total).
        self.events: collections.Counter[tuple[str, str, Cause]] = collections.Counter()

    def decided(self, model: str) -> Decision | None:
        """The last decision for an autoscaled model (None: not autoscaled, or no pass
        yet)."""
        state = self._models.get(model)
        return None if state is None else Decision(state.target, state.reason, state.cause)

    def step(
        self,
        models: Iterable[ModelConfig],
        now: float,
        *,
        demand: DemandFeed | None,
        last_request: Callable[[str], float | None],
        replicas: Mapping[str, Sequence[ReplicaSample]],
    ) -> dict[str, int]:
        """The desired count of every autoscaled model among `models` now; forgets
        the models that are no longer autoscaled. Without a `demand` feed the history
        holds no samples: only idleness (from `last_request`) moves the count."""
        out: dict[str, int] = {}
        seen: set[str] = set()
        for model in models:
            s = model.autoscale
            if s is None:
                continue
            seen.add(model.name)
            state = self._models.get(model.name)
            if state is None:
                # After a restart the replicas adopted are where it stands: starting
                # from `replicas` would drain what the demand had scaled up.
                running = sum(
                    r.state in (ReplicaState.STARTING, ReplicaState.READY)
                    for r in replicas.get(model.name, ())
                )
                start = max(initial(model), min(running, s.max_replicas))
                state = self._models[model.name] = _State(start, now)
            if demand is not None and (
                not state.samples or now - state.samples[-1].at >= SAMPLE_EVERY
            ):
                sample = demand(model.name, now)
                state.samples.append(sample)
                if sample.busy:
                    state.last_busy = now
            # Keep one sample at or before the longest window's start, so it is whole.
            keep = now - max(s.scale_up_window, s.scale_down_window)
            while len(state.samples) > 1 and state.samples[1].at <= keep:
                state.samples.popleft()
            # The history is trimmed to the windows; when a request was last seen is not.
            heard = [t for t in (last_request(model.name), state.last_busy) if t is not None]
            history = Demand(tuple(state.samples), max(heard, default=None), state.since)
            decision = decide(
                s, history, replicas.get(model.name, ()), state.target, state.last_change, now
            )
            if decision.desired != state.target:
                log.info(
                    "model %s: %d -> %d replicas (%s)",
                    model.name,
                    state.target,
                    decision.desired,
                    decision.reason,
                )
                direction = "up" if decision.desired > state.target else "down"
                self.events[model.name, direction, decision.cause] += 1
                state.target, state.last_change = decision.desired, now
                state.reason, state.cause = decision.reason, decision.cause
            out[model.name] = state.target
        for name in set(self._models) - seen:
            del self._models[name]
        return out
