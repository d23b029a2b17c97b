"""Normalise an engine's Prometheus ``/metrics`` page into an :class:`EngineSample`:
the router's scores and the agent's drain read it.

The page's dialect (:data:`llmgw.domain.engines.DIALECTS`) is detected by metric
prefix (``vllm:``, ``sglang:``, ``llamacpp:``): the first sample line carrying one of
them decides, and only that dialect's names are read. `EngineSample.engine` names the
dialect (llmgw-sim speaks vLLM's by default).

Mapping (a metric the engine does not export stays ``None``, never 0):

The names come from the dialect entries (:data:`llmgw.domain.engines.DIALECT_ENTRIES`):

* waiting: ``vllm:num_requests_waiting``, ``sglang:num_queue_reqs``,
  ``llamacpp:requests_deferred``.
* running: ``vllm:num_requests_running``, ``sglang:num_running_reqs``,
  ``llamacpp:requests_processing``.
* kv_usage: ``vllm:kv_cache_usage_perc`` (else the older ``vllm:gpu_cache_usage_perc``),
  ``sglang:token_usage``, ``llamacpp:kv_cache_usage_ratio`` (older llama.cpp builds
  only; current ones export no KV gauge, so None).
* prefix_hit_rate: vLLM from the counters ``vllm:prefix_cache_hits_total`` /
  ``vllm:prefix_cache_queries_total`` (older: ``vllm:gpu_prefix_cache_*_total``),
  windowed against the previous sample (see :func:`windowed_hit_rate`), else the v0
  gauge ``vllm:gpu_prefix_cache_hit_rate``; ``sglang:cache_hit_rate``; llama.cpp none.

Several label sets of one metric (one per ``model_name``, or one per data-parallel
rank in vLLM's ``engine`` label) are combined: counts and counters are **summed**
(the replica's total queue), fractions (KV usage, hit-rate gauges) are **averaged**
(the ranks share one replica's traffic through its own balancer, so the mean is its
usable headroom). With ``model=...`` only samples whose ``model_name`` label equals it
count; samples without that label always count.

Garbage never raises: unparseable lines are skipped, and a page with no recognisable
engine metric yields ``EngineSample(engine="unknown")`` with every field ``None``
(:attr:`EngineSample.known` is False; the caller decides whether that is a failed
scrape). NaN and infinite values are treated as absent.

Speed: a vLLM page is ~100 KB of mostly histogram buckets. Each line is rejected
by one C-level ``str.startswith`` on a tuple of the few names we read; labels are
parsed only on the handful of lines that match.
"""

from __future__ import annotations

import math

import attrs

from llmgw.domain.engines import DIALECT_ENTRIES, DIALECTS

__all__ = [
    "UNKNOWN",
    "EngineSample",
    "parse_metrics",
    "windowed_hit_rate",
]

UNKNOWN = "unknown"


@attrs.frozen
class EngineSample:
    """One scrape of one replica, normalised across engines."""

    engine: str
    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    prefix_hit_rate: float | None = None
    # Raw cumulative prefix-cache counters (vLLM only), kept so the next scrape can
    # compute a windowed hit rate; see windowed_hit_rate().
    prefix_hits: float | None = None
    prefix_queries: float | None = None

    @property
    def known(self) -> bool:
        """Whether the page came from an engine we recognise."""
        return self.engine != UNKNOWN


# Slots of the accumulator. Old names get their own slot so that a version exporting
# both the old and the new name (during a deprecation window) is not double counted.
_WAITING, _RUNNING, _KV, _KV_OLD, _HITS, _QUERIES, _HITS_OLD, _QUERIES_OLD, _RATE = range(9)
_NSLOTS = 9
# Fractions are averaged over label sets; everything else is summed.
_MEAN_SLOTS = frozenset((_KV, _KV_OLD, _RATE))


def _names() -> dict[str, tuple[str, int]]:
    """Every metric name read, to (its dialect, its slot), from the dialect entries."""
    names: dict[str, tuple[str, int]] = {}
    for dialect, entry in DIALECT_ENTRIES.items():
        m = entry.metrics
        for name, slot in (
            (m.waiting, _WAITING),
            (m.running, _RUNNING),
            *zip(m.kv_usage, (_KV, _KV_OLD), strict=False),
            *zip(m.prefix_hits, (_HITS, _HITS_OLD), strict=False),
            *zip(m.prefix_queries, (_QUERIES, _QUERIES_OLD), strict=False),
            *([(m.prefix_hit_rate, _RATE)] if m.prefix_hit_rate else []),
        ):
            names[name] = (dialect, slot)
    return names


_NAMES = _names()
_WANTED = tuple(_NAMES)
_ENGINE_PREFIXES = tuple(f"{e}:" for e in DIALECTS)
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}


