"""Router overhead: the same workload sent directly to simulators and through llmgw.

    python benchmarks/router_overhead.py [--quick] [--json]

Setup (all on 127.0.0.1, started and stopped by this script): two fast `llmgw-sim`
replicas (1 ms engine steps, 1 us/token prefill, 256 sequences each, prefix cache off
so the second target of a round cannot profit from the first one's prompts) and one
`llmgw-server` in front of both, configured with scoring targets that match the
replicas' capacity (see ROUTER_CONFIG) and defaults otherwise. Two targets share the replicas:

* direct: the client round-robins requests over the two replicas itself;
* router: the client sends everything to llmgw, which picks a replica.

Phases: non-streaming at concurrency 1, 32 and 128, then streaming (32 output tokens,
one SSE event each) at 1, 32 and 128 (c=1 shows the added latency of an idle router;
at 32 and 128 it includes queueing for CPU), and once more streaming at 32 on two
more replicas whose decode steps take 10 ms, an engine's pace, at which the machine's
cores are not all busy (see PACED_MODEL). Each phase runs the targets interleaved A, B, A, B
(same prompts for both within a round) after a short unmeasured warm-up. Reported per
phase: request throughput and the router/direct ratio; e2e (and for streams TTFT)
distributions of both targets side by side; the added latency as the difference of
means with a ~95% interval (percentile tails are shown, never subtracted); the router
process's CPU time (utime+stime from /proc/<pid>/stat, sampled around each router
turn) per request and per relayed SSE event; its RSS after the 128-stream phase.

The load generator, the simulators and the router share this machine's cores, so
throughput ratios include CPU contention; CPU per request is the steadier number.
Nothing is asserted: the targets are printed beside the measurements.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any

import attrs
import httpx

from llmgw import bench

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _common as c

MODEL = "bench-model"
# A second pair of replicas, with decode steps at an engine's pace (10 ms, where a GPU
# engine's inter-token time lies) instead of 1 ms. With 1 ms steps, 32 streams keep the
# load generator, the replicas and the router wanting more than this machine's two
# cores, so the added TTFT there is mostly waiting for a core; at 10 ms steps the same
# 32 streams leave cores idle and the difference is the router's own latency.
PACED_MODEL = "bench-model-paced"


def sim_args(step_ms: str) -> tuple[str, ...]:
    return (
        "--decode-step-ms", step_ms,
        "--decode-ms-per-seq", "0.01",
        "--prefill-us-per-token", "1",
        "--max-num-seqs", "256",
        "--no-prefix-caching",
    )  # fmt: skip


SIM_ARGS = sim_args("1")
# The replicas take 256 sequences each: the router's scoring targets say so, so that
# admission (which queues requests once a pool looks saturated, against these
# targets) and scoring see them as far from full. With the defaults (8 in flight per
# replica) admission would hold requests back at c=32 already, and this benchmark would
# measure that policy instead of the proxy's cost. Admission still runs on every request.
PACED_SIM_ARGS = sim_args("10")
ROUTER_CONFIG = """\
[router.scoring]
target_inflight = 256
target_waiting = 64
"""
# `--engine llamacpp`: 16 slots sharing the context, one thread each replica (the tiny
# generated model makes thousands of tokens per second on one core).
LLAMA_ARGS = ("-np", "16", "-c", "16384", "--metrics", "--no-webui", "-t", "1")

PROMPT_TOKENS = 64
OUTPUT_TOKENS = 32
LONG_TOKENS = 128

# Design targets (DESIGN.md §11 and the router issue).
TARGET_CPU_PER_REQUEST = 0.5e-3  # s of router CPU per non-streaming request
TARGET_CPU_PER_EVENT = 50e-6  # s of router CPU per relayed SSE event
TARGET_ADDED_TTFT_P50 = 1e-3  # s, at 32 streams
TARGET_RSS = 150 * 2**20  # bytes


@attrs.frozen
class Phase:
    name: str
    stream: bool
    concurrency: int
    output_tokens: int = OUTPUT_TOKENS
    # False: llmgw only (used for the per-event slope, which needs no baseline).
    direct: bool = True
    # True: on the replicas with engine-speed steps (PACED_SIM_ARGS), which leave the
    # machine's cores partly idle at this concurrency.
    paced: bool = False
    # True: llmgw's process gets the CPU before the simulators and the load generator
    # (_common.cpu_first), as a gateway on cores of its own would; skipped when not
    # permitted.
    router_first: bool = False


PHASES = (
    Phase("unary c=1", False, 1),
    Phase("unary c=32", False, 32),
    Phase("unary c=128", False, 128),
    Phase("stream c=1", True, 1),
    Phase("stream c=32", True, 32),
    Phase("stream c=128", True, 128),
    Phase(f"stream c=32, {LONG_TOKENS} tok", True, 32, LONG_TOKENS, direct=False),
    Phase("stream c=32, 10 ms steps", True, 32, paced=True),
    Phase("stream c=32, llmgw's CPU first", True, 32, router_first=True),
    Phase("stream c=32, 10 ms steps, llmgw's CPU first", True, 32, paced=True, router_first=True),
)


@attrs.frozen
class Settings:
    rounds: int
    turn_seconds: float
    turn_requests: int
    warm_requests: int


DEFAULT = Settings(rounds=3, turn_seconds=3.5, turn_requests=5000, warm_requests=64)
QUICK = Settings(rounds=2, turn_seconds=1.0, turn_requests=1500, warm_requests=16)


def count_events(router: c.RouterProc, tokens: int) -> int:
    """SSE events (`data:` lines, [DONE] included) llmgw relays for one benchmark stream."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "count the events"}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    n = 0
    with httpx.stream(
        "POST", f"{router.base}/v1/chat/completions", json=body, timeout=30, trust_env=False
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data:"):
                n += 1
    return n


async def run_phase(
    phase: Phase,
    settings: Settings,
    sims: list[str],
    router: c.RouterProc,
    model: str = MODEL,
) -> dict[str, Any]:
    config = bench.LoadConfig(
        concurrency=phase.concurrency,
        requests=settings.turn_requests,
        duration=settings.turn_seconds,
        stream=phase.stream,
        workload=bench.WorkloadSpec(
            prompt_tokens=PROMPT_TOKENS, output_tokens=phase.output_tokens, seed=1
        ),
        request_timeout=60.0,
    )
    direct = bench.Target(sims[0], model, name="direct")
    via = bench.Target(router.base, model, name="router")
    rr = c.RoundRobinTransport(sims, c.pooled_transport(phase.concurrency))
    cpu: list[float] = []
    overhead = {"sum": 0.0, "count": 0.0}
    mark: dict[str, Any] = {}
    hist = ("llmgw_router_overhead_seconds_sum", "llmgw_router_overhead_seconds_count")

    busy: dict[str, list[float]] = {"direct": [], "router": []}

    def before(_round: int, target: bench.Target) -> None:
        mark["machine"] = c.machine_cpu()
        if target.name == "router":
            mark["metrics"] = c.scrape(f"{router.admin}/metrics", hist)
            mark["cpu"] = c.cpu_seconds(router.pid)

    def after(_round: int, target: bench.Target, _result: bench.BenchResult) -> None:
        frac = c.busy_fraction(mark["machine"], c.machine_cpu())
        if frac is not None:
            busy[target.name].append(frac)
        if target.name == "router":
            cpu.append(c.cpu_seconds(router.pid) - mark["cpu"])
            now = c.scrape(f"{router.admin}/metrics", hist)
            overhead["sum"] += now[hist[0]] - mark["metrics"][hist[0]]
            overhead["count"] += now[hist[1]] - mark["metrics"][hist[1]]

    targets: list[tuple[bench.Target, Any]] = [(via, c.pooled_transport(phase.concurrency))]
    if phase.direct:
        targets.insert(0, (direct, rr))
    turns = await c.interleave(
        targets,
        config,
        rounds=settings.rounds,
        warm_requests=settings.warm_requests,
        before=before,
        after=after,
    )
    merged = [bench.merge(t) for t in turns]
    d, r = (merged[0], merged[1]) if phase.direct else (None, merged[0])
    return {
        "direct": d,
        "router": r,
        "router_cpu": sum(cpu),
        "rr_sent": rr.sent,
        "busy": {k: sum(v) / len(v) if v else None for k, v in busy.items()},
        "decision_mean": overhead["sum"] / overhead["count"] if overhead["count"] else None,
    }


def analyse(phase: Phase, out: dict[str, Any], events_per_stream: int) -> dict[str, Any]:
    d: bench.BenchResult | None = out["direct"]
    r: bench.BenchResult = out["router"]
    ds, rs = (d.summary if d else None), r.summary
    row: dict[str, Any] = {
        "phase": phase.name,
        "stream": phase.stream,
        "concurrency": phase.concurrency,
        "output_tokens": phase.output_tokens,
        "paced": phase.paced,
        "router_first": phase.router_first,
        "direct": ds,
        "router": rs,
        "throughput_ratio": rs.request_throughput / ds.request_throughput
        if ds and ds.request_throughput
        else None,
        "e2e_mean_diff": c.mean_diff(c.ok_values(d, "e2e"), c.ok_values(r, "e2e")) if d else None,
        "router_cpu_seconds": out["router_cpu"],
        "router_requests": rs.requests,
        "router_ok": rs.ok,
        "direct_split": out["rr_sent"] if d else None,
        # Share of all cores busy (any process) during each target's turns.
        "machine_busy": out["busy"],
        # llmgw's own histogram: request start to the first upstream attempt.
        "router_decision_mean": out["decision_mean"],
        "ttft_p50_diff": None,
        "ttft_mean_diff": None,
        "cpu_per_event": None,
    }
    # All requests the router handled in its turns, failed ones included, cost CPU.
    row["cpu_per_request"] = out["router_cpu"] / rs.requests if rs.requests else None
    if phase.stream:
        if ds is not None and d is not None and rs.ttft is not None and ds.ttft is not None:
            row["ttft_p50_diff"] = rs.ttft.p50 - ds.ttft.p50
            row["ttft_mean_diff"] = c.mean_diff(c.ok_values(d, "ttft"), c.ok_values(r, "ttft"))
        events = events_per_stream * rs.ok
        row["events_per_stream"] = events_per_stream
        row["events_relayed"] = events
        row["cpu_per_event"] = out["router_cpu"] / events if events else None
    return row


def event_slope(rows: list[dict[str, Any]]) -> float | None:
    """Router CPU per extra relayed event: two stream lengths at concurrency 32.

    (CPU per 128-token stream - CPU per 32-token stream) / (difference in events): the
    per-request part (parsing, routing, connections) cancels out."""
    pair = [
        x
        for x in rows
        if x["stream"]
        and x["concurrency"] == 32
        and not x["paced"]
        and not x["router_first"]
        and x["cpu_per_request"]
    ]
    short = [x for x in pair if x["output_tokens"] == OUTPUT_TOKENS]
    long = [x for x in pair if x["output_tokens"] == LONG_TOKENS]
    if not short or not long:
        return None
    s, l_ = short[0], long[0]
    extra = l_["events_per_stream"] - s["events_per_stream"]
    return (l_["cpu_per_request"] - s["cpu_per_request"]) / extra if extra else None


def fmt_diff(v: tuple[float, float] | None) -> str:
    if v is None:
        return "-"
    return f"{v[0] * 1e3:+.2f} ± {v[1] * 1e3:.2f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def verdict(value: float | None, target: float) -> str:
    if value is None:
        return "-"
    return "within" if value <= target else "OVER"


def worst(values: list[float | None]) -> float | None:
    """The largest measured value (phases not run are None)."""
    measured = [v for v in values if v is not None]
    return max(measured) if measured else None


def report(result: dict[str, Any]) -> None:
    rows = result["phases"]
    table = []
    for x in rows:
        ds, rs = x["direct"], x["router"]
        if ds is None:
            continue
        table.append(
            [
                x["phase"],
                f"{ds.request_throughput:.0f}",
                f"{rs.request_throughput:.0f}",
                f"{x['throughput_ratio']:.2f}" if x["throughput_ratio"] else "-",
                c.dist_ms(ds.e2e),
                c.dist_ms(rs.e2e),
                fmt_diff(x["e2e_mean_diff"]),
                f"{pct(x['machine_busy']['direct'])} / {pct(x['machine_busy']['router'])}",
                f"{ds.failed}/{rs.failed}",
            ]
        )
    c.print_table(
        "Throughput and end-to-end latency, direct (client round robin over 2 sims) vs "
        "through llmgw (ms; distributions are p50 / p90 / p99)",
        [
            "phase",
            "direct req/s",
            "router req/s",
            "router/direct",
            "direct e2e",
            "router e2e",
            "added e2e, mean ±95%",
            "cores busy d / r",
            "failed d/r",
        ],
        table,
    )
    table = []
    for x in rows:
        if not x["stream"] or x["direct"] is None:
            continue
        ds, rs = x["direct"], x["router"]
        table.append(
            [
                x["phase"],
                c.dist_ms(ds.ttft, 2),
                c.dist_ms(rs.ttft, 2),
                c.ms(x["ttft_p50_diff"], 2),
                fmt_diff(x["ttft_mean_diff"]),
                c.dist_ms(ds.itl, 2),
                c.dist_ms(rs.itl, 2),
            ]
        )
    c.print_table(
        "Streaming: time to first token and inter-token gaps (ms; p50 / p90 / p99)",
        [
            "phase",
            "direct TTFT",
            "router TTFT",
            "TTFT p50 router-direct",
            "added TTFT, mean ±95%",
            "direct ITL",
            "router ITL",
        ],
        table,
    )
    table = []
    for x in rows:
        table.append(
            [
                x["phase"],
                f"{x['router_cpu_seconds']:.2f}",
                f"{x['router_requests']}",
                f"{x['cpu_per_request'] * 1e3:.3f}" if x["cpu_per_request"] is not None else "-",
                f"{x['events_per_stream']}" if x["stream"] else "-",
                f"{x['cpu_per_event'] * 1e6:.1f}" if x["cpu_per_event"] is not None else "-",
                c.ms(x["router_decision_mean"], 3),
            ]
        )
    c.print_table(
        f"llmgw process CPU (utime+stime, {c.clock_tick() * 1e3:.0f} ms ticks) during its "
        "turns; per event = all of it / events relayed (per-request work included); "
        "last column: llmgw's own histogram, request start to first upstream attempt",
        [
            "phase",
            "CPU s",
            "requests",
            "CPU ms/request",
            "events/stream",
            "CPU us/event",
            "decision mean ms",
        ],
        table,
    )
    by = {x["phase"]: x for x in rows}
    unary = [
        by.get(p, {}).get("cpu_per_request") for p in ("unary c=1", "unary c=32", "unary c=128")
    ]
    s32 = by.get("stream c=32", {})
    s32_paced = by.get("stream c=32, 10 ms steps", {})
    s32_first = by.get("stream c=32, llmgw's CPU first", {})
    s32_paced_first = by.get("stream c=32, 10 ms steps, llmgw's CPU first", {})
    s1 = by.get("stream c=1", {})
    events = [by.get(p, {}).get("cpu_per_event") for p in ("stream c=32", "stream c=128")]
    slope = result["event_slope"]
    checks = [
        [
            "router CPU per non-streaming request",
            " / ".join(c.ms(v, 2) for v in unary) + " ms  (c=1 / 32 / 128)",
            f"<= {TARGET_CPU_PER_REQUEST * 1e3:.1f} ms",
            verdict(worst(unary[1:]), TARGET_CPU_PER_REQUEST),
        ],
        [
            "router CPU per relayed SSE event",
            " / ".join("-" if v is None else f"{v * 1e6:.0f}" for v in events)
            + " us  (c=32 / 128; all router CPU / events)",
            f"<= {TARGET_CPU_PER_EVENT * 1e6:.0f} us",
            verdict(worst(events), TARGET_CPU_PER_EVENT),
        ],
        [
            "  same, marginal (slope 32 -> 128 tokens, c=32)",
            "-" if slope is None else f"{slope * 1e6:.0f} us",
            f"<= {TARGET_CPU_PER_EVENT * 1e6:.0f} us",
            verdict(slope, TARGET_CPU_PER_EVENT),
        ],
        [
            "added TTFT p50 at 32 streams",
            c.ms(s32.get("ttft_p50_diff"), 2) + " ms",
            f"<= {TARGET_ADDED_TTFT_P50 * 1e3:.0f} ms",
            verdict(s32.get("ttft_p50_diff"), TARGET_ADDED_TTFT_P50),
        ],
        [
            "  same, engine-pace replicas (10 ms steps)",
            c.ms(s32_paced.get("ttft_p50_diff"), 2)
            + f" ms  (cores busy {pct(s32_paced.get('machine_busy', {}).get('router'))})",
            f"<= {TARGET_ADDED_TTFT_P50 * 1e3:.0f} ms",
            verdict(s32_paced.get("ttft_p50_diff"), TARGET_ADDED_TTFT_P50),
        ],
        [
            "  same, llmgw's CPU first: 1 / 10 ms steps",
            " / ".join(c.ms(x.get("ttft_p50_diff"), 2) for x in (s32_first, s32_paced_first))
            + " ms",
            f"<= {TARGET_ADDED_TTFT_P50 * 1e3:.0f} ms",
            verdict(
                worst([s32_first.get("ttft_p50_diff"), s32_paced_first.get("ttft_p50_diff")]),
                TARGET_ADDED_TTFT_P50,
            ),
        ],
        [
            "  (context) added TTFT p50 at 1 stream",
            c.ms(s1.get("ttft_p50_diff"), 2) + " ms",
            "",
            "",
        ],
        [
            "router RSS after the 128-stream phase",
            f"{result['rss_after'] / 2**20:.0f} MB (at start {result['rss_start'] / 2**20:.0f} MB)",
            f"<= {TARGET_RSS / 2**20:.0f} MB",
            verdict(result["rss_after"], TARGET_RSS),
        ],
        [
            "throughput router/direct",
            ", ".join(
                f"{x['phase']}: {x['throughput_ratio']:.2f}" for x in rows if x["throughput_ratio"]
            ),
            "(no target)",
            "",
        ],
    ]
    c.print_table("Against the targets", ["metric", "measured", "target", ""], checks)


def start_llamacpp(fleet: c.Fleet, index: int) -> str:
    """A real llama.cpp replica of the generated tiny model (``--engine llamacpp``)."""
    from llmgw.agent.adapters.llamacpp import find_llama_server
    from llmgw.testing_gguf import write_tiny_gguf

    binary = find_llama_server()
    if binary is None:
        raise SystemExit("llama-server not found: build it with scripts/llama_server.sh")
    model = fleet.logdir / "tiny.gguf"
    if not model.exists():
        write_tiny_gguf(model, seed=0)
    # llama-server cannot report a port it picked: it is given one held for the run (it
    # binds with SO_REUSEADDR, so it can listen on the held port).
    port = fleet.reserve_port()
    base = f"http://{c.LOOPBACK}:{port}"
    argv = [binary, "-m", str(model), "--host", c.LOOPBACK, "--port", str(port), "-a", MODEL]
    argv += [*LLAMA_ARGS]
    proc = c.Proc(argv, fleet.logdir / f"llama-{index}.log")
    fleet.procs.append(proc)
    proc.wait_http(f"{base}/health")
    return base


async def main_async(
    settings: Settings, fleet: c.Fleet, engine: str = "sim", only: list[str] | None = None
) -> dict[str, Any]:
    sims = []
    for i in range(2):
        if engine == "llamacpp":
            base = start_llamacpp(fleet, i)
        else:
            _, base = fleet.sim(f"sim-{i}", *SIM_ARGS, "--seed", str(i), model=MODEL)
        sims.append(base)
    paced: list[str] = []
    if engine == "sim":
        for i in range(2):
            args = (*PACED_SIM_ARGS, "--seed", str(i))
            paced.append(fleet.sim(f"paced-{i}", *args, model=PACED_MODEL)[1])
    endpoints = [(f"sim-{i}", base, MODEL) for i, base in enumerate(sims)]
    endpoints += [(f"paced-{i}", base, PACED_MODEL) for i, base in enumerate(paced)]
    router = fleet.router(endpoints, config=ROUTER_CONFIG)
    router.wait_scraped()
    children = c.children_of(router.pid)
    events = {n: count_events(router, n) for n in {p.output_tokens for p in PHASES}}
    rss_start = c.rss_bytes(router.pid)
    rows = []
    rss_after = 0
    for phase in PHASES:
        if (phase.paced and not paced) or (only and phase.name not in only):
            continue
        who = "(direct, router)" if phase.direct else "router only"
        with c.cpu_first(router.pid) if phase.router_first else contextlib.nullcontext("") as how:
            if how is None:
                c.log(f"phase {phase.name}: not permitted to raise llmgw's priority; skipped")
                continue
            c.log(f"phase {phase.name}: {settings.rounds} rounds x {who} {how}".rstrip())
            if phase.paced:
                out = await run_phase(phase, settings, paced, router, PACED_MODEL)
            else:
                out = await run_phase(phase, settings, sims, router)
        if phase.stream and phase.concurrency == 128:
            rss_after = c.rss_bytes(router.pid)
        rows.append(analyse(phase, out, events[phase.output_tokens]))
    return {
        "benchmark": "router_overhead",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": c.machine(),
        "revision": c.revision(),
        "settings": attrs.asdict(settings),
        "sim_args": list(SIM_ARGS),
        "paced_sim_args": list(PACED_SIM_ARGS) if paced else None,
        "prompt_tokens": PROMPT_TOKENS,
        "output_tokens": OUTPUT_TOKENS,
        "router_pid": router.pid,
        "router_child_processes": children,
        "events_per_stream": events,
        "rss_start": rss_start,
        "rss_after": rss_after,
        "phases": rows,
        "event_slope": event_slope(rows),
        "targets": {
            "cpu_per_request": TARGET_CPU_PER_REQUEST,
            "cpu_per_event": TARGET_CPU_PER_EVENT,
            "added_ttft_p50_at_32": TARGET_ADDED_TTFT_P50,
            "rss": TARGET_RSS,
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="short turns (under ~40 s in all)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead")
    p.add_argument(
        "--engine",
        choices=("sim", "llamacpp"),
        default="sim",
        help="what the two replicas are: llmgw-sim, or real llama.cpp servers of a tiny "
        "generated model (needs scripts/llama_server.sh)",
    )
    p.add_argument(
        "--phase",
        action="append",
        metavar="NAME",
        help="run only this phase (repeatable), e.g. 'stream c=32'",
    )
    args = p.parse_args(argv)
    if args.phase:
        unknown = set(args.phase) - {x.name for x in PHASES}
        if unknown:
            p.error(f"no phase {sorted(unknown)}; phases: {', '.join(x.name for x in PHASES)}")
    settings = QUICK if args.quick else DEFAULT
    started = time.monotonic()
    result = None
    try:
        with c.fleet() as fleet:
            result = c.run_trio(main_async, settings, fleet, args.engine, args.phase)
    except* KeyboardInterrupt:
        pass  # trio may deliver it inside an exception group
    if result is None:
        print("interrupted; every started process was stopped", file=sys.stderr)
        return 130
    result["wall_seconds"] = time.monotonic() - started
    if args.json:
        print(json.dumps(bench.to_jsonable(result), indent=2, default=str))
    else:
        print(f"router_overhead  {result['date']}  llmgw {result['revision']}  {result['machine']}")
        replicas = (
            f"2 llama.cpp replicas of a tiny generated model ({' '.join(LLAMA_ARGS)})"
            if args.engine == "llamacpp"
            else f"2 llmgw-sim replicas ({' '.join(SIM_ARGS)})"
        )
        print(
            f"{replicas}, prompt {PROMPT_TOKENS} tokens, "
            f"output {OUTPUT_TOKENS} tokens (SSE events per stream incl. role, finish, usage "
            f"and [DONE]: {result['events_per_stream'][OUTPUT_TOKENS]}); "
            f"{settings.rounds} interleaved rounds of "
            f"<= {settings.turn_seconds:g} s per target and phase; "
            f"took {result['wall_seconds']:.0f} s"
        )
        print(
            "llmgw-server: default configuration except "
            + ", ".join(line for line in ROUTER_CONFIG.splitlines() if "=" in line)
            + ' under [router.scoring], and no store (store.url = "")'
        )
        if result["router_child_processes"]:
            print(f"note: llmgw-server has child processes {result['router_child_processes']}")
        report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
