"""Priority bands and tenant fairness through a real llmgw-server in front of a simulator.

One simulator with ``--max-num-seqs 4``, configured as an endpoint of ``capacity = 4``:
the pool's saturation is about "requests in flight / 4", so a handful of requests
saturates it. With the default ceilings a band gets in while fewer than this many
requests are in flight: bronze 2 (0.30), silver 3 (0.60), gold and platinum 4. A
request of 25 tokens takes about 0.3 s on the simulator.

Clients are trio tasks on one httpx.AsyncClient; every test runs under a deadline.
Timing assertions compare orders of events or use margins of seconds, not tight
bounds: the machine may be small and shared.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable, Iterator

import attrs
import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from .procs import Server, server, sim
from .waiting import wait_until

SIM_ARGS = ("--max-num-seqs", "4")
BASE_CONFIG = """
[router]
scrape_interval = "100ms"
scrape_timeout = "80ms"
[router.admission]
"""


def endpoint(url: str) -> str:
    """The simulator as a static endpoint that says how many sequences it runs."""
    return f'\n[[endpoints]]\nid = "s0"\nurl = "{url}"\nmodels = ["m"]\ncapacity = 4\n'


SHORT = 25  # tokens: about 0.3 s on the simulator
LONG = 3000  # tokens: far longer than any test; held streams are cut by the test
DEADLINE = 30.0  # seconds per test body: a hang fails instead of blocking CI


@attrs.define
class Result:
    band: str | None
    tenant: str | None
    sent: float
    status: int = 0
    first: float | None = None  # first content event (monotonic)
    done: float | None = None
    code: str | None = None  # OpenAI error code of a refusal
    retry_after: int | None = None

    @property
    def ttft(self) -> float:
        assert self.first is not None, self
        return self.first - self.sent


def run(
    srv: Server, main: Callable[[httpx.AsyncClient, httpx.AsyncClient], Awaitable[None]]
) -> None:
    """Run `main(client, admin)` under trio with a deadline."""

    async def wrapper() -> None:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        with trio.fail_after(DEADLINE):
            async with (
                httpx.AsyncClient(base_url=srv.base, timeout=30, limits=limits) as client,
                httpx.AsyncClient(base_url=srv.admin, timeout=5) as admin,
            ):
                await main(client, admin)

    trio.run(wrapper)


async def call(
    client: httpx.AsyncClient,
    band: str | None,
    tenant: str | None = None,
    max_tokens: int = SHORT,
    out: list[Result] | None = None,
    started: trio.Event | None = None,
) -> Result:
    """One streamed chat completion; `started` is set at its first content event."""
    headers = {}
    if band is not None:
        headers["x-llmgw-band"] = band
    if tenant is not None:
        headers["x-llmgw-tenant"] = tenant
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    r = Result(band, tenant, time.monotonic())
    if out is not None:
        out.append(r)
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp:
        r.status = resp.status_code
        if resp.status_code != 200:
            await resp.aread()
            r.code = resp.json()["error"]["code"]
            if "retry-after" in resp.headers:
                r.retry_after = int(resp.headers["retry-after"])
        else:
            async for line in resp.aiter_lines():
                if r.first is None and line.startswith("data: {") and '"content"' in line:
                    r.first = time.monotonic()
                    if started is not None:
                        started.set()
    r.done = time.monotonic()
    return r


async def metric(admin: httpx.AsyncClient, name: str, **labels: str) -> float | None:
    """The sum of a metric's samples whose labels include `labels`; None when absent."""
    text = (await admin.get("/metrics")).text
    found: float | None = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                found = (found or 0.0) + s.value
    return found


async def until(
    admin: httpx.AsyncClient,
    name: str,
    check: Callable[[float], bool],
    within: float = 10.0,
    **labels: str,
) -> float:
    """Wait until a metric (absent counts as 0) has a value for which `check` holds."""
    seen: list[float] = []

    async def holds() -> bool:
        seen.append(await metric(admin, name, **labels) or 0.0)
        return check(seen[-1])

    await wait_until(
        holds, f"{name}{labels} as expected", within, context=lambda: f"value: {seen[-1:]}"
    )
    return seen[-1]


