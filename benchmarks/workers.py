"""Workers (issue #20): llmgw-server with 1 and 2 worker processes behind wrk and
nginx, and the prefix-cache hit rate with 1 and 4 workers, side by side in one run.

    python benchmarks/workers.py [--quick] [--json] [--phase throughput|prefix]...
                                 [--connections N]...

Everything runs on 127.0.0.1 and is started and stopped by this script. Two phases:

* throughput: one nginx (Debian's /usr/sbin/nginx, `daemon off; master_process off;`:
  one process, its config, pid, log and temp files in the run's directory) listening
  on two loopback ports, which llmgw sees as two engines (`--endpoint id=URL=model`).
  It answers POST /v1/completions and /v1/chat/completions with a fixed OpenAI answer
  carrying a `usage` object, GET /metrics with a fixed vLLM page (nothing running,
  nothing waiting, KV cache empty: the scraper sees a vLLM engine), GET /health with
  200; it costs almost no CPU, so the router is what saturates. Targets, interleaved
  with each round starting one target later: **nginx direct** (each of wrk's two
  threads pinned to one port: the floor), **llmgw 1 worker** and **llmgw 2 workers**
  (`llmgw-server` with its default configuration but `workers = N` and no store,
  `[store] url = ""`; both run for the whole phase, the idle one scraping). Each
  turn is an unmeasured wrk warm-up (2 s) then a measured wrk run (10 s; `wrk -t 2
  -c C`, C = 64 and 256) POSTing small completion requests (benchmarks/_wrk.py's
  script: bodies from a file, a per-thread request cap beside the duration).
  Reported: requests/s, wrk's latency p50/p99, errors; llmgw's CPU (utime + stime
  from /proc/<pid>/stat of the control process and its worker processes, the direct
  children) per request; the ratio 2 workers / 1 worker; and how the 2 cores were
  shared during each target's turns: llmgw, nginx, wrk (its rusage, a waited-for
  child of this script) and the rest (this script, the idle router, anything else),
  from /proc/stat. With `workers = 1` llmgw-server runs in one process (no worker
  processes, llmgw.workers is not used); with 2, one control process and two
  workers sharing the client port with SO_REUSEPORT.

* prefix: four `llmgw-sim --personality vllm` replicas (prefix caching on) and three
  targets in front of them: **llmgw 1 worker**, **llmgw 4 workers** (defaults
  otherwise, no store) and the client-side **pinned oracle** of routing_quality.py
  (tenant t to replica t mod 4: the hit rate there is to gain). routing_quality.py's
  shared-prefix workloads `uniform` and `zipf` (8 tenants, a 2,000-token system
  prompt each plus a 100-token unique user message; streamed, 32 output tokens). A
  closed loop of 16 clients, each opening a NEW connection for every request (httpx
  without keep-alive), so the kernel spreads requests over the workers as it would
  over many clients; 400 requests per turn (and at most 120 s). Before each turn
  every replica is idle and its prefix cache reset (POST /reset_prefix_cache); each
  round has fresh system prompts (no router remembers a previous round's tenants).
  Reported: the replicas' prefix-cache hit rate (vllm:prefix_cache_hits_total /
  queries_total over the turn, the cold start included), TTFT p50/p90, the busiest
  replica over the mean, llmgw's routing decisions by tier and its CPU per request
  split over its processes.

Progress goes to stderr; `--json` prints every number on stdout instead of the
tables. Nothing is asserted. The run takes ~8 min (~2 min with --quick: one round,
3 s wrk turns at 64 connections, 100 requests of `uniform`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import resource
import shutil
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from llmgw import bench

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _common as c
import _wrk
import routing_quality as rq

MODEL = "bench-model"
NGINX = "/usr/sbin/nginx"
WRK_THREADS = 2
WRK_BODIES = 256
SIM_FORMAT = "vllm"  # the personality's metric names
PREFIX_REPLICAS = 4

DIRECT = "nginx direct"
W1 = "llmgw 1 worker"
W2 = "llmgw 2 workers"
W4 = "llmgw 4 workers"
ORACLE = rq.ORACLE  # routing_quality.send pins the oracle's requests by this name


@attrs.frozen
class Settings:
    rounds: int
    wrk_seconds: float
    wrk_warm_seconds: float
    wrk_requests: int  # a bound on count per wrk turn, beside its duration
    connections: tuple[int, ...]
    prefix_rounds: int
    prefix_requests: int  # per turn
    prefix_seconds: float  # a turn's bound on time
    prefix_concurrency: int
    workloads: tuple[str, ...]
    warm_requests: int  # per prefix target, once
    quiet_limit: float  # cores busy before a turn (everything) under which it starts
    quiet_most: float  # s waited for that at most


DEFAULT = Settings(
    rounds=2,
    wrk_seconds=10,
    wrk_warm_seconds=2,
    wrk_requests=1_000_000,
    connections=(64, 256),
    prefix_rounds=2,
    prefix_requests=400,
    prefix_seconds=120.0,
    prefix_concurrency=16,
    workloads=("uniform", "zipf"),
    warm_requests=16,
    quiet_limit=0.3,
    quiet_most=120.0,
)
QUICK = Settings(
    rounds=1,
    wrk_seconds=3,
    wrk_warm_seconds=1,
    wrk_requests=300_000,
    connections=(64,),
    prefix_rounds=1,
    prefix_requests=100,
    prefix_seconds=60.0,
    prefix_concurrency=16,
    workloads=("uniform",),
    warm_requests=8,
    quiet_limit=0.5,
    quiet_most=20.0,
)


def llmgw_config(workers: int) -> str:
    """Only what the brief varies: the worker count, and no store."""
    return f'workers = {workers}\n\n[store]\nurl = ""\n'


# -- nginx, the engines that cost nothing ----------------------------------------------------

USAGE = {"prompt_tokens": 16, "completion_tokens": 16, "total_tokens": 32}
COMPLETION = {
    "id": "cmpl-bench",
    "object": "text_completion",
    "created": 1_700_000_000,
    "model": MODEL,
    "choices": [
        {"index": 0, "text": " a fixed answer", "logprobs": None, "finish_reason": "length"}
    ],
    "usage": USAGE,
}
CHAT = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": MODEL,
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "a fixed answer"},
            "finish_reason": "length",
        }
    ],
    "usage": USAGE,
}
MODELS = {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "nginx"}]}
# What llmgw.router.scraper reads of a vLLM page: an idle engine, always.
METRICS = "".join(
    f'# TYPE {name} gauge\n{name}{{model_name="{MODEL}"}} 0\n'
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:gpu_cache_usage_perc",
    )
)

NGINX_CONF = """\
# Generated by benchmarks/workers.py: one process, everything under the run's directory.
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    client_body_buffer_size 64k;
    keepalive_requests 10000000;
    keepalive_timeout 75s;
    server {{
{listen}
        location = /v1/completions {{
            default_type application/json;
            return 200 '{completion}';
        }}
        location = /v1/chat/completions {{
            default_type application/json;
            return 200 '{chat}';
        }}
        location = /v1/models {{
            default_type application/json;
            return 200 '{models}';
        }}
        location = /metrics {{
            default_type "text/plain; version=0.0.4";
            return 200 '{metrics}';
        }}
        location = /health {{
            return 200 '';
        }}
        location / {{
            return 404;
        }}
    }}
}}
"""


def _nginx_str(text: str) -> str:
    """`text` inside a single-quoted nginx string (\\n is nginx's escape for a newline)."""
    assert "'" not in text and "$" not in text, text  # no quoting, no variables
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def start_nginx(fleet: c.Fleet, replicas: int) -> tuple[c.Proc, list[str]]:
    """One nginx process serving `replicas` loopback ports (held for the run; nginx
    binds with SO_REUSEADDR)."""
    binary = NGINX if os.access(NGINX, os.X_OK) else shutil.which("nginx")
    if binary is None:
        raise SystemExit("workers: nginx not found (apt-get install -y nginx-light, as root)")
    home = fleet.logdir / "nginx"
    home.mkdir()
    ports = [fleet.reserve_port() for _ in range(replicas)]
    conf = home / "nginx.conf"
    compact = functools.partial(json.dumps, separators=(",", ":"))
    conf.write_text(
        NGINX_CONF.format(
            dir=home,
            listen="\n".join(f"        listen {c.LOOPBACK}:{p};" for p in ports),
            completion=_nginx_str(compact(COMPLETION)),
            chat=_nginx_str(compact(CHAT)),
            models=_nginx_str(compact(MODELS)),
            metrics=_nginx_str(METRICS),
        )
    )
    argv = [binary, "-p", f"{home}/", "-c", str(conf), "-e", str(home / "error.log")]
    proc = c.Proc(argv, fleet.logdir / "nginx.log")
    fleet.procs.append(proc)
    bases = [f"http://{c.LOOPBACK}:{p}" for p in ports]
    for base in bases:
        proc.wait_http(f"{base}/health", timeout=15.0)
    return proc, bases


def nginx_version(binary: str = NGINX) -> str:
    import subprocess

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=10)
        return (out.stderr or out.stdout).strip().removeprefix("nginx version: ")
    return "?"


