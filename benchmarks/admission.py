"""Admission under overload: priority bands and tenant fairness, on and off, with
llmgw's default configuration, on more than one kind of engine.

    python benchmarks/admission.py            # about 5 minutes
    python benchmarks/admission.py --quick    # about 90 seconds
    python benchmarks/admission.py --json     # the numbers as JSON on stdout

For each engine personality (``--personality``, repeatable; default both), two
``llmgw-sim`` replicas behind one llmgw-server with its DEFAULT configuration (no
store; ``queue_ttl`` shortened so that expiries happen within the run, see below):

* ``llamacpp``: ``--personality llamacpp`` as is: 4 slots each, llama.cpp's metrics
  (no KV gauge). The router reads each replica's slot count from its ``/props``, as
  it does for a real llama-server, so saturation is "requests in flight / 8".
* ``vllm``: ``--personality vllm --max-num-seqs 16 --decode-step-ms 40``: vLLM's
  metrics and a large KV cache, with no capacity the router is told; it sees only
  what a vLLM replica reports (its queue, its KV usage), nothing more. The
  batch and the step are scaled down from the personality's 256 sequences and 10 ms
  so that twice its capacity fits on two shared cores with the router and the load
  generator (at 32 sequences, 150 requests/s, the machine itself could not keep up
  and the engines served half their measured capacity with or without admission);
  nothing about it is llmgw's setting.

Then, once with admission enabled and once with it disabled
(``LLMGW_ROUTER__ADMISSION__ENABLED=false``, a fresh router on the same simulators):

1. **unloaded**: platinum requests one at a time; their TTFT is the reference;
2. **overload**: an open-loop Poisson arrival stream at ``--load`` (default 2) times
   the simulators' capacity, measured at the start of the run directly on the
   simulators. Bands: platinum 10 %, gold 30 % (three equal tenants g1, g2, g3),
   silver 30 %, bronze 30 %. The same seeded schedule is replayed in both modes.
   Every request streams ``--tokens`` tokens. Arrivals stop after ``--duration``
   seconds; requests still unfinished ``--drain`` seconds later are cut and counted.

``queue_ttl`` is 10 s (quick: 5 s) instead of the default 30 s only so that queued
lower bands expire within a run of this length; it does not change when a request is
admitted.

Per band it reports requests served, rejected at once (``queue_full``), expired
(``queue_ttl`` passed) and failed otherwise; TTFT p50/p99 of served requests; and the
queue wait p50/p99, measured on the client as TTFT minus the unloaded platinum
median TTFT (time spent waiting anywhere: in the router's admission queue when
admission is on, in the engines' queues when it is off). For gold: each tenant's
share of the served requests and Jain's fairness index over the three. Per mode: the
requests completed per second while arrivals lasted. Targets (issue #16), printed
beside the measurements: platinum TTFT p99 under overload within 2x of its unloaded
p99, and at least 5x better than with admission off (FIFO); Jain's index across the
equal gold tenants >= 0.9.

Only 127.0.0.1 is contacted. Every process started is stopped on exit (normal
return, exception, Ctrl-C, SIGTERM). Nothing here asserts; it prints what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import attrs
import httpx
import trio

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _common as c

LOOPBACK = c.LOOPBACK
MODEL = "m"
BANDS = ("platinum", "gold", "silver", "bronze")
MIX = (("platinum", 0.10), ("gold", 0.30), ("silver", 0.30), ("bronze", 0.30))
GOLD_TENANTS = ("g1", "g2", "g3")
TARGET_PLATINUM_RATIO = 2.0
TARGET_FIFO_RATIO = 5.0  # platinum TTFT p99 with admission off / on
TARGET_JAIN = 0.9
# Per personality: the simulator's arguments and how many sequences it runs at once
# (to keep it busy while measuring its capacity).
PERSONALITIES: dict[str, tuple[tuple[str, ...], int]] = {
    "llamacpp": (("--personality", "llamacpp"), 4),
    "vllm": (("--personality", "vllm", "--max-num-seqs", "16", "--decode-step-ms", "40"), 16),
}


# -- processes (benchmarks/_common.py) ------------------------------------------------


class Fleet(c.Fleet):
    """The shared process handling, with this benchmark's simulators and routers."""

    def sim(self, name: str, *args: str) -> str:
        return super().sim(name, *args, model=MODEL)[1]

    def router(
        self, name: str, sims: Sequence[str], config: str, env: dict[str, str]
    ) -> tuple[c.Proc, str, str]:
        path = self.logdir / f"{name}.toml"
        endpoints = "".join(
            f'\n[[endpoints]]\nid = "s{i}"\nurl = "{base}"\nmodels = ["{MODEL}"]\n'
            for i, base in enumerate(sims)
        )
        path.write_text(config + endpoints)
        argv = ["--listen", f"{LOOPBACK}:0", "--admin-listen", f"{LOOPBACK}:0"]
        argv += ["--config", str(path)]
        proc = self.start("llmgw-server", *argv, name=name, env=env, ready=True)
        admin = proc.url("admin_listen")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # scored on data from the first request on
            r = httpx.get(f"{admin}/api/v1/endpoints", timeout=5, trust_env=False)
            if all(e.get("engine") is not None for e in r.json()["endpoints"]):
                break
            time.sleep(0.05)
        return proc, proc.url("listen"), admin