async def hold(client: httpx.AsyncClient, nursery: trio.Nursery, n: int, band: str) -> None:
    """Start `n` long streams of `band` and return once each has its first token."""
    for _ in range(n):
        ev = trio.Event()
        nursery.start_soon(lambda e=ev: call(client, band, max_tokens=LONG, started=e))
        await ev.wait()


@pytest.fixture
def fleet(request: pytest.FixtureRequest) -> Iterator[Server]:
    """One simulator behind one router; an indirect parameter adds [router.admission] keys."""
    extra = getattr(request, "param", "")
    with (
        sim(*SIM_ARGS, model="m") as (_, engine),
        server(config=BASE_CONFIG + extra + endpoint(engine)) as srv,
    ):
        srv.wait_scraped()
        yield srv


@pytest.mark.parametrize("fleet", ['queue_ttl = "2s"'], indirect=True, ids=["ttl2s"])
def test_bronze_flood_leaves_platinum_fast(fleet: Server) -> None:
    """Bronze fills only its 30 % layer and queues or expires; platinum keeps its TTFT."""
    bronze: list[Result] = []
    idle: list[Result] = []
    loaded: list[Result] = []

    async def main(client: httpx.AsyncClient, admin: httpx.AsyncClient) -> None:
        for _ in range(5):
            idle.append(await call(client, "platinum", max_tokens=2))
        async with trio.open_nursery() as nursery:
            for i in range(16):
                nursery.start_soon(call, client, "bronze", f"etl{i % 2}", 50, bronze)
            await until(admin, "llmgw_admission_queue_depth", lambda v: v >= 10, band="bronze")
            for _ in range(5):
                loaded.append(await call(client, "platinum", max_tokens=2))
                # Bronze is still held back while platinum is measured.
                assert await metric(admin, "llmgw_admission_queue_depth", band="bronze")
                assert await metric(admin, "llmgw_admission_queue_tenants", band="bronze") == 2
            inflight = await metric(admin, "llmgw_admission_inflight_requests", band="bronze")
            assert inflight is not None and inflight <= 2

    run(fleet, main)
    assert all(r.status == 200 for r in idle + loaded)
    base = statistics.median(r.ttft for r in idle)
    ttfts = [r.ttft for r in loaded]
    # Unloaded TTFT is tens of ms. A bronze request holds a slot for ~0.6 s and the
    # bronze queue needs seconds: platinum must wait behind neither.
    assert statistics.median(ttfts) < base + 0.25, (base, ttfts)
    assert max(ttfts) < base + 1.0, (base, ttfts)
    # 16 bronze requests, two at a time, ~0.6 s each, 2 s TTL: some are served and
    # the rest expire with Retry-After.
    served = [r for r in bronze if r.status == 200]
    expired = [r for r in bronze if r.status == 429]
    assert len(served) + len(expired) == 16, bronze
    assert served and expired
    for r in expired:
        assert r.code == "expired" and r.retry_after is not None and 1 <= r.retry_after <= 2
        assert r.done is not None and r.done - r.sent >= 1.9
    rejected = fleet.metric("llmgw_admission_rejected_total", band="bronze", reason="expired")
    assert rejected == len(expired)
    assert fleet.metric("llmgw_admission_admitted_total", band="platinum", queued="false") == 10
    assert fleet.metric("llmgw_admission_admitted_total", band="bronze") == len(served)


