"""Auth + usage overhead: llmgw's throughput with API keys and usage records on vs off.

    python benchmarks/auth_usage_overhead.py [--quick] [--json] [--no-postgres]

Setup (all on 127.0.0.1, started and stopped by this script): two fast `llmgw-sim`
replicas (the flags of router_overhead.py) and, in front of the same two replicas,

* plain: an `llmgw-server` without a store (``store.url = ""``: no keys, no usage
  records);
* auth + usage (SQLite): an `llmgw-server` with ``[store] url`` set to a SQLite file
  holding one API key; every request carries it (``Authorization: Bearer``), the
  router checks it (a lookup per key, cached for `auth.cache_ttl`, 1 s) and records
  each request's usage through the UsageBatcher (in-memory buffer, a transaction of up
  to 500 records every second);
* auth + usage (PostgreSQL): the same with a throwaway PostgreSQL cluster from
  tests/pg_cluster.py (durable defaults: fsync and synchronous_commit on), when one can
  be started (`--no-postgres` skips it).

Every server runs the default configuration (a replica counts as full when its engine
says so, so admission does not hold these 256-sequence replicas back). Non-streaming
chat requests (prompt 64 tokens, output 32) in a closed loop at concurrency 32; the
targets take turns, each round starting one target later (A B C, B C A, C A B, ...),
with the same prompts within a round, after an unmeasured warm-up each.

Reported per target: requests/s, e2e p50 / p99, the router process's CPU (utime +
stime from /proc/<pid>/stat around each of its turns) per 1,000 requests, and the
ratios to the plain router (throughput over all turns, and each round's own ratio).
The router uses only part of a core here (the client and the replicas need the
rest), so measured throughput moves little with the router's own cost; the inverse
ratio of CPU per request is printed too: the throughput ratio of a router-bound setup.
After the run each store's servers are stopped gracefully (the batcher's final flush)
and the usage rows in the store are counted against the requests the server answered.

The load generator, the simulators and the servers share the machine's cores; only one
server is under load at a time (the others idle, scraping the replicas). Nothing is
asserted: the target (auth + usage cost < 10% of the router's throughput) is printed
beside the measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import httpx

from llmgw import bench
from llmgw.store import open_store

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _common as c

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.pg_cluster

MODEL = "bench-model"
SIM_ARGS = (
    "--decode-step-ms", "1",
    "--decode-ms-per-seq", "0.01",
    "--prefill-us-per-token", "1",
    "--max-num-seqs", "256",
    "--no-prefix-caching",
)  # fmt: skip
CONCURRENCY = 32
PROMPT_TOKENS = 64
OUTPUT_TOKENS = 32

# The target: auth + usage may cost the router less than 10% of its throughput.
TARGET_COST = 0.10


@attrs.frozen
class Settings:
    rounds: int
    turn_seconds: float
    turn_requests: int
    warm_requests: int


DEFAULT = Settings(rounds=5, turn_seconds=4.0, turn_requests=5000, warm_requests=128)
QUICK = Settings(rounds=2, turn_seconds=2.0, turn_requests=2000, warm_requests=32)


@attrs.define
class Server:
    name: str
    router: c.RouterProc
    store_url: str | None = None
    key: str | None = None


async def create_key(url: str) -> str:
    """A fresh store at `url` (migrated) with one API key; its secret."""
    store = await open_store(url)
    try:
        _, secret = await store.create_key("bench")
        return secret
    finally:
        await store.aclose()


async def stored_requests(url: str) -> int:
    store = await open_store(url)
    try:
        return sum(r.requests for r in await store.usage_summary("model"))
    finally:
        await store.aclose()


def start_server(fleet: c.Fleet, name: str, sims: list[str], store_url: str | None) -> c.RouterProc:
    """An llmgw-server with its own config file (Fleet.router shares one path)."""
    # Plain: no store at all (the default would be SQLite in the working directory).
    config = f'[store]\nurl = "{store_url or ""}"\n'
    path = fleet.logdir / f"{name}.toml"
    path.write_text(config)
    argv = [
        "--listen", f"{c.LOOPBACK}:0",
        "--admin-listen", f"{c.LOOPBACK}:0",
        "--config", str(path),
    ]  # fmt: skip
    for i, base in enumerate(sims):
        argv += ["--endpoint", f"sim-{i}={base}={MODEL}"]
    proc = fleet.start("llmgw-server", *argv, name=name, ready=True)
    return c.RouterProc(proc, proc.url("listen"), proc.url("admin_listen"))


def check_auth(server: Server) -> None:
    """A keyed server refuses a request without the key and takes one with it."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    url = f"{server.router.base}/v1/chat/completions"
    r = httpx.post(url, json=body, timeout=10, trust_env=False)
    want = 200 if server.key is None else 401
    if r.status_code != want:
        raise RuntimeError(f"{server.name}: {r.status_code} without a key, expected {want}")
    if server.key is not None:
        headers = {"authorization": f"Bearer {server.key}"}
        r = httpx.post(url, json=body, headers=headers, timeout=10, trust_env=False)
        r.raise_for_status()


