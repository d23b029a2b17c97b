"""Autoscaling end to end in one process: router, controller, agents on the stub
transport and simulated engines on loopback; the router's demand feeds the autoscaler."""

from __future__ import annotations

import trio

from llmgw.domain.fleet import ReplicaState
from llmgw.testing import SIM_PROFILE, Fleet, fleet, until

SCALED = {
    "name": "m",
    "replicas": 1,
    "profiles": [SIM_PROFILE],
    "autoscale": {
        "min_replicas": 1,
        "max_replicas": 2,
        "target_saturation": 0.5,
        "scale_up_window": "1s",
        "scale_down_window": "1s",
        "idle_timeout": "2s",
    },
}


def active(f: Fleet) -> int:
    return sum(
        r.state in (ReplicaState.STARTING, ReplicaState.READY)
        for r in f.controller.reconciler.replicas.values()
    )


async def test_a_model_scales_up_under_load_and_back_to_min_when_idle() -> None:
    async with fleet([SCALED], nodes=1, gpus="2x80GB") as f:
        with trio.fail_after(20):
            await f.wait_ready("m", 1)
        (serving,) = f.router.endpoints.serving("m")
        # Requests wait in the engine's queue: the router sees it full (saturation 1).
        r = await f.client.post(
            f"{serving.endpoint.url}/sim/faults", json={"first_token_delay": 60.0}
        )
        r.raise_for_status()
        body = {"model": "m", "prompt": "hi", "max_tokens": 1}

        async def ask() -> None:
            await f.client.post("/v1/completions", json=body)  # cancelled when done with

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(ask)
            with trio.fail_after(20):
                await f.wait_ready("m", 2)
            decision = f.controller.scaler.decided("m")
            assert decision is not None and "saturation" in decision.reason, decision
            nursery.cancel_scope.cancel()  # the clients go away
        # Nothing in flight for idle_timeout: back to min_replicas, by drain.
        with trio.fail_after(20):
            await until(lambda: active(f) == 1)
        decision = f.controller.scaler.decided("m")
        assert decision is not None and decision.desired == 1, decision


async def test_a_request_to_a_model_at_zero_wakes_it() -> None:
    at_zero = {**SCALED, "replicas": 0, "autoscale": {"min_replicas": 0, "max_replicas": 2}}
    async with fleet([at_zero], nodes=1, gpus="2x80GB") as f:
        with trio.fail_after(20):
            await until(lambda: f.controller.passes >= 3)
        assert active(f) == 0  # `replicas = 0`: nothing starts unasked
        body = {"model": "m", "prompt": "hi", "max_tokens": 1}
        # Nothing runs: the request waits in its band's queue while a replica starts,
        # and is served by it.
        r = await f.client.post("/v1/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert active(f) == 1
        decision = f.controller.scaler.decided("m")
        assert decision is not None and decision.reason == "a request while scaled to zero"
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for metric in f.router.metrics.registry.collect()
            for s in metric.samples
        }
        admitted = ("llmgw_cold_start_requests_total", (("model", "m"), ("outcome", "admitted")))
        assert samples[admitted] == 1
        assert samples[("llmgw_cold_start_wait_seconds_count", (("model", "m"),))] == 1
