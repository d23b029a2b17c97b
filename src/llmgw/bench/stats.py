"""Per-request samples and their summary: percentiles, throughput, error counts.

Everything here is a pure function of values, so it is tested without sockets.
All times are in seconds (floats); the CLI converts to milliseconds for people.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import attrs
import cattrs

T = TypeVar("T")


@attrs.frozen
class Sample:
    """What one request did, as the client saw it.

    `status` is the HTTP status, or 0 when no response arrived (connect error,
    timeout before headers). `error` is None for a request that completed
    normally; otherwise a short label such as ``"429"``, ``"timeout"``,
    ``"stream_error"`` or ``"truncated"`` that groups failures in the summary.
    """

    index: int
    status: int
    error: str | None
    # Offset of the request's start from the start of its run.
    start: float
    e2e: float
    # None when not streaming: a non-streamed response has no observable first token.
    ttft: float | None
    # Gaps between successive content chunks (one token per chunk on vLLM-like engines).
    itl: tuple[float, ...]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None
    # True when token counts came from the server's `usage`, not from counting chunks.
    usage_reported: bool = False
    group: int = 0
    session: str | None = None
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@attrs.frozen
class Dist:
    """A distribution of seconds: count, mean, extremes and percentiles."""

    count: int
    mean: float
    min: float
    p50: float
    p90: float
    p99: float
    max: float

    def percentile(self, name: str) -> float:
        """The value of `name` in ``{"p50", "p90", "p99", "mean", "max"}``."""
        if name not in ("p50", "p90", "p99", "mean", "min", "max"):
            raise ValueError(f"unknown percentile {name!r}; use p50, p90, p99, mean, min or max")
        return float(getattr(self, name))


@attrs.frozen
class Summary:
    """The numbers a benchmark reports for one run (latencies over successful requests)."""

    requests: int
    ok: int
    failed: int
    # Failure label -> count; see `Sample.error`.
    errors: dict[str, int]
    duration: float
    request_throughput: float
    output_token_throughput: float
    total_token_throughput: float
    prompt_tokens: int
    completion_tokens: int
    # None when no server reported `prompt_tokens_details.cached_tokens`.
    cached_tokens: int | None
    ttft: Dist | None
    itl: Dist | None
    # Time per output token after the first: (e2e - ttft) / (tokens - 1).
    tpot: Dist | None
    e2e: Dist | None


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The `q`-quantile (0 <= q <= 1) of already sorted values, interpolating linearly.

    Same definition as numpy's default and ``statistics.quantiles(method="inclusive")``:
    position q*(n-1) between the order statistics, so p50 of [1, 2, 3, 4] is 2.5.
    """
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    a, b = sorted_values[lo], sorted_values[hi]
    # a + (b-a)*frac can step outside [a, b] by rounding; clamp to keep p monotone.
    return min(max(a + (b - a) * frac, a), b)


def dist(values: Iterable[float]) -> Dist | None:
    """Summarise values, or None when there are none (JSON null, not a fake zero)."""
    xs = sorted(values)
    if not xs:
        return None
    mean = math.fsum(xs) / len(xs)
    return Dist(
        count=len(xs),
        mean=min(max(mean, xs[0]), xs[-1]),
        min=xs[0],
        p50=percentile(xs, 0.50),
        p90=percentile(xs, 0.90),
        p99=percentile(xs, 0.99),
        max=xs[-1],
    )


def summarize(samples: Sequence[Sample], duration: float) -> Summary:
    """Summarise samples collected over `duration` seconds of wall time."""
    ok = [s for s in samples if s.ok]
    errors = Counter(s.error for s in samples if s.error is not None)
    prompt = sum(s.prompt_tokens for s in ok)
    completion = sum(s.completion_tokens for s in ok)
    cached = [s.cached_tokens for s in ok if s.cached_tokens is not None]
    rate = 1.0 / duration if duration > 0 else 0.0
    tpot = [
        (s.e2e - s.ttft) / (s.completion_tokens - 1)
        for s in ok
        if s.ttft is not None and s.completion_tokens > 1
    ]
    return Summary(
        requests=len(samples),
        ok=len(ok),
        failed=len(samples) - len(ok),
        errors=dict(sorted(errors.items())),
        duration=duration,
        request_throughput=len(ok) * rate,
        output_token_throughput=completion * rate,
        total_token_throughput=(prompt + completion) * rate,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=sum(cached) if cached else None,
        ttft=dist(s.ttft for s in ok if s.ttft is not None),
        itl=dist(gap for s in ok for gap in s.itl),
        tpot=dist(tpot),
        e2e=dist(s.e2e for s in ok),
    )


# One converter for every bench value: attrs classes to plain dicts and back. Its own:
# a bench's results are its output format (llmgw-ctl bench --json, --samples), read
# back by from_json; the admin API's views (llmgw.jsonviews) are another format, and
# input from operators goes through llmgw.config.structure_as.
converter = cattrs.Converter()


def to_jsonable(value: object) -> Any:
    """Plain dicts, lists and scalars for `value` (attrs classes included)."""
    return converter.unstructure(value)


def to_json(value: object, *, indent: int | None = 2) -> str:
    return json.dumps(to_jsonable(value), indent=indent)


def from_json(text: str, cls: type[T]) -> T:
    """The inverse of `to_json` for a bench value class (e.g. a saved `Summary`)."""
    return converter.structure(json.loads(text), cls)
