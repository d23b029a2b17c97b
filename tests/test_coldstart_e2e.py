"""Wake on request through real processes (issue #22): llmgw-server in control-plane
mode, an llmgw-agent over gRPC, simulators that take `--startup-delay` to come up as a
loading engine does, and the official openai client.

A model with `min_replicas = 0` runs nothing until asked; a request for it waits in
its band's queue while the controller starts a replica and is served by it; the model
idles back to zero. A start that outlasts `cold_start_timeout`, a model that cannot be
placed, and a client that gives up while waiting each end as the issue says.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import openai
import pytest

from tests.procs import AgentProc, FleetServer, agent, fleet_server
from tests.test_fleet_e2e import client, control_config

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")


def scaled(
    name: str,
    *,
    startup: str,
    cold_start_timeout: str = "30s",
    idle_timeout: str = "600s",
    gpu_name: str | None = None,
) -> str:
    """An autoscaled simulator model at zero (TOML)."""
    restrict = f'gpu_name = "{gpu_name}"\n' if gpu_name is not None else ""
    return f"""
[[models]]
name = "{name}"
replicas = 0

[models.autoscale]
min_replicas = 0
max_replicas = 1
idle_timeout = "{idle_timeout}"
cold_start_timeout = "{cold_start_timeout}"

[[models.profiles]]
name = "sim"
engine = "sim"
weights = "sim"
{restrict}args = ["--startup-delay", "{startup}"]
"""


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[FleetServer, AgentProc]]:
    models = [
        scaled("cold", startup="1s", idle_timeout="2s"),
        scaled("slow", startup="8s", cold_start_timeout="1s"),
        scaled("nowhere", startup="0s", gpu_name="H100"),
        scaled("left", startup="2s"),
        scaled("waking", startup="4s"),
        scaled("lagging", startup="8s", cold_start_timeout="3s"),
    ]
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(control_config(models)))
        node = stack.enter_context(
            agent(srv.agent_address, "n1", address="127.0.0.21", gpus="6x80GB")
        )
        srv.wait(lambda: srv.nodes().get("n1", {}).get("state") == "ready", "n1 ready")
        yield srv, node


def cold_outcome(srv: FleetServer, model: str, outcome: str) -> float:
    return srv.metric("llmgw_cold_start_requests_total", model=model, outcome=outcome)


def running(srv: FleetServer, model: str) -> list[dict[str, object]]:
    return [r for r in srv.replicas(model) if r["state"] in ("starting", "ready")]


def test_a_gateway_with_every_model_at_zero_is_healthy_and_lists_them(
    fleet: tuple[FleetServer, AgentProc],
) -> None:
    """Issue #33: scale to zero is the gateway working as configured, so a load balancer
    must keep it; clients that list models can pick one that starts on request."""
    srv, _ = fleet
    assert srv.replicas() == []  # nothing runs: every model is at zero
    assert httpx.get(f"{srv.base}/health", timeout=5).status_code == 200
    assert httpx.get(f"{srv.admin}/readyz", timeout=5).status_code == 200
    listed = client(srv).models.list().data
    states = {m.id: (m.model_extra or {})["llmgw"]["state"] for m in listed}
    assert states["cold"] == states["waking"] == "scaled_to_zero", states
    got = client(srv).models.retrieve("cold")
    assert got.id == "cold" and (got.model_extra or {})["llmgw"] == {"state": "scaled_to_zero"}
    # Per model: not ready until a replica serves, and why.
    r = httpx.get(f"{srv.base}/health", params={"model": "cold"}, timeout=5)
    assert r.status_code == 503 and r.json() == {
        "status": "not ready",
        "model": "cold",
        "state": "scaled_to_zero",
    }
    r = httpx.get(f"{srv.base}/health", params={"model": "no-such"}, timeout=5)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


class HealthPoller:
    """A load balancer's health check, as a thread polling /health (bounded in count)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.statuses: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as http:
            for _ in range(3000):  # 10 minutes at most
                self.statuses.append(http.get(self.url).status_code)
                if self.stop.wait(0.2):
                    return

    def __enter__(self) -> HealthPoller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def test_a_model_at_zero_is_served_after_a_cold_start_and_idles_back(
    fleet: tuple[FleetServer, AgentProc],
) -> None:
    srv, node = fleet
    assert running(srv, "cold") == []  # nothing starts unasked
    with HealthPoller(f"{srv.base}/health") as poller:
        served_after_cold_start(srv, node)
    # The gateway never left the load balancer's pool: at zero, waking, serving, idling.
    assert poller.statuses and set(poller.statuses) == {200}, poller.statuses