# -- load ---------------------------------------------------------------------------------


@attrs.define
class Result:
    band: str
    tenant: str
    at: float  # scheduled offset in the run
    status: int = 0  # 0: no answer (cut at the end, or a transport error)
    code: str | None = None
    ttft: float | None = None
    total: float | None = None
    end: float | None = None  # completion, seconds since the start of the run


def body(tokens: int, stream: bool = True) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Summarise the admission benchmark."}],
        "max_tokens": tokens,
        "stream": stream,
    }


async def one(
    client: httpx.AsyncClient, r: Result, tokens: int, url: str = "", origin: float = 0.0
) -> None:
    headers = {"x-llmgw-band": r.band}
    if r.tenant:
        headers["x-llmgw-tenant"] = r.tenant
    start = time.monotonic()
    try:
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", json=body(tokens), headers=headers
        ) as resp:
            if resp.status_code != 200:
                await resp.aread()
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    r.code = resp.json()["error"]["code"]
                r.status = resp.status_code
                return
            async for line in resp.aiter_lines():
                if r.ttft is None and line.startswith("data: {") and '"content"' in line:
                    r.ttft = time.monotonic() - start
            r.total = time.monotonic() - start
            r.end = time.monotonic() - origin
            r.status = 200
    except httpx.HTTPError as exc:
        r.code = type(exc).__name__


# Load-generator clients the overload's requests are spread over (see overload()).
CLIENTS = 32


def new_client(base: str, timeout: float) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=4000, max_keepalive_connections=4000)
    return httpx.AsyncClient(base_url=base, timeout=timeout, limits=limits, trust_env=False)


async def capacity(sims: Sequence[str], seqs: int, tokens: int, seconds: float) -> float:
    """Requests per second the simulators complete when each has a queue (twice as many
    requests outstanding as it runs at once), so no slot idles between requests."""
    done = 0

    async def worker(client: httpx.AsyncClient, url: str, stop: float) -> None:
        nonlocal done
        while time.monotonic() < stop:
            r = Result("", "", 0.0)
            await one(client, r, tokens, url)
            if r.status == 200 and time.monotonic() <= stop:
                done += 1

    async with new_client("", 60) as client:
        await one(client, Result("", "", 0.0), 2, sims[0])  # warm up connections
        start = time.monotonic()
        stop = start + seconds
        async with trio.open_nursery() as nursery:
            for url in sims:
                for _ in range(2 * seqs):
                    nursery.start_soon(worker, client, url, stop)
    return done / seconds


def schedule(rate: float, duration: float, seed: int) -> list[Result]:
    """Poisson arrivals at `rate` for `duration` seconds, bands and tenants by MIX."""
    rng = random.Random(seed)
    names = [b for b, _ in MIX]
    weights = [w for _, w in MIX]
    out: list[Result] = []
    gold = 0
    t = rng.expovariate(rate)
    while t < duration:
        band = rng.choices(names, weights)[0]
        tenant = f"{band}-tenant"
        if band == "gold":  # in turn, so the gold tenants offer exactly equal loads
            tenant = GOLD_TENANTS[gold % len(GOLD_TENANTS)]
            gold += 1
        out.append(Result(band, tenant, t))
        t += rng.expovariate(rate)
    return out


