"""`import llmgw`: a Router composed and served from Python, in one trio process."""

from __future__ import annotations

import httpx
import trio

import llmgw
from llmgw import server

from .procs import sim


async def test_router_serves_from_a_library_caller() -> None:
    with sim(model="m") as (_, base):
        # Bound here, on port 0: the caller knows the port before the server starts.
        (client_socket,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
        admin_sockets = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = client_socket.socket.getsockname()[1]
        config = llmgw.load_config(
            data={
                "listen": "127.0.0.1:0",
                "admin_listen": "127.0.0.1:0",
                "endpoints": [{"id": "s0", "url": base, "models": ["m"]}],
            },
            environ={},
        )
        records: list[llmgw.UsageRecord] = []

        class Collect:
            def record(self, record: llmgw.UsageRecord) -> None:
                records.append(record)

        router = llmgw.Router(config, usage_sinks=[Collect()])
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: server.serve(
                    config,
                    router=router,
                    client_listeners=[client_socket],
                    admin_listeners=admin_sockets,
                    shutdown=stop,
                    handle_signals=False,
                    task_status=task_status,
                )
            )
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                r = await client.post(
                    "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 3}
                )
            assert r.status_code == 200
            stop.set()
        assert len(records) == 1
        assert records[0].model == "m" and records[0].endpoint == "s0"
        assert records[0].usage.completion_tokens == 3 and not records[0].usage.estimated
