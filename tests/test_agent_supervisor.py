"""Engine supervision with real processes: the simulator launched through its adapter,
readiness, a crash at start, stop (SIGTERM, then SIGKILL to the whole group), drain,
shutdown, and orphans of a previous agent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from llmgw.agent import supervisor as supervisor_module
from llmgw.agent.adapters import LaunchSpec, SimAdapter
from llmgw.agent.records import sweep_orphans, write_record
from llmgw.agent.supervisor import Supervisor, shard_name
from llmgw.config import DeploymentProfile
from llmgw.domain.engine_metrics import parse_metrics
from llmgw.domain.fleet import NodeInfo, ShardState
from llmgw.testing.procs import reserve_port
from llmgw.transport.messages import ShardStatus, StartShard
from tests.waiting import wait_until

NODE = NodeInfo(node_id="n1", hostname="n1", address="127.0.0.1")
SIM = SimAdapter()


class Reports:
    """Every status the supervisor reports, with a way to wait for one."""

    def __init__(self) -> None:
        self.items: list[ShardStatus] = []
        self._changed = trio.Event()

    def __call__(self, status: ShardStatus) -> None:
        self.items.append(status)
        self._changed.set()
        self._changed = trio.Event()

    async def wait(self, predicate: Callable[[ShardStatus], bool]) -> ShardStatus:
        seen = 0
        while True:
            for status in self.items[seen:]:
                if predicate(status):
                    return status
            seen = len(self.items)
            await self._changed.wait()

    async def state(self, state: ShardState, replica: str = "m-r1") -> ShardStatus:
        return await self.wait(lambda s: s.state is state and s.replica_id == replica)

    def states(self, replica: str = "m-r1") -> list[ShardState]:
        return [s.state for s in self.items if s.replica_id == replica]


@asynccontextmanager
async def supervising(tmp_path: Path, **kw: Any) -> AsyncIterator[tuple[Supervisor, Reports]]:
    reports = Reports()
    kw.setdefault("health_interval", 0.05)
    kw.setdefault("drain_interval", 0.05)
    supervisor = Supervisor(tmp_path / "state", reports, **kw)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        yield supervisor, reports
        nursery.cancel_scope.cancel()


def sim_start(port: int, *, args: tuple[str, ...] = (), replica: str = "m-r1") -> StartShard:
    return StartShard(
        command_id="c1",
        replica_id=replica,
        rank=0,
        epoch=1,
        model="m",
        profile=DeploymentProfile(name="sim", engine="sim", weights="sim", args=args),
        gpu_indices=(0,),
        port=port,
    )


@pytest.fixture
def reserve() -> Iterator[Callable[[], int]]:
    """Reserves loopback ports until the test ends (llmgw.testing.procs.reserve_port): an
    engine binds its port by number, and nothing else can take that port first."""
    with ExitStack() as stack:
        yield lambda: stack.enter_context(reserve_port())


async def in_flight(url: str) -> float:
    """Requests the engine at `url` holds (running or waiting), as its /metrics says."""
    async with httpx.AsyncClient(timeout=5) as client:
        sample = parse_metrics((await client.get(f"{url}/metrics")).content)
    return (sample.running or 0) + (sample.waiting or 0)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie nobody reaped yet counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


async def test_sim_launches_becomes_ready_serves_and_stops(
    tmp_path: Path, reserve: Callable[[], int]
) -> None:
    port = reserve()
    with trio.fail_after(30):
        async with supervising(tmp_path) as (supervisor, reports):
            cmd = sim_start(port)
            supervisor.launch(cmd, SIM.command(cmd, NODE))
            ready = await reports.state(ShardState.READY)
            assert ready.endpoint_url == f"http://127.0.0.1:{port}"
            assert ready.pid is not None
            assert (ready.profile, ready.port, ready.gpu_indices) == ("sim", port, (0,))
            pid = ready.pid
            async with httpx.AsyncClient(base_url=ready.endpoint_url, timeout=10) as client:
                r = await client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["text"]

            assert supervisor.stop(("m-r1", 0), 1, grace=5.0) is None
            stopped = await reports.state(ShardState.STOPPED)
            assert stopped.exit_code == 0  # the simulator exits cleanly on SIGTERM
            assert stopped.message == "stopped"
            assert gone(pid)
            assert reports.states() == [
                ShardState.STARTING,
                ShardState.STARTING,  # again, with the pid
                ShardState.READY,
                ShardState.STOPPED,
            ]
    log = (tmp_path / "state" / "logs" / "m-r1-r0-e1.log").read_text()
    assert "llmgw-agent: " in log and "-m llmgw_cli.sim" in log
    assert "llmgw-sim" in log  # the engine's own banner
    assert not list((tmp_path / "state" / "run").iterdir())  # pid record removed


async def test_crash_at_start_is_failed_with_exit_code_and_the_engines_error(
    tmp_path: Path,
    reserve: Callable[[], int],
) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path) as (supervisor, reports):
            cmd = sim_start(reserve(), args=("--no-such-flag",))
            supervisor.launch(cmd, SIM.command(cmd, NODE))
            failed = await reports.state(ShardState.FAILED)
    assert failed.exit_code == 2
    assert any("unrecognized arguments: --no-such-flag" in line for line in failed.output_tail)
    assert failed.message.startswith("exited with code 2 before it was ready: llmgw-sim: error:")
    assert ShardState.READY not in reports.states()


async def test_exit_after_ready_is_failed(tmp_path: Path, reserve: Callable[[], int]) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path) as (supervisor, reports):
            cmd = sim_start(reserve(), args=("--fault-exit-after", "1"))
            supervisor.launch(cmd, SIM.command(cmd, NODE))
            ready = await reports.state(ShardState.READY)
            async with httpx.AsyncClient(base_url=str(ready.endpoint_url), timeout=10) as client:
                with suppress(httpx.HTTPError):  # it may die before answering
                    await client.post("/v1/completions", json={"model": "m", "prompt": "x"})
            failed = await reports.state(ShardState.FAILED)
    assert failed.exit_code == 1
    assert "unexpectedly" in failed.message


STUBBORN = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(["sleep", "300"])
    print(f"worker pid {child.pid}", flush=True)
    time.sleep(300)  # the engine's work: it outlives every grace period given here
    """
)


