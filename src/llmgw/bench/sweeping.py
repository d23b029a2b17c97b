"""Step concurrency up and turn the measured TTFT curve into a replica's capacity.

The rule (also in `RULE`, printed with every suggestion):

* A step *meets the target* when its TTFT percentile (p90 by default) is at most
  the target TTFT and at most 1% of its requests failed.
* Walk the steps in ascending concurrency and stop at the first that misses; the
  last step before it has concurrency C. Stopping at the first miss (rather than
  taking the largest passing step anywhere) keeps one lucky noisy step from
  pushing the suggestion past a real knee.
* ``capacity = max(1, floor(C / replicas))`` on each endpoint (or the engine's own
  limit, e.g. vLLM ``--max-num-seqs``, set to it): in a closed loop every client
  request is in flight at some replica, so C / replicas is the per-replica in-flight
  count that still met the target. Past its capacity a replica counts as full and
  admission holds requests in the router instead of the engine's queue.
* ``router.scoring.target_waiting = max(1, ceil(W))`` where W is the mean
  waiting-queue length per replica that the engines' /metrics reported during
  step C (``vllm:num_requests_waiting``, ``sglang:num_queue_reqs``). It is at
  least 1 because the scorer divides by it; 1 then means "any queueing costs".
  Unknown when no metrics endpoint answered (e.g. benchmarking through a router:
  pass the engines' metrics URLs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import httpx
import trio

from llmgw.bench.runner import BenchResult, LoadConfig, Observer, Target, open_client
from llmgw.bench.runner import run_with_client as _run_with_client
from llmgw.bench.stats import Summary

RULE = (
    "capacity = max(1, floor(C / replicas)) where C is the last concurrency, "
    "walking up, whose TTFT {pct} stayed <= {target} with <= {errors} errors; "
    "target_waiting = max(1, ceil(mean engine waiting queue per replica at C))"
)

PERCENTILES = ("p50", "p90", "p99")

WAITING_METRICS = (
    "vllm:num_requests_waiting",
    "sglang:num_queue_reqs",
    "llamacpp:requests_deferred",
)
RUNNING_METRICS = (
    "vllm:num_requests_running",
    "sglang:num_running_reqs",
    "llamacpp:requests_processing",
)


@attrs.frozen
class EngineLoad:
    """Engine queue gauges sampled during one step, per replica."""

    samples: int
    waiting_mean: float
    waiting_max: float
    running_mean: float | None
    running_max: float | None


@attrs.frozen
class SweepStep:
    concurrency: int
    per_replica: float
    # The chosen TTFT percentile in seconds (None when nothing streamed a token).
    ttft: float | None
    # None when the sweep had no target TTFT.
    passed: bool | None
    engine: EngineLoad | None
    result: BenchResult

    @property
    def summary(self) -> Summary:
        return self.result.summary


@attrs.frozen
class Suggestion:
    capacity: int | None  # per replica
    target_waiting: int | None
    # The concurrency the suggestion was read at.
    concurrency: int | None
    rule: str
    note: str


@attrs.frozen
class SweepResult:
    target: str
    model: str
    target_ttft: float | None
    percentile: str
    replicas: int
    steps: tuple[SweepStep, ...]
    suggestion: Suggestion | None


def gauge(text: str, names: Sequence[str]) -> float | None:
    """Sum of all series of the first metric in `names` present in a Prometheus text page."""
    for name in names:
        total, found = 0.0, False
        for line in text.splitlines():
            if not line.startswith(name):
                continue
            rest = line[len(name) :]
            if rest[:1] not in ("{", " "):
                continue  # a longer name with this prefix
            value = rest.rsplit("}", 1)[-1].split()
            try:
                total += float(value[0])
                found = True
            except (IndexError, ValueError):
                continue
        if found:
            return total
    return None


def step_passes(
    summary: Summary, target_ttft: float, percentile: str, max_error_rate: float
) -> bool:
    if summary.ttft is None or summary.requests == 0:
        return False
    return (
        summary.ttft.percentile(percentile) <= target_ttft
        and summary.failed <= max_error_rate * summary.requests
    )


def suggest(
    steps: Sequence[SweepStep],
    *,
    target_ttft: float,
    percentile: str,
    replicas: int,
    max_error_rate: float = 0.01,
) -> Suggestion:
    """Scoring targets from measured steps (pure; see the module docstring for the rule)."""
    rule = RULE.format(
        pct=percentile, target=f"{target_ttft * 1000:g}ms", errors=f"{max_error_rate:.0%}"
    )
    ordered = sorted(steps, key=lambda s: s.concurrency)
    best: SweepStep | None = None
    missed: SweepStep | None = None
    for step in ordered:
        if not step_passes(step.summary, target_ttft, percentile, max_error_rate):
            missed = step
            break
        best = step
    if best is None:
        first = ordered[0] if ordered else None
        seen = (
            f"TTFT {percentile} {first.ttft * 1000:.0f}ms"
            if first is not None and first.ttft is not None
            else "no successful streamed request"
        )
        where = f"concurrency {first.concurrency}" if first else "no steps"
        return Suggestion(
            None,
            None,
            None,
            rule,
            f"{where} already misses the target ({seen}); no in-flight limit meets it",
        )
    inflight = max(1, math.floor(best.concurrency / replicas))
    waiting = None if best.engine is None else max(1, math.ceil(best.engine.waiting_mean))
    notes = []
    if missed is None:
        notes.append(
            f"every step met the target; the limit is above concurrency {best.concurrency}, "
            "extend the sweep for a tighter value"
        )
    else:
        ttft = "n/a" if missed.ttft is None else f"{missed.ttft * 1000:.0f}ms"
        notes.append(f"concurrency {missed.concurrency} missed it (TTFT {percentile} {ttft})")
    if best.concurrency < replicas:
        notes.append(f"fewer clients ({best.concurrency}) than replicas ({replicas})")
    if waiting is None:
        notes.append("engine waiting queue unknown: no metrics endpoint answered")
    return Suggestion(inflight, waiting, best.concurrency, rule, "; ".join(notes))


async def _sample_engines(
    client: httpx.AsyncClient, urls: Sequence[str], interval: float, into: list[EngineLoad]
) -> None:
    """Poll the engines' gauges until cancelled; appends one summary when stopped."""
    waiting: list[float] = []
    running: list[float] = []
    try:
        while True:
            w_now: list[float] = []
            r_now: list[float] = []
            for url in urls:
                try:
                    resp = await client.get(url)
                except httpx.HTTPError:
                    continue
                if resp.status_code != 200:
                    continue
                w = gauge(resp.text, WAITING_METRICS)
                r = gauge(resp.text, RUNNING_METRICS)
                if w is not None:
                    w_now.append(w)
                if r is not None:
                    r_now.append(r)
            if w_now:  # per replica: mean over the engines that answered
                waiting.append(sum(w_now) / len(w_now))
            if r_now:
                running.append(sum(r_now) / len(r_now))
            await trio.sleep(interval)
    finally:
        if waiting:
            into.append(
                EngineLoad(
                    samples=len(waiting),
                    waiting_mean=sum(waiting) / len(waiting),
                    waiting_max=max(waiting),
                    running_mean=sum(running) / len(running) if running else None,
                    running_max=max(running) if running else None,
                )
            )


