"""The autoscaler: a model's demand, replicas and settings in, its desired count out.

A pure function over frozen values with the clock as an argument, so a fake clock
drives it in tests and the controller's loop drives it in service. It only says how
many replicas a model should have; the reconciler places what is missing and drains
what is surplus (starting ones first, then the youngest ready: never a stream cut).

The rules, in order (docs/autoscaling.md):

1. **Idle**: no request in flight, queued or finished for `idle_timeout`: down to
   `min_replicas` at once.
2. **Wake**: scaled to zero and a request is there (or came since, within
   `idle_timeout`): one replica, at once.
3. **Up**: every sample of the last `scale_up_window` hot (a replica serving, and
   requests queued or in flight with the pool saturation at or above
   `target_saturation`), and no change within that window: up to what would bring
   the load to the target (at least one more). The load counts the queue: serving
   replicas at saturation s with I requests in flight and Q queued carry
   s x (I + Q) / I of what they can, so one scale-up meets a burst instead of one
   replica per cold start. While a replica is still starting (within
   `cold_start_timeout`) only a load beyond the count with it is acted on (it is
   capacity on its way); nothing while the count decided is not placed yet.
4. **Down**: every sample of the last `scale_down_window` cool enough that one replica
   fewer would still stay under the target, nothing queued, and no change within that
   window: one replica fewer (never below one by load: only idleness goes to zero).

The result is always within [`min_replicas`, `max_replicas`]. A window counts only
once the history covers it, and the cooldown after a change is that same window, so
under a constant load the count moves at most once per window and in one direction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import attrs

from llmgw import units
from llmgw.domain.catalog import AutoscaleConfig, ModelConfig
from llmgw.domain.fleet import ReplicaState

__all__ = ["Cause", "Decision", "Demand", "ReplicaSample", "Sample", "decide", "initial"]


@attrs.frozen
class Sample:
    """A model's demand at one moment, as the router sees it."""

    at: float  # monotonic seconds
    inflight: int  # requests being served
    queued: int  # requests waiting in its admission queues
    # How full its usable replicas are, 0..1 (the router's pool saturation: the one
    # the admission bands' ceilings are compared with).
    saturation: float
    # Replicas taking its requests (None: not known). Requests queued while none
    # serves wait for a start, which says nothing of the load on the replicas.
    serving: int | None = None

    @property
    def busy(self) -> bool:
        return self.inflight > 0 or self.queued > 0

    @property
    def load(self) -> float:
        """What the serving replicas are asked for, as a share of what they carry:
        the saturation, scaled up by the queue behind it."""
        if self.inflight == 0:
            return self.saturation
        return self.saturation * (self.inflight + self.queued) / self.inflight


@attrs.frozen
class Demand:
    """A model's demand history."""

    samples: tuple[Sample, ...]  # oldest first
    # The last time a request was seen (in flight, queued or finished); None: never.
    last_request: float | None
    # Since when the model has been watched: idleness counts from here when no
    # request was ever seen.
    since: float


@attrs.frozen
class ReplicaSample:
    state: ReplicaState
    since: float  # when it entered `state`


#: Why a count changed, as a bounded label (llmgw_fleet_scale_events_total): the rule
#: that decided (the module docstring's), or "bounds" for a change of the bounds.
Cause = Literal["bounds", "idle", "wake", "load", "cool", "hold"]


@attrs.frozen
class Decision:
    desired: int
    reason: str  # for people: the rule with its numbers
    cause: Cause = "hold"


def initial(model: ModelConfig) -> int:
    """The count an autoscaled model starts from: its `replicas`, within its bounds."""
    assert model.autoscale is not None
    return _clamp(model.replicas, model.autoscale)


def _clamp(n: int, s: AutoscaleConfig) -> int:
    return max(s.min_replicas, min(s.max_replicas, n))


def _window(demand: Demand, now: float, length: float) -> list[Sample] | None:
    """The samples of the last `length` seconds, or None while the history does not
    reach back that far (a window is only judged whole)."""
    if not demand.samples or demand.samples[0].at > now - length:
        return None
    return [s for s in demand.samples if s.at >= now - length]


