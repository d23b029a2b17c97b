"""Routing quality: client-side round robin vs llmgw's default `chat` profile.

    python benchmarks/routing_quality.py [--quick] [--json]

Setup (all on 127.0.0.1, started and stopped by this script): four `llmgw-sim`
replicas of modest capacity (8 sequences each, 200 us of prefill per uncached prompt
token, so a prefix-cache hit saves ~0.3 s of engine time per request) and a KV cache
that holds about three tenants' system prompts next to a full batch: all tenants'
prompts do not fit in one replica but do fit across the four. One `llmgw-server` with
its default configuration (the `chat` routing profile) in front of the same four.

Workload: 8 tenants (prefix groups), each with a ~1,500-token system prompt shared by
all of its requests plus a 100-token unique suffix, 32 output tokens, streamed, at a
closed-loop concurrency of 48 (--concurrency), above what round robin can serve: its
throughput is already flat from 16 on, so its queues grow.

Targets, interleaved A, B, A, B, ... with the same prompts within a round:

* round robin: the client spreads requests evenly over the four replicas. Every cycle
  of four requests visits each replica once, in a seeded shuffled order: the workload
  issues tenants in a fixed cyclic order (request i belongs to tenant i mod 8), and a
  strict rotation over 4 replicas would line up with it (each replica would see only
  two tenants: perfect affinity by accident, not what a balancer sees in practice);
* llmgw: everything to the router, which picks a replica;
* tenant-pinned (reference, --no-reference skips it): the client sends tenant t to
  replica t mod 4, which fits two tenants' prompts in each cache. Not a contender (it
  ignores load and needs to know tenants); it shows what affinity can gain here.

Before each turn the replicas are idle as llmgw's own scrapes see them (so its first
picks do not rest on the previous turn's load), and every replica's prefix cache is
reset, so neither target inherits the other's cache. Reported: TTFT p50/p90/p99, e2e
p50, throughput, each target's prefix cache hit rate (hit tokens / looked-up tokens,
from the simulators' counters, delta over its turns), llmgw's routing decisions by
tier and its split over the replicas.
Nothing is asserted: the target (TTFT p90 at least 2x better than round robin) is
printed beside the measurement.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

import attrs
import httpx

from llmgw import bench

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _common as c

MODEL = "bench-model"
REPLICAS = 4
TENANTS = 8
PREFIX_TOKENS = 1500
SUFFIX_TOKENS = 100
OUTPUT_TOKENS = 32
KV_BLOCKS = 400  # of 16 tokens: ~3 tenants' prompts (94 blocks each) plus a full batch
SIM_ARGS = (
    "--max-num-seqs", "8",
    "--prefill-us-per-token", "200",
    "--kv-blocks", str(KV_BLOCKS),
)  # fmt: skip
CONCURRENCY = 48  # 12 per replica against 8 batch slots each
TARGET_P90_RATIO = 2.0  # round robin TTFT p90 / llmgw TTFT p90

REFERENCE = "tenant-pinned (reference)"
HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"


@attrs.frozen
class Settings:
    rounds: int
    turn_seconds: float
    turn_requests: int


DEFAULT = Settings(rounds=2, turn_seconds=15.0, turn_requests=3000)
QUICK = Settings(rounds=1, turn_seconds=5.0, turn_requests=1000)


class ShuffledRoundRobin(c.RoundRobinTransport):
    """Round robin in cycles of len(bases): each cycle visits every replica once, in a
    freshly shuffled (seeded) order; see the module docstring for why."""

    def __init__(self, bases: Sequence[str], inner: httpx.AsyncBaseTransport, seed: int) -> None:
        super().__init__(bases, inner)
        rng = random.Random(seed)
        n = len(self.urls)

        def order() -> Any:
            while True:
                cycle = list(range(n))
                rng.shuffle(cycle)
                yield from cycle

        self._next = order()


class TenantTap(httpx.AsyncBaseTransport):
    """Counts, per tenant, the replicas its requests were served by.

    The tenant is read from the prompt's first word (unique per prefix group by the
    workload's construction); the replica from the URL a round robin rewrote, or from
    llmgw's `x-llmgw-endpoint` response header."""

    def __init__(
        self, inner: httpx.AsyncBaseTransport, first_words: dict[str, int], ports: dict[int, str]
    ) -> None:
        self.inner = inner
        self.first_words = first_words
        self.ports = ports
        self.served: dict[int, dict[str, int]] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        text = body["messages"][0]["content"]
        tenant = self.first_words.get(text.split(" ", 1)[0], -1)
        response = await self.inner.handle_async_request(request)
        replica = response.headers.get("x-llmgw-endpoint") or self.ports.get(
            request.url.port or 0, "?"
        )
        per = self.served.setdefault(tenant, {})
        per[replica] = per.get(replica, 0) + 1
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def concentration(served: dict[int, dict[str, int]]) -> tuple[float, float] | None:
    """(mean share of a tenant's requests on its most used replica, mean number of
    replicas that served at least 10% of a tenant's requests)."""
    shares, spread = [], []
    for per in served.values():
        total = sum(per.values())
        if total:
            shares.append(max(per.values()) / total)
            spread.append(sum(1 for n in per.values() if n >= 0.1 * total))
    if not shares:
        return None
    return sum(shares) / len(shares), sum(spread) / len(spread)