def served_after_cold_start(srv: FleetServer, node: AgentProc) -> None:
    started = time.monotonic()
    done = client(srv).completions.create(model="cold", prompt="hello", max_tokens=3)
    waited = time.monotonic() - started
    assert done.usage is not None and done.usage.completion_tokens == 3
    assert waited >= 1.0  # it did wait for the engine's startup
    assert cold_outcome(srv, "cold", "admitted") == 1
    assert srv.metric("llmgw_cold_start_wait_seconds_count", model="cold") == 1

    # No request for idle_timeout: back to zero, by drain; the engine stops.
    srv.wait(lambda: not running(srv, "cold"), "cold back at zero replicas", logs=[node.proc])
    srv.wait(
        lambda: not [n for n in node.engines() if n.startswith("cold-")] or None,
        "the cold engine stopped",
    )
    # The control plane's account of it: one cold start of at least the engine's
    # startup, a scale-up for the request and a scale-down for idleness.
    start = {"model": "cold", "cold": "true"}
    assert srv.metric("llmgw_fleet_replica_start_seconds_count", **start) == 1
    assert srv.metric("llmgw_fleet_replica_start_seconds_sum", **start) >= 1.0
    events = "llmgw_fleet_scale_events_total"
    assert srv.metric(events, model="cold", direction="up", cause="wake") == 1
    assert srv.metric(events, model="cold", direction="down", cause="idle") == 1
    # And it wakes again, for a stream this time.
    stream = client(srv).chat.completions.create(
        model="cold",
        messages=[{"role": "user", "content": "again"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert cold_outcome(srv, "cold", "admitted") == 2


def test_a_start_longer_than_cold_start_timeout_is_a_503_that_says_starting(
    fleet: tuple[FleetServer, AgentProc],
) -> None:
    srv, node = fleet
    started = time.monotonic()
    r = httpx.post(f"{srv.base}/v1/completions", json={"model": "slow", "prompt": "hi"}, timeout=30)
    assert r.status_code == 503, r.text
    assert time.monotonic() - started < 6  # the timeout (1s), not the start (8s)
    error = r.json()["error"]
    assert error["code"] == "model_starting", error
    assert "starting" in error["message"] and "1s" in error["message"], error
    assert r.headers["retry-after"] == "1"
    assert cold_outcome(srv, "slow", "starting") == 1
    # The start goes on: a later request finds it ready.
    srv.wait(lambda: srv.ready_replicas("slow", 1), "slow ready", logs=[node.proc])
    done = client(srv).completions.create(model="slow", prompt="hi", max_tokens=2)
    assert done.usage is not None and done.usage.completion_tokens == 2


def test_a_model_that_cannot_be_placed_is_refused_at_once_with_the_reason(
    fleet: tuple[FleetServer, AgentProc],
) -> None:
    srv, _ = fleet
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as caught:
        client(srv).completions.create(model="nowhere", prompt="hi", max_tokens=2)
    assert time.monotonic() - started < 10  # cold_start_timeout is 30s
    response = caught.value.response
    assert response.status_code == 503
    assert response.headers["retry-after"] == "60"
    error = response.json()["error"]
    assert error["code"] == "model_unplaceable", error
    assert "cannot be placed" in error["message"] and "H100" in error["message"], error
    assert cold_outcome(srv, "nowhere", "unplaceable") == 1


def test_a_client_that_gives_up_while_waiting_is_counted_and_leaves_no_work(
    fleet: tuple[FleetServer, AgentProc],
) -> None:
    srv, node = fleet
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{srv.base}/v1/completions", json={"model": "left", "prompt": "hi"}, timeout=0.5
        )
    srv.wait(
        lambda: cold_outcome(srv, "left", "disconnected") == 1 or None,
        "the disconnect counted",
    )
    # The replica it woke comes up, and the request that left never reaches it.
    (ready,) = srv.wait(lambda: srv.ready_replicas("left", 1), "left ready", logs=[node.proc])
    seen = httpx.get(f"{ready['url']}/sim/requests", timeout=5).json()["requests"]
    assert [s for s in seen if s["path"].startswith("/v1/")] == [], seen  # health checks only
    assert cold_outcome(srv, "left", "admitted") == 0


def test_a_stream_that_waits_for_a_cold_start_begins_with_comments_and_is_served(
    fleet: tuple[FleetServer, AgentProc],
) -> None:
    """Issue #33: bytes reach the client while the model wakes (its engine takes 4 s to
    start here), so proxies between it and llmgw see no idle connection."""
    srv, _ = fleet
    body = {
        "model": "waking",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{srv.base}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream"
        received = r.iter_lines()
        lines = [next(received)]
        assert lines[0] == ": waking", lines  # before any replica could answer
        # Meanwhile the admission view and the dashboard say it wakes, not that it is full.
        (pool,) = [p for p in srv.get("/api/v1/admission")["pools"] if p["pool"] == "waking"]
        assert pool["state"] == "waking", pool
        page = httpx.get(f"{srv.admin}/", timeout=5).text
        assert "waking: its first replica is starting" in page
        lines += [line for line in received if line]
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["usage"]["completion_tokens"] == 3
    assert all(line.startswith((": waking", "data: ")) for line in lines), lines
    assert cold_outcome(srv, "waking", "admitted") == 1


def test_a_begun_stream_whose_model_outlasts_its_cold_start_timeout_ends_with_the_error(
    fleet: tuple[FleetServer, AgentProc],
) -> None:
    srv, _ = fleet
    stream = client(srv).chat.completions.create(
        model="lagging", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True
    )
    with pytest.raises(openai.APIError) as caught:
        list(stream)
    assert caught.value.code == "model_starting", caught.value.body
    assert "cold_start_timeout (3s)" in caught.value.message
    assert cold_outcome(srv, "lagging", "starting") == 1
