"""Sleeping engines through real processes (issue #22): llmgw-server in control-plane
mode, an llmgw-agent over gRPC and llmgw-sim in vLLM's sleep mode (`--sleep-mode`,
launched so by the agent for a profile with `sleep_after`), with the openai client.

An idle replica is put to sleep and stays placed (same engine process, GPUs held);
the next request wakes it, once, however many arrive together, and is served.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from tests.procs import AgentProc, FleetServer, agent, fleet_server
from tests.test_fleet_e2e import client, control_config

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")

SLEEPY = """
[[models]]
name = "s"
replicas = 1

[[models.profiles]]
name = "sim"
engine = "sim"
weights = "sim"
sleep_after = "2s"
args = ["--wake-delay", "700ms"]
"""


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[FleetServer, AgentProc, dict[str, Any]]]:
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(control_config([SLEEPY])))
        node = stack.enter_context(agent(srv.agent_address, "n1", address="127.0.0.41"))
        (replica,) = srv.wait(lambda: srv.ready_replicas("s", 1), "s ready", logs=[node.proc])
        yield srv, node, replica


def sleeping(replica: dict[str, Any]) -> bool:
    answer = httpx.get(f"{replica['url']}/is_sleeping", timeout=5).json()
    return bool(answer["is_sleeping"])


def events(srv: FleetServer, event: str) -> float:
    return srv.metric("llmgw_engine_sleeps_total", model="s", event=event)


def complete(srv: FleetServer) -> float:
    """One completion through llmgw; how long it took."""
    started = time.monotonic()
    done = client(srv).completions.create(model="s", prompt="hello", max_tokens=2)
    assert done.usage is not None and done.usage.completion_tokens == 2
    return time.monotonic() - started


def test_an_idle_replica_sleeps_and_the_next_request_wakes_it(
    fleet: tuple[FleetServer, AgentProc, dict[str, Any]],
) -> None:
    srv, node, replica = fleet
    engines = node.engines()
    srv.wait(lambda: sleeping(replica) or None, "the idle engine asleep", logs=[node.proc])
    assert events(srv, "sleep") >= 1
    # Asleep, it is still placed: the same engine process, ready, its GPU held.
    assert node.engines() == engines
    assert srv.ready_replicas("s", 1)
    assert srv.nodes()["n1"]["gpus_allocated"] == 1
    assert srv.endpoints()[replica["id"]]["asleep"] is True
    woken = events(srv, "wake")
    took = complete(srv)
    assert took >= 0.7  # it waited for the wake, then was served
    assert events(srv, "wake") == woken + 1
    assert srv.metric("llmgw_engine_wake_seconds_count", model="s") == woken + 1
    assert not sleeping(replica)
    assert srv.endpoints()[replica["id"]]["asleep"] is False


def test_requests_that_find_it_asleep_together_wake_it_once(
    fleet: tuple[FleetServer, AgentProc, dict[str, Any]],
) -> None:
    srv, node, replica = fleet
    srv.wait(lambda: sleeping(replica) or None, "the idle engine asleep", logs=[node.proc])
    woken = events(srv, "wake")
    with ThreadPoolExecutor(4) as pool:
        took = list(pool.map(lambda _: complete(srv), range(4)))
    assert all(t >= 0.7 for t in took), took
    assert events(srv, "wake") == woken + 1
    assert events(srv, "wake_failed") == 0 and events(srv, "sleep_failed") == 0
