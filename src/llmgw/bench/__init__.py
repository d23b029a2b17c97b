"""Workload driver for OpenAI-compatible servers: `llmgw-ctl bench` as a library.

    import trio
    from llmgw import bench

    target = bench.Target("http://127.0.0.1:8080", model="m")
    result = trio.run(bench.run, target, bench.LoadConfig(concurrency=8, requests=200))
    print(result.summary.ttft.p90, bench.to_json(result.summary))

`run` returns every request's `Sample` plus a `Summary`; `run_interleaved`
alternates targets for fair comparisons; `sweep` steps concurrency up and
suggests `router.scoring` targets. All times are seconds.
"""

from llmgw.bench.runner import (
    BenchResult,
    LoadConfig,
    Observer,
    Target,
    api_url,
    merge,
    run,
    run_interleaved,
    run_sync,
    run_with_client,
)
from llmgw.bench.stats import (
    Dist,
    Sample,
    Summary,
    converter,
    dist,
    from_json,
    percentile,
    summarize,
    to_json,
    to_jsonable,
)
from llmgw.bench.sweeping import EngineLoad, Suggestion, SweepResult, SweepStep, suggest, sweep
from llmgw.bench.workload import Prompt, Workload, WorkloadSpec

__all__ = [
    "BenchResult",
    "Dist",
    "EngineLoad",
    "LoadConfig",
    "Observer",
    "Prompt",
    "Sample",
    "Suggestion",
    "Summary",
    "SweepResult",
    "SweepStep",
    "Target",
    "Workload",
    "WorkloadSpec",
    "api_url",
    "converter",
    "dist",
    "from_json",
    "merge",
    "percentile",
    "run",
    "run_interleaved",
    "run_sync",
    "run_with_client",
    "suggest",
    "summarize",
    "sweep",
    "to_json",
    "to_jsonable",
]