async def measure(settings: Settings, servers: list[Server], sims: list[str]) -> dict[str, Any]:
    config = bench.LoadConfig(
        concurrency=CONCURRENCY,
        requests=settings.turn_requests,
        duration=settings.turn_seconds,
        stream=False,
        workload=bench.WorkloadSpec(
            prompt_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS, seed=1
        ),
        request_timeout=60.0,
    )
    by_name = {s.name: s for s in servers}
    cpu: dict[str, list[float]] = {s.name: [] for s in servers}
    busy: dict[str, list[float]] = {s.name: [] for s in servers}
    mark: dict[str, Any] = {}

    def before(_round: int, target: bench.Target) -> None:
        mark["machine"] = c.machine_cpu()
        mark["cpu"] = c.cpu_seconds(by_name[target.label].router.pid)

    def after(_round: int, target: bench.Target, _result: bench.BenchResult) -> None:
        name = target.label
        cpu[name].append(c.cpu_seconds(by_name[name].router.pid) - mark["cpu"])
        frac = c.busy_fraction(mark["machine"], c.machine_cpu())
        if frac is not None:
            busy[name].append(frac)

    targets: list[tuple[bench.Target, Any]] = [
        (
            bench.Target(s.router.base, MODEL, name=s.name, api_key=s.key),
            c.pooled_transport(CONCURRENCY),
        )
        for s in servers
    ]
    turns = await c.interleave(
        targets,
        config,
        rounds=settings.rounds,
        warm_requests=settings.warm_requests,
        before=before,
        after=after,
        rotate=True,
    )
    return {
        s.name: {"turns": t, "merged": bench.merge(t), "cpu": cpu[s.name], "busy": busy[s.name]}
        for s, t in zip(servers, turns, strict=True)
    }