def default_metrics_url(base: str) -> str:
    base = base.rstrip("/")
    base = base.removesuffix("/v1")
    return f"{base}/metrics"


async def sweep(
    target: Target,
    config: LoadConfig,
    concurrencies: Sequence[int],
    *,
    target_ttft: float | None = None,
    percentile: str = "p90",
    replicas: int = 1,
    max_error_rate: float = 0.01,
    metrics_urls: Sequence[str] | None = None,
    metrics_interval: float = 0.25,
    stop_on_miss: bool = True,
    observer: Observer | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> SweepResult:
    """One run per concurrency (each bounded by `config`), fresh prompts per step.

    `metrics_urls` are the engines' Prometheus pages, sampled every
    `metrics_interval` seconds during each step; by default ``{url}/metrics`` of
    the target itself (right when benchmarking an engine directly). With a
    `target_ttft` the sweep stops after the first step that misses it (unless
    `stop_on_miss` is False) and returns a `Suggestion`.
    """
    if not concurrencies or any(c < 1 for c in concurrencies):
        raise ValueError("concurrencies must be a non-empty list of positive integers")
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    if percentile not in PERCENTILES:
        raise ValueError(f"percentile must be one of {', '.join(PERCENTILES)}, got {percentile!r}")
    urls = list(metrics_urls) if metrics_urls is not None else [default_metrics_url(target.url)]
    steps: list[SweepStep] = []
    start_index = config.start_index
    pool = attrs.evolve(config, concurrency=max(concurrencies) + 1)
    async with open_client(pool, transport) as client:
        for concurrency in sorted(concurrencies):
            step_config = attrs.evolve(config, concurrency=concurrency, start_index=start_index)
            loads: list[EngineLoad] = []
            async with trio.open_nursery() as nursery:
                if urls:
                    nursery.start_soon(_sample_engines, client, urls, metrics_interval, loads)
                result = await _run_with_client(client, target, step_config, observer=observer)
                nursery.cancel_scope.cancel()
            start_index += len(result.samples)
            ttft = (
                None if result.summary.ttft is None else result.summary.ttft.percentile(percentile)
            )
            passed = (
                None
                if target_ttft is None
                else step_passes(result.summary, target_ttft, percentile, max_error_rate)
            )
            steps.append(
                SweepStep(
                    concurrency=concurrency,
                    per_replica=concurrency / replicas,
                    ttft=ttft,
                    passed=passed,
                    engine=loads[0] if loads else None,
                    result=result,
                )
            )
            if passed is False and stop_on_miss:
                break
    suggestion = (
        None
        if target_ttft is None
        else suggest(
            steps,
            target_ttft=target_ttft,
            percentile=percentile,
            replicas=replicas,
            max_error_rate=max_error_rate,
        )
    )
    return SweepResult(
        target=target.label,
        model=target.model,
        target_ttft=target_ttft,
        percentile=percentile,
        replicas=replicas,
        steps=tuple(steps),
        suggestion=suggestion,
    )
