"""Prometheus exposition of the simulated engine, in vLLM's, SGLang's or llama.cpp's names.

Everything is read at scrape time from the engine's ``Stats`` and from ``Recorder``
(latency histograms, per-reason request counts, step counts), all owned by the trio
thread: the route calls ``render()`` there, so the collector needs no locks.

The ``llamacpp`` format is the page ``llama-server --metrics`` serves, copied from
build b11434 (the one llmgw's tests run): fifteen unlabelled ``llamacpp:`` samples,
each with its ``# HELP`` and ``# TYPE`` lines, in llama-server's order and with its
types (``n_tokens_max`` really is declared a counter there), values printed as C++
streams print a double (``%g``: ``1.23457e+06`` for a large counter, as llama-server
does). There is no KV-cache gauge: current llama-server exports none (older builds
had ``kv_cache_usage_ratio`` / ``kv_cache_tokens``), and no hit-rate gauge either; its
only cache figure is the counter ``prompt_tokens_cached_total``. How the simulator
fills each sample:

* ``requests_processing`` / ``requests_deferred``: sequences running / waiting;
* ``prompt_tokens_total``: prompt tokens computed at admission (cache misses),
  ``prompt_tokens_cached_total``: prompt tokens found in the prefix cache;
* ``tokens_predicted_total``: generated tokens;
* ``prompt_seconds_total`` / ``tokens_predicted_seconds_total``: slot-seconds spent in
  steps that prefilled / decoded each sequence (llama-server sums them per slot too);
* ``prompt_tokens_seconds`` / ``predicted_tokens_seconds``: tokens per slot-second
  since the previous scrape (llama-server resets this "bucket" on every ``/metrics``);
* ``n_decode_total``: engine steps, ``n_busy_slots_per_decode``: sequences per step;
* ``n_tokens_max``: the longest finished sequence (prompt + output);
* ``spec_decode_*``: 0 (no speculative decoding here).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from llmgw.domain.engines import DIALECTS, Dialect
from llmgw.domain.histogram import Histogram
from llmgw.sim.model import EngineConfig, Finished, ScheduledStep, Stats

# The sim speaks every metric dialect the router reads.
MetricsFormat = Dialect
FORMATS: tuple[MetricsFormat, ...] = DIALECTS

# vLLM's bucket edges, so dashboards built for vLLM read these unchanged.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

#: Window for SGLang's gen_throughput gauge.
THROUGHPUT_WINDOW_S = 5.0


class Recorder:
    """What the engine loop and the handlers observe beyond the engine's own counters."""

    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.finished: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self._recent: deque[tuple[float, int]] = deque()
        # llama.cpp's counters: steps, sequences per step summed, slot-seconds spent
        # prefilling and decoding, the longest finished sequence.
        self.steps = 0
        self.busy_slots = 0
        self.prompt_seconds = 0.0
        self.decode_seconds = 0.0
        self.max_seq_tokens = 0

    def stepped(self, step: ScheduledStep) -> None:
        """One engine step has completed."""
        self.steps += 1
        self.busy_slots += len(step.work)
        self.decode_seconds += step.duration * step.num_decodes
        self.prompt_seconds += step.duration * (len(step.work) - step.num_decodes)

    def sequence_done(self, done: Finished) -> None:
        self.max_seq_tokens = max(self.max_seq_tokens, done.prompt_tokens + done.completion_tokens)

    def generated(self, now: float, n: int) -> None:
        self._recent.append((now, n))
        while self._recent and self._recent[0][0] < now - THROUGHPUT_WINDOW_S:
            self._recent.popleft()

    def throughput(self, now: float) -> float:
        """Generated tokens per second over the last few seconds."""
        return sum(n for t, n in self._recent if t >= now - THROUGHPUT_WINDOW_S) / (
            THROUGHPUT_WINDOW_S
        )