# -- CPU accounting --------------------------------------------------------------------------


def tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of `pid` and of each of its direct children (the workers), as
    _common.cpu_seconds_tree adds them up."""
    out = {pid: c.cpu_seconds(pid)}
    for child in c.children_of(pid):
        with contextlib.suppress(OSError, ValueError):
            out[child] = c.cpu_seconds(child)
    return out


def tree_delta(before: dict[int, float], after: dict[int, float]) -> dict[int, float]:
    """Per process that lived through both readings (a restarted worker's time is lost,
    and counted in `restarts`)."""
    return {pid: after[pid] - before[pid] for pid in after if pid in before}


def children_cpu() -> float:
    """utime + stime of this script's waited-for children (wrk, once each run ended)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def own_cpu() -> float:
    """utime + stime of this script (the load generator of the prefix phase)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def quiet(settings: Settings, label: str) -> float:
    """Before a turn: until the machine's busy cores over 1 s (all processes, this run's
    idle ones included) are below `settings.quiet_limit`, re-reading every 5 s for at
    most `settings.quiet_most` s (then the turn runs anyway, logged). The machine is
    shared: another job starting between turns shows here, one starting during a turn
    in the "rest" column. Returns the last reading, in cores."""
    cores = os.cpu_count() or 1
    deadline = trio.current_time() + settings.quiet_most
    while True:
        m0 = c.machine_cpu()
        await trio.sleep(1.0)
        frac = c.busy_fraction(m0, c.machine_cpu()) or 0.0
        if frac * cores < settings.quiet_limit:
            return frac * cores
        if trio.current_time() >= deadline:
            c.log(f"{label}: the machine is still busy ({frac * cores:.2f} cores); going on")
            return frac * cores
        await trio.sleep(4.0)


@attrs.define
class Gateway:
    name: str
    workers: int
    rp: c.RouterProc

    @property
    def pid(self) -> int:
        return self.rp.pid

    @property
    def metrics_url(self) -> str:
        return f"{self.rp.admin}/metrics"

    def processes(self) -> list[int]:
        return [self.pid, *c.children_of(self.pid)]


def start_gateway(
    fleet: c.Fleet, name: str, workers: int, endpoints: Sequence[tuple[str, str, str]]
) -> Gateway:
    rp = fleet.router(endpoints, config=llmgw_config(workers), name=name.replace(" ", "-"))
    rp.wait_scraped(timeout=30.0)
    gw = Gateway(name, workers, rp)
    kids = c.children_of(rp.pid)
    expected = workers if workers > 1 else 0
    if len(kids) != expected:
        c.log(f"{name}: {len(kids)} child processes, expected {expected}: {kids}")
    return gw


LLMGW_COUNTERS = (
    "llmgw_requests_total",
    "llmgw_admission_wait_seconds_count",
    "llmgw_admission_rejected_total",
    "llmgw_worker_restarts_total",
    "llmgw_upstream_errors_total",
    "llmgw_retries_total",
)


# -- phase 1: throughput ---------------------------------------------------------------------


@attrs.define
class WrkTurn:
    target: str
    connections: int
    round: int
    result: _wrk.WrkResult
    wall: float
    busy: float  # machine CPU seconds busy (all cores) during the measured run
    total: float  # machine CPU seconds in all (wall x cores)
    wrk_cpu: float
    nginx_cpu: float
    llmgw_cpu: dict[int, float] | None  # per process of the target's llmgw
    idle_llmgw_cpu: float  # the other llmgw's processes (idle, scraping)
    script_cpu: float  # this script
    background: float  # cores busy in the 1 s before the turn (quiet())
    counters: dict[str, float] | None
    loadavg: float


def wrk_bodies(path: Path) -> Path:
    """Small completion requests, a few hundred distinct prompts (shorter than one
    prefix block: no prefix affinity work beyond the hash of a short prompt)."""
    return _wrk.write_bodies(
        path,
        (
            {"model": MODEL, "prompt": f"Say hello to number {i}.", "max_tokens": 16}
            for i in range(WRK_BODIES)
        ),
    )


async def run_throughput(
    settings: Settings, fleet: c.Fleet, wrk: str, only_connections: Sequence[int] | None
) -> dict[str, Any]:
    c.log("[throughput] starting nginx (2 ports) and llmgw with 1 and 2 workers")
    nginx, bases = start_nginx(fleet, 2)
    endpoints = [(f"nginx-{i}", base, MODEL) for i, base in enumerate(bases)]
    gws = {
        W1: start_gateway(fleet, "llmgw-w1", 1, endpoints),
        W2: start_gateway(fleet, "llmgw-w2", 2, endpoints),
    }
    names = [DIRECT, W1, W2]
    url_of = {DIRECT: bases[0], W1: gws[W1].rp.base, W2: gws[W2].rp.base}
    logdir = fleet.logdir
    bodies = wrk_bodies(logdir / "wrk-bodies.jsonl")
    cap = max(1, settings.wrk_requests // WRK_THREADS)
    spread = [b.removeprefix("http://") for b in bases]
    scripts = {
        name: _wrk.write_script(
            logdir / f"wrk-{'direct' if name == DIRECT else 'llmgw'}.lua",
            bodies,
            threads=WRK_THREADS,
            cap=cap,
            addrs=spread if name == DIRECT else [],
        )
        for name in names
    }
    wrk_log = logdir / "wrk.log"
    conns = list(only_connections or settings.connections)
    cores = os.cpu_count() or 1
    turns: list[WrkTurn] = []

    async def wrk_run(name: str, connections: int, seconds: float) -> _wrk.WrkResult:
        return await _wrk.run(
            wrk,
            url_of[name] + "/v1/completions",
            scripts[name],
            threads=WRK_THREADS,
            connections=connections,
            seconds=seconds,
            log=wrk_log,
        )

    for conn in conns:
        for rnd in range(settings.rounds):
            order = [names[(rnd + j) % len(names)] for j in range(len(names))]
            c.log(f"[throughput] c={conn} round {rnd + 1}: {', '.join(order)}")
            for name in order:
                background = await quiet(settings, f"c={conn} {name}")
                if settings.wrk_warm_seconds > 0:
                    await wrk_run(name, conn, settings.wrk_warm_seconds)
                gw = gws.get(name)
                others = [g for n, g in gws.items() if n != name]
                load = os.getloadavg()[0]
                counters0 = c.scrape(gw.metrics_url, LLMGW_COUNTERS) if gw else None
                mine0 = tree_cpu(gw.pid) if gw else None
                idle0 = [tree_cpu(g.pid) for g in others]
                nginx0 = c.cpu_seconds(nginx.pid)
                wrk0 = children_cpu()
                own0 = own_cpu()
                machine0 = c.machine_cpu()
                t0 = time.monotonic()
                res = await wrk_run(name, conn, settings.wrk_seconds)
                wall = time.monotonic() - t0
                machine1 = c.machine_cpu()
                wrk1 = children_cpu()
                own1 = own_cpu()
                nginx1 = c.cpu_seconds(nginx.pid)
                idle1 = [tree_cpu(g.pid) for g in others]
                mine = tree_delta(mine0, tree_cpu(gw.pid)) if gw and mine0 else None
                counters = None
                if gw and counters0 is not None:
                    now = c.scrape(gw.metrics_url, LLMGW_COUNTERS)
                    counters = {k: now[k] - counters0[k] for k in LLMGW_COUNTERS}
                turn = WrkTurn(
                    target=name,
                    connections=conn,
                    round=rnd,
                    result=res,
                    wall=wall,
                    busy=machine1[0] - machine0[0],
                    total=machine1[1] - machine0[1],
                    wrk_cpu=wrk1 - wrk0,
                    nginx_cpu=nginx1 - nginx0,
                    llmgw_cpu=mine,
                    idle_llmgw_cpu=sum(
                        sum(tree_delta(a, b).values()) for a, b in zip(idle0, idle1, strict=True)
                    ),
                    script_cpu=own1 - own0,
                    background=background,
                    counters=counters,
                    loadavg=load,
                )
                turns.append(turn)
                cpu = sum(mine.values()) if mine else None
                c.log(
                    f"  {name:16} {res.request_throughput:8.0f} req/s, p50 "
                    f"{c.ms(res.p50, 2)} ms, p99 {c.ms(res.p99, 2)} ms, {res.failed} failed"
                    + (f", llmgw {cpu / wall:.2f} cores" if cpu is not None else "")
                    + f", nginx {turn.nginx_cpu / wall:.2f}, wrk {turn.wrk_cpu / wall:.2f}"
                    + f", machine busy {turn.busy / turn.total:.0%} of {cores} cores"
                )
    bodies.unlink()
    rows = analyse_throughput(turns, names, conns, cores)
    fleet.stop([g.rp.proc for g in gws.values()] + [nginx])
    return {
        "bases": bases,
        "nginx": nginx_version(nginx.argv[0]),
        "wrk": {"binary": wrk, "version": _wrk.version(wrk), "threads": WRK_THREADS},
        "connections": conns,
        "rows": rows,
        "turns": [attrs.asdict(t) for t in turns],
    }


def analyse_throughput(
    turns: Sequence[WrkTurn], names: Sequence[str], conns: Sequence[int], cores: int
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for conn in conns:
        by: dict[str, dict[str, Any]] = {}
        for name in names:
            ts = [t for t in turns if t.target == name and t.connections == conn]
            if not ts:
                continue
            res = _wrk.merge([t.result for t in ts])
            wall = sum(t.wall for t in ts)
            total = sum(t.total for t in ts)
            per_proc: dict[int, float] = {}
            llmgw_cpu: float | None = None
            if ts[0].llmgw_cpu is not None:
                for t in ts:
                    for pid, v in (t.llmgw_cpu or {}).items():
                        per_proc[pid] = per_proc.get(pid, 0.0) + v
                llmgw_cpu = sum(per_proc.values())
            counters: dict[str, float] | None = None
            if ts[0].counters is not None:
                counters = {
                    k: sum((t.counters or {}).get(k, 0.0) for t in ts) for k in ts[0].counters
                }
            busy = sum(t.busy for t in ts)
            wrk_cpu = sum(t.wrk_cpu for t in ts)
            nginx_cpu = sum(t.nginx_cpu for t in ts)
            idle_llmgw = sum(t.idle_llmgw_cpu for t in ts)
            script = sum(t.script_cpu for t in ts)
            accounted = (llmgw_cpu or 0.0) + nginx_cpu + wrk_cpu + idle_llmgw + script
            row = {
                "target": name,
                "connections": conn,
                "requests": res.requests,
                "failed": res.failed,
                "errors": res.errors,
                "capped_threads": res.capped_threads,
                "throughput": res.request_throughput,
                "p50": res.p50,
                "p90": res.p90,
                "p99": res.p99,
                "mean": res.mean,
                "wall": wall,
                "llmgw_cpu": llmgw_cpu,
                "llmgw_cpu_per_process": per_proc,
                "cpu_per_request": llmgw_cpu / res.requests if llmgw_cpu and res.requests else None,
                # Shares of the machine during the measured runs, in cores (0..cores).
                "cores": {
                    "llmgw": llmgw_cpu / wall if llmgw_cpu is not None else None,
                    "nginx": nginx_cpu / wall,
                    "wrk": wrk_cpu / wall,
                    "idle llmgw": idle_llmgw / wall,
                    "script": script / wall,
                    "rest": max(0.0, busy - accounted) / wall,
                    "busy": busy / total * cores if total else None,
                },
                "counters": counters,
                "loadavg": [t.loadavg for t in ts],
                "background": [t.background for t in ts],
                "ratio_throughput": None,
                "ratio_cpu_per_request": None,
                "vs_direct": None,
            }
            by[name] = row
        base = by.get(W1)
        direct = by.get(DIRECT)
        for name, row in by.items():
            if base is not None and name != DIRECT:
                if base["throughput"]:
                    row["ratio_throughput"] = row["throughput"] / base["throughput"]
                if base["cpu_per_request"] and row["cpu_per_request"]:
                    row["ratio_cpu_per_request"] = row["cpu_per_request"] / base["cpu_per_request"]
            if direct is not None and name != DIRECT and direct["throughput"]:
                row["vs_direct"] = row["throughput"] / direct["throughput"]
            rows.append(row)
    return rows


# -- phase 2: prefix-cache hit rate ----------------------------------------------------------


def fresh_connection_client() -> httpx.AsyncClient:
    """httpx without keep-alive: every request opens (and closes) its own connection, so
    the kernel's SO_REUSEPORT spreads them over the workers as over many clients."""
    transport = httpx.AsyncHTTPTransport(
        limits=httpx.Limits(max_keepalive_connections=0),
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        trust_env=False,
    )
    return wrap_client(transport)