async def unloaded(base: str, n: int, tokens: int) -> list[float]:
    async with new_client(base, 60) as client:
        await one(client, Result("platinum", "", 0.0), 2)  # warm up
        ttfts = []
        for _ in range(n):
            r = Result("platinum", "p", 0.0)
            await one(client, r, tokens)
            if r.ttft is not None:
                ttfts.append(r.ttft)
            await trio.sleep(0.05)
    return ttfts


async def overload(base: str, plan: list[Result], tokens: int, drain: float) -> float:
    """Replay `plan` (fresh Results); returns the seconds from first arrival to the end.

    The requests are spread over :data:`CLIENTS` clients in turn: one httpx pool with
    the thousand connections admission holds open spent seconds of the generator's
    CPU choosing a connection for each request (its pool is scanned per request), and
    the arrivals stalled for 14 s in the middle of a run (2026-12-07), on and off
    alike, which the TTFTs then counted."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(new_client(base, 600)) for _ in range(CLIENTS)]
        for client in clients:
            await one(client, Result("platinum", "", 0.0), 2)  # warm up
        start = trio.current_time()
        origin = time.monotonic()
        end = plan[-1].at if plan else 0.0
        with trio.move_on_at(start + end + drain):
            async with trio.open_nursery() as nursery:
                for k, r in enumerate(plan):
                    await trio.sleep_until(start + r.at)
                    nursery.start_soon(one, clients[k % CLIENTS], r, tokens, "", origin)
        return trio.current_time() - start


# -- statistics -----------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def jain(xs: Sequence[float]) -> float | None:
    if not xs or not any(xs):
        return None
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def tenant_ttft(plan: list[Result], tenant: str) -> list[float]:
    return [r.ttft for r in plan if r.tenant == tenant and r.ttft is not None and r.status == 200]


def summarize(
    plan: list[Result], base_ttft: float, elapsed: float, window: float
) -> dict[str, Any]:
    bands: dict[str, Any] = {}
    for band in BANDS:
        rs = [r for r in plan if r.band == band]
        ttft = [r.ttft for r in rs if r.status == 200 and r.ttft is not None]
        wait = [max(0.0, t - base_ttft) for t in ttft]
        bands[band] = {
            "offered": len(rs),
            "served": sum(1 for r in rs if r.status == 200),
            "rejected": sum(1 for r in rs if r.code == "queue_full"),
            "expired": sum(1 for r in rs if r.code == "expired"),
            "failed": sum(1 for r in rs if r.status not in (0, 200, 429)),
            "cut": sum(1 for r in rs if r.status == 0),
            "ttft_p50": pct(ttft, 50),
            "ttft_p90": pct(ttft, 90),
            "ttft_p99": pct(ttft, 99),
            "wait_p50": pct(wait, 50),
            "wait_p99": pct(wait, 99),
        }
    gold = [sum(1 for r in plan if r.tenant == t and r.status == 200) for t in GOLD_TENANTS]
    total = sum(gold)
    # Completions while arrivals still overloaded the pool: how much of the simulators'
    # capacity was used (the rest of the run is draining, or waiting for expiries).
    in_window = sum(1 for r in plan if r.end is not None and r.end <= window)
    return {
        "elapsed_s": elapsed,
        "served_per_s": in_window / window if window > 0 else 0.0,
        "bands": bands,
        "gold_tenants": {
            t: {
                "served": n,
                "share": n / total if total else None,
                "ttft_p50": pct(tenant_ttft(plan, t), 50),
                "ttft_p99": pct(tenant_ttft(plan, t), 99),
            }
            for t, n in zip(GOLD_TENANTS, gold, strict=True)
        },
        "gold_jain": jain(gold),
    }


# -- run ------------------------------------------------------------------------------------


def config(ttl: float) -> str:
    return f"""