class EngineCollector(Collector):
    def __init__(
        self,
        fmt: MetricsFormat,
        model_name: str,
        config: EngineConfig,
        stats: Callable[[], Stats],
        recorder: Recorder,
        clock: Callable[[], float],
    ) -> None:
        if fmt not in ("vllm", "sglang"):
            raise ValueError(f"EngineCollector serves vllm or sglang names, not {fmt!r}")
        self.fmt = fmt
        self.model = model_name
        self.config = config
        self.stats = stats
        self.rec = recorder
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        if self.fmt == "vllm":
            yield from self._vllm(s)
        else:
            yield from self._sglang(s)

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=["model_name"])
        g.add_metric([self.model], value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=["model_name"])
        c.add_metric([self.model], value)
        return c

    def _histogram(self, name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
        m = HistogramMetricFamily(name, doc, labels=["model_name"])
        m.add_metric([self.model], h.buckets(), h.sum)
        return m

    def _vllm(self, s: Stats) -> Iterator[Metric]:
        yield self._gauge("vllm:num_requests_running", "Requests in the batch.", s.num_running)
        yield self._gauge("vllm:num_requests_waiting", "Requests queued.", s.num_waiting)
        yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full.", s.kv_usage)
        # The pre-v1 name, still scraped by some routers.
        yield self._gauge("vllm:gpu_cache_usage_perc", "KV-cache usage, 1 = full.", s.kv_usage)
        yield self._counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up.", s.prefix_queries
        )
        yield self._counter("vllm:prefix_cache_hits", "Prompt tokens found.", s.prefix_hits)
        yield self._counter("vllm:prompt_tokens", "Prefilled prompt tokens.", s.prompt_tokens)
        yield self._counter("vllm:generation_tokens", "Generated tokens.", s.generation_tokens)
        yield self._counter("vllm:num_preemptions", "Preempted sequences.", s.preemptions)
        ok = CounterMetricFamily(
            "vllm:request_success",
            "Finished requests by reason.",
            labels=["model_name", "finished_reason"],
        )
        for reason, n in self.rec.finished.items():
            ok.add_metric([self.model, reason], n)
        yield ok
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "KV-cache configuration.",
            labels=["model_name", "block_size", "num_gpu_blocks", "enable_prefix_caching"],
        )
        info.add_metric(
            [
                self.model,
                str(self.config.block_size),
                str(self.config.num_blocks),
                str(self.config.enable_prefix_caching),
            ],
            1.0,
        )
        yield info
        yield self._histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", self.rec.ttft
        )
        yield self._histogram(
            "vllm:inter_token_latency_seconds", "Time between tokens.", self.rec.itl
        )
        yield self._histogram("vllm:e2e_request_latency_seconds", "Request latency.", self.rec.e2e)

    def _sglang(self, s: Stats) -> Iterator[Metric]:
        bs = self.config.block_size
        yield self._gauge("sglang:num_running_reqs", "Requests in the batch.", s.num_running)
        yield self._gauge("sglang:num_queue_reqs", "Requests queued.", s.num_waiting)
        yield self._gauge("sglang:token_usage", "KV-cache usage, 1 = full.", s.kv_usage)
        yield self._gauge("sglang:num_used_tokens", "KV slots in use.", s.num_used_blocks * bs)
        hit_rate = s.prefix_hits / s.prefix_queries if s.prefix_queries else 0.0
        yield self._gauge("sglang:cache_hit_rate", "Prefix-cache hit rate.", hit_rate)
        yield self._gauge(
            "sglang:gen_throughput", "Generated tokens/s.", self.rec.throughput(self.clock())
        )
        yield self._counter("sglang:prompt_tokens", "Prompt tokens.", s.prompt_tokens)
        yield self._counter("sglang:generation_tokens", "Generated tokens.", s.generation_tokens)
        yield self._counter("sglang:cached_tokens", "Prompt tokens found cached.", s.prefix_hits)
        yield self._counter(
            "sglang:num_requests", "Finished requests.", sum(self.rec.finished.values())
        )
        yield self._histogram(
            "sglang:time_to_first_token_seconds", "Time to first token.", self.rec.ttft
        )
        yield self._histogram(
            "sglang:inter_token_latency_seconds", "Time between tokens.", self.rec.itl
        )
        yield self._histogram(
            "sglang:e2e_request_latency_seconds", "Request latency.", self.rec.e2e
        )


