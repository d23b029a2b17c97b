"""prometheus-client's multiprocess mode against llmgw.workers.merge (issue #35): what
a worker pays per metric update, and what one scrape of the control process's
``/metrics`` costs, with two workers.

    python benchmarks/metrics_merge.py [--models N]... [--rounds R] [--json]

Both ways export the same families, in the shapes the router's are (names, labels and
buckets of llmgw.router.metrics): per model, requests by endpoint (4) and status (2),
prompt and completion tokens by endpoint, requests in flight (a gauge that adds up
over processes), a pool's saturation (a level: the highest), and the latency and
time-to-first-token histograms. Only families of plain Counter, Gauge and Histogram
objects: the router's collectors computed at scrape time (endpoints, admission,
inter-token gaps) have no multiprocess form, so they are left out of both.

* **merge** (what llmgw does): each worker, asked, collects its registry and encodes
  its families as its wire message (``merge.families``, msgspec); the control process
  decodes them, merges them with its own (``merge.metrics``) and renders the page
  (``generate_latest``).
* **mmap** (prometheus-client's multiprocess mode, ``PROMETHEUS_MULTIPROC_DIR``):
  every update writes its value to the process's mmap file; the control process reads
  every process's files (``MultiProcessCollector``) and renders the page. Gauges
  declare ``multiprocess_mode`` (``livesum`` and ``livemax``).

Each worker and the control process is a process of its own (the value class is
chosen when prometheus_client is imported). Per round and size, the two ways run in
turn, each round starting with the other. Reported: a worker's cost per update
(``inc`` on a labelled counter, ``observe`` on a labelled histogram, ``inc`` on a
labelled gauge; 100,000 each, the mean), a worker's cost per scrape (merge only), the
control process's cost per scrape (median of 30), and the CPU one scrape takes over
all three processes. The sample lines of the two pages are compared (they must be the
same numbers). Nothing is asserted; ~30 s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _common as c

WORKERS = 2
ENDPOINTS = 4
STATUSES = ("200", "429")
UPDATES = 100_000
SCRAPES = 30
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
MODES = ("merge", "mmap")


def _families(mode: str, registry: Any) -> dict[str, Any]:
    from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

    disable_created_metrics()  # type: ignore[no-untyped-call]  # as llmgw.router.metrics does
    mmap = mode == "mmap"
    return {
        "requests": Counter(
            "llmgw_requests_total", "Requests.", ["model", "endpoint", "status"], registry=registry
        ),
        "prompt": Counter(
            "llmgw_prompt_tokens_total", "Prompt tokens.", ["model", "endpoint"], registry=registry
        ),
        "completion": Counter(
            "llmgw_completion_tokens_total",
            "Completion tokens.",
            ["model", "endpoint"],
            registry=registry,
        ),
        # merge.py knows these two as a sum and a level by name (SUMS, LEVELS).
        "in_flight": Gauge(
            "llmgw_requests_in_flight",
            "In flight.",
            ["model"],
            registry=registry,
            multiprocess_mode="livesum" if mmap else "all",  # "all": the default
        ),
        "saturation": Gauge(
            "llmgw_admission_pool_saturation_ratio",
            "Saturation.",
            ["model"],
            registry=registry,
            multiprocess_mode="livemax" if mmap else "all",
        ),
        "duration": Histogram(
            "llmgw_request_duration_seconds",
            "Latency.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ),
        "ttft": Histogram(
            "llmgw_time_to_first_token_seconds",
            "TTFT.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ),
    }


def _fill(f: dict[str, Any], models: int, worker: int) -> None:
    for m in range(models):
        model = f"model-{m}"
        for e in range(ENDPOINTS):
            endpoint = f"{model}-r{e}"
            for s, status in enumerate(STATUSES):
                f["requests"].labels(model, endpoint, status).inc(1 + m + e + s + worker)
            f["prompt"].labels(model, endpoint).inc(1000 + m)
            f["completion"].labels(model, endpoint).inc(100 + e)
        f["in_flight"].labels(model).inc(m % 3 + worker)
        f["saturation"].labels(model).set((m % 10) / 10 + worker / 100)
        for value in (0.02, 0.3, 4.0 + worker):
            f["duration"].labels(model).observe(value)
            f["ttft"].labels(model).observe(value / 10)


def _per_update_ns(f: dict[str, Any]) -> dict[str, float]:
    counter = f["requests"].labels("model-0", "model-0-r0", "200")
    histogram = f["duration"].labels("model-0")
    gauge = f["in_flight"].labels("model-0")
    out = {}
    for name, call, arg in (
        ("counter_inc", counter.inc, 1),
        ("histogram_observe", histogram.observe, 0.3),
        ("gauge_inc", gauge.inc, 1),
    ):
        start = time.perf_counter_ns()
        for _ in range(UPDATES):
            call(arg)
        out[name] = (time.perf_counter_ns() - start) / UPDATES
    return out


def _worker(mode: str, models: int, index: int, out: Path) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    f = _families(mode, registry)
    _fill(f, models, index)
    # The timed updates stay in the page: both ways make the same ones.
    result: dict[str, Any] = {"update_ns": _per_update_ns(f)}
    if mode == "merge":
        import msgspec

        from llmgw.workers import wire
        from llmgw.workers.merge import families

        encoder = msgspec.msgpack.Encoder()
        times = []
        for seq in range(SCRAPES):
            start = time.perf_counter()
            body = encoder.encode(wire.Metrics(seq, families(registry.collect())))
            times.append(time.perf_counter() - start)
        out.write_bytes(body)
        result["scrape_s"] = statistics.median(times)
    else:
        result["scrape_s"] = 0.0  # the updates wrote the files already
    return result


class _Page:
    """generate_latest's view of merged families (as llmgw.workers.pool's)."""

    def __init__(self, families: list[Any]) -> None:
        self._families = families

    def collect(self) -> list[Any]:
        return self._families


def _control(mode: str, models: int, inputs: list[Path]) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry, generate_latest

    times = []
    if mode == "merge":
        import msgspec

        from llmgw.workers import merge, wire

        registry = CollectorRegistry()
        _families(mode, registry)  # the control process's router: declared, no traffic
        decoder = msgspec.msgpack.Decoder(wire.Metrics)
        bodies = [p.read_bytes() for p in inputs]
        for _ in range(SCRAPES):
            start = time.perf_counter()
            answers = [decoder.decode(b).families for b in bodies]
            own = list(registry.collect())
            page = generate_latest(_Page(list(merge.metrics(own, answers))))
            times.append(time.perf_counter() - start)
    else:
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        for _ in range(SCRAPES):
            start = time.perf_counter()
            page = generate_latest(registry)
            times.append(time.perf_counter() - start)
    samples = sorted(
        line for line in page.decode().splitlines() if line and not line.startswith("#")
    )
    return {
        "scrape_s": statistics.median(times),
        "page_bytes": len(page),
        "samples": len(samples),
        "digest": hashlib.sha256("\n".join(samples).encode()).hexdigest()[:16],
    }


def _role(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--role", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, **env},
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _turn(mode: str, models: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="llmgw-metrics-") as tmp:
        env: dict[str, str] = {}
        if mode == "mmap":
            (Path(tmp) / "mmap").mkdir()
            env["PROMETHEUS_MULTIPROC_DIR"] = str(Path(tmp) / "mmap")
        outs = [Path(tmp) / f"worker-{i}.msgpack" for i in range(WORKERS)]
        workers = [
            _role(["worker", mode, str(models), str(i), str(out)], env)
            for i, out in enumerate(outs)
        ]
        control = _role(["control", mode, str(models), *map(str, outs)], env)
    return {"workers": workers, "control": control}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, action="append")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = args.models or [30, 300]
    results: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for models in sizes:
        results[models] = {mode: [] for mode in MODES}
        for r in range(args.rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for mode in order:
                c.log(f"{models} models, round {r + 1}: {mode}")
                results[models][mode].append(_turn(mode, models))
    if args.json:
        print(json.dumps({"machine": c.machine(), "results": results}))
        return
    rows = []
    for models, by_mode in results.items():
        digests = {t["control"]["digest"] for turns in by_mode.values() for t in turns}
        for mode, turns in by_mode.items():

            def mean(pick: Any, turns: list[dict[str, Any]] = turns) -> float:
                return float(statistics.mean(pick(t) for t in turns))

            update = {
                k: mean(lambda t, k=k: statistics.mean(w["update_ns"][k] for w in t["workers"]))
                for k in ("counter_inc", "histogram_observe", "gauge_inc")
            }
            worker_scrape = mean(lambda t: max(w["scrape_s"] for w in t["workers"]))
            control_scrape = mean(lambda t: t["control"]["scrape_s"])
            cpu = mean(
                lambda t: t["control"]["scrape_s"] + sum(w["scrape_s"] for w in t["workers"])
            )
            rows.append(
                [
                    str(models),
                    str(turns[0]["control"]["samples"]),
                    mode,
                    f"{update['counter_inc']:.0f}",
                    f"{update['histogram_observe']:.0f}",
                    f"{update['gauge_inc']:.0f}",
                    c.ms(worker_scrape),
                    c.ms(control_scrape),
                    c.ms(cpu),
                    "same" if len(digests) == 1 else "DIFFER",
                ]
            )
    c.print_table(
        f"/metrics with {WORKERS} workers, merge.py against multiprocess mode ({c.machine()})",
        [
            "models",
            "samples",
            "way",
            "counter inc ns",
            "histogram observe ns",
            "gauge inc ns",
            "worker ms/scrape",
            "control ms/scrape",
            "CPU ms/scrape",
            "pages",
        ],
        rows,
    )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--role":
        role, mode, models = sys.argv[2], sys.argv[3], int(sys.argv[4])
        if role == "worker":
            out = _worker(mode, models, int(sys.argv[5]), Path(sys.argv[6]))
        else:
            out = _control(mode, models, [Path(p) for p in sys.argv[5:]])
        print(json.dumps(out))
    else:
        main()