class TenantPinned(httpx.AsyncBaseTransport):
    """Reference, not a contender: the client knows each request's tenant and sends
    tenant t to replica t mod n (two tenants per replica, which fit its cache). An upper
    bound on what prefix affinity can gain here, ignoring load entirely."""

    def __init__(
        self, bases: Sequence[str], inner: httpx.AsyncBaseTransport, first_words: dict[str, int]
    ) -> None:
        self.urls = [httpx.URL(b) for b in bases]
        self.inner = inner
        self.first_words = first_words

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        text = json.loads(request.content)["messages"][0]["content"]
        tenant = self.first_words.get(text.split(" ", 1)[0], 0)
        u = self.urls[tenant % len(self.urls)]
        request.url = request.url.copy_with(scheme=u.scheme, host=u.host, port=u.port)
        request.headers["host"] = f"{u.host}:{u.port}"
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def sim_counters(sims: Sequence[str]) -> dict[str, float]:
    total = {HITS: 0.0, QUERIES: 0.0}
    for base in sims:
        for k, v in c.scrape(f"{base}/metrics", (HITS, QUERIES)).items():
            total[k] += v
    return total


def router_counters(router: c.RouterProc) -> dict[str, float]:
    """llmgw's decisions by tier, requests by endpoint, admission waits and refusals."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    text = httpx.get(f"{router.admin}/metrics", timeout=5, trust_env=False).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "llmgw_routing_decisions_total":
                key = f"tier:{s.labels.get('tier')}"
            elif s.name == "llmgw_requests_total":
                key = f"endpoint:{s.labels.get('endpoint')}"
            elif s.name in (
                "llmgw_admission_wait_seconds_sum",
                "llmgw_admission_wait_seconds_count",
                "llmgw_admission_rejected_total",
            ):
                key = s.name
            else:
                continue
            out[key] = out.get(key, 0.0) + s.value
    return out


def reset_caches(sims: Sequence[str]) -> None:
    for base in sims:
        httpx.post(f"{base}/reset_prefix_cache", timeout=5, trust_env=False).raise_for_status()


def wait_seen_idle(router: c.RouterProc, timeout: float = 10.0) -> None:
    """Wait until llmgw's own scrapes show every replica idle. The previous turn (round
    robin's, say) leaves the replicas busy for a moment, and llmgw would otherwise place
    its first requests on a load that is no longer there: a turn must not start with
    another target's leftovers in its view. Blocks (between turns, nothing else runs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        endpoints = httpx.get(f"{router.admin}/api/v1/endpoints", timeout=5).json()["endpoints"]
        if all(e["running"] == 0 and e["waiting"] == 0 for e in endpoints):
            return
        time.sleep(0.1)
    c.log(f"llmgw still sees busy replicas after {timeout:g}s; starting the turn anyway")


