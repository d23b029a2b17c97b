"""llmgw-agent as a program: usage errors, the management address, and a real agent
process over gRPC that runs a simulator and stops it when told to exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest
import trio

from llmgw.domain.fleet import ShardState
from llmgw.testing.procs import reserve_port
from llmgw.transport.messages import Register, StartShard
from llmgw_cli.agent import management_address
from tests.test_agent import ScriptedServer, alive, start_sim

BIN = Path(sys.executable).parent


def run_agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "llmgw-agent"), *args], capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "the following arguments are required: --server"),
        (("--server", "nohost"), "expected HOST:PORT"),
        (("--server", "h:1", "--label", "novalue"), "--label: expected KEY=VALUE"),
        (("--server", "h:1", "--fake-gpus", "lots"), "fake GPU spec 'lots'"),
        (("--server", "h:1", "--tls-cert", "c.pem"), "--tls-cert and --tls-key go together"),
        (
            ("--server", "h:1", "--tls-cert", "/nonexistent/c", "--tls-key", "/nonexistent/k"),
            "--tls-cert: no such file",
        ),
        (("--server", "h:1", "--heartbeat", "soon"), "argument --heartbeat: expected a duration"),
        (("--server", "h:1", "--heartbeat", "10ms"), "--heartbeat: must be at least 0.05s"),
        (("--server", "h:1", "--max-backoff", "1ms"), "--max-backoff: must be at least 0.1s"),
        (("--server", "h:1", "--address", "not-an-ip"), "does not appear to be an IPv4 or IPv6"),
        (("--server", "h:1", "--bogus"), "unrecognized arguments: --bogus"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    done = run_agent(*args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("llmgw-agent: error: ")
    assert message in lines[0]


def test_management_address() -> None:
    assert management_address("127.0.0.1", 7443) == "127.0.0.1"
    assert management_address("localhost", 7443) == "127.0.0.1"
    assert management_address("", 7443) == "127.0.0.1"
    assert management_address("::1", 7443) == "::1"
    try:
        routed = management_address("192.0.2.1", 7443)  # TEST-NET-1: only routed, never sent
    except RuntimeError:
        pytest.skip("no route off this host")
    assert routed.count(".") == 3 and not routed.startswith("127.")


def _open(path: Path) -> IO[bytes]:
    return path.open("wb")


async def test_agent_process_over_grpc_runs_an_engine_and_stops_it_on_sigterm(
    tmp_path: Path,
) -> None:
    grpc = pytest.importorskip("llmgw.transport.grpc")
    server = ScriptedServer(heartbeat=0.2)
    listener = grpc.GrpcListener("127.0.0.1:0")
    # The engine's port, held for the test (the agent's engine binds it by number).
    with reserve_port() as port, trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(listener.serve, server.handle)
            agent = await trio.lowlevel.open_process(
                [
                    str(BIN / "llmgw-agent"),
                    "--server",
                    f"127.0.0.1:{listener.port}",
                    "--node-id",
                    "cli-node",
                    "--fake-gpus",
                    "1x24GB",
                    "--label",
                    "rack=r7",
                    "--fabric",
                    "nv-1",
                    "--state-dir",
                    str(tmp_path / "state"),
                ],
                stderr=_open(tmp_path / "agent.log"),
                start_new_session=True,
            )
            try:
                register = await server.wait_for(Register)
                assert register.node.node_id == "cli-node"
                assert register.node.address == "127.0.0.1"  # loopback server
                assert register.node.labels == {"rack": "r7"}
                assert register.node.fabrics == ("nv-1",)
                assert len(register.node.gpus) == 1
                command: StartShard = start_sim(port)
                await server.send(command)
                ready = await server.status(ShardState.READY)
                assert ready.endpoint_url == f"http://127.0.0.1:{port}"
                engine = ready.pid
                assert engine is not None and alive(engine)
                agent.send_signal(signal.SIGTERM)
                assert await agent.wait() == 0
                assert not alive(engine)
            finally:
                if agent.returncode is None:
                    os.killpg(agent.pid, signal.SIGKILL)
                    await agent.wait()
            nursery.cancel_scope.cancel()
    stderr = (tmp_path / "agent.log").read_text()
    assert "plaintext" in stderr  # no TLS: said loudly
    assert "SIGTERM: stopping engines, then exiting" in stderr
