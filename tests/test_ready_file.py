"""Port 0 and `--ready-file`: llmgw-server and llmgw-sim listen on ports the kernel
picks and name them, atomically, in a JSON file once every listener is bound; the
ports named there serve. In-process callers of `llmgw.server.serve` learn the same
through `on_listening`, or bind the sockets themselves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

import llmgw
from llmgw import server
from llmgw_cli._common import write_ready_file

from .procs import BIN, agent, engine_port_range, running, sim, wait_for

MODEL = """
[control]
port_range = [{low}, {high}]

[[models]]
name = "m"
[[models.profiles]]
name = "sim"
engine = "sim"
weights = "sim"
"""


def port_of(address: str) -> int:
    port = int(address.rsplit(":", 1)[1])
    assert port > 0, address
    return port


def test_server_on_port_0_names_every_bound_listener_and_they_serve(tmp_path: Path) -> None:
    config = tmp_path / "llmgw.toml"
    low, high = engine_port_range()
    config.write_text(MODEL.format(low=low, high=high) + '[store]\nurl = ""\n')
    ready = tmp_path / "ready.json"
    argv = [
        "--config", str(config), "--ready-file", str(ready),
        "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--agent-listen", "127.0.0.1:0",
    ]  # fmt: skip
    with running("llmgw-server", *argv) as proc:
        found = proc.wait_ready_file(ready)
        assert sorted(found) == ["admin_listen", "agent_listen", "listen"]
        (listen,), (admin,), (agents,) = (
            found["listen"],
            found["admin_listen"],
            found["agent_listen"],
        )
        assert all(a.startswith("127.0.0.1:") for a in (listen, admin, agents)), found
        assert len({port_of(listen), port_of(admin), port_of(agents)}) == 3
        # The client API and the admin listener answer on the ports named...
        assert httpx.get(f"http://{listen}/v1/models", timeout=5).status_code == 200
        assert httpx.get(f"http://{admin}/healthz", timeout=5).status_code == 200
        # ...and an agent dialling the agent port registers.
        with agent(agents, "n1", address="127.0.0.91"):
            wait_for(
                lambda: httpx.get(f"http://{admin}/api/v1/nodes", timeout=5).json()["nodes"],
                "the agent registered",
                context=proc.output,
            )
        # The log says where it listens, with the ports picked.
        out = proc.output()
        assert f"client API listening on {listen}" in out
        assert f"admin (metrics, API, dashboard) listening on {admin}" in out
        assert f"control plane: listening for agents on {agents}" in out
        assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        assert proc.stop() == 0
    assert not ready.exists()  # removed on exit: it names ports no longer served


def test_router_mode_names_no_agent_listener(tmp_path: Path) -> None:
    with sim(model="m") as (_, engine):
        argv = ("--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
        with running("llmgw-server", *argv, "--endpoint", f"e={engine}=m", ready=True) as proc:
            assert sorted(proc.ready) == ["admin_listen", "listen"]
            r = httpx.post(
                f"{proc.url('listen')}/v1/completions",
                json={"model": "m", "prompt": "hi", "max_tokens": 2},
                timeout=10,
            )
            assert r.status_code == 200, r.text


def test_sim_on_port_0_names_its_port_and_serves(tmp_path: Path) -> None:
    ready = tmp_path / "sim.json"
    argv = ("--port", "0", "--model", "m", "--ready-file", str(ready))
    with running("llmgw-sim", *argv) as proc:
        found = proc.wait_ready_file(ready)
        (address,) = found["listen"]
        assert address.startswith("127.0.0.1:") and port_of(address)
        assert httpx.get(f"http://{address}/health", timeout=5).status_code == 200
        r = httpx.post(
            f"http://{address}/v1/completions",
            json={"model": "m", "prompt": "hi", "max_tokens": 2},
            timeout=10,
        )
        assert r.status_code == 200, r.text
        assert f"listening on {address}" in proc.output()
        proc.kill(signal.SIGTERM)
        assert proc.popen.wait(10) == 0
    assert not ready.exists()


@pytest.mark.parametrize("program", ["llmgw-server", "llmgw-sim"])
def test_a_ready_file_that_cannot_be_written_is_a_runtime_error(
    tmp_path: Path, program: str
) -> None:
    ready = tmp_path / "missing" / "ready.json"
    args = {
        "llmgw-server": ["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                         "--endpoint", "e=http://127.0.0.1:9=m"],
        "llmgw-sim": ["--port", "0"],
    }[program]  # fmt: skip
    done = subprocess.run(
        [str(BIN / program), *args, "--ready-file", str(ready)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "LLMGW_STORE__URL": ""},
    )
    assert done.returncode == 1, done
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{program}: error: ") and f"cannot write the ready file {ready}" in last


def test_write_ready_file_replaces_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "ready.json"
    path.write_text("stale")
    write_ready_file(path, {"listen": ["127.0.0.1:41234"], "admin_listen": ["[::1]:41235"]})
    assert json.loads(path.read_text()) == {
        "listen": ["127.0.0.1:41234"],
        "admin_listen": ["[::1]:41235"],
    }
    assert [p.name for p in tmp_path.iterdir()] == ["ready.json"]  # no temporary left


async def test_serve_reports_the_ports_it_bound_for_port_0() -> None:
    """A library caller gives port 0 and learns the ports from `on_listening` (before
    `task_status`), in the configuration's address syntax."""
    config = llmgw.load_config(
        data={
            "listen": "127.0.0.1:0",
            "admin_listen": "127.0.0.1:0",
            "endpoints": [{"id": "e", "url": "http://127.0.0.1:9", "models": ["m"]}],
            "store": {"url": ""},
        },
        environ={},
    )
    reported: list[server.Listening] = []
    stop = trio.Event()
    with trio.fail_after(20):
        async with llmgw.assemble(config) as gateway, trio.open_nursery() as nursery:
            await nursery.start(
                partial(
                    llmgw.serve,
                    gateway,
                    on_listening=reported.append,
                    shutdown=stop,
                    handle_signals=False,
                )
            )
            (listening,) = reported
            assert sorted(listening) == ["admin_listen", "listen"]
            async with httpx.AsyncClient(timeout=5) as client:
                (admin,) = listening["admin_listen"]
                assert port_of(admin)
                assert (await client.get(f"http://{admin}/healthz")).status_code == 200
                (listen,) = listening["listen"]
                assert (await client.get(f"http://{listen}/v1/models")).status_code == 200
            stop.set()