async def measure(
    settings: Settings, sims: list[str], router: c.RouterProc, concurrency: int, pinned: bool
) -> dict[str, Any]:
    spec = bench.WorkloadSpec(
        prompt_tokens=PREFIX_TOKENS + SUFFIX_TOKENS,
        output_tokens=OUTPUT_TOKENS,
        shared_prefix_ratio=PREFIX_TOKENS / (PREFIX_TOKENS + SUFFIX_TOKENS),
        prefix_groups=TENANTS,
        seed=7,
    )
    config = bench.LoadConfig(
        concurrency=concurrency,
        requests=settings.turn_requests,
        duration=settings.turn_seconds,
        stream=True,
        workload=spec,
        request_timeout=120.0,
    )
    rr = bench.Target(sims[0], MODEL, name="round robin")
    via = bench.Target(router.base, MODEL, name="llmgw")
    oracle = bench.Target(sims[0], MODEL, name=REFERENCE)
    workload = bench.Workload(spec)
    first_words = {workload.prefix(g)[0]: g for g in range(TENANTS)}
    ports = {httpx.URL(base).port or 0: f"sim-{i}" for i, base in enumerate(sims)}
    rr_transport = ShuffledRoundRobin(sims, c.pooled_transport(concurrency), seed=spec.seed)
    taps = {
        rr.label: TenantTap(rr_transport, first_words, ports),
        via.label: TenantTap(c.pooled_transport(concurrency), first_words, ports),
    }
    if pinned:
        taps[oracle.label] = TenantTap(
            TenantPinned(sims, c.pooled_transport(concurrency), first_words), first_words, ports
        )
    cache = {label: {HITS: 0.0, QUERIES: 0.0} for label in taps}
    decisions: dict[str, float] = {}
    mark: dict[str, Any] = {}

    def before(_round: int, target: bench.Target) -> None:
        wait_seen_idle(router)
        reset_caches(sims)
        mark["sims"] = sim_counters(sims)
        if target is via:
            mark["router"] = router_counters(router)

    def after(rnd: int, target: bench.Target, result: bench.BenchResult) -> None:
        now = sim_counters(sims)
        for k in (HITS, QUERIES):
            cache[target.label][k] += now[k] - mark["sims"][k]
        if target is via:
            for k, v in router_counters(router).items():
                decisions[k] = decisions.get(k, 0.0) + v - mark["router"].get(k, 0.0)
        s = result.summary
        c.log(
            f"round {rnd + 1} {target.label}: {s.requests} requests, TTFT p90 "
            f"{c.ms(s.ttft.p90 if s.ttft else None, 0)} ms"
        )

    turns = await c.interleave(
        [(rr, taps[rr.label]), (via, taps[via.label])]
        + ([(oracle, taps[oracle.label])] if pinned else []),
        config,
        rounds=settings.rounds,
        before=before,
        after=after,
    )
    results = [bench.merge(t) for t in turns]
    return {
        "results": {r.target: r for r in results},
        "cache": cache,
        "decisions": decisions,
        "rr_split": rr_transport.sent,
        "tenants": {k: tap.served for k, tap in taps.items()},
        "concentration": {k: concentration(tap.served) for k, tap in taps.items()},
        "workload": spec,
        "concurrency": concurrency,
    }


def hit_rate(counts: dict[str, float]) -> float | None:
    return counts[HITS] / counts[QUERIES] if counts[QUERIES] else None


def report(result: dict[str, Any]) -> None:
    rows = []
    for name, r in result["results"].items():
        s: bench.Summary = r.summary
        rate = hit_rate(result["cache"][name])
        conc = result["concentration"][name]
        rows.append(
            [
                name,
                f"{s.ok}/{s.requests}",
                c.ms(s.ttft.p50 if s.ttft else None, 0),
                c.ms(s.ttft.p90 if s.ttft else None, 0),
                c.ms(s.ttft.p99 if s.ttft else None, 0),
                c.ms(s.e2e.p50 if s.e2e else None, 0),
                f"{s.request_throughput:.2f}",
                f"{s.output_token_throughput:.0f}",
                "-" if rate is None else f"{rate:.1%}",
                "-" if conc is None else f"{conc[0]:.0%} / {conc[1]:.1f}",
            ]
        )
    c.print_table(
        f"{TENANTS} tenants x {PREFIX_TOKENS}-token system prompt + {SUFFIX_TOKENS} unique "
        f"tokens, {OUTPUT_TOKENS} output tokens, streamed, concurrency {result['concurrency']}, "
        f"{REPLICAS} simulators ({' '.join(SIM_ARGS)}); times in ms",
        [
            "target",
            "ok/requests",
            "TTFT p50",
            "TTFT p90",
            "TTFT p99",
            "e2e p50",
            "req/s",
            "output tok/s",
            "prefix cache hit rate",
            "tenant on top replica / replicas per tenant",
        ],
        rows,
    )
    ratios = result["ratios"]
    d = result["decisions"]
    tiers = ", ".join(
        f"{k.split(':', 1)[1]} {v:.0f}" for k, v in sorted(d.items()) if k.startswith("tier:")
    )
    waits = d.get("llmgw_admission_wait_seconds_count", 0.0)
    wait = d.get("llmgw_admission_wait_seconds_sum", 0.0) / waits if waits else None
    split = " / ".join(f"{v:.0f}" for k, v in sorted(d.items()) if k.startswith("endpoint:"))
    c.print_table(
        "llmgw vs round robin (ratios > 1 favour llmgw)",
        ["metric", "measured", "target", ""],
        [
            [
                "TTFT p90, round robin / llmgw",
                f"{ratios['ttft_p90']:.2f}x" if ratios["ttft_p90"] else "-",
                f">= {TARGET_P90_RATIO:g}x",
                "-"
                if ratios["ttft_p90"] is None
                else ("met" if ratios["ttft_p90"] >= TARGET_P90_RATIO else "MISSED"),
            ],
            [
                "TTFT p50, round robin / llmgw",
                f"{ratios['ttft_p50']:.2f}x" if ratios["ttft_p50"] else "-",
                "",
                "",
            ],
            [
                "throughput, llmgw / round robin",
                f"{ratios['throughput']:.2f}x" if ratios["throughput"] else "-",
                "",
                "",
            ],
            ["llmgw decisions by tier", tiers or "-", "", ""],
            [
                "llmgw admission: requests queued, their mean wait, refused",
                f"{waits:.0f} of {result['results']['llmgw'].summary.requests}, "
                f"{c.ms(wait, 0)} ms, {d.get('llmgw_admission_rejected_total', 0):.0f}",
                "",
                "",
            ],
            ["llmgw requests per replica", split or "-", "", ""],
            [
                "prefix cache hit rate: llmgw / tenant-pinned reference",
                "-"
                if result["hit_rates"].get(REFERENCE) is None
                else f"{result['hit_rates']['llmgw']:.1%} / {result['hit_rates'][REFERENCE]:.1%}",
                "",
                "",
            ],
            [
                "round robin requests per replica",
                " / ".join(str(n) for n in result["rr_split"]),
                "",
                "",
            ],
        ],
    )


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


