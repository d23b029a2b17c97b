"""The closed-loop load driver: N concurrent workers, each sending its next request
as soon as the previous one finishes, against any OpenAI-compatible base URL.

Every run is bounded: by a request count, a duration, or both (whichever comes
first), and every request by `request_timeout`. When the duration ends, no new
request starts and the ones in flight finish (each still within its own timeout),
so long requests are not silently dropped from the latency distribution.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal, Protocol

import attrs
import httpx
import trio

from llmgw.bench.sse import SSEDecoder
from llmgw.bench.stats import Sample, Summary, summarize
from llmgw.bench.transport import FastTransport
from llmgw.bench.workload import Prompt, Workload, WorkloadSpec

Endpoint = Literal["chat", "completions"]

# Header names a run sends by default; `LoadConfig` can rename them.
BAND_HEADER = "x-llmgw-band"
SESSION_HEADER = "x-session-id"


def _positive_or_none(_inst: object, attr: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{attr.name} must be positive, got {value}")


def _at_least_one(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attr.name} must be at least 1, got {value}")


def api_url(base: str, endpoint: Endpoint) -> str:
    """``{base}/v1/chat/completions``; a base already ending in /v1 is not doubled."""
    base = base.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return f"{base}/{'chat/completions' if endpoint == 'chat' else 'completions'}"


@attrs.frozen
class Target:
    """Where to send requests. `name` labels results (defaults to the URL)."""

    url: str
    model: str
    name: str = ""
    api_key: str | None = attrs.field(default=None, repr=False)
    endpoint: Endpoint = "chat"
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return self.name or self.url


@attrs.frozen
class LoadConfig:
    """How hard and how long to drive a target.

    `requests` and `duration` (seconds) bound the run; at least one must be set.
    `start_index` picks the first workload index, so consecutive runs (sweep steps,
    interleaved rounds) send fresh prompts instead of hitting the prefix cache with
    the previous run's.
    """

    concurrency: int = attrs.field(default=8, validator=_at_least_one)
    requests: int | None = attrs.field(default=200, validator=_positive_or_none)
    duration: float | None = attrs.field(default=None, validator=_positive_or_none)
    stream: bool = True
    workload: WorkloadSpec = attrs.field(factory=WorkloadSpec)
    band: str | None = None
    band_header: str = BAND_HEADER
    session_header: str = SESSION_HEADER
    # vLLM/SGLang extension: generate exactly max_tokens, so output length is fixed.
    ignore_eos: bool = True
    request_timeout: float = attrs.field(default=120.0, validator=_positive_or_none)
    connect_timeout: float = 10.0
    # Merged into every request body last (e.g. {"temperature": 0}).
    extra_body: Mapping[str, Any] = attrs.field(factory=dict, hash=False)
    start_index: int = 0

    def __attrs_post_init__(self) -> None:
        if self.requests is None and self.duration is None:
            raise ValueError("a run needs a bound: set requests, duration or both")


@attrs.frozen
class BenchResult:
    """One run against one target: every request's sample and their summary."""

    target: str
    model: str
    config: LoadConfig
    samples: tuple[Sample, ...]
    summary: Summary


class Observer(Protocol):
    """Progress reporting hooks (a progress bar, a log); called on the trio thread."""

    def run_started(self, target: Target, config: LoadConfig) -> None: ...

    def request_done(self, sample: Sample) -> None: ...

    def run_finished(self, result: BenchResult) -> None: ...


def request_body(target: Target, config: LoadConfig, prompt: Prompt) -> dict[str, Any]:
    body: dict[str, Any] = {"model": target.model, "max_tokens": prompt.max_tokens}
    if target.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    if config.stream:
        body["stream"] = True
        # Token counts from the server's usage chunk beat counting chunks.
        body["stream_options"] = {"include_usage": True}
    if config.ignore_eos:
        body["ignore_eos"] = True
    body.update(config.extra_body)
    return body


def request_headers(target: Target, config: LoadConfig, prompt: Prompt) -> dict[str, str]:
    headers = dict(target.headers)
    if target.api_key:
        headers["authorization"] = f"Bearer {target.api_key}"
    if config.band:
        headers[config.band_header] = config.band
    if prompt.session is not None:
        headers[config.session_header] = prompt.session
    if config.stream:
        headers["accept"] = "text/event-stream"
    return headers