def _hot(x: Sample, s: AutoscaleConfig) -> bool:
    # Saturation without a request is a stale reading, not demand; a queue while no
    # replica serves is a wake (rule 2), not load.
    if x.serving == 0:
        return False
    return x.queued > 0 or (x.inflight > 0 and x.saturation >= s.target_saturation)


def decide(
    settings: AutoscaleConfig,
    demand: Demand,
    replicas: Sequence[ReplicaSample],
    target: int,
    last_change: float | None,
    now: float,
) -> Decision:
    """The desired replica count of a model now.

    `target` is the count desired so far (the last decision), `replicas` the model's
    replicas as the reconciler holds them, `last_change` when `target` last changed
    (None: never, so no cooldown)."""
    s = settings
    bounded = _clamp(target, s)
    if bounded != target:
        return Decision(bounded, f"kept within [{s.min_replicas}, {s.max_replicas}]", "bounds")
    latest = demand.samples[-1] if demand.samples else None
    busy = latest is not None and latest.busy
    heard = [x.at for x in demand.samples if x.busy]
    if demand.last_request is not None:
        heard.append(demand.last_request)
    last_request = max(heard, default=None)
    idle = now - (demand.since if last_request is None else last_request)
    if not busy and idle >= s.idle_timeout and target > s.min_replicas:
        # Whole seconds: a reason for people, not a duration to read back.
        idle_for = units.format_duration(round(idle))
        return Decision(s.min_replicas, f"idle for {idle_for}", "idle")
    # A request since the count went to zero (or now): it waits for a replica.
    asked = (
        last_request is not None
        and idle < s.idle_timeout
        and (last_change is None or last_request > last_change)
    )
    if target == 0 and (busy or asked):
        return Decision(_clamp(1, s), "a request while scaled to zero", "wake")
    quiet_since = math.inf if last_change is None else now - last_change
    up = _window(demand, now, s.scale_up_window)
    if (
        up is not None
        and quiet_since >= s.scale_up_window
        and 0 < target < s.max_replicas
        and all(_hot(x, s) for x in up)
    ):
        placed = sum(r.state in (ReplicaState.STARTING, ReplicaState.READY) for r in replicas)
        if placed < target:
            # More would not be placed either (GET /api/v1/placement says why).
            return Decision(target, f"hot, but {target - placed} replica(s) not placed yet")
        level = min(x.load for x in up)
        # What carries the load now: the replicas serving (as the router saw them),
        # else those the reconciler holds ready.
        serving = up[-1].serving
        if serving is None:
            serving = sum(r.state is ReplicaState.READY for r in replicas)
        base = min(serving, target)
        needed = math.ceil(round(base * level / s.target_saturation, 6))
        starting = sum(
            r.state is ReplicaState.STARTING and now - r.since < s.cold_start_timeout
            for r in replicas
        )
        if starting and needed <= target:
            return Decision(target, f"hot, but {starting} replica(s) still starting")
        wanted = needed if starting else max(target + 1, needed)
        return Decision(
            min(wanted, s.max_replicas),
            f"load {level:.2f} (saturation with the queue) at or above "
            f"{s.target_saturation:g} for {units.format_duration(s.scale_up_window)}",
            "load",
        )
    down = _window(demand, now, s.scale_down_window)
    if (
        down is not None
        and quiet_since >= s.scale_down_window
        and target > max(s.min_replicas, 1)
        and all(x.queued == 0 for x in down)
    ):
        # One fewer must not push the same load over the target (or it would be
        # scaled back up: the flapping the hysteresis is for).
        level = max(x.saturation for x in down)
        if level * target / (target - 1) < s.target_saturation:
            return Decision(
                target - 1,
                f"saturation {level:.2f} would stay under {s.target_saturation:g} "
                f"on {target - 1} for {units.format_duration(s.scale_down_window)}",
                "cool",
            )
    return Decision(target, "steady")