def _model_label(line: str, i: int) -> tuple[str | None, int] | None:
    """Scan a label set starting just after ``{``; return (model_name, index after ``}``).

    None when the label set is malformed. Values may contain ``}``, ``,``, ``#`` and
    escapes, so the scan honours quotes instead of searching for ``}``.
    """
    model: str | None = None
    n = len(line)
    while True:
        while i < n and line[i] in " \t,":
            i += 1
        if i >= n:
            return None
        if line[i] == "}":
            return model, i + 1
        eq = line.find("=", i)
        if eq < 0:
            return None
        name = line[i:eq].strip()
        i = eq + 1
        while i < n and line[i] in " \t":
            i += 1
        if i >= n or line[i] != '"':
            return None
        i += 1
        parts: list[str] = []
        while True:
            quote = line.find('"', i)
            if quote < 0:
                return None
            backslash = line.find("\\", i, quote)
            if backslash < 0:
                parts.append(line[i:quote])
                i = quote + 1
                break
            parts.append(line[i:backslash])
            if backslash + 1 >= n:
                return None
            esc = line[backslash + 1]
            parts.append(_ESCAPES.get(esc, "\\" + esc))
            i = backslash + 2
        if name == "model_name":
            model = "".join(parts)


def _value(rest: str) -> float | None:
    """The sample value from what follows the name/labels (timestamp, exemplar ignored)."""
    fields = rest.split(None, 1)
    if not fields:
        return None
    try:
        v = float(fields[0])
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def parse_metrics(
    text: str | bytes,
    *,
    model: str | None = None,
    previous: EngineSample | None = None,
) -> EngineSample:
    """Parse one ``/metrics`` page. Never raises on content (see the module docstring).

    `previous` is this endpoint's last sample: with it, vLLM's prefix-cache counters
    give a hit rate over the window between the two scrapes.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    engine: str | None = None
    sums = [0.0] * _NSLOTS
    counts = [0] * _NSLOTS
    for line in text.split("\n"):
        if not line:
            continue
        if line[0] in " \t":
            line = line.lstrip()
            if not line:
                continue
        if line[0] == "#":
            continue
        if not line.startswith(_WANTED):
            if engine is None and line.startswith(_ENGINE_PREFIXES):
                engine = line[: line.index(":")]
            continue
        # Exact name: the prefix test also passes `vllm:num_requests_waiting_foo`.
        end = len(line)
        for sep in "{ \t":
            j = line.find(sep, 0, end)
            if j >= 0:
                end = j
        hit = _NAMES.get(line[:end])
        if hit is None:
            continue
        owner, slot = hit
        if engine is None:
            engine = owner
        elif owner != engine:
            continue
        if end < len(line) and line[end] == "{":
            labelled = _model_label(line, end + 1)
            if labelled is None:
                continue
            label_model, end = labelled
            if model is not None and label_model is not None and label_model != model:
                continue
        v = _value(line[end:])
        if v is None:
            continue
        sums[slot] += v
        counts[slot] += 1

    if engine is None or engine not in DIALECTS:
        return EngineSample(engine=UNKNOWN)

    def get(slot: int, fallback: int | None = None) -> float | None:
        if counts[slot]:
            return sums[slot] / counts[slot] if slot in _MEAN_SLOTS else sums[slot]
        return get(fallback) if fallback is not None else None

    sample = EngineSample(
        engine=engine,
        waiting=get(_WAITING),
        running=get(_RUNNING),
        kv_usage=get(_KV, _KV_OLD),
        prefix_hit_rate=get(_RATE),
        prefix_hits=get(_HITS, _HITS_OLD),
        prefix_queries=get(_QUERIES, _QUERIES_OLD),
    )
    if sample.prefix_queries is not None:
        # Cumulative counters describe the engine's whole life; only a window tells
        # what the cache does now. Without a previous sample the rate is unknown.
        sample = attrs.evolve(sample, prefix_hit_rate=windowed_hit_rate(previous, sample))
    return sample


def windowed_hit_rate(previous: EngineSample | None, current: EngineSample) -> float | None:
    """Prefix-cache hit rate between two scrapes from vLLM's cumulative counters.

    None when unknown: no previous sample, a counter missing, no queries in the
    window (nothing to measure), or a counter went backwards (the engine restarted).
    """
    if previous is None:
        return None
    h0, q0 = previous.prefix_hits, previous.prefix_queries
    h1, q1 = current.prefix_hits, current.prefix_queries
    if h0 is None or q0 is None or h1 is None or q1 is None:
        return None
    dh, dq = h1 - h0, q1 - q0
    if dq <= 0 or dh < 0:
        return None
    return min(1.0, dh / dq)