def analyse(out: dict[str, Any], stored: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    base = out["plain"]
    base_tput = base["merged"].summary.request_throughput
    base_rounds = [t.summary.request_throughput for t in base["turns"]]
    base_cpu = sum(base["cpu"]) / base["merged"].summary.requests * 1e3

    def per_turn_cpu(o: dict[str, Any]) -> list[float]:
        return [
            cpu / t.summary.requests * 1e3
            for cpu, t in zip(o["cpu"], o["turns"], strict=True)
            if t.summary.requests
        ]

    base_turn_cpu = per_turn_cpu(base)
    rows = []
    for name, o in out.items():
        s: bench.Summary = o["merged"].summary
        cpu_per_1000 = sum(o["cpu"]) / s.requests * 1e3 if s.requests else None
        rounds = [t.summary.request_throughput for t in o["turns"]]
        ratios = [r / b for r, b in zip(rounds, base_rounds, strict=True) if b]
        row: dict[str, Any] = {
            "target": name,
            "summary": s,
            "requests_per_s": s.request_throughput,
            "e2e_p50": s.e2e.p50 if s.e2e else None,
            "e2e_p99": s.e2e.p99 if s.e2e else None,
            "router_cpu_seconds": sum(o["cpu"]),
            "cpu_per_1000": cpu_per_1000,
            "machine_busy": sum(o["busy"]) / len(o["busy"]) if o["busy"] else None,
            "round_throughput": rounds,
            "throughput_ratio": s.request_throughput / base_tput if base_tput else None,
            "round_ratios": ratios,
            "cpu_ratio": cpu_per_1000 / base_cpu if cpu_per_1000 and base_cpu else None,
            "round_cpu_per_1000": per_turn_cpu(o),
            "round_cpu_ratios": [
                a / b for a, b in zip(per_turn_cpu(o), base_turn_cpu, strict=False) if b
            ],
            "e2e_mean_diff": None
            if name == "plain"
            else c.mean_diff(c.ok_values(base["merged"], "e2e"), c.ok_values(o["merged"], "e2e")),
            "usage": stored.get(name),
        }
        rows.append(row)
    return rows


def verdict(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return "within" if 1 - ratio < TARGET_COST else "OVER"


def report(result: dict[str, Any]) -> None:
    rows = result["rows"]
    table = []
    for x in rows:
        s = x["summary"]
        diff = x["e2e_mean_diff"]
        usage = x["usage"]
        table.append(
            [
                x["target"],
                f"{s.ok}/{s.requests}",
                f"{x['requests_per_s']:.0f}",
                c.ms(x["e2e_p50"], 1),
                c.ms(x["e2e_p99"], 1),
                "-" if diff is None else f"{diff[0] * 1e3:+.2f} ± {diff[1] * 1e3:.2f}",
                "-" if x["cpu_per_1000"] is None else f"{x['cpu_per_1000']:.2f}",
                "-" if x["machine_busy"] is None else f"{x['machine_busy']:.0%}",
                "-" if usage is None else f"{usage['stored']:.0f} / {usage['answered']:.0f}",
            ]
        )
    c.print_table(
        f"Non-streaming chat at concurrency {CONCURRENCY} through llmgw, auth + usage off vs "
        "on (e2e in ms; router CPU = utime+stime of that llmgw-server during its turns)",
        [
            "target",
            "ok/requests",
            "req/s",
            "e2e p50",
            "e2e p99",
            "e2e vs plain, mean ±95%",
            "router CPU s / 1,000 req",
            "cores busy",
            "usage rows / requests answered",
        ],
        table,
    )
    checks = []
    for x in rows:
        if x["target"] == "plain":
            continue
        ratio = x["throughput_ratio"]
        rr = x["round_ratios"]
        checks.append(
            [
                f"{x['target']}: throughput vs plain",
                f"{ratio:.3f} (cost {1 - ratio:+.1%}); per round "
                + " ".join(f"{r:.2f}" for r in rr)
                + (f", median {statistics.median(rr):.2f}" if rr else ""),
                f"cost < {TARGET_COST:.0%}",
                verdict(ratio),
            ]
        )
        cr = x["cpu_ratio"]
        checks.append(
            [
                f"{x['target']}: router CPU per request vs plain",
                "-"
                if cr is None
                else f"{cr:.3f} ({cr - 1:+.1%}); per round "
                + " ".join(f"{r:.2f}" for r in x["round_cpu_ratios"]),
                "",
                "",
            ]
        )
        # Here the router uses a fraction of one core (the client and the replicas
        # share the machine); were it the bottleneck, its throughput would go as
        # 1 / CPU per request.
        checks.append(
            [
                f"{x['target']}: router-bound throughput vs plain (1 / CPU per request)",
                "-" if cr is None else f"{1 / cr:.3f} (cost {1 - 1 / cr:+.1%})",
                f"cost < {TARGET_COST:.0%}",
                verdict(None if cr is None else 1 / cr),
            ]
        )
    c.print_table("Against the target", ["metric", "measured", "target", ""], checks)


async def main_async(
    settings: Settings, fleet: c.Fleet, tmp: Path, pg_url: str | None
) -> dict[str, Any]:
    sims = []
    for i in range(2):
        _, base = fleet.sim(f"sim-{i}", *SIM_ARGS, "--seed", str(i), model=MODEL)
        sims.append(base)
    stores = {"auth+usage sqlite": f"sqlite:///{tmp}/usage.db"}
    if pg_url is not None:
        stores["auth+usage postgres"] = pg_url
    servers = [Server("plain", start_server(fleet, "plain", sims, None))]
    for name, url in stores.items():
        key = await create_key(url)
        slug = name.split()[-1]
        servers.append(Server(name, start_server(fleet, slug, sims, url), url, key))
    for s in servers:
        s.router.wait_scraped()
        check_auth(s)
    c.log(
        f"{settings.rounds} rounds x ({', '.join(s.name for s in servers)}), "
        f"<= {settings.turn_seconds:g} s each"
    )
    out = await measure(settings, servers, sims)
    # The usage rows each store got: stop its server (SIGTERM: the batcher's final
    # flush) after reading how many requests it answered.
    stored: dict[str, dict[str, float]] = {}
    for s in servers:
        if s.store_url is None:
            continue
        answered = c.scrape(f"{s.router.admin}/metrics", ["llmgw_requests_total"])
        s.router.proc.stop(timeout=20)
        stored[s.name] = {
            "answered": answered["llmgw_requests_total"],
            "stored": await stored_requests(s.store_url),
            "exit_code": s.router.proc.popen.returncode,
        }
    return {
        "benchmark": "auth_usage_overhead",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": c.machine(),
        "revision": c.revision(),
        "settings": attrs.asdict(settings),
        "sim_args": list(SIM_ARGS),
        "concurrency": CONCURRENCY,
        "prompt_tokens": PROMPT_TOKENS,
        "output_tokens": OUTPUT_TOKENS,
        "targets": [s.name for s in servers],
        "rows": analyse(out, stored),
        "target_cost": TARGET_COST,
    }


def start_postgres(clusters: list[Any]) -> tuple[str | None, str | None]:
    """(url, why not) of a database in a throwaway PostgreSQL cluster with durable
    settings; the cluster goes into `clusters` before it starts (the caller stops it,
    even when interrupted half-way)."""
    try:
        from tests.pg_cluster import TempCluster

        cluster = TempCluster(fast=False)
        clusters.append(cluster)
        cluster.start()
        return cluster.new_database(), None
    except Exception as exc:  # not installed, not startable: the row is optional
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="short turns (under ~40 s in all)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead")
    p.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL row")
    args = p.parse_args(argv)
    settings = QUICK if args.quick else DEFAULT
    started = time.monotonic()
    result = None
    clusters: list[Any] = []
    pg_url, pg_missing = None, "--no-postgres"
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-store-") as tmp:
        try:
            with c.fleet() as fleet:  # from here on SIGTERM acts like Ctrl-C
                if not args.no_postgres:
                    c.log("starting a throwaway PostgreSQL cluster")
                    pg_url, pg_missing = start_postgres(clusters)
                    if pg_missing:
                        c.log(f"no PostgreSQL row: {pg_missing}")
                result = c.run_trio(main_async, settings, fleet, Path(tmp), pg_url)
        except* KeyboardInterrupt:
            pass  # trio may deliver it inside an exception group
        finally:
            for cluster in clusters:  # after the servers (the fleet) have stopped
                cluster.stop()
    if result is None:
        print("interrupted; every started process was stopped", file=sys.stderr)
        return 130
    result["wall_seconds"] = time.monotonic() - started
    result["postgres_missing"] = pg_missing
    if args.json:
        print(json.dumps(bench.to_jsonable(result), indent=2, default=str))
        return 0
    print(f"auth_usage_overhead  {result['date']}  llmgw {result['revision']}  {result['machine']}")
    print(
        f"2 llmgw-sim replicas ({' '.join(SIM_ARGS)}), non-streaming, prompt {PROMPT_TOKENS} "
        f"tokens, output {OUTPUT_TOKENS}, concurrency {CONCURRENCY}; {settings.rounds} "
        f"interleaved rounds of <= {settings.turn_seconds:g} s per target after "
        f"{settings.warm_requests} warm-up requests each; took {result['wall_seconds']:.0f} s"
    )
    print(
        'each llmgw-server: default configuration; plain: store.url = ""; '
        "auth+usage ones: [store] url, "
        "one API key sent with "
        "every request" + ("" if pg_url else f"; no PostgreSQL row ({pg_missing})")
    )
    report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