@contextlib.asynccontextmanager
async def open_client(
    config: LoadConfig, transport: httpx.AsyncBaseTransport | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """A pooled client for the run (:class:`~llmgw.bench.transport.FastTransport`
    unless `transport` is given).

    TCP_NODELAY: without it small SSE writes can wait ~40 ms on delayed ACKs, which
    would show up as fake TTFT. The environment's proxy settings are ignored on
    purpose: a load generator measures the target, not a proxy in between.
    """
    if transport is None:
        transport = FastTransport(config.connect_timeout, config.concurrency)
    # Only connect has an httpx timeout; the whole request is bounded by a trio
    # cancel scope, which also covers a stream that trickles forever.
    timeout = httpx.Timeout(None, connect=config.connect_timeout)
    async with httpx.AsyncClient(transport=transport, timeout=timeout, trust_env=False) as client:
        yield client


class _Attempt:
    """Mutable scratch for one request while it runs; frozen into a `Sample` at the end."""

    def __init__(self, prompt: Prompt, start: float) -> None:
        self.prompt = prompt
        self.start = start
        self.status = 0
        self.error: str | None = None
        self.message: str | None = None
        self.token_times: list[float] = []
        self.text_words = 0
        self.usage: dict[str, Any] | None = None
        self.done = False

    def fail(self, label: str, message: str | None = None) -> None:
        if self.error is None:  # the first failure is the cause; later ones follow from it
            self.error = label
            self.message = message[:300] if message else None

    def sample(self, run_start: float, end: float, streamed: bool) -> Sample:
        usage = self.usage or {}
        prompt_tokens = usage.get("prompt_tokens")
        completion_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if not isinstance(completion_tokens, int):
            completion_tokens = len(self.token_times) if streamed else self.text_words
        times = self.token_times
        return Sample(
            index=self.prompt.index,
            status=self.status,
            error=self.error,
            start=self.start - run_start,
            e2e=end - self.start,
            ttft=times[0] - self.start if times else None,
            itl=tuple(b - a for a, b in itertools.pairwise(times)),
            prompt_tokens=prompt_tokens if isinstance(prompt_tokens, int) else self.prompt.words,
            completion_tokens=completion_tokens,
            cached_tokens=cached if isinstance(cached, int) else None,
            usage_reported=self.usage is not None,
            group=self.prompt.group,
            session=self.prompt.session,
            message=self.message,
        )


def _error_message(body: bytes) -> str:
    """The `error.message` of an OpenAI-shaped error body, else the body's start."""
    try:
        obj = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", errors="replace").strip()
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("detail"))
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
    return json.dumps(obj)[:200]


def _chunk_content(choice: Mapping[str, Any], endpoint: Endpoint) -> str:
    if endpoint == "completions":
        text = choice.get("text")
        return text if isinstance(text, str) else ""
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return ""
    # Reasoning models stream thoughts first; those are tokens the user waits through.
    parts = (delta.get("content"), delta.get("reasoning_content"), delta.get("reasoning"))
    return "".join(p for p in parts if isinstance(p, str))


def _handle_event(attempt: _Attempt, data: str, endpoint: Endpoint, now: float) -> None:
    if data.strip() == "[DONE]":
        attempt.done = True
        return
    try:
        obj = json.loads(data)
    except ValueError:
        attempt.fail("bad_sse", data[:200])
        return
    if not isinstance(obj, dict):
        attempt.fail("bad_sse", data[:200])
        return
    if "error" in obj:
        err = obj["error"]
        msg = err.get("message") if isinstance(err, dict) else err
        attempt.fail("stream_error", str(msg))
        return
    usage = obj.get("usage")
    if isinstance(usage, dict):
        attempt.usage = usage
    choices = obj.get("choices")
    if isinstance(choices, list) and any(
        isinstance(c, dict) and _chunk_content(c, endpoint) for c in choices
    ):
        attempt.token_times.append(now)


async def _stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str],
    attempt: _Attempt, endpoint: Endpoint,
) -> None:  # fmt: skip
    async with client.stream("POST", url, json=body, headers=headers) as resp:
        attempt.status = resp.status_code
        if resp.status_code != 200:
            attempt.fail(str(resp.status_code), _error_message(await resp.aread()))
            return
        decoder = SSEDecoder()
        async for chunk in resp.aiter_bytes():
            now = trio.current_time()
            for event in decoder.feed(chunk):
                _handle_event(attempt, event.data, endpoint, now)
        for event in decoder.close():
            _handle_event(attempt, event.data, endpoint, trio.current_time())
    if not attempt.done:
        attempt.fail("truncated", "stream ended without data: [DONE]")


async def _plain(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str],
    attempt: _Attempt, endpoint: Endpoint,
) -> None:  # fmt: skip
    resp = await client.post(url, json=body, headers=headers)
    attempt.status = resp.status_code
    if resp.status_code != 200:
        attempt.fail(str(resp.status_code), _error_message(resp.content))
        return
    try:
        obj = resp.json()
    except ValueError:
        attempt.fail("bad_json", resp.text[:200])
        return
    if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
        attempt.usage = obj["usage"]
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        attempt.fail("bad_json", "response has no choices")
        return
    if endpoint == "chat":
        message = choices[0].get("message") or {}
        text = message.get("content") if isinstance(message, dict) else None
    else:
        text = choices[0].get("text")
    # Fallback token count when no usage: about one token per word (see workload).
    attempt.text_words = len(text.split()) if isinstance(text, str) else 0


