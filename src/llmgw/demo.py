"""`llmgw-server --demo`: the whole system on one machine, for a newcomer.

A built-in catalog of two small simulated models, the server in control-plane
mode, and an agent with pretended GPUs running in the same process. The agent
dials the server's gRPC agent port like any other, and the engines it starts are
real `llmgw-sim` processes, so within seconds the OpenAI API answers and the
admin API shows a fleet.

With ``--engine llamacpp`` the same two models are served by real ``llama-server``
processes (the binary scripts/llama_server.sh builds) of a tiny generated GGUF model
(:mod:`llmgw.testing.gguf`, random output), on an agent that is a CPU node: no
pretended GPUs.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from llmgw import server
from llmgw.agent.agent import Agent, NodeSettings
from llmgw.assembly import Timings, Workers, assemble, control_timings
from llmgw.config import DEFAULT_STORE_URL, Config, StoreConfig
from llmgw.transport.grpc import GrpcConnector, GrpcListener

DEMO_GPUS = "4x24GB:Demo-GPU"


def _sim(name: str) -> dict[str, Any]:
    return {"name": "sim", "engine": "sim", "weights": name}


#: Overlaid on the configuration (file, environment, flags) with --demo.
DEMO_OVERLAY: dict[str, Any] = {
    "models": [
        {"name": "demo-chat", "aliases": ["chat"], "replicas": 2, "profiles": [_sim("demo-chat")]},
        {
            "name": "demo-small",
            "aliases": ["small"],
            "replicas": 1,
            "fallbacks": ["demo-chat"],
            "profiles": [_sim("demo-small")],
        },
    ],
    "control": {"interval": "1s"},
    "router": {"scrape_interval": "500ms", "scrape_timeout": "400ms"},
}


def llamacpp_overlay(weights: Path) -> dict[str, Any]:
    """DEMO_OVERLAY with llama.cpp profiles serving the GGUF file `weights`."""
    profile = {
        "name": "cpu",
        "engine": "llamacpp",
        "weights": str(weights),
        "args": ["-np", "2", "-c", "2048", "-t", "1"],
    }
    models = [{**m, "replicas": 1, "profiles": [dict(profile)]} for m in DEMO_OVERLAY["models"]]
    return {**DEMO_OVERLAY, "models": models}


async def run_demo(
    config: Config,
    *,
    announce: Any = print,
    fake_gpus: str | None = DEMO_GPUS,
    on_listening: Callable[[server.Listening], None] | None = None,
    client_listeners: Sequence[trio.SocketListener] | None = None,
    admin_listeners: Sequence[trio.SocketListener] | None = None,
    workers: Workers | None = None,
) -> None:
    """Serve `config` (which includes a demo overlay) with one in-process demo agent
    (`fake_gpus` None: a CPU node); `on_listening`, `client_listeners` and
    `admin_listeners` as for :func:`llmgw.assembly.assemble`, `on_listening` called before
    the first `announce`. Unless the configuration names a store, the demo
    has a fresh one of its own (keys and usage work), gone when it stops: keys made in
    one demo run do not lock the README's requests out of the next."""
    with tempfile.TemporaryDirectory(prefix="llmgw-demo-") as state:
        if config.store.url == DEFAULT_STORE_URL:
            config = attrs.evolve(config, store=StoreConfig(url=f"sqlite:///{state}/llmgw.db"))
        await _run(
            config,
            announce,
            fake_gpus,
            Path(state),
            on_listening,
            (client_listeners, admin_listeners),
            workers,
        )


async def _run(
    config: Config,
    announce: Any,
    fake_gpus: str | None,
    state: Path,
    on_listening: Callable[[server.Listening], None] | None,
    sockets: tuple[Sequence[trio.SocketListener] | None, Sequence[trio.SocketListener] | None] = (
        None,
        None,
    ),
    workers: Workers | None = None,
) -> None:
    listener = GrpcListener(config.agent_listen, tls=config.agent_tls)
    agent_scope = trio.CancelScope()

    async def serve_then_stop_agent(task_status: trio.TaskStatus[Any]) -> None:
        # serve() returns on SIGINT/SIGTERM once streams have drained; then the agent
        # stops, and with it its engines.
        async with assemble(
            config,
            agents=listener,
            # Nothing survives from a previous run to adopt: place at once.
            timings=Timings(control_timings(config.control).heartbeat, settle=0.2),
            client_listeners=sockets[0],
            admin_listeners=sockets[1],
            workers=workers,
        ) as gateway:
            await server.serve(gateway, on_listening=on_listening, task_status=task_status)
        agent_scope.cancel()

    async with trio.open_nursery() as nursery:
        await nursery.start(serve_then_stop_agent)
        agent = Agent(
            GrpcConnector(f"127.0.0.1:{listener.port}"),
            NodeSettings(node_id="demo-node", address="127.0.0.1", fake_gpus=fake_gpus),
            state_dir=state,
        )
        if fake_gpus is None:
            announce(
                "llmgw demo: a CPU node; models demo-chat and demo-small (llama.cpp, a "
                "tiny generated model: its output is random) start in a few seconds"
            )
        else:
            announce(
                "llmgw demo: a node with 4 pretended GPUs; models demo-chat (2 replicas) "
                "and demo-small start in a few seconds"
            )
        with agent_scope:
            await agent.run()