[router.admission]
queue_ttl = "{ttl:g}s"

[store]
url = ""
"""


def measure(
    f: Fleet, sims: Sequence[str], enabled: bool, args: argparse.Namespace, plan: list[Result]
) -> dict[str, Any]:
    mode = "on" if enabled else "off"
    env = {"LLMGW_ROUTER__ADMISSION__ENABLED": "true" if enabled else "false"}
    proc, base, admin = f.router(f"router-{mode}", sims, config(args.ttl), env)
    try:
        # TTFT does not depend on the output length: short requests keep this phase short.
        idle = trio.run(unloaded, base, args.unloaded, 2)
        base_ttft = pct(idle, 50) or 0.0
        fresh = [Result(r.band, r.tenant, r.at) for r in plan]
        elapsed = trio.run(overload, base, fresh, args.tokens, args.drain)
        out = summarize(fresh, base_ttft, elapsed, args.duration)
        out["unloaded_platinum_ttft_p50"] = base_ttft
        out["unloaded_platinum_ttft_p99"] = pct(idle, 99)
        over = out["bands"]["platinum"]["ttft_p99"]
        idle99 = out["unloaded_platinum_ttft_p99"]
        out["platinum_p99_ratio"] = over / idle99 if over is not None and idle99 else None
        with contextlib.suppress(httpx.HTTPError):
            out["server_metrics"] = server_counts(admin)
        return out
    finally:
        proc.stop()
        f.procs.remove(proc)


def server_counts(admin: str) -> dict[str, float]:
    """The router's own admission counters, to cross-check the client's view."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{admin}/metrics", timeout=5, trust_env=False).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in (
                "llmgw_admission_admitted_total",
                "llmgw_admission_rejected_total",
                "llmgw_admission_abandoned_total",
                "llmgw_admission_wait_seconds_count",
                "llmgw_admission_wait_seconds_sum",
            ):
                key = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model")
                out[f"{s.name}{{{key}}}"] = out.get(f"{s.name}{{{key}}}", 0.0) + s.value
    return out


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def verdict(value: float | None, ok: bool) -> str:
    return "" if value is None else (" ok" if ok else " MISSED")


