"""Several instances on one PostgreSQL, through real processes (issue #20): three
llmgw-server processes on one database, two llmgw-agent processes given all three
servers, simulators, and clients through the instances that do not lead.

One instance leads the control plane; killed with SIGKILL, another leads within 15 s,
the agents follow it, no engine restarts, and every request through the surviving
instances succeeds throughout; the old leader comes back as a follower. A leader
paused with SIGSTOP that wakes after losing its lease has its agents gone and sends
nothing they accept.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from tests.pg_cluster import TempCluster
from tests.procs import AgentProc, FleetPorts, FleetServer, agent, fleet_server, wait_for
from tests.test_fleet_e2e import control_config

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")

MODEL = """
[[models]]
name = "m"
replicas = 2

[[models.profiles]]
name = "sim"
engine = "sim"
weights = "sim"
"""


def config(url: str) -> str:
    extra = f'[store]\nurl = "{url}"\n'
    # A short lease (the takeover bound below is the issue's, 15 s), long enough that a
    # loaded machine (three servers, PostgreSQL, agents, engines on two cores) renews it.
    return control_config([MODEL], extra=extra).replace("[control]\n", '[control]\nlease = "6s"\n')


def leading(srv: FleetServer) -> bool:
    try:
        return srv.metric("llmgw_fleet_leading") == 1
    except (httpx.HTTPError, OSError):
        return False


class Load:
    """Requests through `servers` in turn, one at a time, until stopped (bounded:
    2,000 requests or 120 s); every answer recorded."""

    def __init__(self, servers: list[FleetServer], headers: dict[str, str] | None = None) -> None:
        self.servers = servers
        self.headers = headers or {}
        self.ok = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        deadline = time.monotonic() + 120
        i = 0
        while not self._stop.is_set() and time.monotonic() < deadline and i < 2000:
            srv = self.servers[i % len(self.servers)]
            i += 1
            try:
                r = httpx.post(
                    f"{srv.base}/v1/completions",
                    json={"model": "m", "prompt": "hi", "max_tokens": 2},
                    headers=self.headers,
                    timeout=10,
                )
                if r.status_code == 200:
                    self.ok += 1
                else:
                    self.failed.append(f"{srv.base}: {r.status_code} {r.text[:200]}")
            except httpx.HTTPError as exc:
                self.failed.append(f"{srv.base}: {type(exc).__name__}: {exc}")
            time.sleep(0.02)


@pytest.fixture
def ha(pg_cluster: TempCluster) -> Iterator[tuple[list[FleetServer], list[AgentProc], str]]:
    url = pg_cluster.new_database()
    with ExitStack() as stack:
        servers = [stack.enter_context(fleet_server(config(url))) for _ in range(3)]
        every = ",".join(s.agent_address for s in servers)
        agents = [
            stack.enter_context(agent(every, f"n{i}", address=f"127.0.0.{81 + i}", gpus="2x80GB"))
            for i in range(2)
        ]
        leader = wait_for(lambda: [s for s in servers if leading(s)], "a leader")[0]
        leader.wait(
            lambda: leader.ready_replicas("m", 2), "two replicas", logs=[a.proc for a in agents]
        )
        # Every instance routes to them (the followers from what the leader published).
        for s in servers:
            wait_for(lambda s=s: len(s.endpoints()) == 2, f"{s.base} routes to both replicas")
        yield servers, agents, url


def moved(srv: FleetServer, agents: list[AgentProc]) -> bool:
    """Whether every one of `agents` is registered, connected and ready with `srv`
    (not: every node `srv` knows so far, which holds once the first has moved)."""
    nodes = srv.nodes()
    return set(nodes) == {a.node_id for a in agents} and all(
        n["state"] == "ready" and n["connected"] for n in nodes.values()
    )


def engines(agents: list[AgentProc]) -> dict[str, int]:
    return {name: pid for a in agents for name, pid in a.engines().items()}


def test_a_killed_leader_is_replaced_and_nothing_is_lost(
    ha: tuple[list[FleetServer], list[AgentProc], str],
) -> None:
    servers, agents, url = ha
    leader = next(s for s in servers if leading(s))
    followers = [s for s in servers if s is not leader]
    before = engines(agents)
    assert len(before) == 2
    ports = FleetPorts.of(leader.proc.ready)
    with Load(followers) as load:
        wait_for(lambda: load.ok >= 20, "requests flowing")
        leader.proc.kill(signal.SIGKILL)
        killed = time.monotonic()
        new = wait_for(lambda: [s for s in followers if leading(s)], "a new leader", timeout=20)[0]
        took = time.monotonic() - killed
        assert took < 15, f"a new leader after {took:.1f}s"
        # The agents follow it, and it adopts what they run: no engine restarts.
        new.wait(lambda: moved(new, agents), "both agents moved")
        new.wait(lambda: new.ready_replicas("m", 2), "the replicas adopted")
        served = load.ok
        wait_for(lambda: load.ok >= served + 20, "requests still flowing")
    assert load.failed == []
    assert engines(agents) == before
    # The old leader comes back (same ports) as a follower, and serves.
    with fleet_server(config(url), ports=ports) as back:
        wait_for(lambda: len(back.endpoints()) == 2, "the returned instance routes")
        r = httpx.post(
            f"{back.base}/v1/completions",
            json={"model": "m", "prompt": "hi", "max_tokens": 2},
            timeout=10,
        )
        assert r.status_code == 200, r.text
        assert not leading(back) and leading(new)
    assert engines(agents) == before


def test_a_paused_leader_that_wakes_commands_nothing(
    ha: tuple[list[FleetServer], list[AgentProc], str],
) -> None:
    servers, agents, _ = ha
    leader = next(s for s in servers if leading(s))
    followers = [s for s in servers if s is not leader]
    before = engines(agents)
    commands = leader.metric("llmgw_fleet_commands_total")
    os.killpg(leader.proc.pid, signal.SIGSTOP)
    try:
        new = wait_for(lambda: [s for s in followers if leading(s)], "a new leader", timeout=20)[0]
        new.wait(lambda: moved(new, agents), "both agents moved")
        new.wait(lambda: new.ready_replicas("m", 2), "the replicas adopted")
    finally:
        os.killpg(leader.proc.pid, signal.SIGCONT)
    # Awake, it knows its lease is gone before it acts: it steps down, issues no
    # command, and no agent registers with it again.
    wait_for(lambda: not leading(leader), "the woken leader steps down")
    assert "no longer leading the control plane" in leader.proc.output()
    assert leader.metric("llmgw_fleet_commands_total") == commands
    # Its own account (its admin API's fleet routes are the leader's now): no node.
    assert leader.metric("llmgw_fleet_nodes_connected") == 0
    assert set(leader.nodes()) == {"n0", "n1"}  # passed on to the new leader
    assert engines(agents) == before
    assert leading(new)


def test_a_keys_rpm_holds_across_three_instances(
    ha: tuple[list[FleetServer], list[AgentProc], str],
) -> None:
    """rpm 600 through three instances: the window's admissions add up to 600, not
    600 each (counted in the store, in leases of 6)."""
    servers, _, _ = ha
    made = httpx.post(f"{servers[0].admin}/api/v1/keys", json={"name": "k", "rpm": 600}, timeout=5)
    assert made.status_code == 201, made.text
    headers = {"authorization": f"Bearer {made.json()['secret']}"}
    codes: dict[int, int] = {}
    started = time.monotonic()
    with httpx.Client(timeout=10) as client:
        for i in range(900):
            srv = servers[i % 3]
            r = client.post(
                f"{srv.base}/v1/completions",
                json={"model": "m", "prompt": "x", "max_tokens": 1},
                headers=headers,
            )
            codes[r.status_code] = codes.get(r.status_code, 0) + 1
    assert time.monotonic() - started < 60  # all in one window
    # At most one lease of 6 per instance left unspent: 582..600.
    assert 570 <= codes.get(200, 0) <= 600, codes
    assert codes.get(200, 0) + codes.get(429, 0) == 900, codes


def test_a_postgresql_restart_under_load_loses_no_request() -> None:
    cluster = TempCluster().start()
    try:
        url = cluster.new_database()
        with ExitStack() as stack:
            servers = [stack.enter_context(fleet_server(config(url))) for _ in range(2)]
            every = ",".join(s.agent_address for s in servers)
            node = stack.enter_context(agent(every, "n0", address="127.0.0.91", gpus="2x80GB"))
            leader = wait_for(lambda: [s for s in servers if leading(s)], "a leader")[0]
            leader.wait(lambda: leader.ready_replicas("m", 2), "two replicas", logs=[node.proc])
            for s in servers:
                wait_for(lambda s=s: len(s.endpoints()) == 2, f"{s.base} routes")
            made = httpx.post(f"{leader.admin}/api/v1/keys", json={"name": "k"}, timeout=5)
            assert made.status_code == 201, made.text
            headers = {"authorization": f"Bearer {made.json()['secret']}"}
            with Load(servers, headers) as load:
                wait_for(lambda: load.ok >= 20, "requests flowing")
                # Down until an instance has felt it (they ask the store twice a second).
                cluster.restart(
                    lambda: wait_for(
                        lambda: any("the store failed" in s.proc.output() for s in servers),
                        "an instance finding the store gone",
                    )
                )
                served = load.ok
                wait_for(lambda: load.ok >= served + 40, "requests after the restart")
            assert load.failed == []
            # The leader kept its lease through it (shorter than the lease).
            assert leading(leader)

            # Every request's usage reached the store once it was back.
            def stored() -> int:
                r = httpx.get(f"{leader.admin}/api/v1/usage", timeout=5)
                return sum(row["requests"] for row in r.json()["usage"])

            wait_for(lambda: stored() == load.ok, "every request's usage in the store")
    finally:
        cluster.stop()


def test_any_instance_answers_for_the_fleet_and_takes_runtime_models(
    ha: tuple[list[FleetServer], list[AgentProc], str],
) -> None:
    servers, _, _ = ha
    leader = next(s for s in servers if leading(s))
    follower = next(s for s in servers if s is not leader)
    # The fleet, as the leader knows it, from any instance: the API and the dashboard.
    assert set(follower.nodes()) == set(leader.nodes()) == {"n0", "n1"}
    page = httpx.get(f"{follower.admin}/fleet", timeout=10)
    assert page.status_code == 200 and "n0" in page.text and "n1" in page.text
    assert {r["id"] for r in follower.replicas("m")} == {r["id"] for r in leader.replicas("m")}
    # A model added through a follower is the leader's to place, and every
    # instance routes to it.
    body = {
        "name": "added",
        "replicas": 1,
        "profiles": [{"name": "sim", "engine": "sim", "weights": "sim"}],
    }
    r = httpx.post(f"{follower.admin}/api/v1/models", json=body, timeout=10)
    assert r.status_code == 201, r.text
    leader.wait(lambda: leader.ready_replicas("added", 1), "the added model placed")
    for s in servers:
        wait_for(
            lambda s=s: any("added" in e["models"] for e in s.endpoints().values()),
            f"{s.base} routes to it",
        )
        done = httpx.post(
            f"{s.base}/v1/completions",
            json={"model": "added", "prompt": "hi", "max_tokens": 1},
            timeout=10,
        )
        assert done.status_code == 200, done.text


def test_instances_with_workers_route_to_what_the_leader_published(
    pg_cluster: TempCluster,
) -> None:
    """Each instance with two workers (llmgw.workers): the followers' workers route too
    (the leader publishes through its workers' pool, the followers feed theirs)."""
    url = pg_cluster.new_database()
    with ExitStack() as stack:
        servers = [
            stack.enter_context(fleet_server(config(url), "--workers", "2")) for _ in range(2)
        ]
        every = ",".join(s.agent_address for s in servers)
        node = stack.enter_context(agent(every, "n0", address="127.0.0.95", gpus="2x80GB"))
        leader = wait_for(lambda: [s for s in servers if leading(s)], "a leader")[0]
        leader.wait(lambda: leader.ready_replicas("m", 2), "two replicas", logs=[node.proc])
        for s in servers:
            wait_for(lambda s=s: len(s.endpoints()) == 2, f"{s.base} routes to both replicas")
            for _ in range(6):  # new connections: the kernel picks the worker
                r = httpx.post(
                    f"{s.base}/v1/completions",
                    json={"model": "m", "prompt": "hi", "max_tokens": 1},
                    timeout=10,
                )
                assert r.status_code == 200, r.text