def test_silver_waits_while_gold_flows(fleet: Server) -> None:
    """Strict priority: queued gold goes first; silver goes only once no gold waits and
    the pool is below silver's ceiling."""
    gold: list[Result] = []
    silver: list[Result] = []
    n_gold = 12
    fast_before = fleet.metric("llmgw_router_overhead_seconds_bucket", le="0.1")
    all_before = fleet.metric("llmgw_router_overhead_seconds_count")
    waited_before = fleet.metric("llmgw_admission_wait_seconds_sum", band="silver")

    async def main(client: httpx.AsyncClient, admin: httpx.AsyncClient) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(n_gold):
                nursery.start_soon(call, client, "gold", None, SHORT, gold)

            async def all_gold_in() -> bool:
                depth = await metric(admin, "llmgw_admission_queue_depth", band="gold") or 0
                admitted = await metric(admin, "llmgw_admission_admitted_total", band="gold")
                return depth >= 4 and depth + (admitted or 0) == n_gold

            # Every gold request has reached the router (admitted or queued) and a
            # queue has formed.
            await wait_until(all_gold_in, "every gold request admitted or queued, 4+ queued")
            for _ in range(3):
                nursery.start_soon(call, client, "silver", None, SHORT, silver)
            await until(admin, "llmgw_admission_queue_depth", lambda v: v == 3, band="silver")
            # Gold keeps flowing past the waiting silver requests.
            await until(admin, "llmgw_admission_queue_depth", lambda v: v == 0, band="gold")
            assert await metric(admin, "llmgw_admission_queue_depth", band="silver") == 3

    run(fleet, main)
    assert [r.status for r in gold + silver] == [200] * (n_gold + 3), gold + silver
    last_gold = max(r.sent + r.ttft for r in gold)
    first_silver = min(r.sent + r.ttft for r in silver)
    assert last_gold < first_silver, (last_gold, first_silver)
    assert fleet.metric("llmgw_admission_admitted_total", band="silver", queued="true") == 3
    assert fleet.metric("llmgw_admission_wait_seconds_count", band="silver") == 3
    # Silver queued for gold's turns (each ~0.3 s); llmgw's own time excludes that.
    waited = fleet.metric("llmgw_admission_wait_seconds_sum", band="silver") - waited_before
    assert waited >= 3 * 0.2, waited
    fast = fleet.metric("llmgw_router_overhead_seconds_bucket", le="0.1") - fast_before
    assert fast == fleet.metric("llmgw_router_overhead_seconds_count") - all_before == 15


def test_gold_flood_of_one_tenant_does_not_starve_another(fleet: Server) -> None:
    """Deficit round-robin: tenant B's few requests go within a turn or two of joining,
    while tenant A's flood is still queued (FIFO would put B behind all of it)."""
    a: list[Result] = []
    b: list[Result] = []
    n_a = 64  # a flood that lasts ~5 s: margin for a slow machine between B and its end

    async def main(client: httpx.AsyncClient, admin: httpx.AsyncClient) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(n_a):
                nursery.start_soon(call, client, "gold", "A", SHORT, a)
            await until(admin, "llmgw_admission_queue_depth", lambda v: v >= 50, band="gold")
            assert await metric(admin, "llmgw_admission_queue_tenants", band="gold") == 1
            async with trio.open_nursery() as tenant_b:
                for _ in range(3):
                    tenant_b.start_soon(call, client, "gold", "B", SHORT, b)
            # B is done; A's flood is not.
            assert (await metric(admin, "llmgw_admission_queue_depth", band="gold") or 0) >= 10

    run(fleet, main)
    assert [r.status for r in a + b] == [200] * (n_a + 3)
    b_done = max(r.done for r in b if r.done is not None)
    a_later = [r for r in a if r.sent + r.ttft > b_done]
    assert len(a_later) >= 10, (len(a_later), b_done)
    # B waited about a turn, not behind the flood: ~64 A requests at ~4 per 0.3 s.
    assert max(r.ttft for r in b) < 2.0, [r.ttft for r in b]