def wrap_client(transport: httpx.AsyncBaseTransport) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(None, connect=10.0),
        trust_env=False,
        headers={"connection": "close"},
    )


@attrs.define
class PrefixTurn:
    target: str
    workload: str
    round: int
    samples: list[bench.Sample]
    wall: float
    hits: float
    queries: float
    per_replica: list[float]
    llmgw: dict[str, float]
    cpu: dict[int, float] | None
    busy: float | None
    loadavg: float
    background: float  # cores busy in the 1 s before the turn (quiet())
    client_cpu: float  # this script: the load generator and its connections


async def closed_loop(
    who: rq.Contender, wl: rq.Workload, seed: str, settings: Settings
) -> tuple[list[bench.Sample], float]:
    """`prefix_concurrency` clients, each sending its next request when the previous
    one was answered, until `prefix_requests` were sent or `prefix_seconds` passed."""
    config = rq.base_config(settings.prefix_concurrency)
    samples: list[bench.Sample] = []
    index = itertools.count()
    t0 = trio.current_time()
    deadline = t0 + settings.prefix_seconds

    async def client() -> None:
        while trio.current_time() < deadline:
            i = next(index)
            if i >= settings.prefix_requests:
                return
            req = wl.conversation(seed, i)[0]
            samples.append(await rq.send(who, config, req, i, t0))

    async with trio.open_nursery() as nursery:
        for _ in range(settings.prefix_concurrency):
            nursery.start_soon(client)
    return samples, trio.current_time() - t0


