"""Wake on request with a real engine (issue #22): an autoscaled llama.cpp model at zero
replicas on a CPU node (`llmgw-agent` without GPUs, `llama-server` of the tiny
generated GGUF model), asked through the official openai client: served after its cold
start, idle back to zero, and woken again.

Needs the llama-server binary (scripts/llama_server.sh; CI builds it first) and fails,
not skips, without it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import openai
import pytest

from llmgw.testing_gguf import write_tiny_gguf
from tests.procs import AgentProc, FleetServer, agent, engine_port_range, fleet_server
from tests.test_llamacpp_fleet import EXACT, require_llama_server

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")


def config(weights: Path) -> str:
    low, high = engine_port_range()
    return f"""
[router]
scrape_interval = "300ms"
scrape_timeout = "300ms"

[control]
interval = "200ms"
port_range = [{low}, {high}]

[[models]]
name = "tiny"
replicas = 0

[models.autoscale]
min_replicas = 0
max_replicas = 1
idle_timeout = "2s"

[[models.profiles]]
name = "cpu"
engine = "llamacpp"
weights = {json.dumps(str(weights))}
args = ["-np", "1", "-c", "1024", "-t", "1"]
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FleetServer, AgentProc]]:
    require_llama_server()
    weights = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(config(weights)))
        cpu = stack.enter_context(agent(srv.agent_address, "c1", address="127.0.0.83", gpus=None))
        srv.wait(lambda: srv.nodes().get("c1", {}).get("state") == "ready", "c1 ready")
        yield srv, cpu


def ask(srv: FleetServer) -> tuple[int, float]:
    """One completion of exactly 3 tokens; its token count and how long it took."""
    c = openai.OpenAI(base_url=f"{srv.base}/v1", api_key="unused", max_retries=0, timeout=60)
    started = time.monotonic()
    done = c.completions.create(model="tiny", prompt="hello", max_tokens=3, extra_body=EXACT)
    assert done.usage is not None
    return done.usage.completion_tokens, time.monotonic() - started


def active(srv: FleetServer) -> list[object]:
    return [r for r in srv.replicas("tiny") if r["state"] in ("starting", "ready")]


def test_llama_server_at_zero_is_served_after_a_cold_start_idles_and_wakes_again(
    fleet: tuple[FleetServer, AgentProc],
) -> None:
    srv, cpu = fleet
    assert active(srv) == []  # replicas = 0: nothing runs until asked
    assert cpu.engines() == {}
    tokens, _ = ask(srv)
    assert tokens == 3
    (engine,) = cpu.engines()  # a llama-server was started for it
    start = {"model": "tiny", "cold": "true"}
    assert srv.metric("llmgw_fleet_replica_start_seconds_count", **start) == 1
    assert srv.metric("llmgw_cold_start_requests_total", model="tiny", outcome="admitted") == 1
    # A warm request waits for nothing.
    assert ask(srv)[0] == 3
    assert srv.metric("llmgw_cold_start_requests_total", model="tiny", outcome="admitted") == 1

    # Idle for idle_timeout: drained, the engine stopped, the node's CPU free again.
    srv.wait(lambda: not active(srv) or None, "tiny back at zero", timeout=30, logs=[cpu.proc])
    srv.wait(lambda: cpu.engines() == {} or None, "the llama-server stopped", logs=[cpu.proc])
    tokens, _ = ask(srv)
    assert tokens == 3
    assert srv.metric("llmgw_fleet_replica_start_seconds_count", **start) == 2
    assert srv.metric("llmgw_cold_start_requests_total", model="tiny", outcome="admitted") == 2
    assert engine not in cpu.engines()  # a new engine, not the stopped one
