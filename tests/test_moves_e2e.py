"""A replica moved to make room, through real processes (issue #22): llmgw-server with a
SQLite store (runtime models), two llmgw-agent processes with pretended GPUs of
different kinds, simulators, and the openai client.

llama fits any GPU of 20 GB or more and was placed on the only L4 while it was alone;
an embedding model that runs only on L4 GPUs is added once an A100 node has joined.
The controller moves llama to the A100 (replacement first, then the old one drains)
and places the embedding model on the L4; llama serves throughout.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.procs import agent, fleet_server
from tests.test_fleet_e2e import client, control_config

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")

LLAMA = """
[[models]]
name = "llama"
replicas = 1

[[models.profiles]]
name = "any"
engine = "sim"
weights = "sim"
min_gpu_memory = "20GB"
"""
EMBED = {
    "name": "embed",
    "replicas": 1,
    "profiles": [{"name": "l4", "engine": "sim", "weights": "sim", "gpu_name": "L4"}],
}


def test_a_replica_in_the_way_moves_and_the_constrained_model_is_placed(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'llmgw.db'}"
    config = control_config([LLAMA], extra=f'[store]\nurl = "{store}"\n')
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(config))
        l4 = stack.enter_context(
            agent(srv.agent_address, "l4", address="127.0.0.51", gpus="1x24GB:NVIDIA L4")
        )
        (first,) = srv.wait(
            lambda: srv.ready_replicas("llama", 1), "llama on the L4", logs=[l4.proc]
        )
        assert first["nodes"][0]["node_id"] == "l4"
        a100 = stack.enter_context(
            agent(srv.agent_address, "a100", address="127.0.0.52", gpus="1x80GB:NVIDIA A100")
        )
        srv.wait(lambda: srv.nodes().get("a100", {}).get("state") == "ready", "a100 ready")
        r = httpx.post(f"{srv.admin}/api/v1/models", json=EMBED, timeout=5)
        assert r.status_code == 201, r.text

        def settled() -> bool:
            llama, embed = srv.ready_replicas("llama", 1), srv.ready_replicas("embed", 1)
            return bool(
                llama
                and embed
                and llama[0]["nodes"][0]["node_id"] == "a100"
                and embed[0]["nodes"][0]["node_id"] == "l4"
                and not [x for x in srv.replicas("llama") if x["id"] == first["id"]]
            )

        # llama keeps answering while it moves (bounded: 30 s, 3000 requests).
        deadline, served = time.monotonic() + 30, 0
        while not settled() and time.monotonic() < deadline and served < 3000:
            done = client(srv).completions.create(model="llama", prompt="hi", max_tokens=1)
            assert done.usage is not None and done.usage.completion_tokens == 1
            served += 1
        assert served > 0
        srv.wait(settled, "llama on the A100 and embed on the L4", logs=[l4.proc, a100.proc])
        assert srv.metric("llmgw_fleet_replica_moves_total") == 1
        assert srv.metric("llmgw_requests_total", model="llama", status="200") >= 1
        assert srv.metric("llmgw_requests_total", model="llama", status="503") == 0
