"""Where a stream's time to first token goes, direct to the engine and through llmgw.

    python benchmarks/ttft_breakdown.py [--concurrency 8 --concurrency 32] [--rounds 6]
                                        [--router-first 32]

Setup (all on 127.0.0.1, started and stopped by this script): two `llmgw-sim`
replicas with 10 ms decode steps (an engine's pace; router_overhead.py's
PACED_SIM_ARGS) and one `llmgw-server` in front of both. At each concurrency, streams
of 32 tokens run interleaved direct (the client round-robins over the replicas) and
through llmgw, `--rounds` turns each.

Three clocks per turn, as means over the turn's streams:

* client: the load generator's TTFT, from sending the request to the first token;
* llmgw: llmgw's own `llmgw_time_to_first_token_seconds`, from the request's head
  parsed to the first event relayed (router turns only);
* engine: the replicas' `vllm:time_to_first_token_seconds`, from the request reaching
  the engine's queue to its first token.

"client - engine" is the time outside the engine's queue and steps: HTTP on both
sides, the load generator's own work and, through llmgw, two more hops. The added
TTFT is reported as the median over rounds of router p50 - direct p50 (the rounds
are paired) with each round's value, so run-to-run spread stays visible. Nothing is
asserted.

The levels named by `--router-first` (default: 32) run once more with llmgw's
process given the CPU before the others (nice and autogroup nice -10; root or
CAP_SYS_NICE). On these 2 cores the simulated engines are CPU work that competes
with the router, which real engines on GPUs do not: when a replica ends a step, it
writes one event per stream in a burst of about half a millisecond, and llmgw, woken
by the first of them on the same core, waits for the burst to end before it runs.
The direct turns are unaffected (llmgw is idle then).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from llmgw import bench

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _common as c
import router_overhead as ro

MODEL = "bench-model"
LLMGW_TTFT = ("llmgw_time_to_first_token_seconds_sum", "llmgw_time_to_first_token_seconds_count")
ENGINE_TTFT = ("vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count")


def mean_between(before: dict[str, float], after: dict[str, float], names: Any) -> float | None:
    count = after[names[1]] - before[names[1]]
    return (after[names[0]] - before[names[0]]) / count if count else None


async def run_concurrency(
    concurrency: int, rounds: int, sims: list[str], router: c.RouterProc
) -> dict[str, Any]:
    config = bench.LoadConfig(
        concurrency=concurrency,
        requests=5000,
        duration=4.0,
        stream=True,
        workload=bench.WorkloadSpec(prompt_tokens=ro.PROMPT_TOKENS, output_tokens=32, seed=1),
        request_timeout=60.0,
    )
    direct = bench.Target(sims[0], MODEL, name="direct")
    via = bench.Target(router.base, MODEL, name="router")
    marks: dict[str, Any] = {}
    turns: dict[str, list[dict[str, float | None]]] = {"direct": [], "router": []}

    def snapshot() -> tuple[dict[str, float], dict[str, float]]:
        engines = [c.scrape(f"{url}/metrics", ENGINE_TTFT) for url in sims]
        summed = {name: sum(e[name] for e in engines) for name in ENGINE_TTFT}
        return c.scrape(f"{router.admin}/metrics", LLMGW_TTFT), summed

    def before(_round: int, target: bench.Target) -> None:
        marks[target.name] = snapshot()

    def after(_round: int, target: bench.Target, result: bench.BenchResult) -> None:
        (llmgw0, engine0), (llmgw1, engine1) = marks[target.name], snapshot()
        ttft = result.summary.ttft
        turns[target.name].append(
            {
                "client_p50": ttft.p50 if ttft else None,
                "client_mean": ttft.mean if ttft else None,
                "engine_mean": mean_between(engine0, engine1, ENGINE_TTFT),
                "llmgw_mean": mean_between(llmgw0, llmgw1, LLMGW_TTFT)
                if target.name == "router"
                else None,
            }
        )

    rr = c.RoundRobinTransport(sims, c.pooled_transport(concurrency))
    await c.interleave(
        [(direct, rr), (via, c.pooled_transport(concurrency))],
        config,
        rounds=rounds,
        warm_requests=32,
        before=before,
        after=after,
    )
    return turns


def avg(turns: list[dict[str, float | None]], key: str) -> float | None:
    values = [v for t in turns if (v := t[key]) is not None]
    return statistics.fmean(values) if values else None


def report(results: dict[str, dict[str, Any]]) -> None:
    rows = []
    for level, turns in results.items():
        d, r = turns["direct"], turns["router"]
        diffs = [
            rt["client_p50"] - dt["client_p50"]
            for dt, rt in zip(d, r, strict=True)
            if rt["client_p50"] is not None and dt["client_p50"] is not None
        ]
        d_client, r_client = avg(d, "client_mean"), avg(r, "client_mean")
        d_engine, r_engine = avg(d, "engine_mean"), avg(r, "engine_mean")
        llmgw = avg(r, "llmgw_mean")
        rows.append(
            [
                level,
                c.ms(statistics.median(diffs) if diffs else None),
                " ".join(c.ms(x, 1) for x in diffs),
                f"{c.ms(d_client)} / {c.ms(r_client)}",
                f"{c.ms(d_engine)} / {c.ms(r_engine)}",
                c.ms(llmgw),
                c.ms(None if d_client is None or d_engine is None else d_client - d_engine),
                c.ms(None if r_client is None or r_engine is None else r_client - r_engine),
                c.ms(None if llmgw is None or r_engine is None else llmgw - r_engine),
            ]
        )
    c.print_table(
        "TTFT through llmgw against direct, replicas at 10 ms steps (ms; means over each "
        "turn's streams, averaged over rounds)",
        [
            "streams",
            "added p50 (median of rounds)",
            "per round",
            "client mean d / r",
            "engine mean d / r",
            "llmgw mean",
            "client - engine, direct",
            "client - engine, router",
            "llmgw - engine",
        ],
        rows,
    )


async def main_async(
    fleet: c.Fleet, levels: list[int], first: list[int], rounds: int
) -> dict[str, Any]:
    sims = []
    for i in range(2):
        args = (*ro.PACED_SIM_ARGS, "--seed", str(i))
        sims.append(fleet.sim(f"sim-{i}", *args, model=MODEL)[1])
    router = fleet.router([(f"sim-{i}", base, MODEL) for i, base in enumerate(sims)])
    router.wait_scraped()
    results = {}
    for concurrency in levels:
        c.log(f"{concurrency} streams: {rounds} rounds x (direct, router)")
        results[str(concurrency)] = await run_concurrency(concurrency, rounds, sims, router)
    for concurrency in first:
        with c.cpu_first(router.pid) as done:
            if done is None:
                c.log("--router-first: not permitted to raise llmgw's priority; skipped")
                break
            c.log(f"{concurrency} streams, llmgw's CPU first ({done}): {rounds} rounds")
            label = f"{concurrency}, llmgw's CPU first"
            results[label] = await run_concurrency(concurrency, rounds, sims, router)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--concurrency", type=int, action="append", help="streams (repeatable)")
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds per level")
    p.add_argument(
        "--router-first",
        type=int,
        action="append",
        help="streams to run again with llmgw's process first for the CPU (repeatable; "
        "default 32; 0 for none)",
    )
    args = p.parse_args(argv)
    levels = args.concurrency or [1, 8, 32]
    first = [n for n in (args.router_first or [32]) if n > 0]
    started = time.monotonic()
    with c.fleet() as fleet:
        results = c.run_trio(main_async, fleet, levels, first, args.rounds)
    print(f"ttft_breakdown  llmgw {c.revision()}  {c.machine()}")
    print(
        f"2 llmgw-sim replicas ({' '.join(ro.PACED_SIM_ARGS)}), prompt {ro.PROMPT_TOKENS} "
        f"tokens, 32 output tokens; {args.rounds} rounds of <= 4 s per target and level; "
        f"took {time.monotonic() - started:.0f} s"
    )
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