async def run_prefix(settings: Settings, fleet: c.Fleet) -> dict[str, Any]:
    c.log(f"[prefix] starting {PREFIX_REPLICAS} llmgw-sim --personality vllm and llmgw x2")
    sims: list[str] = []
    procs: list[c.Proc] = []
    for i in range(PREFIX_REPLICAS):
        proc, base = fleet.sim(f"vllm-{i}", "--personality", "vllm", "--seed", str(i), model=MODEL)
        sims.append(base)
        procs.append(proc)
    endpoints = [(f"vllm-{i}", base, MODEL) for i, base in enumerate(sims)]
    gws = {
        W1: start_gateway(fleet, "llmgw-prefix-w1", 1, endpoints),
        W4: start_gateway(fleet, "llmgw-prefix-w4", 4, endpoints),
    }
    wls = rq.workloads()
    turns: list[PrefixTurn] = []
    async with contextlib.AsyncExitStack() as stack:
        contenders = [
            rq.Contender(
                name,
                bench.Target(gw.rp.base, MODEL, name=name),
                await stack.enter_async_context(fresh_connection_client()),
                router_pid=gw.pid,
                router=gw.rp,
                flags=f'default configuration, workers = {gw.workers}, no store (store.url = "")',
            )
            for name, gw in gws.items()
        ]
        oracle_transport = rq.PinnedOracle(
            sims,
            httpx.AsyncHTTPTransport(
                limits=httpx.Limits(max_keepalive_connections=0),
                socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
                trust_env=False,
            ),
        )
        contenders.append(
            rq.Contender(
                ORACLE,
                bench.Target(sims[0], MODEL, name=ORACLE),
                await stack.enter_async_context(wrap_client(oracle_transport)),
            )
        )
        for who in contenders:
            await rq.warm_up(who, settings.warm_requests)
        for k, wname in enumerate(settings.workloads):
            wl = wls[wname]
            for rnd in range(settings.prefix_rounds):
                seed = f"workers:{wname}:{rnd}"
                order = rq.rotate(contenders, k + rnd)
                c.log(f"[prefix] {wname} round {rnd + 1}: {', '.join(w.name for w in order)}")
                for who in order:
                    turns.append(await prefix_turn(who, wl, seed, rnd, sims, settings))
    rows = analyse_prefix(turns, [w.name for w in contenders], settings.workloads)
    fleet.stop([g.rp.proc for g in gws.values()] + procs)
    return {
        "sims": sims,
        "sim_args": ["--personality", "vllm", "--seed", "I"],
        "workloads": {w: wls[w].title for w in settings.workloads},
        "rows": rows,
    }


