"""Router overhead: the same workload sent directly to engines, through llmgw,
through vllm-router and through sglang-router, in one run.

    benchmarks/setup_peers.sh                 # once: vllm-router, sglang-router, wrk
    python benchmarks/router_overhead.py [--quick] [--json]      # ~11 min; --quick ~2 min
                                         [--engine sim|timer|llamacpp]... [--phase NAME]...
                                         [--no-cache-aware] [--no-sglang] [--no-peers]

Everything runs on 127.0.0.1 and is started and stopped by this script. Two engine
patterns, one after the other, each with its own two replicas and its own routers:

* sim: two fast `llmgw-sim` replicas (1 ms engine steps, 1 us/token prefill, 256
  sequences each, prefix cache off so no target profits from another's prompts). Like
  vLLM, one engine step emits one event for every running stream at once.
* timer: two benchmarks/timer_engine.py replicas (stdlib asyncio, not llmgw's HTTP
  stack), where every stream runs on its own timer: first token 5 ms after the
  request, then one token every 5 ms, out of phase with the other streams.
* (`--engine llamacpp` instead of sim: two llama.cpp servers of a tiny generated model.)

Targets in front of the same replicas, interleaved A, B, C, ... (each round starting
one target later), same prompts for all within a round:

* direct: the load generator spreads requests over the replicas itself;
* llmgw: one `llmgw-server` with its DEFAULT configuration (no store);
  A probe at the start sends 128 streams through it and reports how many queued in
  admission (none should: the replicas run 256 sequences each);
* vllm-router rr and vllm-router cache_aware: PyPI's `vllm-router` (Rust) with its
  round_robin and cache_aware policies, from benchmarks/.venv-peers
  (benchmarks/setup_peers.sh; never a dependency of llmgw itself);
* sglang-router rr and sglang-router cache_aware: PyPI's `sglang-router` (Rust; the
  SGLang Model Gateway, which vllm-router is a fork of), `sglang-router launch
  --worker-urls ...` with the same two policies, from the same venv. Registering a
  replica it reads /health (required), /server_info else /get_server_info and
  /model_info else /get_model_info (optional); the script probes these itself and
  prints what the replicas answered. It also asks the Hugging Face hub for a
  tokenizer of the model /get_model_info names: HF_ENDPOINT points it at a refused
  loopback port instead. (It sets no TCP_NODELAY on client connections: from the
  second request on a keep-alive connection its streams reach the client ~40 ms late,
  Nagle against the client's delayed ACK; its streaming TTFT rows include that.)

Phases: non-streaming through **wrk** (Debian's package; 64 connections, 2 threads,
a Lua script posting chat completions; for direct each wrk thread is pinned to one
replica) on the sim replicas; streaming (32 output tokens, 36 SSE events) at 1, 32
and 128 concurrent streams on sim and 32 and 128 on timer, through llmgw.bench's
client; and routers-only streams of 128 tokens at 32, whose CPU per stream minus that
of the 32-token streams, per extra event, is the marginal CPU per relayed event.

Reported: throughput and its ratio to direct; latency distributions side by side
(never subtracted; added latency is a difference of means with a ~95% interval, and
the added TTFT p50 the targets ask for); each router's CPU (utime+stime from
/proc/<pid>/stat around its turns, all threads, with its child processes: llmgw's
default runs one worker per core behind a control process) per request and per
relayed event;
llmgw's admission queueing; RSS after the 128-stream phase. The load generator, the
engines and the routers share this machine's cores, so throughput ratios include CPU
contention; CPU per request is the steadier number. Nothing is asserted: the issue's
targets are printed beside the measurements.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx

from llmgw import bench

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _common as c
import _wrk

HERE = Path(__file__).resolve().parent
PEERS_VENV = HERE / ".venv-peers"

MODEL = "bench-model"
TIMER_MODEL = "bench-model-timer"


def sim_args(step_ms: str) -> tuple[str, ...]:
    return (
        "--decode-step-ms", step_ms,
        "--decode-ms-per-seq", "0.01",
        "--prefill-us-per-token", "1",
        "--max-num-seqs", "256",
        "--no-prefix-caching",
    )  # fmt: skip


SIM_ARGS = sim_args("1")
# The same with decode steps at an engine's pace (10 ms); ttft_breakdown.py uses it.
PACED_SIM_ARGS = sim_args("10")
TIMER_ARGS = ("--ttft-ms", "5", "--itl-ms", "5", "--max-num-seqs", "256")
# `--engine llamacpp`: 16 slots sharing the context, one thread each replica (the tiny
# generated model makes thousands of tokens per second on one core).
LLAMA_ARGS = ("-np", "16", "-c", "16384", "--metrics", "--no-webui", "-t", "1")

PROMPT_TOKENS = 64
OUTPUT_TOKENS = 32
LONG_TOKENS = 128
WRK_CONNECTIONS = 64
WRK_THREADS = 2
# Distinct request bodies per wrk round (each thread starts at its own offset).
WRK_BODIES = 16384
WRK_START_INDEX = 10_000_000

# Issue #15's targets, against vllm-router in the same run.
TARGET_CPU_PER_REQUEST_RATIO = 2.0  # llmgw / vllm-router, non-streaming
TARGET_CPU_PER_EVENT_RATIO = 1.0  # llmgw / vllm-router, per relayed SSE event
TARGET_ADDED_TTFT_P50 = 2e-3  # s, at 32 streams, on both engine patterns
TARGET_RSS = 150 * 2**20  # bytes, llmgw after 128 streams

DIRECT = "direct"
LLMGW = "llmgw"
# The same server with [listen_tls]: hypercorn serves the client port (HTTP/1.1 here;
# wrk offers no h2). Only in the wrk phases (its CPU per request beside plaintext).
LLMGW_TLS = "llmgw https"
VLLM_RR = "vllm-router rr"
VLLM_CA = "vllm-router cache_aware"
SGLANG_RR = "sglang-router rr"
SGLANG_CA = "sglang-router cache_aware"
PEERS = (VLLM_RR, VLLM_CA, SGLANG_RR, SGLANG_CA)
REFERENCE = VLLM_RR  # the vllm-router row the ratios are taken against

# What sglang-router reads from each worker while registering it, in this order (the
# second name of a pair only after a 404 on the first; seen in its log and through a
# logging proxy), and whether it needs it: without a 200 on /health it never registers
# the worker (its readiness stays "insufficient healthy workers"); without the two
# info endpoints it registers it anyway, as model "unknown" and without labels.
SGLANG_WORKER_PATHS = (
    (("/health",), True),
    (("/server_info", "/get_server_info"), False),
    (("/model_info", "/get_model_info"), False),
)


@attrs.frozen
class Pattern:
    name: str
    model: str


PATTERNS = {
    "sim": Pattern("sim", MODEL),
    "llamacpp": Pattern("llamacpp", MODEL),
    "timer": Pattern("timer", TIMER_MODEL),
}


@attrs.frozen
class Phase:
    name: str
    wrk: bool
    concurrency: int
    output_tokens: int = OUTPUT_TOKENS
    # False: routers only (the per-event slope needs no baseline).
    direct: bool = True
    patterns: tuple[str, ...] = ("sim", "llamacpp", "timer")
    # False: skipped by --quick (context rows: one stream, the per-event slope).
    quick: bool = True


PHASES = (
    Phase(f"unary c={WRK_CONNECTIONS} (wrk)", True, WRK_CONNECTIONS, patterns=("sim", "llamacpp")),
    Phase("stream c=1", False, 1, patterns=("sim", "llamacpp"), quick=False),
    Phase("stream c=32", False, 32),
    Phase("stream c=128", False, 128),
    Phase(f"stream c=32, {LONG_TOKENS} tok", False, 32, LONG_TOKENS, direct=False, quick=False),
)


@attrs.frozen
class Settings:
    rounds: int
    turn_seconds: float
    turn_requests: int
    warm_requests: int
    wrk_rounds: int
    wrk_seconds: float
    wrk_warm_seconds: float
    wrk_requests: int  # a bound on count per wrk turn, beside its duration
    probe_seconds: float
    all_phases: bool = True  # False: only the phases marked quick


DEFAULT = Settings(
    rounds=3,
    turn_seconds=3.5,
    turn_requests=5000,
    warm_requests=64,
    wrk_rounds=2,
    wrk_seconds=10,
    wrk_warm_seconds=1,
    wrk_requests=100_000,
    probe_seconds=2.0,
)
QUICK = Settings(
    rounds=2,
    turn_seconds=1.0,
    turn_requests=1500,
    warm_requests=16,
    wrk_rounds=1,
    wrk_seconds=3,
    wrk_warm_seconds=0,
    wrk_requests=30_000,
    probe_seconds=1.0,
    all_phases=False,
)

LLMGW_HIST = (
    "llmgw_router_overhead_seconds_sum",
    "llmgw_router_overhead_seconds_count",
    "llmgw_admission_wait_seconds_sum",
    "llmgw_admission_wait_seconds_count",
    "llmgw_admission_rejected_total",
)


@attrs.define
class Router:
    """One router process under test."""

    name: str
    kind: str  # "llmgw" | "vllm-router" | "sglang-router"
    base: str
    proc: c.Proc
    metrics_url: str
    settings: str
    events: dict[int, int] = attrs.field(factory=dict)
    rss_start: int = 0
    rss_after_128: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def split(self) -> dict[str, float]:
        """Requests per replica so far, by the router's own counter."""
        if self.kind == "llmgw":
            return c.scrape_by_label(self.metrics_url, "llmgw_requests_total", "endpoint")
        if self.kind == "sglang-router":
            # Per worker it counts circuit-breaker outcomes: one per upstream attempt.
            return c.scrape_by_label(self.metrics_url, "smg_worker_cb_outcomes_total", "worker")
        return c.scrape_by_label(self.metrics_url, "vllm_router_processed_requests_total", "worker")


