"""Wake on request and sleep with a real engine (issue #22): an autoscaled llama.cpp
model at zero replicas on a CPU node (`llmgw-agent` without GPUs, `llama-server` of the
tiny generated GGUF model), asked through the official openai client: served after its
cold start, idle back to zero, and woken again; and a profile with `sleep_after`, whose
llama-server sleeps on its own when idle and wakes for the next request.

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

from llmgw.testing.gguf import write_tiny_gguf
from tests.procs import AgentProc, FleetServer, agent, engine_port_range, fleet_server
from tests.test_llamacpp_fleet import EXACT, require_llama_server

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")


def config(weights: Path, *, sleep: bool = False) -> str:
    low, high = engine_port_range()
    scaled = (
        "replicas = 1\n"
        if sleep
        else (
            "replicas = 0\n\n[models.autoscale]\n"
            'min_replicas = 0\nmax_replicas = 1\nidle_timeout = "2s"\n'
        )
    )
    return f"""
[router]
scrape_interval = "300ms"
scrape_timeout = "300ms"

[control]
interval = "200ms"
port_range = [{low}, {high}]

[[models]]
name = "tiny"
{scaled}
[[models.profiles]]
name = "cpu"
engine = "llamacpp"
weights = {json.dumps(str(weights))}
args = ["-np", "1", "-c", "1024", "-t", "1"]
{'sleep_after = "1s"' if sleep else ""}
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


def test_a_sleeping_llama_server_wakes_for_the_next_request(
    tmp_path: Path,
) -> None:
    require_llama_server()
    weights = write_tiny_gguf(tmp_path / "tiny.gguf")
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(config(weights, sleep=True)))
        cpu = stack.enter_context(agent(srv.agent_address, "c2", address="127.0.0.84", gpus=None))
        srv.wait(lambda: srv.ready_replicas("tiny", 1), "tiny ready", timeout=60, logs=[cpu.proc])
        assert ask(srv)[0] == 3
        (log,) = cpu.engine_logs()
        # Idle for a second: llama-server unloads the model on its own; the router's
        # health checks and scrapes do not keep it awake.
        srv.wait(
            lambda: "entering sleeping state" in log.read_text(errors="replace") or None,
            "llama-server asleep",
            logs=[cpu.proc],
        )
        engines = cpu.engines()
        assert ask(srv)[0] == 3  # woken by the request, and served
        assert "exiting sleeping state" in log.read_text(errors="replace")
        assert cpu.engines() == engines  # the same engine: slept, not restarted
