"""Time `llmgw.control.placement.plan` at control-plane scale.

    python benchmarks/placement_scale.py [--nodes 1000] [--fabrics 16] [--models 200]
                                         [--repeat 7] [--json]

A fleet of N nodes x 8 GPUs (H100, 80 GB) in F fabrics, and M models with a mix of
shapes (1, 2, 4 and 8 GPUs on one node; 2 nodes x 4 and 2 nodes x 8 GPUs; fallback
profiles) and 1-3 replicas each. Scenarios, each timed `--repeat` times (min, median
and max printed; the machine's other load shows in the median and max):

* initial   -- an empty fleet, every replica to place;
* steady    -- everything placed, 10 more replicas to place;
* churn     -- 5% of the nodes lost, their replicas placed again;
* saturated -- after `initial`, ten times as many replicas again, every model's
               profiles named apart: most are unplaceable and each is explained,
               drain hints included (the expensive path).

The design target is a whole reconcile pass under 100 ms at 1,000 nodes and 200
models; `plan` is the bulk of it. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable

import attrs

from llmgw.config import DeploymentProfile
from llmgw.control.placement import NodeCapacity, PlaceRequest, PlanResult, plan
from llmgw.domain.fleet import Gpu, NodeState, Placement

PORTS = (20000, 20999)
GB = 10**9


def fleet(nodes: int, fabrics: int) -> list[NodeCapacity]:
    out = []
    for i in range(nodes):
        gpus = tuple(Gpu(j, f"GPU-{i}-{j}", "NVIDIA H100 80GB HBM3", 80 * GB) for j in range(8))
        out.append(
            NodeCapacity(
                node_id=f"gpu-{i:04d}",
                state=NodeState.READY,
                since=0.0,
                gpus=gpus,
                engines=frozenset({"vllm", "sglang", "sim"}),
                fabrics=(f"ib-{i % fabrics:02d}",),
                used_gpus=frozenset(),
                used_ports=frozenset(),
                address=f"10.0.{i // 256}.{i % 256}",
            )
        )
    return out


def profile(name: str, tp: int, pp: int = 1, per_node: int | None = None) -> DeploymentProfile:
    return DeploymentProfile(
        name=name,
        engine="vllm",
        weights=f"org/{name}",
        tensor_parallel=tp,
        pipeline_parallel=pp,
        gpus_per_node=per_node,
        min_gpu_memory=80 * GB,  # type: ignore[arg-type]
        gpu_name="H100|H200",
    )


SHAPES = [  # (weight, profiles in order of preference)
    (40, (profile("tp1", 1),)),
    (25, (profile("tp2", 2), profile("tp1", 1))),
    (15, (profile("tp4", 4), profile("tp2", 2))),
    (10, (profile("tp8", 8), profile("2x4", 4, 2, 4))),
    (5, (profile("2x4", 8, 1, 4),)),
    (5, (profile("2x8", 8, 2, 8), profile("tp8", 8))),
]


def models(count: int, rng: random.Random) -> list[tuple[str, tuple[DeploymentProfile, ...], int]]:
    weights = [w for w, _ in SHAPES]
    out = []
    for i in range(count):
        (_, profiles) = rng.choices(SHAPES, weights)[0]
        out.append((f"model-{i:03d}", profiles, rng.randint(1, 3)))
    return out


def requests(
    catalog: list[tuple[str, tuple[DeploymentProfile, ...], int]], factor: int = 1, start: int = 0
) -> list[PlaceRequest]:
    out = []
    epoch = start
    for name, profiles, replicas in catalog:
        for _ in range(replicas * factor):
            epoch += 1
            out.append(PlaceRequest(name, f"{name}-r{epoch}", epoch, profiles))
    return out


def timed(fn: Callable[[], PlanResult], repeat: int) -> tuple[list[float], PlanResult]:
    times = []
    result = fn()  # warm-up (regex and import caches)
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1000)
    return times, result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--fabrics", type=int, default=16)
    ap.add_argument("--models", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    rng = random.Random(args.seed)
    nodes = fleet(args.nodes, args.fabrics)
    catalog = models(args.models, rng)
    first = requests(catalog)
    rows: list[dict[str, object]] = []

    def record(name: str, times: list[float], result: PlanResult, asked: int) -> None:
        rows.append(
            {
                "scenario": name,
                "requests": asked,
                "placed": len(result.placed),
                "unplaced": len(result.unplaced),
                "min_ms": round(min(times), 2),
                "median_ms": round(statistics.median(times), 2),
                "max_ms": round(max(times), 2),
            }
        )

    times, initial = timed(lambda: plan(nodes, first, (), PORTS, 100.0), args.repeat)
    record("initial", times, initial, len(first))

    more = requests(catalog[:10], start=10_000)[:10]
    existing: list[Placement] = list(initial.placed)
    times, steady = timed(lambda: plan(initial.nodes, more, existing, PORTS, 100.0), args.repeat)
    record("steady", times, steady, len(more))

    lost_ids = {n.node_id for n in nodes[:: max(1, len(nodes) // (len(nodes) // 20 or 1))]}
    churned = [
        NodeCapacity(
            n.node_id,
            NodeState.LOST,
            40.0,
            n.gpus,
            n.engines,
            n.fabrics,
            frozenset(),
            frozenset(),
            n.address,
        )
        if n.node_id in lost_ids
        else n
        for n in initial.nodes
    ]
    profiles = {name: profs for name, profs, _ in catalog}
    survivors = [p for p in initial.placed if not set(p.nodes) & lost_ids]
    again = [
        PlaceRequest(p.model, p.replica_id + "b", p.epoch + 100_000, profiles[p.model])
        for p in initial.placed
        if set(p.nodes) & lost_ids
    ]
    times, churn = timed(lambda: plan(churned, again, survivors, PORTS, 100.0), args.repeat)
    record(f"churn ({len(lost_ids)} lost)", times, churn, len(again))

    # Profiles named apart per model, so no two models share an explanation (the worst
    # case for its cache), on top of the initial placements (drain hints are searched).
    apart = [
        (name, tuple(attrs.evolve(p, name=f"{p.name}@{name}") for p in profs), replicas)
        for name, profs, replicas in catalog
    ]
    flood = requests(apart, factor=10, start=20_000)
    times, saturated = timed(
        lambda: plan(initial.nodes, flood, initial.placed, PORTS, 100.0), args.repeat
    )
    record("saturated", times, saturated, len(flood))

    if args.json:
        json.dump(
            {"nodes": args.nodes, "fabrics": args.fabrics, "models": args.models, "runs": rows},
            sys.stdout,
            indent=2,
        )
        print()
        return 0
    print(
        f"plan() on {args.nodes} nodes x 8 GPUs, {args.fabrics} fabrics, {args.models} models "
        f"(min / median / max of {args.repeat}; target: a whole reconcile pass < 100 ms)"
    )
    print(
        f"{'scenario':<20} {'requests':>8} {'placed':>7} {'unplaced':>8} "
        f"{'min':>9} {'median':>9} {'max':>9}"
    )
    for r in rows:
        print(
            f"{r['scenario']!s:<20} {r['requests']:>8} {r['placed']:>7} {r['unplaced']:>8} "
            f"{r['min_ms']:>6} ms {r['median_ms']:>6} ms {r['max_ms']:>6} ms"
        )
    if saturated.unplaced:
        print("\nexample explanation:", saturated.unplaced[-1].summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
