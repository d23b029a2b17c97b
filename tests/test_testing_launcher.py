"""The in-process launcher (llmgw.testing.launcher) under the real supervisor: the
simulator as its adapter's argv says, ready by its health check, on another port when
its own is taken, stopped by SIGTERM (exit 0) or SIGKILL (-9), argv it refuses and
other programs failed as the supervisor reports a failed process; and the harness's
agent, whose state directory goes when it stops."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import trio

from llmgw.agent.adapters import LaunchSpec, SimAdapter
from llmgw.agent.supervisor import Supervisor
from llmgw.domain.fleet import NodeInfo, ShardState
from llmgw.testing import run_agent
from llmgw.testing.launcher import InProcessLauncher
from llmgw.testing.procs import reserve_port
from llmgw.transport.stub import StubNetwork
from tests.test_agent_supervisor import Reports, in_flight, sim_start
from tests.waiting import wait_until

NODE = NodeInfo(node_id="n1", hostname="n1", address="127.0.0.1")
SIM = SimAdapter()


@asynccontextmanager
async def supervising(tmp_path: Path, **kw: Any) -> AsyncIterator[tuple[Supervisor, Reports]]:
    reports = Reports()
    launcher = InProcessLauncher()
    supervisor = Supervisor(
        tmp_path / "state",
        reports,
        health_interval=0.05,
        drain_interval=0.05,
        launcher=launcher,
        **kw,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(launcher.run)
        await nursery.start(supervisor.run)
        yield supervisor, reports
        nursery.cancel_scope.cancel()


async def test_the_sim_serves_on_its_port_in_process_and_stops_on_sigterm(tmp_path: Path) -> None:
    with reserve_port() as port, trio.fail_after(30):
        async with supervising(tmp_path) as (supervisor, reports):
            cmd = sim_start(port, args=("--max-num-seqs", "3"))
            supervisor.launch(cmd, SIM.command(cmd, NODE))
            ready = await reports.state(ShardState.READY)
            assert ready.endpoint_url == f"http://127.0.0.1:{port}"
            assert ready.capacity == 3 and ready.pid is None
            async with httpx.AsyncClient(base_url=ready.endpoint_url, timeout=10) as client:
                r = await client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
                assert r.status_code == 200, r.text
                # Its argv was read by llmgw-sim's parser: the flag took effect.
                r = await client.get("/metrics")
                assert "vllm:num_requests_running" in r.text

            assert supervisor.stop(("m-r1", 0), 1, grace=5.0) is None
            stopped = await reports.state(ShardState.STOPPED)
            assert (stopped.exit_code, stopped.message) == (0, "stopped")
            # No process: no pid record. Its output went to the log, as a process's does.
            assert list((tmp_path / "state" / "run").iterdir()) == []
            log = (tmp_path / "state" / "logs" / "m-r1-r0-e1.log").read_text()
            assert f"listening on 127.0.0.1:{port}, serving m" in log
            assert "max_num_seqs=3" in log


async def test_a_taken_port_gives_the_engine_another_and_its_urls_say_which(
    tmp_path: Path,
) -> None:
    (taken,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = taken.socket.getsockname()[1]
    with taken.socket, trio.fail_after(30):
        async with supervising(tmp_path) as (supervisor, reports):
            cmd = sim_start(port)
            supervisor.launch(cmd, SIM.command(cmd, NODE))
            ready = await reports.state(ShardState.READY)
            assert ready.port == port  # the command's port, as assigned
            assert ready.endpoint_url is not None
            assert ready.endpoint_url.startswith("http://127.0.0.1:")
            assert ready.endpoint_url != f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(base_url=ready.endpoint_url, timeout=10) as client:
                r = await client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
                assert r.status_code == 200, r.text
            # The drain reads the engine's /metrics where it really is.
            assert supervisor.drain(("m-r1", 0), 1, deadline=10.0) is None
            stopped = await reports.state(ShardState.STOPPED)
            assert (stopped.exit_code, stopped.message) == (0, "drained")


async def test_an_engine_that_does_not_exit_on_sigterm_is_killed(tmp_path: Path) -> None:
    with reserve_port() as port, trio.fail_after(30):
        async with supervising(tmp_path) as (supervisor, reports):
            # A request waits 30 s for its first token: the graceful shutdown waits on it.
            cmd = sim_start(port, args=("--fault-first-token-delay", "30"))
            supervisor.launch(cmd, SIM.command(cmd, NODE))
            ready = await reports.state(ShardState.READY)
            url = ready.endpoint_url
            assert url is not None

            async def hang() -> None:
                # Cut off when the engine is killed, as by a process's death.
                with suppress(httpx.HTTPError):
                    await client.post(f"{url}/v1/completions", json={"model": "m", "prompt": "x"})

            async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=30) as client:
                nursery.start_soon(hang)
                held: float = await wait_until(lambda: in_flight(url), "a request in flight")
                assert held == 1
                assert supervisor.stop(("m-r1", 0), 1, grace=0.2) is None
                stopped = await reports.state(ShardState.STOPPED)
                nursery.cancel_scope.cancel()
            assert stopped.exit_code == -9
            assert stopped.message is not None and "killed" in stopped.message


async def test_argv_the_simulator_refuses_fails_with_its_error(tmp_path: Path) -> None:
    with reserve_port() as port, trio.fail_after(30):
        async with supervising(tmp_path) as (supervisor, reports):
            cmd = sim_start(port, args=("--max-num-seqs", "0"))
            supervisor.launch(cmd, SIM.command(cmd, NODE))
            failed = await reports.state(ShardState.FAILED)
            assert failed.exit_code == 2
            assert failed.message is not None
            assert failed.message.startswith("exited with code 2 before it was ready: llmgw-sim:")
            assert "--max-num-seqs" in failed.message
            assert failed.output_tail and "--max-num-seqs" in failed.output_tail[-1]


async def test_only_the_simulator_runs_in_process(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path) as (supervisor, reports):
            cmd = sim_start(20000)
            spec = LaunchSpec(
                argv=("/usr/bin/vllm", "serve"), env={}, health_url=None, endpoint_url=None
            )
            supervisor.launch(cmd, spec)
            failed = await reports.state(ShardState.FAILED)
            assert failed.message == "cannot start /usr/bin/vllm: only llmgw-sim runs in-process"
            assert supervisor.launched == 0


async def test_the_harness_agent_removes_its_state_directory() -> None:
    network = StubNetwork()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            agent = await nursery.start(run_agent, network, "n1")
            state_dir = agent.supervisor.state_dir
            assert (state_dir / "run").is_dir()
            nursery.cancel_scope.cancel()
    assert not state_dir.exists()