@pytest.mark.parametrize(
    "fleet", ['queue_ttl = "3s"\nqueue_capacity_per_band = 2\n'], indirect=True, ids=["ttl3s-cap2"]
)
def test_ttl_and_capacity_answer_429(fleet: Server) -> None:
    """A full band queue refuses at once; a queued request expires after queue_ttl; a
    client that leaves the queue is counted as abandoned; unknown bands get 400."""
    held: list[Result] = []
    queued: list[Result] = []
    full: list[Result] = []

    async def main(client: httpx.AsyncClient, admin: httpx.AsyncClient) -> None:
        r = await client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            headers={"x-llmgw-band": "iron"},
        )
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "unknown_band"
        assert "valid bands: platinum, gold, silver, bronze" in r.json()["error"]["message"]

        async with trio.open_nursery() as nursery:
            # Four gold streams hold the pool at saturation 4/4 = 1.0.
            for _ in range(4):
                ev = trio.Event()
                nursery.start_soon(call, client, "gold", None, LONG, held, ev)
                await ev.wait()
            await until(admin, "llmgw_admission_pool_saturation_ratio", lambda v: v == 1.0)
            answered = [trio.Event(), trio.Event()]

            async def queue(tenant: str, done: trio.Event) -> None:
                await call(client, "bronze", tenant, SHORT, queued)
                done.set()

            for tenant, done in zip(("x", "y"), answered, strict=True):
                nursery.start_soon(queue, tenant, done)
            await until(admin, "llmgw_admission_queue_depth", lambda v: v == 2, band="bronze")
            assert await metric(admin, "llmgw_admission_queue_tenants", band="bronze") == 2
            for _ in range(3):
                full.append(await call(client, "bronze"))
            # A client that gives up while queued leaves the queue at once.
            gone, left = trio.CancelScope(), trio.Event()

            async def give_up() -> None:
                with gone:
                    await call(client, "silver")
                left.set()

            nursery.start_soon(give_up)
            await until(admin, "llmgw_admission_queue_depth", lambda v: v == 1, band="silver")
            gone.cancel()
            await left.wait()
            assert gone.cancelled_caught  # it was still queued when it left
            await until(admin, "llmgw_admission_abandoned_total", lambda v: v == 1, band="silver")
            assert await metric(admin, "llmgw_admission_queue_depth", band="silver") == 0
            snapshot = (await admin.get("/api/v1/admission")).json()
            (pool,) = snapshot["pools"]
            assert pool["pool"] == "m" and pool["admitting"] == []
            await until(admin, "llmgw_admission_queue_depth", lambda v: v == 0, band="bronze")
            # The server has answered both; let their clients finish reading the refusals.
            for done in answered:
                await done.wait()
            nursery.cancel_scope.cancel()  # ends the held streams
        # The pool is free again: bronze flows.
        await until(admin, "llmgw_admission_pool_saturation_ratio", lambda v: v < 0.3)
        assert (await call(client, "bronze")).status == 200

    run(fleet, main)
    for r in full:
        assert (r.status, r.code) == (429, "queue_full"), r
        assert r.retry_after is not None and 1 <= r.retry_after <= 3
        assert r.done is not None and r.done - r.sent < 1.5  # at once, not after the TTL
    assert len(queued) == 2
    for r in queued:
        assert (r.status, r.code) == (429, "expired"), r
        assert r.retry_after is not None and 1 <= r.retry_after <= 3
        assert r.done is not None and 2.9 <= r.done - r.sent < 10
    m = fleet.metric
    assert m("llmgw_admission_rejected_total", band="bronze", reason="queue_full") == 3
    assert m("llmgw_admission_rejected_total", band="bronze", reason="expired") == 2
    assert m("llmgw_admission_wait_seconds_count", band="bronze", outcome="expired") == 2
    assert m("llmgw_admission_wait_seconds_count", band="silver", outcome="abandoned") == 1
    assert m("llmgw_admission_admitted_total", band="gold", queued="false") == 4
    assert m("llmgw_admission_admitted_total", band="bronze", queued="false") == 1


def test_admission_disabled_exports_no_admission_gauges() -> None:
    """With admission off every band goes straight through and no queue metrics exist."""
    with (
        sim(*SIM_ARGS, model="m") as (_, engine),
        server(
            config=BASE_CONFIG + endpoint(engine),
            env={"LLMGW_ROUTER__ADMISSION__ENABLED": "false"},
        ) as srv,
    ):
        srv.wait_scraped()
        results: list[Result] = []

        async def main(client: httpx.AsyncClient, admin: httpx.AsyncClient) -> None:
            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(call, client, "bronze", None, SHORT, results)
            text = (await admin.get("/metrics")).text
            assert "llmgw_admission_queue_depth" not in text
            assert "llmgw_admission_pool_saturation_ratio" not in text
            assert "llmgw_admission_admitted_total{" not in text

        run(srv, main)
        assert [r.status for r in results] == [200] * 8