async def send_one(
    client: httpx.AsyncClient, target: Target, config: LoadConfig, prompt: Prompt, run_start: float
) -> Sample:
    """Send one request and measure it; never raises for an HTTP or network failure."""
    url = api_url(target.url, target.endpoint)
    body = request_body(target, config, prompt)
    headers = request_headers(target, config, prompt)
    attempt = _Attempt(prompt, trio.current_time())
    with trio.move_on_after(config.request_timeout) as scope:
        try:
            if config.stream:
                await _stream(client, url, body, headers, attempt, target.endpoint)
            else:
                await _plain(client, url, body, headers, attempt, target.endpoint)
        except httpx.TimeoutException as exc:
            attempt.fail("timeout", f"{type(exc).__name__}: {exc}")
        except httpx.ConnectError as exc:
            attempt.fail("connect_error", str(exc))
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            attempt.fail("connection_lost", f"{type(exc).__name__}: {exc}")
        except httpx.HTTPError as exc:
            attempt.fail("http_error", f"{type(exc).__name__}: {exc}")
    if scope.cancelled_caught:
        attempt.fail("timeout", f"no complete response within {config.request_timeout:g}s")
    return attempt.sample(run_start, trio.current_time(), config.stream)


async def run_with_client(
    client: httpx.AsyncClient,
    target: Target,
    config: LoadConfig,
    *,
    observer: Observer | None = None,
) -> BenchResult:
    """`run` on a client the caller owns (to share one pool across several runs)."""
    workload = Workload(config.workload)
    if observer is not None:
        observer.run_started(target, config)
    samples: list[Sample] = []
    start = trio.current_time()
    deadline = start + config.duration if config.duration is not None else math.inf
    stop_index = config.start_index + config.requests if config.requests else None
    next_index = config.start_index

    async def worker() -> None:
        nonlocal next_index
        # trio switches tasks only at awaits, so the index counter needs no lock.
        while trio.current_time() < deadline and (stop_index is None or next_index < stop_index):
            index = next_index
            next_index += 1
            sample = await send_one(client, target, config, workload.prompt(index), start)
            samples.append(sample)
            if observer is not None:
                observer.request_done(sample)

    async with trio.open_nursery() as nursery:
        for _ in range(config.concurrency):
            nursery.start_soon(worker)
    duration = trio.current_time() - start
    samples.sort(key=lambda s: s.index)
    result = BenchResult(
        target=target.label,
        model=target.model,
        config=config,
        samples=tuple(samples),
        summary=summarize(samples, duration),
    )
    if observer is not None:
        observer.run_finished(result)
    return result


async def run(
    target: Target,
    config: LoadConfig | None = None,
    *,
    observer: Observer | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> BenchResult:
    """Drive `target` with `config` (inside trio) and return every sample and a summary.

    `transport` replaces the network (e.g. ``httpx.MockTransport``) for tests.
    """
    config = config or LoadConfig()
    async with open_client(config, transport) as client:
        return await run_with_client(client, target, config, observer=observer)


def run_sync(
    target: Target,
    config: LoadConfig | None = None,
    *,
    observer: Observer | None = None,
) -> BenchResult:
    """`run` from synchronous code: starts its own trio event loop."""
    return trio.run(lambda: run(target, config, observer=observer))


def merge(results: Sequence[BenchResult]) -> BenchResult:
    """Several runs against one target as one result; throughput over their summed time."""
    if not results:
        raise ValueError("merge of no results")
    samples = tuple(s for r in results for s in r.samples)
    first = results[0]
    return BenchResult(
        target=first.target,
        model=first.model,
        config=first.config,
        samples=samples,
        summary=summarize(samples, sum(r.summary.duration for r in results)),
    )


async def run_interleaved(
    targets: Sequence[Target],
    config: LoadConfig | None = None,
    *,
    rounds: int = 3,
    observer: Observer | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[BenchResult, ...]:
    """Alternate targets A, B, A, B, ... for `rounds` rounds; one merged result per target.

    Each turn is one run bounded by `config` (so each target gets `rounds` x
    `config.requests` requests). Within a round every target receives the same
    prompts (same workload indices); each round moves on to fresh indices. Slow
    drift of the machine (thermal, other load) thus hits all targets alike.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if not targets:
        raise ValueError("run_interleaved needs at least one target")
    config = config or LoadConfig()
    per_target: list[list[BenchResult]] = [[] for _ in targets]
    start_index = config.start_index
    # Room for every target's connections, so each keeps its warm keep-alive pool
    # across turns instead of evicting the other's.
    pool = attrs.evolve(config, concurrency=config.concurrency * len(targets))
    async with open_client(pool, transport) as client:
        for _ in range(rounds):
            step = attrs.evolve(config, start_index=start_index)
            used = 0
            for i, target in enumerate(targets):
                result = await run_with_client(client, target, step, observer=observer)
                per_target[i].append(result)
                used = max(used, len(result.samples))
            start_index += used
    return tuple(merge(rs) for rs in per_target)