def stubborn_spec() -> LaunchSpec:
    return LaunchSpec(
        argv=(sys.executable, "-c", STUBBORN), env={}, health_url=None, endpoint_url=None
    )


async def stubborn_worker(supervisor: Supervisor, replica: str = "m-r1") -> int:
    """The pid of the stubborn engine's child, once it printed it (by then SIGTERM is
    ignored)."""
    shard = supervisor.shards[(replica, 0)]
    line = await wait_until(
        lambda: next((line for line in shard.tail if "worker pid" in line), None),
        "the stubborn engine's worker pid in its output",
    )
    return int(line.split()[-1])


async def test_stop_kills_the_whole_group_after_the_grace(
    tmp_path: Path, reserve: Callable[[], int]
) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path) as (supervisor, reports):
            supervisor.launch(sim_start(reserve()), stubborn_spec())
            ready = await reports.state(ShardState.READY)  # no health URL: ready when launched
            worker = await stubborn_worker(supervisor)
            assert not gone(worker)
            started = trio.current_time()
            assert supervisor.stop(("m-r1", 0), 1, grace=0.5) is None
            stopped = await reports.state(ShardState.STOPPED)
            assert 0.4 < trio.current_time() - started < 5
    assert stopped.exit_code == -signal.SIGKILL
    assert "killed (did not exit within its grace period after SIGTERM)" in stopped.message
    assert ready.pid is not None and gone(ready.pid)
    # The engine's own child went with its process group (SIGKILL lands asynchronously).
    await wait_until(lambda: gone(worker), f"the engine's child {worker} gone", timeout=5)


