"""`llmgw-server --demo`: a self-contained fleet for a newcomer.

Until the control plane deploys replicas itself, the demo starts simulated
engines as child processes on loopback and puts the router in front of them.
"""

from __future__ import annotations

import functools
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio

DEMO_MODELS = (("demo-chat", ("chat",)), ("demo-small", ("small",)))
REPLICAS = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _wait_healthy(url: str, process: trio.Process) -> None:
    async with httpx.AsyncClient() as client:
        with trio.fail_after(30):
            while True:
                if process.returncode is not None:
                    raise RuntimeError(f"simulator exited with {process.returncode}")
                try:
                    if (await client.get(url, timeout=1.0)).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await trio.sleep(0.05)


@asynccontextmanager
async def demo_fleet() -> AsyncIterator[dict[str, Any]]:
    """Start the simulators; yields the config overlay (endpoints and models) for them."""
    endpoints = []
    async with trio.open_nursery() as nursery:
        processes = []
        for name, _ in DEMO_MODELS:
            for i in range(REPLICAS):
                port = _free_port()
                argv = [
                    sys.executable,
                    "-m",
                    "llmgw_cli.sim",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--model",
                    name,
                    "--seed",
                    str(i),
                ]
                process: trio.Process = await nursery.start(
                    functools.partial(trio.run_process, argv, check=False)
                )
                processes.append(process)
                url = f"http://127.0.0.1:{port}"
                await _wait_healthy(f"{url}/health", process)
                endpoints.append({"id": f"{name}-{i}", "url": url, "models": [name]})
        models = [{"name": name, "aliases": list(aliases)} for name, aliases in DEMO_MODELS]
        try:
            yield {"endpoints": endpoints, "models": models}
        finally:
            for process in processes:
                process.terminate()
