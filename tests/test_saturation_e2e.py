"""The default configuration in front of big engines: nothing holds them back.

Two simulators that run 256 sequences each (as a vLLM replica does by default)
behind a llmgw-server with no configuration but its endpoints. 64 concurrent streams
must all run on the engines at once, with none waiting in llmgw's admission queue:
a replica is full when its engine says so, and these never do.
"""

from __future__ import annotations

import httpx
import trio

from .procs import server, sim, sim_metric
from .test_admission_e2e import metric, until
from .waiting import wait_until

STREAMS = 64
LONG = 3000  # tokens: far longer than the test; the streams are cut when it ends
DEADLINE = 60.0


async def stream(client: httpx.AsyncClient) -> None:
    """One long streamed chat, read until it ends or the test cancels it."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": LONG,
        "stream": True,
    }
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for _ in resp.aiter_lines():
            pass


def test_64_streams_run_on_two_big_engines_with_no_admission_wait() -> None:
    with (
        sim("--max-num-seqs", "256", model="m") as (_, e0),
        sim("--max-num-seqs", "256", model="m") as (_, e1),
        server("--endpoint", f"s0={e0}=m", "--endpoint", f"s1={e1}=m") as srv,
    ):
        srv.wait_scraped()

        def running() -> float:
            return sum(sim_metric(e, "vllm:num_requests_running") or 0.0 for e in (e0, e1))

        async def main() -> None:
            limits = httpx.Limits(max_connections=STREAMS, max_keepalive_connections=STREAMS)
            with trio.fail_after(DEADLINE):
                async with (
                    httpx.AsyncClient(base_url=srv.base, timeout=30, limits=limits) as client,
                    httpx.AsyncClient(base_url=srv.admin, timeout=5) as admin,
                    trio.open_nursery() as nursery,
                ):
                    for _ in range(STREAMS):
                        nursery.start_soon(stream, client)
                    # Every stream admitted at once, none queued in the router...
                    await until(
                        admin,
                        "llmgw_admission_admitted_total",
                        lambda v: v == STREAMS,
                        within=20,
                        queued="false",
                    )
                    # ...and all 64 running on the engines together.
                    await wait_until(
                        lambda: trio.to_thread.run_sync(lambda: running() == STREAMS),
                        "64 sequences running on the engines",
                        20,
                        context=lambda: f"running: {running()}",
                    )
                    assert await metric(admin, "llmgw_admission_wait_seconds_count") in (None, 0)
                    queued = await metric(admin, "llmgw_admission_admitted_total", queued="true")
                    assert queued in (None, 0)
                    # Both engines carry them (the router spread them).
                    each = [sim_metric(e, "vllm:num_requests_running") or 0 for e in (e0, e1)]
                    assert min(each) >= STREAMS // 4, each
                    nursery.cancel_scope.cancel()

        trio.run(main)


def test_a_small_engine_nothing_describes_is_full_by_its_own_queue() -> None:
    """A 4-sequence engine that nothing describes: no capacity is guessed for it, and
    once it queues what the router sent (6 behind its 4, past target_waiting), its own
    account says it is full (admission then holds the rest in its own queue, in band
    order, rather than the engine's)."""
    with (
        sim("--max-num-seqs", "4", model="m") as (_, e0),
        server("--endpoint", f"s0={e0}=m") as srv,
    ):
        srv.wait_scraped()
        assert srv.endpoints()["s0"]["capacity"] is None  # nothing says it yet

        async def main() -> None:
            with trio.fail_after(DEADLINE):
                async with (
                    httpx.AsyncClient(base_url=srv.base, timeout=30) as client,
                    trio.open_nursery() as nursery,
                ):
                    for _ in range(10):
                        nursery.start_soon(stream, client)
                    view = await wait_until(
                        lambda: trio.to_thread.run_sync(
                            lambda: (e := srv.endpoints()["s0"])["waiting"] and e
                        ),
                        "the engine's queue, scraped",
                        20,
                        context=lambda: f"endpoint: {srv.endpoints()['s0']}",
                    )
                    assert view["waiting"] >= 4 and view["running"] == 4, view
                    assert (view["capacity"], view["capacity_source"]) == (None, None), view
                    assert view["saturation"] == 1.0, view
                    nursery.cancel_scope.cancel()

        trio.run(main)