async def test_second_stop_with_a_shorter_grace_kills_sooner(
    tmp_path: Path, reserve: Callable[[], int]
) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path) as (supervisor, reports):
            supervisor.launch(sim_start(reserve()), stubborn_spec())
            await reports.state(ShardState.READY)
            await stubborn_worker(supervisor)
            started = trio.current_time()
            supervisor.stop(("m-r1", 0), 1, grace=60)
            shard = supervisor.shards[("m-r1", 0)]
            # The first stop has sent SIGTERM and waits out its grace...
            await wait_until(lambda: shard.kill_scope is not None, "the 60 s grace running")
            # ...when the second one shortens it.
            supervisor.stop(("m-r1", 0), 1, grace=0.1)
            await reports.state(ShardState.STOPPED)
            assert trio.current_time() - started < 5


async def test_stop_of_wrong_epoch_or_unknown_shard_is_refused(
    tmp_path: Path, reserve: Callable[[], int]
) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path) as (supervisor, reports):
            supervisor.launch(sim_start(reserve()), stubborn_spec())
            await reports.state(ShardState.READY)
            assert supervisor.stop(("m-r1", 0), 2, grace=1) == "this node runs epoch 1, not 2"
            assert supervisor.stop(("other", 0), 1, grace=1) == "not running on this node"
            assert supervisor.shards[("m-r1", 0)].live


async def test_drain_waits_for_in_flight_requests_then_stops(
    tmp_path: Path, reserve: Callable[[], int]
) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path) as (supervisor, reports):
            # Every request is held 1.5 s before it may be scheduled.
            cmd = sim_start(reserve(), args=("--fault-first-token-delay", "1.5"))
            supervisor.launch(cmd, SIM.command(cmd, NODE))
            ready = await reports.state(ShardState.READY)
            url = str(ready.endpoint_url)
            answers: list[int] = []

            async def request() -> None:
                async with httpx.AsyncClient(base_url=str(ready.endpoint_url), timeout=20) as c:
                    r = await c.post("/v1/completions", json={"model": "m", "prompt": "x"})
                    answers.append(r.status_code)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(request)
                # In flight (waiting) at the engine when the drain begins.
                await wait_until(lambda: in_flight(url), "the request in flight at the engine")
                started = trio.current_time()
                assert supervisor.drain(("m-r1", 0), 1, deadline=20) is None
                draining = await reports.state(ShardState.DRAINING)
                assert draining.endpoint_url == ready.endpoint_url
                stopped = await reports.state(ShardState.STOPPED)
            assert answers == [200]  # the request finished before the engine stopped
            assert stopped.message == "drained"
            assert trio.current_time() - started > 0.8


async def test_drain_deadline(tmp_path: Path, reserve: Callable[[], int]) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path) as (supervisor, reports):
            cmd = sim_start(reserve(), args=("--fault-first-token-delay", "30"))
            supervisor.launch(cmd, SIM.command(cmd, NODE))
            ready = await reports.state(ShardState.READY)

            async def hang() -> None:
                async with httpx.AsyncClient(base_url=str(ready.endpoint_url), timeout=20) as c:
                    with suppress(httpx.HTTPError):
                        await c.post("/v1/completions", json={"model": "m", "prompt": "x"})

            async with trio.open_nursery() as nursery:
                nursery.start_soon(hang)
                await wait_until(
                    lambda: in_flight(str(ready.endpoint_url)), "the request in flight"
                )
                supervisor.drain(("m-r1", 0), 1, deadline=0.5)
                stopped = await reports.state(ShardState.STOPPED)
                nursery.cancel_scope.cancel()
    assert stopped.message == "drain deadline (0.5s) passed with requests in flight"


async def test_stop_during_drain_cuts_it_short(tmp_path: Path, reserve: Callable[[], int]) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path) as (supervisor, reports):
            supervisor.launch(sim_start(reserve()), stubborn_spec())  # no metrics URL
            await reports.state(ShardState.READY)
            await stubborn_worker(supervisor)
            supervisor.drain(("m-r1", 0), 1, deadline=60)
            await reports.state(ShardState.DRAINING)
            supervisor.stop(("m-r1", 0), 1, grace=0.2)
            stopped = await reports.state(ShardState.STOPPED)
    assert stopped.exit_code == -signal.SIGKILL