def table(result: dict[str, Any]) -> str:
    lines = []
    head = (
        "| admission | band | offered | served | rejected | expired | other | "
        "TTFT p50 ms | TTFT p99 ms | wait p50 ms | wait p99 ms |"
    )
    lines += [head, "|" + "---|" * 11]
    for mode in ("on", "off"):
        if mode not in result:
            continue
        run = result[mode]
        for band in BANDS:
            b = run["bands"][band]
            lines.append(
                f"| {mode} | {band} | {b['offered']} | {b['served']} | {b['rejected']} | "
                f"{b['expired']} | {b['failed'] + b['cut']} | {ms(b['ttft_p50'])} | "
                f"{ms(b['ttft_p99'])} | {ms(b['wait_p50'])} | {ms(b['wait_p99'])} |"
            )
    lines.append("")
    lines.append(
        "| admission | served/s during arrivals | unloaded platinum TTFT p99 ms "
        "| overload platinum TTFT p99 ms "
        f"| ratio (target <= {TARGET_PLATINUM_RATIO:g}) | gold shares g1/g2/g3 "
        f"| Jain (target >= {TARGET_JAIN:g}) |"
    )
    lines.append("|" + "---|" * 7)
    for mode in ("on", "off"):
        if mode not in result:
            continue
        run = result[mode]
        ratio = run["platinum_p99_ratio"]
        shares = "/".join(
            "-" if v["share"] is None else f"{v['share']:.2f}" for v in run["gold_tenants"].values()
        )
        j = run["gold_jain"]
        lines.append(
            f"| {mode} | {run['served_per_s']:.1f} | {ms(run['unloaded_platinum_ttft_p99'])} | "
            f"{ms(run['bands']['platinum']['ttft_p99'])} | "
            f"{'-' if ratio is None else f'{ratio:.2f}'}"
            f"{verdict(ratio, ratio is not None and ratio <= TARGET_PLATINUM_RATIO)} | "
            f"{shares} | {'-' if j is None else f'{j:.3f}'}"
            f"{verdict(j, j is not None and j >= TARGET_JAIN)} |"
        )
    on, off = result.get("on"), result.get("off")
    if on and off:
        p_on, p_off = on["bands"]["platinum"]["ttft_p99"], off["bands"]["platinum"]["ttft_p99"]
        fifo = p_off / p_on if p_on and p_off is not None else None
        lines.append("")
        lines.append(
            f"platinum TTFT p99, admission off (FIFO) / on: "
            f"{'-' if fifo is None else f'{fifo:.1f}x'} (target >= {TARGET_FIFO_RATIO:g}x)"
            f"{verdict(fifo, fifo is not None and fifo >= TARGET_FIFO_RATIO)}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="shorter phases (about 90 s in all)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--personality",
        action="append",
        choices=tuple(PERSONALITIES),
        help="engine personality (repeatable; default: all)",
    )
    p.add_argument("--load", type=float, default=2.0, help="offered load / capacity (2)")
    p.add_argument("--duration", type=float, help="seconds of arrivals (30; quick 8)")
    p.add_argument("--drain", type=float, help="seconds to finish after arrivals (45; quick 10)")
    p.add_argument("--ttl", type=float, help="router.admission.queue_ttl seconds (10; quick 5)")
    p.add_argument("--tokens", type=int, default=16, help="tokens per request (16)")
    p.add_argument("--unloaded", type=int, help="unloaded platinum requests (40; quick 15)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mode", choices=("both", "on", "off"), default="both", help="admission")
    args = p.parse_args(argv)
    quick = args.quick
    args.duration = args.duration or (8.0 if quick else 30.0)
    args.drain = args.drain or (10.0 if quick else 45.0)
    args.ttl = args.ttl or (5.0 if quick else 10.0)
    args.unloaded = args.unloaded or (15 if quick else 40)

    started = time.monotonic()
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    result: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}",
        "settings": {k: getattr(args, k) for k in ("load", "duration", "drain", "ttl", "tokens")},
        "personalities": {},
    }
    with c.fleet(Fleet) as f:
        for name in args.personality or tuple(PERSONALITIES):
            sim_args, seqs = PERSONALITIES[name]
            started_sims = [c.Fleet.sim(f, f"{name}-{i}", *sim_args, model=MODEL) for i in range(2)]
            sims = [base for _, base in started_sims]
            cap = trio.run(capacity, sims, seqs, args.tokens, 3.0 if quick else 5.0)
            rate = args.load * cap
            plan = schedule(rate, args.duration, args.seed)
            log(
                f"[{name}] capacity {cap:.1f} req/s; offering {rate:.1f} req/s ({len(plan)} "
                f"requests over {args.duration:g}s)"
            )
            run: dict[str, Any] = {
                "sim_args": list(sim_args),
                "capacity_per_s": cap,
                "offered_per_s": rate,
            }
            for enabled in {"both": (True, False), "on": (True,), "off": (False,)}[args.mode]:
                run["on" if enabled else "off"] = measure(f, sims, enabled, args, plan)
                log(
                    f"[{name}] admission {'on' if enabled else 'off'}: done at "
                    f"{time.monotonic() - started:.0f}s"
                )
            result["personalities"][name] = run
            f.stop([proc for proc, _ in started_sims])  # the next personality's own engines
    result["wall_s"] = time.monotonic() - started
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, run in result["personalities"].items():
            print(
                f"\n{name}: 2 x llmgw-sim {' '.join(run['sim_args'])}; capacity "
                f"{run['capacity_per_s']:.1f} req/s, offered {run['offered_per_s']:.1f} req/s; "
                "llmgw default configuration, queue_ttl "
                f"{args.ttl:g}s, no store\n"
            )
            print(table(run))
        print(f"\nwall time {result['wall_s']:.0f}s; logs in {f.logdir}")
    return 0


if __name__ == "__main__":
    code = 130
    try:
        code = main()
    except* KeyboardInterrupt:  # bare, or from inside a trio nursery
        print("interrupted; every process started was stopped", file=sys.stderr)
    sys.exit(code)