async def prefix_turn(
    who: rq.Contender,
    wl: rq.Workload,
    seed: str,
    rnd: int,
    sims: list[str],
    settings: Settings,
) -> PrefixTurn:
    background = await quiet(settings, f"{wl.name} {who.name}")
    rq.reset_caches(sims)
    rq.wait_sims_idle(sims, SIM_FORMAT)
    if who.router is not None:
        rq.wait_seen_idle(who.router)
    before = rq.sim_states(sims, SIM_FORMAT)
    gw0 = rq.llmgw_counters(who.router) if who.router is not None else {}
    cpu0 = tree_cpu(who.router_pid) if who.router_pid else None
    machine0 = c.machine_cpu()
    load = os.getloadavg()[0]
    own0 = own_cpu()
    samples, wall = await closed_loop(who, wl, seed, settings)
    client_cpu = own_cpu() - own0
    busy = c.busy_fraction(machine0, c.machine_cpu())
    cpu = tree_delta(cpu0, tree_cpu(who.router_pid)) if who.router_pid and cpu0 else None
    gw: dict[str, float] = {}
    if who.router is not None:
        gw = {k: v - gw0.get(k, 0.0) for k, v in rq.llmgw_counters(who.router).items()}
    rq.wait_sims_idle(sims, SIM_FORMAT, timeout=5.0)
    after = rq.sim_states(sims, SIM_FORMAT)
    turn = PrefixTurn(
        target=who.name,
        workload=wl.name,
        round=rnd,
        samples=samples,
        wall=wall,
        hits=sum(a.hits - b.hits for a, b in zip(after, before, strict=True)),
        queries=sum(a.queries - b.queries for a, b in zip(after, before, strict=True)),
        per_replica=[a.requests - b.requests for a, b in zip(after, before, strict=True)],
        llmgw=gw,
        cpu=cpu,
        busy=busy,
        loadavg=load,
        background=background,
        client_cpu=client_cpu,
    )
    ok = [s for s in samples if s.ok]
    ttft = bench.dist(s.ttft for s in ok if s.ttft is not None)
    c.log(
        f"  {who.name:16} {len(samples)} sent, {len(samples) - len(ok)} failed in "
        f"{wall:.1f} s; hit rate {turn.hits / turn.queries if turn.queries else 0:.1%}, "
        f"TTFT p50 {c.ms(ttft.p50 if ttft else None, 0)} ms, per replica "
        f"{[int(x) for x in turn.per_replica]}"
    )
    return turn


