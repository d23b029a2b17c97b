"""How long a cold start takes end to end, and what part of it is llmgw's.

    python benchmarks/cold_start.py [--runs 5] [--engine llamacpp|sim]... [--json]

For each engine, in one run, interleaved (A, B, A, B, ...) so the machine's drift hits
both alike:

* **alone**: the engine's own command (the argv llmgw's agent recorded for the
  replica it started, on a port of its own) from exec until ``/health`` answers 200
  (polled every 10 ms), then one completion of 3 tokens;
* **through llmgw**: a fresh ``llmgw-server`` (the **default configuration** plus one
  autoscaled model at ``min_replicas = 0``) and one ``llmgw-agent`` (a CPU node for
  llama.cpp, a pretended GPU for the simulator); once the controller has run its first
  pass, one completion of 3 tokens with the official openai client: the time the
  client waited, and the server's own account of it
  (``llmgw_fleet_replica_start_seconds``: placement to ready;
  ``llmgw_cold_start_wait_seconds``: the request's wait in the queue).

llmgw's share is the cold request through llmgw minus the engine alone (exec to
healthy plus its first completion): the command to the agent, the agent's exec and
health polling (every 0.5 s by default), publishing the replica to the router and
the admission queue letting the request go.

Engines: ``llamacpp`` is the real llama-server (scripts/llama_server.sh builds it) on
the tiny generated GGUF model (llmgw.testing.gguf), so its load is short and the
overhead shows; a real model's load (seconds to minutes) is the engine's, not
llmgw's. ``sim`` is llmgw-sim with no startup delay: nearly all of its cold start is
the process's Python start-up.

Loopback only; every wait has a deadline; every process is stopped on exit.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import (
    Fleet,
    fleet,
    log,
    machine,
    print_table,
    revision,
    scrape,
)

from llmgw.agent.adapters.llamacpp import find_llama_server
from llmgw.testing.gguf import write_tiny_gguf
from llmgw.testing.procs import LOOPBACK

DEADLINE = 120.0  # any one start, llmgw's or the engine's
PROMPT = {"prompt": "hello", "max_tokens": 3}
# Exactly 3 tokens from llama.cpp's noise model; the simulator ignores them.
EXACT = {"seed": 7, "ignore_eos": True}


def profile(engine: str, weights: Path | None) -> str:
    if engine == "llamacpp":
        return (
            f'engine = "llamacpp"\nweights = {json.dumps(str(weights))}\n'
            'args = ["-np", "1", "-c", "1024", "-t", "1"]\n'
        )
    return 'engine = "sim"\nweights = "sim"\n'


def config(engine: str, weights: Path | None) -> str:
    """The default configuration, plus one model at zero (and no store: none is needed
    and its first open would be timed too)."""
    return f"""
[store]
url = ""

[[models]]
name = "cold"
replicas = 0

[models.autoscale]
min_replicas = 0
max_replicas = 1