async def main_async(
    settings: Settings, fleet: c.Fleet, concurrency: int, pinned: bool
) -> dict[str, Any]:
    sims = []
    for i in range(REPLICAS):
        _, base = fleet.sim(f"sim-{i}", *SIM_ARGS, "--seed", str(i), model=MODEL)
        sims.append(base)
    router = fleet.router([(f"sim-{i}", base, MODEL) for i, base in enumerate(sims)])
    router.wait_scraped()
    out = await measure(settings, sims, router, concurrency, pinned)
    rr, gw = out["results"]["round robin"].summary, out["results"]["llmgw"].summary

    def p(s: bench.Summary, q: str) -> float | None:
        return None if s.ttft is None else s.ttft.percentile(q)

    out["ratios"] = {
        "ttft_p90": ratio(p(rr, "p90"), p(gw, "p90")),
        "ttft_p50": ratio(p(rr, "p50"), p(gw, "p50")),
        "throughput": ratio(gw.request_throughput, rr.request_throughput),
    }
    out["hit_rates"] = {k: hit_rate(v) for k, v in out["cache"].items()}
    out.update(
        benchmark="routing_quality",
        date=time.strftime("%Y-%m-%d %H:%M:%S %z"),
        machine=c.machine(),
        revision=c.revision(),
        settings=attrs.asdict(settings),
        sim_args=list(SIM_ARGS),
        target_ttft_p90_ratio=TARGET_P90_RATIO,
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="short turns (under ~40 s in all)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead")
    p.add_argument(
        "--concurrency",
        type=int,
        default=CONCURRENCY,
        help=f"closed-loop concurrency (default {CONCURRENCY})",
    )
    p.add_argument(
        "--no-reference", action="store_true", help="skip the tenant-pinned reference target"
    )
    args = p.parse_args(argv)
    settings = QUICK if args.quick else DEFAULT
    started = time.monotonic()
    result = None
    try:
        with c.fleet() as fleet:
            result = c.run_trio(
                main_async, settings, fleet, args.concurrency, not args.no_reference
            )
    except* KeyboardInterrupt:
        pass  # trio may deliver it inside an exception group
    if result is None:
        print("interrupted; every started process was stopped", file=sys.stderr)
        return 130
    result["wall_seconds"] = time.monotonic() - started
    if args.json:
        summaries = {k: v.summary for k, v in result.pop("results").items()}
        result["summaries"] = summaries
        print(json.dumps(bench.to_jsonable(result), indent=2, default=str))
    else:
        print(f"routing_quality  {result['date']}  llmgw {result['revision']}  {result['machine']}")
        print(
            f"{settings.rounds} interleaved rounds of <= {settings.turn_seconds:g} s per target; "
            f"took {result['wall_seconds']:.0f} s"
        )
        report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