class Exposition:
    """A private registry holding only the engine collector."""

    def __init__(self, collector: EngineCollector) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class LlamaCppPage:
    """llama-server's ``/metrics`` page (see the module docstring), rendered by hand:
    prometheus_client would append ``_total`` to its counters and label nothing the way
    llama-server does not."""

    def __init__(self, stats: Callable[[], Stats], recorder: Recorder) -> None:
        self.stats = stats
        self.rec = recorder
        # llama-server's throughput gauges cover the time since the previous scrape.
        self._bucket = (0.0, 0.0, 0.0, 0.0)

    def samples(self) -> list[tuple[str, str, str, float]]:
        """(name without ``llamacpp:``, type, help, value), in llama-server's order."""
        s, rec = self.stats(), self.rec
        uncached = float(s.prefix_queries - s.prefix_hits)
        generated = float(s.generation_tokens)
        now = (uncached, rec.prompt_seconds, generated, rec.decode_seconds)
        prev, self._bucket = self._bucket, now
        d_prompt, d_prompt_s, d_gen, d_gen_s = (a - b for a, b in zip(now, prev, strict=True))
        prompt_rate = d_prompt / d_prompt_s if d_prompt > 0 and d_prompt_s > 0 else 0.0
        gen_rate = d_gen / d_gen_s if d_gen > 0 and d_gen_s > 0 else 0.0
        counter, gauge = "counter", "gauge"
        return [
            (
                "prompt_tokens_total",
                counter,
                "Number of prompt tokens processed, excluding cached tokens",
                uncached,
            ),
            (
                "prompt_tokens_cached_total",
                counter,
                "Number of prompt tokens reused from the cache",
                float(s.prefix_hits),
            ),
            (
                "prompt_seconds_total",
                counter,
                "Total time spent processing prompts",
                rec.prompt_seconds,
            ),
            ("tokens_predicted_total", counter, "Number of generation tokens processed", generated),
            (
                "tokens_predicted_seconds_total",
                counter,
                "Total time spent generating tokens",
                rec.decode_seconds,
            ),
            (
                "n_decode_total",
                counter,
                "Total number of llama_decode() calls, excluding speculative decoding and "
                "multimodal decoding",
                float(rec.steps),
            ),
            (
                "n_tokens_max",
                counter,
                "Largest observed sequence length (prompt + generation)",
                float(rec.max_seq_tokens),
            ),
            (
                "spec_decode_num_draft_tokens_total",
                counter,
                "Speculative: Total draft tokens generated",
                0.0,
            ),
            (
                "spec_decode_num_accepted_tokens_total",
                counter,
                "Speculative: Total draft tokens accepted by the target model",
                0.0,
            ),
            (
                "spec_decode_num_drafts_total",
                counter,
                "Speculative: Total speculative decoding verification steps",
                0.0,
            ),
            ("prompt_tokens_seconds", gauge, "Average prompt throughput in tokens/s", prompt_rate),
            (
                "predicted_tokens_seconds",
                gauge,
                "Average generation throughput in tokens/s",
                gen_rate,
            ),
            ("requests_processing", gauge, "Number of requests processing", float(s.num_running)),
            ("requests_deferred", gauge, "Number of requests deferred", float(s.num_waiting)),
            (
                "n_busy_slots_per_decode",
                gauge,
                "Average number of busy slots per llama_decode() call",
                rec.busy_slots / max(rec.steps, 1),
            ),
        ]

    def render(self) -> bytes:
        lines: list[str] = []
        for name, kind, doc, value in self.samples():
            lines.append(f"# HELP llamacpp:{name} {doc}")
            lines.append(f"# TYPE llamacpp:{name} {kind}")
            lines.append(f"llamacpp:{name} {value:g}")
        return ("\n".join(lines) + "\n").encode()


#: The content type each format's page is served with (llama-server's has no charset).
CONTENT_TYPES: dict[MetricsFormat, bytes] = {
    "vllm": b"text/plain; version=0.0.4; charset=utf-8",
    "sglang": b"text/plain; version=0.0.4; charset=utf-8",
    "llamacpp": b"text/plain; version=0.0.4",
}


def exposition(
    fmt: MetricsFormat,
    model_name: str,
    config: EngineConfig,
    stats: Callable[[], Stats],
    recorder: Recorder,
    clock: Callable[[], float],
) -> Exposition | LlamaCppPage:
    """The ``/metrics`` page of a simulator in format `fmt`."""
    if fmt == "llamacpp":
        return LlamaCppPage(stats, recorder)
    return Exposition(EngineCollector(fmt, model_name, config, stats, recorder, clock))