# -- processes ---------------------------------------------------------------------------


def start_engines(fleet: c.Fleet, pattern: Pattern) -> tuple[list[str], list[c.Proc]]:
    bases: list[str] = []
    procs: list[c.Proc] = []
    for i in range(2):
        if pattern.name == "llamacpp":
            base, proc = start_llamacpp(fleet, i)
        elif pattern.name == "timer":
            ready = fleet.logdir / f"timer-{i}.ready.json"
            argv = [sys.executable, str(HERE / "timer_engine.py"), "--host", c.LOOPBACK]
            argv += ["--port", "0", "--model", pattern.model, *TIMER_ARGS]
            argv += ["--ready-file", str(ready)]
            proc = c.Proc(argv, fleet.logdir / f"timer-{i}.log")
            fleet.procs.append(proc)
            proc.wait_ready_file(ready, timeout=30.0)
            base = proc.url()
        else:
            proc, base = fleet.sim(f"sim-{i}", *SIM_ARGS, "--seed", str(i), model=pattern.model)
        bases.append(base)
        procs.append(proc)
    return bases, procs


def start_llamacpp(fleet: c.Fleet, index: int) -> tuple[str, c.Proc]:
    """A real llama.cpp replica of the generated tiny model (``--engine llamacpp``)."""
    from llmgw.agent.adapters.llamacpp import find_llama_server
    from llmgw.testing.gguf import write_tiny_gguf

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
    return base, proc


def start_llmgw(fleet: c.Fleet, pattern: Pattern, bases: Sequence[str]) -> Router:
    name = f"llmgw-{pattern.name}"
    endpoints = [(f"{pattern.name}-{i}", base, pattern.model) for i, base in enumerate(bases)]
    rp = fleet.router(endpoints, config=None, name=name)
    rp.wait_scraped()
    settings = "default configuration"
    return Router(
        LLMGW,
        "llmgw",
        rp.base,
        rp.proc,
        f"{rp.admin}/metrics",
        settings + ', no store (store.url = "")',
    )


def start_llmgw_tls(fleet: c.Fleet, pattern: Pattern, bases: Sequence[str]) -> Router:
    from llmgw.transport.certs import make_ca, make_server_cert

    pki = fleet.logdir / f"pki-{pattern.name}"
    pair = make_server_cert(pki, make_ca(pki), ("127.0.0.1", "localhost"))
    config = f'[store]\nurl = ""\n\n[listen_tls]\ncert = "{pair.cert}"\nkey = "{pair.key}"\n'
    endpoints = [(f"{pattern.name}-{i}", base, pattern.model) for i, base in enumerate(bases)]
    rp = fleet.router(endpoints, config=config, name=f"llmgw-tls-{pattern.name}")
    rp.wait_scraped()
    return Router(
        LLMGW_TLS,
        "llmgw",
        rp.base.replace("http://", "https://", 1),
        rp.proc,
        f"{rp.admin}/metrics",
        "default configuration plus [listen_tls] (EC P-256 certificate), no store",
    )