def analyse_prefix(
    turns: Sequence[PrefixTurn], names: Sequence[str], workloads: Sequence[str]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for wname in workloads:
        by: dict[str, dict[str, Any]] = {}
        for name in names:
            ts = [t for t in turns if t.target == name and t.workload == wname]
            if not ts:
                continue
            samples = [s for t in ts for s in t.samples]
            ok = [s for s in samples if s.ok]
            hits = sum(t.hits for t in ts)
            queries = sum(t.queries for t in ts)
            per_replica = [sum(x) for x in zip(*(t.per_replica for t in ts), strict=True)]
            mean = sum(per_replica) / len(per_replica) if per_replica else 0.0
            per_proc: dict[int, float] = {}
            for t in ts:
                for pid, v in (t.cpu or {}).items():
                    per_proc[pid] = per_proc.get(pid, 0.0) + v
            llmgw: dict[str, float] = {}
            for t in ts:
                for key, v in t.llmgw.items():
                    llmgw[key] = llmgw.get(key, 0.0) + v
            errors: dict[str, int] = {}
            for s in samples:
                if s.error is not None:
                    errors[s.error] = errors.get(s.error, 0) + 1
            cpu = sum(per_proc.values()) if per_proc else None
            busy = [t.busy for t in ts if t.busy is not None]
            by[name] = {
                "workload": wname,
                "target": name,
                "sent": len(samples),
                "ok": len(ok),
                "errors": errors,
                "wall": sum(t.wall for t in ts),
                "throughput": len(ok) / sum(t.wall for t in ts),
                "hits": hits,
                "queries": queries,
                "hit_rate": hits / queries if queries else None,
                "ttft": bench.dist(s.ttft for s in ok if s.ttft is not None),
                "e2e": bench.dist(s.e2e for s in ok),
                "per_replica": per_replica,
                "busiest_over_mean": max(per_replica) / mean if mean else None,
                "llmgw": llmgw,
                "cpu": cpu,
                "cpu_per_process": per_proc,
                "cpu_per_request": cpu / len(ok) if cpu is not None and ok else None,
                "cores_busy": sum(busy) / len(busy) if busy else None,
                "loadavg": [t.loadavg for t in ts],
                "background": [t.background for t in ts],
                "client_cpu_per_request": sum(t.client_cpu for t in ts) / len(samples)
                if samples
                else None,
                "hit_rate_vs_1": None,
            }
        base = by.get(W1)
        for row in by.values():
            if base is not None and base["hit_rate"] and row["hit_rate"] is not None:
                row["hit_rate_vs_1"] = row["hit_rate"] / base["hit_rate"]
            rows.append(row)
    return rows


# -- output ----------------------------------------------------------------------------------


def ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def cores_of(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def process_split(per_proc: dict[int, float], wall: float) -> str:
    """`control X + workers Y, Z` in cores; the first process is the root (tree_cpu
    reads it first); one process: just X."""
    if not per_proc:
        return "-"
    root, *kids = per_proc.values()
    if not kids:
        return f"{root / wall:.2f} (one process)"
    return f"control {root / wall:.2f} + workers " + ", ".join(
        f"{v / wall:.2f}" for v in sorted(kids, reverse=True)
    )


def report_throughput(out: dict[str, Any], settings: Settings) -> None:
    rows = out["rows"]
    table = []
    for r in rows:
        table.append(
            [
                r["target"],
                str(r["connections"]),
                f"{r['throughput']:.0f}",
                ratio(r["ratio_throughput"]),
                ratio(r["vs_direct"]),
                f"{c.ms(r['p50'], 2)} / {c.ms(r['p99'], 2)}",
                f"{r['failed']}"
                + (f" (capped {r['capped_threads']})" if r["capped_threads"] else ""),
                c.ms(r["cpu_per_request"], 3),
                ratio(r["ratio_cpu_per_request"]),
            ]
        )
    c.print_table(
        f"Throughput: wrk -t {WRK_THREADS} -c C, POST /v1/completions, {settings.rounds} "
        f"rounds x {settings.wrk_seconds:g} s per target (after a {settings.wrk_warm_seconds:g} s "
        "warm-up each), interleaved; CPU = utime+stime of llmgw's control process and its "
        "workers",
        [
            "target",
            "conns",
            "req/s",
            "vs 1 worker",
            "vs nginx",
            "latency p50 / p99 ms",
            "failed",
            "llmgw CPU ms/req",
            "vs 1 worker",
        ],
        table,
    )
    table = []
    for r in rows:
        k = r["cores"]
        table.append(
            [
                r["target"],
                str(r["connections"]),
                cores_of(k["llmgw"]),
                cores_of(k["nginx"]),
                cores_of(k["wrk"]),
                cores_of(k["idle llmgw"] + k["script"]),
                cores_of(k["rest"]),
                cores_of(k["busy"]),
                cores_of(max(r["background"])),
                process_split(r["llmgw_cpu_per_process"], r["wall"]),
            ]
        )
    c.print_table(
        "Where the 2 cores went during each target's measured runs, in cores (CPU seconds / "
        "wall seconds; 2.00 = both cores): the llmgw under test, nginx, wrk, this run's "
        "idle rest (the other llmgw, scraping, and this script), the rest (interrupt time "
        "charged to no process, and other people's jobs); before: the machine's busy cores "
        "in the 1 s before the turn (the highest of its turns)",
        [
            "target",
            "conns",
            "llmgw",
            "nginx",
            "wrk",
            "idle",
            "rest",
            "machine busy",
            "before",
            "llmgw by process, cores",
        ],
        table,
    )
    table = []
    for r in rows:
        k = r["counters"]
        if k is None:
            continue
        table.append(
            [
                r["target"],
                str(r["connections"]),
                str(r["requests"]),
                f"{k['llmgw_requests_total']:.0f}",
                f"{k['llmgw_admission_wait_seconds_count']:.0f}",
                f"{k['llmgw_admission_rejected_total']:.0f}",
                f"{k['llmgw_upstream_errors_total']:.0f}",
                f"{k['llmgw_worker_restarts_total']:.0f}",
            ]
        )
    c.print_table(
        "llmgw's own counters over the measured runs (its /metrics, merged over workers by "
        "the control process) beside wrk's count",
        [
            "target",
            "conns",
            "wrk requests",
            "llmgw_requests_total",
            "admission queued",
            "admission refused",
            "upstream errors",
            "worker restarts",
        ],
        table,
    )


def report_prefix(out: dict[str, Any], settings: Settings) -> None:
    table = []
    for r in out["rows"]:
        tiers = {k.split(":", 1)[1]: v for k, v in r["llmgw"].items() if k.startswith("tier:")}
        table.append(
            [
                r["workload"],
                r["target"],
                f"{r['ok']}/{r['sent']}",
                "-" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}",
                ratio(r["hit_rate_vs_1"]),
                c.dist_ms(r["ttft"], 0).rsplit(" / ", 1)[0],
                f"{r['throughput']:.1f}",
                " ".join(str(int(x)) for x in r["per_replica"]),
                "-" if r["busiest_over_mean"] is None else f"{r['busiest_over_mean']:.2f}",
                ", ".join(f"{k} {v:.0f}" for k, v in sorted(tiers.items())) or "-",
                c.ms(r["cpu_per_request"], 2),
                process_split(r["cpu_per_process"], r["wall"]),
                cores_of(r["cores_busy"] * (os.cpu_count() or 1) if r["cores_busy"] else None),
                cores_of(max(r["background"])),
            ]
        )
    c.print_table(
        f"Prefix-cache hit rate: {PREFIX_REPLICAS} llmgw-sim --personality vllm, "
        f"{settings.prefix_concurrency} closed-loop clients, a new connection per request, "
        f"{settings.prefix_requests} requests per turn x {settings.prefix_rounds} rounds, caches "
        "reset before each turn (hit rate = the replicas' hit / queried prompt tokens, cold "
        "start included; machine busy during the turns and before them, in cores)",
        [
            "workload",
            "target",
            "ok/sent",
            "hit rate",
            "vs 1 worker",
            "TTFT p50 / p90 ms",
            "req/s",
            "requests per replica",
            "busiest/mean",
            "llmgw decisions by tier",
            "llmgw CPU ms/req",
            "llmgw by process, cores",
            "machine busy",
            "before",
        ],
        table,
    )


# -- main ------------------------------------------------------------------------------------


def loadavg() -> str:
    """/proc/loadavg as it reads: 1, 5 and 15 min load, running/total tasks, last pid."""
    return Path("/proc/loadavg").read_text().strip()


async def main_async(
    settings: Settings,
    fleet: c.Fleet,
    *,
    phases: Sequence[str],
    wrk: str | None,
    connections: Sequence[int] | None,
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "benchmark": "workers",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": c.machine(),
        "revision": c.revision(),
        "settings": attrs.asdict(settings),
        "loadavg": {"start": loadavg()},
    }
    if "throughput" in phases:
        assert wrk is not None
        result["throughput"] = await run_throughput(settings, fleet, wrk, connections)
        result["loadavg"]["after throughput"] = loadavg()
    if "prefix" in phases:
        result["prefix"] = await run_prefix(settings, fleet)
        result["loadavg"]["after prefix"] = loadavg()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="short turns (~2 min in all)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead")
    p.add_argument(
        "--phase",
        action="append",
        choices=("throughput", "prefix"),
        help="run only this phase (repeatable; default both)",
    )
    p.add_argument(
        "--connections",
        action="append",
        type=int,
        metavar="N",
        help="wrk connections (repeatable; default 64 and 256, --quick 64)",
    )
    args = p.parse_args(argv)
    phases = args.phase or ["throughput", "prefix"]
    wrk = _wrk.find()
    if "throughput" in phases and wrk is None:
        print(f"workers: {_wrk.INSTALL_HINT}", file=sys.stderr)
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
                    phases=phases,
                    wrk=wrk,
                    connections=args.connections,
                )
            )
    except* KeyboardInterrupt:
        pass
    if result is None:
        print("interrupted; every started process was stopped", file=sys.stderr)
        return 130
    result["wall_seconds"] = time.monotonic() - started
    if args.json:
        print(json.dumps(bench.to_jsonable(result), indent=2, default=str))
        return 0
    print(f"workers  {result['date']}  llmgw {result['revision']}  {result['machine']}")
    print(
        "load average (1/5/15 min, running/total, last pid): "
        + "; ".join(f"{k}: {v}" for k, v in result["loadavg"].items())
        + f"; took {result['wall_seconds']:.0f} s"
    )
    if "throughput" in result:
        t = result["throughput"]
        print(
            f"throughput: nginx {t['nginx']} (one process, master_process off) on 2 loopback "
            f"ports = 2 engines; {t['wrk']['version']}; llmgw default configuration, "
            'workers = 1 or 2, [store] url = ""'
        )
        report_throughput(t, settings)
    if "prefix" in result:
        pr = result["prefix"]
        print(
            "prefix: "
            + "; ".join(f"{k}: {v}" for k, v in pr["workloads"].items())
            + f"; streamed, {rq.OUTPUT_TOKENS} output tokens; llmgw default configuration, "
            'workers = 1 or 4, [store] url = ""'
        )
        report_prefix(pr, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