[[models.profiles]]
name = "p"
{profile(engine, weights)}"""


def through_llmgw(f: Fleet, engine: str, weights: Path | None, run: int) -> dict[str, Any]:
    path = f.logdir / f"cold-{engine}-{run}.toml"
    path.write_text(config(engine, weights))
    agent_port = f.reserve_port()
    server = f.start(
        "llmgw-server",
        "--config", str(path),
        "--listen", f"{LOOPBACK}:0",
        "--admin-listen", f"{LOOPBACK}:0",
        "--agent-listen", f"{LOOPBACK}:{agent_port}",
        name=f"server-{engine}-{run}",
        ready=True,
    )  # fmt: skip
    base, admin = server.url("listen"), server.url("admin_listen")
    state = Path(tempfile.mkdtemp(prefix="llmgw-cold-", dir=f.logdir))
    gpus = [] if engine == "llamacpp" else ["--fake-gpus", "1x80GB"]
    agent = f.start(
        "llmgw-agent",
        "--server", f"{LOOPBACK}:{agent_port}",
        "--node-id", "n1",
        "--address", LOOPBACK,
        "--state-dir", str(state),
        *gpus,
        name=f"agent-{engine}-{run}",
    )  # fmt: skip
    passes = "llmgw_fleet_reconcile_passes_total"
    deadline = time.monotonic() + DEADLINE
    while scrape(f"{admin}/metrics", [passes]).get(passes, 0) < 1:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no reconcile pass within {DEADLINE:g}s")
        time.sleep(0.1)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=DEADLINE)
    started = time.monotonic()
    done = client.completions.create(model="cold", extra_body=EXACT, **PROMPT)
    total = time.monotonic() - started
    assert done.usage is not None and done.usage.completion_tokens == 3, done
    names = [
        "llmgw_fleet_replica_start_seconds_sum",
        "llmgw_cold_start_wait_seconds_sum",
    ]
    got = scrape(f"{admin}/metrics", names)
    (record,) = (state / "run").glob("*.json")
    argv = json.loads(record.read_text())["argv"]
    f.stop([server, agent])
    return {
        "total": total,
        "placement_to_ready": got.get(names[0]),
        "queued": got.get(names[1]),
        "argv": argv,
    }


def alone(f: Fleet, argv: Sequence[str], run: int) -> dict[str, Any]:
    port = f.reserve_port()
    args = list(argv)
    args[args.index("--port") + 1] = str(port)
    from llmgw.testing.procs import Proc

    url = f"http://{LOOPBACK}:{port}"
    started = time.monotonic()
    proc = Proc(args, f.logdir / f"alone-{run}-{port}.log")
    f.procs.append(proc)
    deadline = started + DEADLINE
    with httpx.Client(timeout=2.0) as http:
        while True:
            try:
                if http.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{args[0]} not healthy within {DEADLINE:g}s")
            time.sleep(0.01)
        healthy = time.monotonic() - started
        model = http.get(f"{url}/v1/models").json()["data"][0]["id"]
        asked = time.monotonic()
        r = http.post(f"{url}/v1/completions", json={"model": model, **PROMPT, **EXACT}, timeout=60)
        r.raise_for_status()
        first = time.monotonic() - asked
    f.stop([proc])
    return {"healthy": healthy, "first": first}


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
    }


def cell(s: dict[str, float]) -> str:
    return f"{s['mean']:.2f} ({s['min']:.2f}-{s['max']:.2f})"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--engine", action="append", choices=("llamacpp", "sim"))
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    engines = args.engine or ["llamacpp", "sim"]
    if "llamacpp" in engines and find_llama_server() is None:
        print("llama-server not found: scripts/llama_server.sh builds it", file=sys.stderr)
        return 2
    results: dict[str, dict[str, list[float]]] = {}
    with fleet() as f:
        weights = write_tiny_gguf(f.logdir / "tiny.gguf")
        for engine in engines:
            r = results[engine] = {k: [] for k in ("total", "start", "queued", "healthy", "first")}
            for run in range(args.runs):
                log(f"{engine}: run {run + 1} of {args.runs} through llmgw")
                via = through_llmgw(f, engine, weights, run)
                log(f"{engine}: run {run + 1} of {args.runs} alone")
                own = alone(f, via["argv"], run)
                r["total"].append(via["total"])
                r["start"].append(via["placement_to_ready"])
                r["queued"].append(via["queued"])
                r["healthy"].append(own["healthy"])
                r["first"].append(own["first"])
    out = {engine: {k: summary(v) for k, v in r.items()} for engine, r in results.items()}
    for engine, r in results.items():
        share = [t - h - q for t, h, q in zip(r["total"], r["healthy"], r["first"], strict=True)]
        out[engine]["llmgw_share"] = summary(share)
    if args.json:
        print(json.dumps({"revision": revision(), "machine": machine(), "results": out}))
        return 0
    print(f"revision {revision()}; {machine()}; {args.runs} runs each, seconds: mean (min-max)\n")
    rows = [
        [
            engine,
            cell(s["healthy"]),
            cell(s["first"]),
            cell(s["total"]),
            cell(s["start"]),
            cell(s["queued"]),
            cell(s["llmgw_share"]),
        ]
        for engine, s in out.items()
    ]
    print_table(
        "Cold start: a request for a model at zero replicas",
        [
            "engine",
            "alone: exec to healthy",
            "alone: first completion",
            "via llmgw: request",
            "placement to ready",
            "request queued",
            "llmgw's share",
        ],
        rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