def start_vllm_router(
    fleet: c.Fleet, binary: Path, pattern: Pattern, bases: Sequence[str], policy: str
) -> Router:
    peer = c.start_vllm_router(
        fleet, binary, bases, policy, name=f"vllm-router-{policy}-{pattern.name}"
    )
    name = VLLM_RR if policy == "round_robin" else VLLM_CA
    return Router(name, peer.kind, peer.base, peer.proc, peer.metrics_url, peer.flags)


def probe_worker_paths(bases: Sequence[str]) -> dict[str, dict[str, int | str]]:
    """Per replica, the status each path sglang-router reads at registration answers
    (SGLANG_WORKER_PATHS; the fallback only after a 404, as sglang-router does)."""
    out: dict[str, dict[str, int | str]] = {}
    for base in bases:
        seen: dict[str, int | str] = {}
        for paths, _ in SGLANG_WORKER_PATHS:
            for path in paths:
                try:
                    r = httpx.get(f"{base}{path}", timeout=5, trust_env=False)
                    status: int | str = r.status_code
                except httpx.HTTPError as e:
                    status = type(e).__name__
                seen[path] = status
                if status != 404:
                    break
        out[base] = seen
    return out


def worker_paths_note(probe: dict[str, dict[str, int | str]]) -> str:
    """One line for the header: what the replicas answered (all alike, else per replica)."""
    texts = {
        base: ", ".join(f"{path} {status}" for path, status in seen.items())
        for base, seen in probe.items()
    }
    if len(set(texts.values())) == 1:
        return next(iter(texts.values()))
    return "; ".join(f"replica {i}: {t}" for i, t in enumerate(texts.values()))


def worker_paths_missing(probe: dict[str, dict[str, int | str]]) -> list[str]:
    """What a replica lacks of what sglang-router reads (no 200 on either name), each
    marked required or optional."""
    missing: list[str] = []
    for seen in probe.values():
        for paths, required in SGLANG_WORKER_PATHS:
            if not any(seen.get(path) == 200 for path in paths):
                name = " or ".join(paths)
                name += " (required)" if required else ' (optional: model "unknown")'
                if name not in missing:
                    missing.append(name)
    return missing


def start_sglang_router(
    fleet: c.Fleet, binary: Path, pattern: Pattern, bases: Sequence[str], policy: str
) -> Router:
    """sglang-router in front of `bases` (benchmarks/_common.py starts it: no traffic
    leaves loopback); RuntimeError when it does not take every replica within 60 s."""
    peer = c.start_sglang_router(
        fleet, binary, bases, policy, name=f"sglang-router-{policy}-{pattern.name}"
    )
    name = SGLANG_RR if policy == "round_robin" else SGLANG_CA
    return Router(name, peer.kind, peer.base, peer.proc, peer.metrics_url, peer.flags)


