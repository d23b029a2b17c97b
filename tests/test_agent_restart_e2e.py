"""An agent killed with SIGKILL and started again, through real processes (issue #32):
llmgw-server in control-plane mode, llmgw-agent, simulators as engines.

The engines an agent leaves behind keep serving while it is gone; the agent started
again with the same state directory adopts the healthy ones and reports them, and the
server, which never stopped wanting them, keeps them: the model serves throughout,
with no server restart, no engine restarted and none doubled. When the engine is gone
too, the server hears the node report nothing of it and places the replica again at
once (a shard the node no longer reports is lost), instead of routing to a dead port.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.procs import AgentProc, FleetServer, agent, alive, fleet_server, kill_engines, wait_for
from tests.test_fleet_e2e import commands, considered_again, control_config, logs, model

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")

#: The node-expiry bound (control.lost_after): long, so that nothing here is the
#: doing of a node lost (see the fixture); the model must serve again well within it.
LOST_AFTER = 60.0


class Load:
    """Chat completions through `srv`, one at a time, until stopped (bounded: 2,000
    requests or 120 s); answers counted, failures kept with their time."""

    def __init__(self, srv: FleetServer) -> None:
        self.srv = srv
        self.ok = 0
        self.failed: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        deadline = time.monotonic() + 120
        with httpx.Client(timeout=10) as client:
            for _ in range(2000):
                if self._stop.is_set() or time.monotonic() > deadline:
                    return
                try:
                    r = client.post(
                        f"{self.srv.base}/v1/chat/completions",
                        json={
                            "model": "m",
                            "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 2,
                        },
                    )
                    if r.status_code == 200:
                        self.ok += 1
                    else:
                        self.failed.append((time.monotonic(), f"{r.status_code} {r.text[:200]}"))
                except httpx.HTTPError as exc:
                    self.failed.append((time.monotonic(), f"{type(exc).__name__}: {exc}"))
                self._stop.wait(0.05)  # light load: about 20 requests a second at most


def chat(srv: FleetServer) -> bool:
    r = httpx.post(
        f"{srv.base}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=10,
    )
    return r.status_code == 200


def engine_processes(address: str) -> list[int]:
    """Simulator engines bound to `address` (one agent's, whoever started them), from
    the process table."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        if "llmgw_cli.sim" in words[1:3] and address in words and alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


@pytest.fixture
def node() -> Iterator[tuple[FleetServer, AgentProc, ExitStack]]:
    # A node is lost only after a long silence here, so the agent, started again on a
    # loaded machine, is always back before: what happens to the replica is then the
    # registration's doing, not the node's expiry.
    config = control_config([model("m", replicas=1)], unreachable="2s", lost=f"{LOST_AFTER:g}s")
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(config))
        a = stack.enter_context(agent(srv.agent_address, "n1", address="127.0.0.121"))
        srv.wait(lambda: srv.ready_replicas("m", 1), "m ready", logs=logs(a))
        yield srv, a, stack


def kill(a: AgentProc) -> None:
    """SIGKILL the agent alone (its engines are in process groups of their own)."""
    a.proc.kill(signal.SIGKILL)
    a.proc.popen.wait(10)


def registered_again(srv: FleetServer, since: float) -> bool:
    """Whether n1 is connected and ready and heartbeated after `since` (wall clock)."""
    n1 = srv.nodes()["n1"]
    return bool(n1["connected"] and n1["state"] == "ready" and n1["last_heartbeat"] > since)


def test_a_restarted_agent_adopts_its_engine_and_the_model_serves_throughout(
    node: tuple[FleetServer, AgentProc, ExitStack],
) -> None:
    srv, a, stack = node
    (before,) = srv.ready_replicas("m", 1)
    engines = a.engines()
    assert list(engines.values()) == engine_processes("127.0.0.121")
    issued = commands(srv)
    with Load(srv) as load:
        wait_for(lambda: load.ok >= 10, "requests flowing")
        kill(a)
        killed = time.time()
        again = stack.enter_context(
            agent(srv.agent_address, "n1", address="127.0.0.121", state_dir=a.state_dir)
        )
        srv.wait(lambda: registered_again(srv, killed), "n1 registered again", logs=[again.proc])
        # Whatever the server would do about what the new agent reported, it has done.
        considered_again(srv, ["n1"])
        served = load.ok
        wait_for(lambda: load.ok >= served + 20, "requests still flowing")
    assert load.failed == [], (load.failed[:3], again.proc.output()[-3000:])
    # The same replica and the same engine process: adopted, not restarted or doubled,
    # and the server issued no command about it.
    (after,) = srv.ready_replicas("m", 1)
    assert (after["id"], after["epoch"], after["url"]) == (
        before["id"],
        before["epoch"],
        before["url"],
    )
    assert commands(srv) == issued
    assert again.engines() == engines
    assert engine_processes("127.0.0.121") == sorted(engines.values())
    assert "adopting engine" in again.proc.output()
    assert chat(srv)


def test_a_restarted_agent_without_its_engine_has_the_replica_placed_again(
    node: tuple[FleetServer, AgentProc, ExitStack],
) -> None:
    """The agent and its engine both die (an OOM kill of the whole cgroup): the node
    comes back reporting nothing, and the server replaces the replica at once, long
    before the node could be lost."""
    srv, a, stack = node
    (before,) = srv.ready_replicas("m", 1)
    kill(a)
    killed = time.monotonic()
    assert kill_engines(a.state_dir)
    wait_for(lambda: engine_processes("127.0.0.121") == [], "the engine gone")
    again = stack.enter_context(
        agent(srv.agent_address, "n1", address="127.0.0.121", state_dir=a.state_dir)
    )
    # With no server restart, and within the node-expiry bound.
    (after,) = srv.wait(
        lambda: [r for r in srv.ready_replicas("m", 1) if r["id"] != before["id"]],
        "m placed again",
        timeout=LOST_AFTER - 15,
        logs=[again.proc],
    )
    wait_for(lambda: chat(srv), "m serves again", timeout=15, context=srv.proc.output)
    assert time.monotonic() - killed < LOST_AFTER
    assert after["epoch"] > before["epoch"]
    assert "no longer reports its rank 0" in srv.proc.output()
    assert "lost: silent for" not in srv.proc.output()  # the node never was
    assert before["id"] not in srv.endpoints()
    # One engine: the new one.
    assert len(engine_processes("127.0.0.121")) == 1
    assert list(again.engines().values()) == engine_processes("127.0.0.121")