async def test_cancelling_the_supervisor_stops_every_engine(
    tmp_path: Path, reserve: Callable[[], int]
) -> None:
    pids: list[int] = []
    with trio.fail_after(30):
        async with supervising(tmp_path, shutdown_grace=0.5) as (supervisor, reports):
            cmd = sim_start(reserve())
            supervisor.launch(cmd, SIM.command(cmd, NODE))
            supervisor.launch(sim_start(reserve(), replica="m-r2"), stubborn_spec())
            pids.append((await reports.state(ShardState.READY)).pid or 0)
            pids.append((await reports.state(ShardState.READY, "m-r2")).pid or 0)
    assert all(pids)
    assert all(gone(pid) for pid in pids)
    assert reports.states()[-1] is ShardState.STOPPED
    assert reports.states("m-r2")[-1] is ShardState.STOPPED


async def test_a_newer_epoch_waits_for_the_older_to_stop(
    tmp_path: Path, reserve: Callable[[], int]
) -> None:
    port = reserve()
    with trio.fail_after(30):
        async with supervising(tmp_path) as (supervisor, reports):
            old = sim_start(port)
            supervisor.launch(old, SIM.command(old, NODE))
            first = await reports.state(ShardState.READY)
            new = StartShard(**{**_fields(old), "epoch": 2, "command_id": "c2"})
            supervisor.launch(new, SIM.command(new, NODE))  # same port: must wait
            ready = await reports.wait(lambda s: s.state is ShardState.READY and s.epoch == 2)
            assert ready.pid != first.pid
            assert any(s.state is ShardState.STOPPED and s.epoch == 1 for s in reports.items)


def _fields(cmd: StartShard) -> dict[str, Any]:
    return {a.name: getattr(cmd, a.name) for a in StartShard.__attrs_attrs__}


async def test_launch_failure_of_a_missing_executable(
    tmp_path: Path, reserve: Callable[[], int]
) -> None:
    spec = LaunchSpec(argv=("/nonexistent/engine",), env={}, health_url=None, endpoint_url=None)
    with trio.fail_after(10):
        async with supervising(tmp_path) as (supervisor, reports):
            supervisor.launch(sim_start(reserve()), spec)
            failed = await reports.state(ShardState.FAILED)
    assert failed.message.startswith("cannot start /nonexistent/engine: No such file")
    assert failed.pid is None


def _spawn(
    argv: list[str], env: dict[str, str] | None = None, output: int | None = None
) -> subprocess.Popen[bytes]:
    """A process in a session of its own, as the agent starts engines."""
    return subprocess.Popen(
        argv,
        env={**os.environ, **(env or {})},
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
        start_new_session=True,
    )


