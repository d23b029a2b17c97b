"""A refused start moves on, through real processes (issue #20).

Two llmgw-agent processes share one host address, as two agents on one machine do.
The agent running the model's replica is killed with SIGKILL; its engine lives on (as
engines should) and keeps its port. Once the node is lost the controller places the
replacement on the other agent, on that same port (the lowest free one it knows of);
the agent refuses it because another process holds the port, and the controller
places it again at once on a port that is free, with no backoff: the model is served
again within seconds of the loss.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import ExitStack

import pytest

from tests.procs import agent, fleet_server
from tests.test_fleet_e2e import complete, control_config

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")

MODEL = """
[[models]]
name = "m"
replicas = 1

[[models.profiles]]
name = "sim"
engine = "sim"
weights = "sim"
"""


def test_a_start_refused_for_a_port_in_use_is_placed_again_on_a_free_port() -> None:
    # A backoff of a minute: the model would stay unserved for it if the refusal
    # counted as the model's failure.
    config = control_config([MODEL], base_backoff="60s", max_backoff="60s")
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(config))
        agents = {
            node_id: stack.enter_context(
                agent(srv.agent_address, node_id, address="127.0.0.61", gpus="1x80GB")
            )
            for node_id in ("a", "b")
        }
        (first,) = srv.wait(lambda: srv.ready_replicas("m", 1), "m ready")
        port = first["nodes"][0]["port"]
        host = first["nodes"][0]["node_id"]
        other = "b" if host == "a" else "a"
        complete(srv, "m")

        agents[host].proc.kill(signal.SIGKILL)  # its engine keeps the port
        srv.wait(lambda: srv.nodes()[host]["state"] == "lost", f"{host} lost", timeout=30)
        lost_at = time.monotonic()
        (second,) = srv.wait(
            lambda: [r for r in srv.ready_replicas("m", 1) if r["id"] != first["id"]],
            "the replacement ready on the other agent",
            logs=[agents[other].proc],
        )
        served_after = time.monotonic() - lost_at
        assert second["nodes"][0]["node_id"] == other
        assert second["nodes"][0]["port"] != port
        assert served_after < 20  # not after the 60 s backoff
        complete(srv, "m")
        # The refusal was seen and counted, and did not back the model off.
        refused = srv.metric(
            "llmgw_fleet_replica_start_failures_total", model="m", reason="not_launched"
        )
        assert refused >= 1
        assert "in use by another process" in srv.proc.output()