def count_events(base: str, model: str, tokens: int) -> int:
    """SSE events (`data:` lines, [DONE] included) relayed for one benchmark stream."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "count the events"}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    n = 0
    with httpx.stream(
        "POST", f"{base}/v1/chat/completions", json=body, timeout=30, trust_env=False
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data:"):
                n += 1
    return n


# -- measuring -------------------------------------------------------------------------------


class Meter:
    """Around each turn: machine CPU, and for a router its CPU, counters and split."""

    def __init__(self, routers: dict[str, Router]) -> None:
        self.routers = routers
        self.mark: dict[str, Any] = {}
        self.busy: dict[str, list[float]] = {}
        self.cpu: dict[str, float] = {}
        self.counters: dict[str, dict[str, float]] = {}
        self.split: dict[str, dict[str, float]] = {}

    def before(self, name: str) -> None:
        self.mark = {"machine": c.machine_cpu()}
        r = self.routers.get(name)
        if r is not None:
            self.mark["split"] = r.split()
            if r.kind == "llmgw":
                self.mark["counters"] = c.scrape(r.metrics_url, LLMGW_HIST)
            self.mark["cpu"] = c.cpu_seconds_tree(r.pid)

    def after(self, name: str) -> None:
        r = self.routers.get(name)
        if r is not None:
            self.cpu[name] = self.cpu.get(name, 0.0) + c.cpu_seconds_tree(r.pid) - self.mark["cpu"]
            frac = c.busy_fraction(self.mark["machine"], c.machine_cpu())
            split = r.split()
            acc = self.split.setdefault(name, {})
            for k, v in split.items():
                acc[k] = acc.get(k, 0.0) + v - self.mark["split"].get(k, 0.0)
            if r.kind == "llmgw":
                now = c.scrape(r.metrics_url, LLMGW_HIST)
                acc2 = self.counters.setdefault(name, dict.fromkeys(LLMGW_HIST, 0.0))
                for k in LLMGW_HIST:
                    acc2[k] += now[k] - self.mark["counters"][k]
        else:
            frac = c.busy_fraction(self.mark["machine"], c.machine_cpu())
        if frac is not None:
            self.busy.setdefault(name, []).append(frac)

    def record(self, name: str) -> dict[str, Any]:
        busy = self.busy.get(name) or []
        out: dict[str, Any] = {
            "cpu_seconds": self.cpu.get(name),
            "busy": sum(busy) / len(busy) if busy else None,
            "split": self.split.get(name),
        }
        k = self.counters.get(name)
        if k is not None:
            out["admission_queued"] = k["llmgw_admission_wait_seconds_count"]
            out["admission_wait_mean"] = (
                k["llmgw_admission_wait_seconds_sum"] / k["llmgw_admission_wait_seconds_count"]
                if k["llmgw_admission_wait_seconds_count"]
                else None
            )
            out["admission_rejected"] = k["llmgw_admission_rejected_total"]
            out["decision_mean"] = (
                k["llmgw_router_overhead_seconds_sum"] / k["llmgw_router_overhead_seconds_count"]
                if k["llmgw_router_overhead_seconds_count"]
                else None
            )
        return out


def load_config(settings: Settings, phase: Phase) -> bench.LoadConfig:
    return bench.LoadConfig(
        concurrency=phase.concurrency,
        requests=settings.turn_requests,
        duration=settings.turn_seconds,
        stream=not phase.wrk,
        workload=bench.WorkloadSpec(
            prompt_tokens=PROMPT_TOKENS, output_tokens=phase.output_tokens, seed=1
        ),
        request_timeout=60.0,
    )


async def run_stream_phase(
    phase: Phase, settings: Settings, pattern: Pattern, bases: list[str], routers: list[Router]
) -> dict[str, Any]:
    config = load_config(settings, phase)
    by_name = {r.name: r for r in routers}
    targets: list[tuple[bench.Target, Any]] = []
    rr = c.RoundRobinTransport(bases, c.pooled_transport(phase.concurrency))
    if phase.direct:
        targets.append((bench.Target(bases[0], pattern.model, name=DIRECT), rr))
    for r in routers:
        targets.append(
            (
                bench.Target(r.base, pattern.model, name=r.name),
                c.pooled_transport(phase.concurrency),
            )
        )
    meter = Meter(by_name)
    turns = await c.interleave(
        targets,
        config,
        rounds=settings.rounds,
        warm_requests=min(settings.warm_requests, max(8, 2 * phase.concurrency)),
        before=lambda _r, t: meter.before(t.name),
        after=lambda _r, t, _res: meter.after(t.name),
        rotate=True,
    )
    out: dict[str, Any] = {}
    for (target, _), results in zip(targets, turns, strict=True):
        merged = bench.merge(results)
        out[target.name] = {"result": merged, **meter.record(target.name)}
    if phase.direct:
        out[DIRECT]["split"] = dict(enumerate(rr.sent))
    return out


def wrk_bodies(path: Path, model: str, start: int, n: int) -> Path:
    workload = bench.Workload(
        bench.WorkloadSpec(prompt_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS, seed=1)
    )
    target = bench.Target("unused", model)
    config = bench.LoadConfig(stream=False)
    return _wrk.write_bodies(
        path,
        (
            bench.runner.request_body(target, config, workload.prompt(i))
            for i in range(start, start + n)
        ),
    )


async def run_wrk_phase(
    phase: Phase,
    settings: Settings,
    pattern: Pattern,
    bases: list[str],
    routers: list[Router],
    wrk: str,
    logdir: Path,
) -> dict[str, Any]:
    by_name = {r.name: r for r in routers}
    names = ([DIRECT] if phase.direct else []) + [r.name for r in routers]
    url_of = {DIRECT: bases[0], **{r.name: r.base for r in routers}}
    path = "/v1/chat/completions"
    log = logdir / f"wrk-{pattern.name}.log"
    cap = max(1, settings.wrk_requests // WRK_THREADS)
    spread = [b.removeprefix("http://") for b in bases]

    def script(name: str, bodies: Path, tag: str) -> Path:
        addrs = spread if name == DIRECT else []
        return _wrk.write_script(
            logdir / f"wrk-{pattern.name}-{tag}-{'direct' if name == DIRECT else 'router'}.lua",
            bodies,
            threads=WRK_THREADS,
            cap=cap,
            addrs=addrs,
        )

    async def one(name: str, bodies: Path, tag: str, seconds: float) -> _wrk.WrkResult:
        return await _wrk.run(
            wrk,
            url_of[name] + path,
            script(name, bodies, tag),
            threads=WRK_THREADS,
            connections=phase.concurrency,
            seconds=seconds,
            log=log,
        )

    if settings.wrk_warm_seconds > 0:
        warm = wrk_bodies(
            logdir / f"wrk-{pattern.name}-warm.jsonl", pattern.model, 50_000_000, 2048
        )
        for name in names:
            await one(name, warm, "warm", settings.wrk_warm_seconds)
        warm.unlink()
    meter = Meter(by_name)
    per: dict[str, list[_wrk.WrkResult]] = {n: [] for n in names}
    for rnd in range(settings.wrk_rounds):
        bodies = wrk_bodies(
            logdir / f"wrk-{pattern.name}-round{rnd}.jsonl",
            pattern.model,
            WRK_START_INDEX + rnd * WRK_BODIES,
            WRK_BODIES,
        )
        for j in range(len(names)):
            name = names[(rnd + j) % len(names)]
            meter.before(name)
            res = await one(name, bodies, f"round{rnd}", settings.wrk_seconds)
            meter.after(name)
            per[name].append(res)
        bodies.unlink()  # megabytes each
    return {n: {"result": _wrk.merge(per[n]), **meter.record(n)} for n in names}


async def probe_admission(settings: Settings, router: Router, model: str) -> dict[str, float]:
    """A short burst of 128 streams through the default llmgw: did admission queue?"""
    config = bench.LoadConfig(
        concurrency=128,
        requests=4000,
        duration=settings.probe_seconds,
        stream=True,
        workload=bench.WorkloadSpec(
            prompt_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS, seed=2
        ),
        request_timeout=60.0,
        start_index=70_000_000,
    )
    before = c.scrape(router.metrics_url, LLMGW_HIST)
    async with bench.runner.open_client(config, c.pooled_transport(128)) as client:
        result = await bench.run_with_client(client, bench.Target(router.base, model), config)
    after = c.scrape(router.metrics_url, LLMGW_HIST)
    return {
        "requests": result.summary.requests,
        "queued": after["llmgw_admission_wait_seconds_count"]
        - before["llmgw_admission_wait_seconds_count"],
        "rejected": after["llmgw_admission_rejected_total"]
        - before["llmgw_admission_rejected_total"],
    }


# -- analysis --------------------------------------------------------------------------------


def analyse(
    pattern: Pattern, phase: Phase, out: dict[str, Any], routers: dict[str, Router]
) -> list[dict[str, Any]]:
    rows = []
    d = out.get(DIRECT)
    for name, rec in out.items():
        res = rec["result"]
        router = routers.get(name)
        row: dict[str, Any] = {
            "pattern": pattern.name,
            "phase": phase.name,
            "wrk": phase.wrk,
            "concurrency": phase.concurrency,
            "output_tokens": phase.output_tokens,
            "target": name,
            **{k: v for k, v in rec.items() if k != "result"},
            "throughput_ratio": None,
            "e2e_mean_diff": None,
            "ttft_p50_diff": None,
            "ttft_mean_diff": None,
            "cpu_per_request": None,
            "cpu_per_event": None,
            "events_per_stream": None,
        }
        if phase.wrk:
            row["wrk_result"] = attrs.asdict(res)
            row["requests"], row["ok"], row["failed"] = res.requests, res.ok, res.failed
            row["request_throughput"] = res.request_throughput
            if d is not None and name != DIRECT:
                dr = d["result"]
                if dr.request_throughput:
                    row["throughput_ratio"] = res.request_throughput / dr.request_throughput
                row["e2e_mean_diff"] = _wrk.mean_diff(dr, res)
        else:
            s = res.summary
            row["summary"] = s
            row["requests"], row["ok"], row["failed"] = s.requests, s.ok, s.failed
            row["request_throughput"] = s.request_throughput
            if d is not None and name != DIRECT:
                dr = d["result"]
                ds = dr.summary
                if ds.request_throughput:
                    row["throughput_ratio"] = s.request_throughput / ds.request_throughput
                row["e2e_mean_diff"] = c.mean_diff(c.ok_values(dr, "e2e"), c.ok_values(res, "e2e"))
                if s.ttft is not None and ds.ttft is not None:
                    row["ttft_p50_diff"] = s.ttft.p50 - ds.ttft.p50
                    row["ttft_mean_diff"] = c.mean_diff(
                        c.ok_values(dr, "ttft"), c.ok_values(res, "ttft")
                    )
        if router is not None and row["cpu_seconds"] is not None and row["requests"]:
            # All requests the router handled in its turns, failed ones included, cost CPU.
            row["cpu_per_request"] = row["cpu_seconds"] / row["requests"]
            if not phase.wrk:
                per_stream = router.events[phase.output_tokens]
                row["events_per_stream"] = per_stream
                events = per_stream * row["ok"]
                row["events_relayed"] = events
                row["cpu_per_event"] = row["cpu_seconds"] / events if events else None
        rows.append(row)
    return rows


def event_slope(rows: list[dict[str, Any]], pattern: str, target: str) -> float | None:
    """Router CPU per extra relayed event: 128- against 32-token streams at c=32.

    (CPU per long stream - CPU per short stream) / (difference in events): the
    per-request part (parsing, routing, connections) cancels out."""
    pick = {
        x["output_tokens"]: x
        for x in rows
        if x["pattern"] == pattern
        and x["target"] == target
        and not x["wrk"]
        and x["concurrency"] == 32
        and x["cpu_per_request"] is not None
    }
    s, l_ = pick.get(OUTPUT_TOKENS), pick.get(LONG_TOKENS)
    if s is None or l_ is None:
        return None
    extra = l_["events_per_stream"] - s["events_per_stream"]
    return (l_["cpu_per_request"] - s["cpu_per_request"]) / extra if extra else None


# -- report ----------------------------------------------------------------------------------


def fmt_diff(v: tuple[float, float] | None) -> str:
    if v is None:
        return "-"
    return f"{v[0] * 1e3:+.2f} ± {v[1] * 1e3:.2f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def wrk_dist(r: _wrk.WrkResult) -> str:
    return f"{r.p50 * 1e3:.1f} / {r.p90 * 1e3:.1f} / {r.p99 * 1e3:.1f}"


def fmt_split(split: dict[Any, float] | None) -> str:
    if not split:
        return "-"
    return " / ".join(f"{v:.0f}" for _, v in sorted(split.items(), key=lambda kv: str(kv[0])))


def mb(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**20:.0f}"


def ratio2(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def us(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x * 1e6:.{digits}f}"


def report(result: dict[str, Any]) -> None:
    rows = result["rows"]
    for pname in result["patterns"]:
        prow = [x for x in rows if x["pattern"] == pname]
        if not prow:
            continue
        table = []
        for x in prow:
            if x["target"] != DIRECT and not any(
                y["target"] == DIRECT and y["phase"] == x["phase"] for y in prow
            ):
                continue  # routers-only phases are in the CPU table
            if x["wrk"]:
                dist = wrk_dist(_wrk.WrkResult(**x["wrk_result"]))
                if x["wrk_result"]["capped_threads"]:
                    dist += " (capped)"
            else:
                dist = c.dist_ms(x["summary"].e2e)
            table.append(
                [
                    x["phase"],
                    x["target"],
                    f"{x['request_throughput']:.0f}",
                    "-" if x["throughput_ratio"] is None else f"{x['throughput_ratio']:.2f}",
                    dist,
                    fmt_diff(x["e2e_mean_diff"]),
                    pct(x["busy"]),
                    f"{x['failed']}/{x['requests']}",
                ]
            )
        c.print_table(
            f"{pname} engines: throughput and end-to-end latency (ms; p50 / p90 / p99; "
            "wrk's for the wrk phase); added = mean minus direct's",
            [
                "phase",
                "target",
                "req/s",
                "x direct",
                "e2e",
                "added e2e, mean ±95%",
                "cores busy",
                "failed/requests",
            ],
            table,
        )
        table = []
        for x in prow:
            if x["wrk"] or "summary" not in x or x["output_tokens"] != OUTPUT_TOKENS:
                continue
            s = x["summary"]
            table.append(
                [
                    x["phase"],
                    x["target"],
                    c.dist_ms(s.ttft, 2),
                    c.ms(x["ttft_p50_diff"], 2),
                    fmt_diff(x["ttft_mean_diff"]),
                    c.dist_ms(s.itl, 2),
                ]
            )
        c.print_table(
            f"{pname} engines, streaming: time to first token and inter-token gaps "
            "(ms; p50 / p90 / p99)",
            ["phase", "target", "TTFT", "TTFT p50 - direct", "added TTFT, mean ±95%", "ITL"],
            table,
        )
    table = []
    for x in rows:
        if x["target"] == DIRECT:
            continue
        adm = "-"
        if "admission_queued" in x:
            adm = f"{x['admission_queued']:.0f}"
            if x.get("admission_wait_mean") is not None:
                adm += f", {x['admission_wait_mean'] * 1e3:.0f} ms"
        table.append(
            [
                f"{x['pattern']}: {x['phase']}",
                x["target"],
                "-" if x["cpu_seconds"] is None else f"{x['cpu_seconds']:.2f}",
                f"{x['requests']}",
                c.ms(x["cpu_per_request"], 3),
                "-" if x["events_per_stream"] is None else f"{x['events_per_stream']}",
                us(x["cpu_per_event"], 1),
                fmt_split(x["split"]),
                adm,
                c.ms(x.get("decision_mean"), 3),
            ]
        )
    c.print_table(
        f"Router process CPU (utime+stime, all threads, {c.clock_tick() * 1e3:.0f} ms ticks) "
        "during its turns; per event = all of it / events relayed (per-request work "
        "included); llmgw's admission: requests queued and their mean wait; decision: "
        "llmgw's own histogram, request start to first upstream attempt",
        [
            "engines: phase",
            "router",
            "CPU s",
            "requests",
            "CPU ms/request",
            "events/stream",
            "CPU us/event",
            "requests per replica",
            "admission queued",
            "decision ms",
        ],
        table,
    )
    report_targets(result)


def report_targets(result: dict[str, Any]) -> None:
    rows = result["rows"]
    names = [n for n in (LLMGW, *PEERS) if any(x["target"] == n for x in rows)]
    contenders = [n for n in (LLMGW,) if n in names]

    def get(pattern: str, phase: str, target: str, key: str) -> Any:
        for x in rows:
            if x["pattern"] == pattern and x["phase"] == phase and x["target"] == target:
                return x.get(key)
        return None

    def verdicts(values: dict[str, float | None], limit: float) -> str:
        parts = []
        for n in contenders:
            v = values.get(n)
            if v is not None:
                label = "default"
                parts.append(f"{label} {'within' if v <= limit else 'OVER'}")
        return ", ".join(parts) or "-"

    table: list[list[str]] = []

    def add(
        metric: str,
        pattern: str,
        values: dict[str, float | None],
        fmt: Callable[[float | None], str],
        target: str,
        ratio_limit: float | None = None,
        abs_limit: float | None = None,
        ratio_column: bool = True,
    ) -> None:
        ref = values.get(REFERENCE)
        ratios = {
            n: (values[n] / ref if values.get(n) is not None and ref else None) for n in contenders
        }
        ratio = " / ".join("-" if ratios[n] is None else f"{ratios[n]:.2f}x" for n in contenders)
        if not ratio_column:
            ratio = "-"
        if ratio_limit is not None:
            verdict = verdicts(ratios, ratio_limit)
        elif abs_limit is not None:
            verdict = verdicts(values, abs_limit)
        else:
            verdict = ""
        table.append(
            [metric, pattern, *(fmt(values.get(n)) for n in names), ratio, target, verdict]
        )

    patterns = result["patterns"]
    unary = f"unary c={WRK_CONNECTIONS} (wrk)"
    per_request = f"<= {TARGET_CPU_PER_REQUEST_RATIO:g}x vllm-router"
    per_event = f"<= {TARGET_CPU_PER_EVENT_RATIO:g}x vllm-router"
    for p in patterns:
        vals = {n: get(p, unary, n, "cpu_per_request") for n in names}
        if any(v is not None for v in vals.values()):
            metric = "CPU per non-streaming request, ms"
            add(metric, p, vals, lambda v: c.ms(v, 3), per_request, TARGET_CPU_PER_REQUEST_RATIO)
    for p in patterns:
        plain, tls = (
            get(p, unary, LLMGW, "cpu_per_request"),
            get(p, unary, LLMGW_TLS, "cpu_per_request"),
        )
        if plain is not None and tls is not None:
            shown = {n: tls if n == LLMGW else None for n in names}
            add(
                f"  same, llmgw over TLS (plaintext {c.ms(plain, 3)} ms: {tls / plain:.2f}x)",
                p,
                shown,
                lambda v: c.ms(v, 3),
                "(reported)",
            )
    for p in patterns:
        for conc in (32, 128):
            vals = {n: get(p, f"stream c={conc}", n, "cpu_per_event") for n in names}
            if any(v is not None for v in vals.values()):
                metric = f"CPU per relayed SSE event, us, c={conc}"
                add(metric, p, vals, lambda v: us(v, 1), per_event, TARGET_CPU_PER_EVENT_RATIO)
        vals = {n: event_slope(rows, p, n) for n in names}
        if any(v is not None for v in vals.values()):
            metric = "  same, marginal (128- vs 32-token streams)"
            add(metric, p, vals, lambda v: us(v, 1), per_event, TARGET_CPU_PER_EVENT_RATIO)
    for p in patterns:
        for conc in (32, 128, 1):
            vals = {n: get(p, f"stream c={conc}", n, "ttft_p50_diff") for n in names}
            if not any(v is not None for v in vals.values()):
                continue
            if conc == 32:
                limit = f"<= {TARGET_ADDED_TTFT_P50 * 1e3:g} ms"
                metric = "added TTFT p50 at 32 streams, ms"
                add(
                    metric,
                    p,
                    vals,
                    lambda v: c.ms(v, 2),
                    limit,
                    abs_limit=TARGET_ADDED_TTFT_P50,
                    ratio_column=False,
                )
            else:
                metric = f"  (context) at {conc} stream{'s' if conc > 1 else ''}, ms"
                add(metric, p, vals, lambda v: c.ms(v, 2), "", ratio_column=False)
    for p in patterns:
        vals = {n: result["rss_after_128"].get(p, {}).get(n) for n in names}
        if any(v is not None for v in vals.values()):
            limit = f"<= {TARGET_RSS / 2**20:.0f} MB (llmgw)"
            add("RSS after the 128-stream phase, MB", p, vals, mb, limit, abs_limit=TARGET_RSS)
    for p in patterns:
        for phase in PHASES:
            vals = {n: get(p, phase.name, n, "throughput_ratio") for n in names}
            if any(v is not None for v in vals.values()):
                metric = f"throughput / direct, {phase.name}"
                add(metric, p, vals, ratio2, "(no target)", ratio_column=False)
    c.print_table(
        "Against issue #15's targets (llmgw / vllm-router rr; ratios are llmgw with its "
        "default configuration over vllm-router rr; sglang-router's numbers beside them, "
        "no target of their own; nothing asserted)",
        ["metric", "engines", *names, "llmgw / vllm-router rr", "target", "verdict"],
        table,
    )


# -- main ------------------------------------------------------------------------------------


async def main_async(
    settings: Settings,
    fleet: c.Fleet,
    *,
    engines: list[str],
    only: list[str] | None,
    cache_aware: bool,
    peers: bool,
    sglang: bool,
    peers_venv: Path,
    wrk: str,
) -> dict[str, Any]:
    vllm_bin = c.peer_binary("vllm-router", peers_venv) if peers else None
    sglang_bin = c.peer_binary("sglang-router", peers_venv) if peers and sglang else None
    # Per engine pattern: what the replicas answered on the paths sglang-router reads,
    # what they lack of them, and whether sglang-router could not be started.
    sglang_workers: dict[str, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    probe: dict[str, Any] | None = None
    rss_after_128: dict[str, dict[str, int]] = {}
    router_info: dict[str, dict[str, Any]] = {}
    child_processes: dict[str, list[int]] = {}
    for pname in engines:
        pattern = PATTERNS[pname]
        phases = [
            p
            for p in PHASES
            if pname in p.patterns and (p.name in only if only else settings.all_phases or p.quick)
        ]
        if not phases:
            continue
        c.log(f"[{pname}] starting 2 replicas and the routers")
        bases, engine_procs = start_engines(fleet, pattern)
        routers = [start_llmgw(fleet, pattern, bases)]
        tls_router = start_llmgw_tls(fleet, pattern, bases) if any(p.wrk for p in phases) else None
        if probe is None:
            probe = await probe_admission(settings, routers[0], pattern.model)
            c.log(
                f"probe, 128 streams through default llmgw: {probe['queued']:.0f} of "
                f"{probe['requests']} requests queued in admission, {probe['rejected']:.0f} "
                "refused"
            )
        if vllm_bin is not None:
            routers.append(start_vllm_router(fleet, vllm_bin, pattern, bases, "round_robin"))
            if cache_aware:
                routers.append(start_vllm_router(fleet, vllm_bin, pattern, bases, "cache_aware"))
        if sglang_bin is not None:
            probe_paths = probe_worker_paths(bases)
            info: dict[str, Any] = {
                "paths": probe_paths,
                "note": worker_paths_note(probe_paths),
                "missing": worker_paths_missing(probe_paths),
                "failed": None,
            }
            sglang_workers[pname] = info
            if info["missing"]:
                c.log(
                    f"[{pname}] the replicas lack what sglang-router reads: "
                    f"{', '.join(info['missing'])}; they answered {info['note']}"
                )
            started: list[Router] = []
            try:
                for policy in ("round_robin", "cache_aware") if cache_aware else ("round_robin",):
                    started.append(start_sglang_router(fleet, sglang_bin, pattern, bases, policy))
            except RuntimeError as e:
                # Reported, and the run goes on without sglang-router on these engines.
                fleet.stop([r.proc for r in started])
                started = []
                info["failed"] = str(e)
                c.log(f"[{pname}] sglang-router left out: {str(e).splitlines()[0]}")
            routers += started
        by_name = {r.name: r for r in routers}
        if tls_router is not None:
            by_name[tls_router.name] = tls_router
            router_info.setdefault(
                tls_router.name, {"kind": tls_router.kind, "settings": tls_router.settings}
            )
        for r in routers:
            r.events = {
                n: count_events(r.base, pattern.model, n) for n in {p.output_tokens for p in phases}
            }
            r.rss_start = c.rss_bytes_tree(r.pid)
            router_info.setdefault(r.name, {"kind": r.kind, "settings": r.settings})
            router_info[r.name].setdefault("events_per_stream", {})[pname] = r.events
            kids = c.children_of(r.pid)
            if kids:
                child_processes[f"{pname}/{r.name}"] = kids
        for phase in phases:
            who = ", ".join(([DIRECT] if phase.direct else []) + [r.name for r in routers])
            rounds = settings.wrk_rounds if phase.wrk else settings.rounds
            c.log(f"[{pname}] phase {phase.name}: {rounds} rounds x ({who})")
            if phase.wrk:
                wrk_routers = routers + ([tls_router] if tls_router is not None else [])
                out = await run_wrk_phase(
                    phase, settings, pattern, bases, wrk_routers, wrk, fleet.logdir
                )
            else:
                out = await run_stream_phase(phase, settings, pattern, bases, routers)
            if not phase.wrk and phase.concurrency == 128:
                for r in routers:
                    r.rss_after_128 = c.rss_bytes_tree(r.pid)
            rows += analyse(pattern, phase, out, by_name)
        rss_after_128[pname] = {
            r.name: r.rss_after_128 for r in routers if r.rss_after_128 is not None
        }
        for r in routers:
            router_info[r.name].setdefault("rss_start", {})[pname] = r.rss_start
        fleet.stop([r.proc for r in routers] + engine_procs)
    return {
        "benchmark": "router_overhead",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": c.machine(),
        "revision": c.revision(),
        "settings": attrs.asdict(settings),
        "patterns": [p for p in engines if any(x["pattern"] == p for x in rows)],
        "sim_args": list(SIM_ARGS),
        "timer_args": list(TIMER_ARGS),
        "llama_args": list(LLAMA_ARGS),
        "prompt_tokens": PROMPT_TOKENS,
        "output_tokens": OUTPUT_TOKENS,
        "wrk": {
            "binary": wrk,
            "version": _wrk.version(wrk),
            "connections": WRK_CONNECTIONS,
            "threads": WRK_THREADS,
        },
        "vllm_router": (
            {"version": c.peer_version("vllm-router", peers_venv), "binary": str(vllm_bin)}
            if vllm_bin is not None
            else None
        ),
        "peers_venv": str(peers_venv),
        "sglang_router": (
            {
                "version": c.peer_version("sglang-router", peers_venv),
                "binary": str(sglang_bin),
                "worker_paths": sglang_workers,
            }
            if sglang_bin is not None
            else None
        ),
        "probe": probe,
        "routers": router_info,
        "router_child_processes": child_processes,
        "rss_after_128": rss_after_128,
        "rows": rows,
        "targets": {
            "cpu_per_request_ratio": TARGET_CPU_PER_REQUEST_RATIO,
            "cpu_per_event_ratio": TARGET_CPU_PER_EVENT_RATIO,
            "added_ttft_p50_at_32": TARGET_ADDED_TTFT_P50,
            "rss": TARGET_RSS,
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="short turns (under ~2 min in all)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead")
    p.add_argument(
        "--engine",
        action="append",
        choices=sorted(PATTERNS),
        help="engine patterns to run, in order (repeatable; default: sim, then timer); "
        "llamacpp: real llama.cpp servers of a tiny generated model "
        "(needs scripts/llama_server.sh)",
    )
    p.add_argument(
        "--phase",
        action="append",
        metavar="NAME",
        help="run only this phase (repeatable), e.g. 'stream c=32'",
    )
    p.add_argument(
        "--no-cache-aware",
        action="store_true",
        help="skip the cache_aware policy of vllm-router and sglang-router",
    )
    p.add_argument("--no-sglang", action="store_true", help="no sglang-router targets")
    p.add_argument(
        "--no-peers",
        action="store_true",
        help="no vllm-router or sglang-router targets (direct and llmgw only)",
    )
    p.add_argument(
        "--peers-venv",
        type=Path,
        default=PEERS_VENV,
        help=f"venv holding vllm-router and sglang-router (default {PEERS_VENV}; "
        "made by setup_peers.sh)",
    )
    args = p.parse_args(argv)
    if args.phase:
        unknown = set(args.phase) - {x.name for x in PHASES}
        if unknown:
            p.error(f"no phase {sorted(unknown)}; phases: {', '.join(x.name for x in PHASES)}")
    engines = args.engine or ["sim", "timer"]
    wrk = _wrk.find()
    if wrk is None:
        print(
            f"router_overhead: {_wrk.INSTALL_HINT}, or run benchmarks/setup_peers.sh",
            file=sys.stderr,
        )
        return 2
    if not args.no_peers and c.peer_binary("vllm-router", args.peers_venv) is None:
        print(
            f"router_overhead: no vllm-router in {args.peers_venv}: run benchmarks/setup_peers.sh "
            "(or pass --no-peers to measure llmgw against direct only)",
            file=sys.stderr,
        )
        return 2
    if (
        not args.no_peers
        and not args.no_sglang
        and c.peer_binary("sglang-router", args.peers_venv) is None
    ):
        print(
            f"router_overhead: no sglang-router in {args.peers_venv}: run "
            "benchmarks/setup_peers.sh (or pass --no-sglang)",
            file=sys.stderr,
        )
        return 2
    settings = QUICK if args.quick else DEFAULT
    started = time.monotonic()
    result = None
    try:
        with c.fleet() as fleet:
            result = c.run_trio(
                functools.partial(
                    main_async,
                    settings,
                    fleet,
                    engines=engines,
                    only=args.phase,
                    cache_aware=not args.no_cache_aware,
                    peers=not args.no_peers,
                    sglang=not args.no_sglang,
                    peers_venv=args.peers_venv,
                    wrk=wrk,
                )
            )
    except* KeyboardInterrupt:
        pass  # trio may deliver it inside an exception group
    if result is None:
        print("interrupted; every started process was stopped", file=sys.stderr)
        return 130
    result["wall_seconds"] = time.monotonic() - started
    if args.json:
        print(json.dumps(bench.to_jsonable(result), indent=2, default=str))
        return 0
    print(f"router_overhead  {result['date']}  llmgw {result['revision']}  {result['machine']}")
    print(
        f"prompt {PROMPT_TOKENS} tokens, output {OUTPUT_TOKENS} tokens; "
        f"{settings.wrk_rounds} wrk rounds of {settings.wrk_seconds:g} s and "
        f"{settings.rounds} rounds of <= {settings.turn_seconds:g} s per target and phase, "
        f"interleaved; took {result['wall_seconds']:.0f} s"
    )
    for pname in result["patterns"]:
        desc = {
            "sim": f"2 llmgw-sim replicas ({' '.join(SIM_ARGS)}): "
            "one burst of events per engine step",
            "timer": f"2 timer_engine.py replicas ({' '.join(TIMER_ARGS)}): "
            "each stream on its own timer",
            "llamacpp": f"2 llama.cpp replicas of a tiny model ({' '.join(LLAMA_ARGS)})",
        }[pname]
        events = {
            n: info["events_per_stream"][pname]
            for n, info in result["routers"].items()
            if pname in info.get("events_per_stream", {})
        }
        ev = ", ".join(f"{n} {e.get(OUTPUT_TOKENS, '-')}" for n, e in events.items())
        print(f"engines {pname}: {desc}; SSE events per {OUTPUT_TOKENS}-token stream: {ev}")
    print(f"wrk: {result['wrk']['version']}, -t {WRK_THREADS} -c {WRK_CONNECTIONS}")
    peers = [
        f"{dist} {result[key]['version']}"
        for dist, key in (("vllm-router", "vllm_router"), ("sglang-router", "sglang_router"))
        if result[key]
    ]
    if peers:
        print(f"peers: {', '.join(peers)} (PyPI's wheels, in {result['peers_venv']})")
    for n, info in result["routers"].items():
        version = ""
        for kind, key in (("vllm-router", "vllm_router"), ("sglang-router", "sglang_router")):
            if info["kind"] == kind and result[key]:
                version = f"{kind} {result[key]['version']} "
        print(f"{n}: {version}{info['settings']}")
    if result["sglang_router"]:
        for pname, w in result["sglang_router"]["worker_paths"].items():
            line = f"sglang-router's registration reads on the {pname} replicas: {w['note']}"
            if w["missing"]:
                line += f"; absent: {', '.join(w['missing'])}"
            print(line)
            if w["failed"]:
                first = w["failed"].splitlines()[0]
                print(f"  sglang-router LEFT OUT on the {pname} engines: {first}")
    if result["probe"] is not None:
        pr = result["probe"]
        print(
            f"admission probe (128 streams, default llmgw): {pr['queued']:.0f} of "
            f"{pr['requests']} queued, {pr['rejected']:.0f} refused"
        )
    if result["router_child_processes"]:
        print(f"note: routers with child processes: {result['router_child_processes']}")
    report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