async def test_orphans_of_a_previous_agent_are_stopped(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    argv = ["sleep", "300"]
    orphan = _spawn(argv)
    other = _spawn(["sleep", "301"])
    try:
        (run / "a-r0-e1.json").write_text(json.dumps({"pid": orphan.pid, "argv": argv}))
        # A record whose pid now runs something else: not ours to kill.
        (run / "b-r0-e1.json").write_text(json.dumps({"pid": other.pid, "argv": argv}))
        (run / "c-r0-e1.json").write_text("not json")
        with trio.fail_after(10):
            killed = await sweep_orphans(run, grace=5)
        assert killed == [orphan.pid]
        assert orphan.wait(5) == -signal.SIGTERM
        assert other.poll() is None
        assert not list(run.iterdir())
    finally:
        for p in (orphan, other):
            p.kill()
            p.wait()


async def test_a_healthy_engine_a_killed_agent_left_is_adopted_ready(
    tmp_path: Path, reserve: Callable[[], int]
) -> None:
    """The engine serves on after its agent died; the next supervisor takes it over as
    it is (no launch), and it stops on command like any shard."""
    cmd = sim_start(reserve())
    spec = SIM.command(cmd, NODE)
    run = tmp_path / "state" / "run"
    run.mkdir(parents=True)
    engine = _spawn(list(spec.argv), env=spec.env, output=subprocess.PIPE)
    try:
        assert spec.health_url is not None
        health = spec.health_url

        async def healthy() -> bool:
            async with httpx.AsyncClient(timeout=2) as client:
                return (await client.get(health)).status_code == 200

        with trio.fail_after(30):
            await wait_until(healthy, "the engine healthy", timeout=25)
            write_record(run, shard_name(cmd), engine.pid, cmd, spec)
            assert engine.stdout is not None
            engine.stdout.close()  # the agent that read its output is gone
            async with supervising(tmp_path) as (supervisor, reports):
                ready = await reports.state(ShardState.READY)
                assert ready.pid == engine.pid and ready.epoch == 1
                assert ready.endpoint_url == spec.endpoint_url
                assert ready.message == "adopted from a previous agent"
                assert (ready.port, ready.gpu_indices, ready.profile) == (cmd.port, (0,), "sim")
                assert supervisor.launched == 0
                assert supervisor.stop(("m-r1", 0), 1, grace=10) is None
                stopped = await reports.state(ShardState.STOPPED)
        assert engine.wait(5) in (0, -signal.SIGTERM)  # stopped by SIGTERM, gracefully
        assert stopped.exit_code is None  # not our child: its status went elsewhere
        assert not list(run.iterdir())
        log = (tmp_path / "state" / "logs" / "m-r1-r0-e1.log").read_text()
        assert f"llmgw-agent: adopted pid {engine.pid}" in log
    finally:
        engine.kill()
        engine.wait()


async def test_a_left_engine_that_is_unhealthy_is_stopped_and_a_reused_pid_left_alone(
    tmp_path: Path, reserve: Callable[[], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervisor_module, "ADOPT_WITHIN", 0.3)
    run = tmp_path / "state" / "run"
    run.mkdir(parents=True)
    argv = ["sleep", "300"]
    hung, reused, headless = (_spawn(argv) for _ in range(3))
    try:
        cmd = sim_start(reserve())
        unhealthy = LaunchSpec(tuple(argv), {}, "http://127.0.0.1:1/health", None)
        write_record(run, "hung-r0-e1", hung.pid, attrs.evolve(cmd, replica_id="hung"), unhealthy)
        write_record(
            run, "reused-r0-e1", reused.pid, attrs.evolve(cmd, replica_id="reused"), unhealthy
        )
        record = run / "reused-r0-e1.json"  # as if the pid were another process's now
        record.write_text(json.dumps({**json.loads(record.read_text()), "start": 1}))
        rank1 = attrs.evolve(cmd, replica_id="two", rank=1, node_count=2)
        write_record(run, "two-r1-e1", headless.pid, rank1, LaunchSpec(tuple(argv), {}, None, None))
        with trio.fail_after(20):
            async with supervising(tmp_path) as (supervisor, reports):
                adopted = await reports.state(ShardState.READY, "two")
                assert adopted.pid == headless.pid and adopted.rank == 1
                assert set(supervisor.shards) == {("two", 1)}
                assert hung.wait(10) == -signal.SIGTERM
                assert reused.poll() is None
        # Leaving stops what it adopted, as every engine it runs.
        assert headless.wait(10) == -signal.SIGTERM
        assert not list(run.iterdir())
    finally:
        for p in (hung, reused, headless):
            p.kill()
            p.wait()


@pytest.mark.parametrize("lines", [3, 500])
async def test_tail_is_bounded_and_log_keeps_everything(
    tmp_path: Path, lines: int, reserve: Callable[[], int]
) -> None:
    script = f"for i in range({lines}): print('\\x1b[32mline', i, '\\x1b[0m')\nraise SystemExit(3)"
    spec = LaunchSpec(
        argv=(sys.executable, "-c", script),
        env={},
        health_url="http://127.0.0.1:1/health",
        endpoint_url=None,
    )
    with trio.fail_after(10):
        async with supervising(tmp_path, tail_lines=200) as (supervisor, reports):
            supervisor.launch(sim_start(reserve()), spec)
            failed = await reports.state(ShardState.FAILED)
    assert failed.exit_code == 3
    assert len(failed.output_tail) == min(lines, 200)
    assert failed.output_tail[-1] == f"line {lines - 1} "  # colours stripped
    log = (tmp_path / "state" / "logs" / "m-r1-r0-e1.log").read_text()
    assert log.count("\x1b[32mline") == lines  # verbatim
