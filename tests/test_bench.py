"""The bench library: statistics, workload generation, SSE parsing, the load loop."""

from __future__ import annotations

import functools
import itertools
import json
import math
import statistics
from collections.abc import AsyncIterator

import attrs
import httpx
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from llmgw import bench
from llmgw.bench.sse import Event, SSEDecoder
from llmgw.bench.sweeping import gauge, suggest
from llmgw.bench.workload import VOCABULARY

# ----------------------------------------------------------------------------- stats


def test_percentile_known_values() -> None:
    assert bench.percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert bench.percentile([7.0], 0.99) == 7.0
    xs = [float(i) for i in range(1, 12)]  # 1..11: position q*10
    assert bench.percentile(xs, 0.9) == 10.0
    assert bench.percentile(xs, 0.0) == 1.0
    assert bench.percentile(xs, 1.0) == 11.0
    assert bench.percentile(xs, 0.99) == pytest.approx(10.9)
    with pytest.raises(ValueError):
        bench.percentile([], 0.5)


finite = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@given(st.lists(finite, min_size=2, max_size=200))
def test_percentile_matches_statistics_inclusive(xs: list[float]) -> None:
    xs.sort()
    deciles = statistics.quantiles(xs, n=10, method="inclusive")
    for i, expected in enumerate(deciles, start=1):
        assert bench.percentile(xs, i / 10) == pytest.approx(expected, rel=1e-9, abs=1e-9)


@given(st.lists(finite, min_size=1, max_size=200))
def test_dist_is_ordered(xs: list[float]) -> None:
    d = bench.dist(xs)
    assert d is not None
    assert d.count == len(xs)
    assert d.min <= d.p50 <= d.p90 <= d.p99 <= d.max
    assert d.min <= d.mean <= d.max


def test_dist_of_nothing_is_none() -> None:
    assert bench.dist([]) is None


def _sample(i: int, *, error: str | None = None, ttft: float | None = 0.1) -> bench.Sample:
    return bench.Sample(
        index=i,
        status=200 if error is None else 429,
        error=error,
        start=0.0,
        e2e=1.0,
        ttft=ttft,
        itl=(0.1, 0.2),
        prompt_tokens=10,
        completion_tokens=3,
        usage_reported=True,
    )


def test_summarize_counts_and_throughput() -> None:
    samples = [_sample(0), _sample(1), _sample(2, error="429"), _sample(3, error="timeout")]
    s = bench.summarize(samples, duration=2.0)
    assert (s.requests, s.ok, s.failed) == (4, 2, 2)
    assert s.errors == {"429": 1, "timeout": 1}
    assert s.request_throughput == 1.0
    assert s.completion_tokens == 6 and s.prompt_tokens == 20
    assert s.output_token_throughput == 3.0
    assert s.total_token_throughput == 13.0
    assert s.cached_tokens is None
    assert s.ttft is not None and s.ttft.count == 2
    assert s.itl is not None and s.itl.count == 4
    assert s.tpot is not None and s.tpot.p50 == pytest.approx((1.0 - 0.1) / 2)


def test_summary_json_round_trip() -> None:
    s = bench.summarize([_sample(0), _sample(1, error="500")], duration=1.0)
    text = bench.to_json(s)
    assert json.loads(text)["errors"] == {"500": 1}
    assert bench.from_json(text, bench.Summary) == s


# -------------------------------------------------------------------------- workload


def test_vocabulary_words_are_one_sim_token_each() -> None:
    # The simulator counts 4 characters per token: a 3-letter word plus a space.
    assert all(len(w) == 3 for w in VOCABULARY)
    assert len(set(VOCABULARY)) == len(VOCABULARY)


def test_prompt_length_is_in_words() -> None:
    w = bench.Workload(bench.WorkloadSpec(prompt_tokens=100, output_tokens=7))
    p = w.prompt(5)
    assert len(p.text.split(" ")) == p.words == 100
    assert p.max_tokens == 7
    assert math.ceil(len(p.text) / 4) == 100


@given(
    ratio=st.floats(min_value=0, max_value=1),
    groups=st.integers(min_value=1, max_value=5),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_shared_prefix_is_shared_within_group_only(ratio: float, groups: int, seed: int) -> None:
    spec = bench.WorkloadSpec(
        prompt_tokens=40, shared_prefix_ratio=ratio, prefix_groups=groups, seed=seed
    )
    w = bench.Workload(spec)
    prompts = [w.prompt(i) for i in range(3 * groups)]
    n = round(ratio * 40)
    for p in prompts:
        assert p.prefix_words == n
        assert len(p.text.split()) == 40
    for a in prompts:
        for b in prompts:
            if a.index == b.index:
                continue
            wa, wb = a.text.split(), b.text.split()
            pairs = enumerate(zip(wa, wb, strict=True))
            common = next((i for i, (x, y) in pairs if x != y), len(wa))
            if a.group == b.group:
                assert wa[:n] == wb[:n]
                # beyond the prefix the prompts diverge (almost surely at once)
                assert common < 40 or n == 40
            elif n > 0:
                assert common == 0, "different groups must not share even the first word"


def test_groups_are_balanced_and_sessions_keep_their_group() -> None:
    w = bench.Workload(bench.WorkloadSpec(prefix_groups=3))
    assert [w.prompt(i).group for i in range(6)] == [0, 1, 2, 0, 1, 2]
    assert w.prompt(0).session is None
    ws = bench.Workload(bench.WorkloadSpec(prefix_groups=2, sessions=4, seed=9))
    by_session: dict[str | None, set[int]] = {}
    for i in range(40):
        p = ws.prompt(i)
        by_session.setdefault(p.session, set()).add(p.group)
    assert len(by_session) == 4
    assert all(len(groups) == 1 for groups in by_session.values())


def test_seed_determinism() -> None:
    spec = bench.WorkloadSpec(prompt_tokens=50, shared_prefix_ratio=0.5, prefix_groups=2, seed=3)
    a = [bench.Workload(spec).prompt(i) for i in range(5)]
    b = [bench.Workload(spec).prompt(i) for i in range(5)]
    assert a == b
    other = [bench.Workload(attrs.evolve(spec, seed=4)).prompt(i) for i in range(5)]
    assert all(x.text != y.text for x, y in zip(a, other, strict=True))


def test_workload_spec_validation() -> None:
    with pytest.raises(ValueError, match="shared_prefix_ratio"):
        bench.WorkloadSpec(shared_prefix_ratio=1.5)
    with pytest.raises(ValueError, match="prompt_tokens"):
        bench.WorkloadSpec(prompt_tokens=0)
    with pytest.raises(ValueError, match="bound"):
        bench.LoadConfig(requests=None, duration=None)


# ------------------------------------------------------------------------------- SSE


def _stream_bytes(eol: str) -> bytes:
    events = [
        ": keep-alive",
        'data: {"a": 1}',
        "event: custom\ndata: line1\ndata: line2 \u00e9\u4e2d",
        "data:no-space",
        "data: [DONE]",
    ]
    return "".join(e.replace("\n", eol) + eol + eol for e in events).encode()


EXPECTED = [
    Event('{"a": 1}'),
    Event("line1\nline2 \u00e9\u4e2d", event="custom"),
    Event("no-space"),
    Event("[DONE]"),
]


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_sse_whole(eol: str) -> None:
    d = SSEDecoder()
    assert d.feed(_stream_bytes(eol)) + d.close() == EXPECTED


@given(eol=st.sampled_from(["\n", "\r\n", "\r"]), cuts=st.lists(st.integers(0, 200)))
def test_sse_any_split(eol: str, cuts: list[int]) -> None:
    raw = _stream_bytes(eol)
    bounds = sorted({min(c, len(raw)) for c in cuts} | {0, len(raw)})
    d = SSEDecoder()
    events: list[Event] = []
    for lo, hi in itertools.pairwise(bounds):
        events += d.feed(raw[lo:hi])
    assert events + d.close() == EXPECTED


def test_sse_last_event_without_blank_line() -> None:
    d = SSEDecoder()
    assert d.feed(b'data: {"x": 1}\n\ndata: [DONE]') == [Event('{"x": 1}')]
    assert d.close() == [Event("[DONE]")]


# ------------------------------------------------------------- load loop (fake server)


def _chunk(text: str) -> bytes:
    obj = {"choices": [{"index": 0, "delta": {"content": text}}]}
    return f"data: {json.dumps(obj)}\n\n".encode()


class FakeEngine:
    """An OpenAI-ish streaming server on virtual time: prefill then fixed-step decode."""

    def __init__(self, *, prefill: float = 0.2, step: float = 0.05, usage: bool = True) -> None:
        self.prefill = prefill
        self.step = step
        self.usage = usage
        self.inflight = 0
        self.peak = 0
        self.bodies: list[dict[str, object]] = []
        self.headers: list[httpx.Headers] = []

    def ttft(self) -> float:
        return self.prefill

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            waiting = max(0, self.inflight - 2)
            return httpx.Response(
                200, text=f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
            )
        body = json.loads(request.content)
        self.bodies.append(body)
        self.headers.append(request.headers)
        n = int(body["max_tokens"])
        if not body.get("stream"):
            self.inflight += 1
            await trio.sleep(self.ttft() + self.step * (n - 1))  # simulated generation
            self.inflight -= 1
            text = " ".join(["tok"] * n)
            return httpx.Response(
                200,
                json={
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": 11, "completion_tokens": n, "total_tokens": 11 + n},
                },
            )
        return httpx.Response(200, content=self._events(n))

    async def _events(self, n: int) -> AsyncIterator[bytes]:
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        try:
            yield b'data: {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}\n\n'
            await trio.sleep(self.ttft())  # simulated prefill (virtual time)
            for i in range(n):
                if i:
                    await trio.sleep(self.step)  # simulated decode step
                yield _chunk(" tok")
            if self.usage:
                usage = {
                    "prompt_tokens": 11,
                    "completion_tokens": n,
                    "prompt_tokens_details": {"cached_tokens": 4},
                }
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"
        finally:
            self.inflight -= 1


def _transport(engine: FakeEngine) -> httpx.AsyncBaseTransport:
    return httpx.MockTransport(engine.handle)


TARGET = bench.Target("http://engine.test", model="m")


def _config(**kw: object) -> bench.LoadConfig:
    base = bench.LoadConfig(
        concurrency=4,
        requests=12,
        workload=bench.WorkloadSpec(prompt_tokens=16, output_tokens=5),
    )
    return attrs.evolve(base, **kw)


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    # Virtual time for every test here: the fake engines' sleeps are their simulated
    # work, and the clock jumps over them as soon as all tasks wait.
    return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})


async def test_streaming_timings_on_virtual_time() -> None:
    engine = FakeEngine(prefill=0.2, step=0.05)
    result = await bench.run(
        TARGET, _config(band="silver", workload=bench.WorkloadSpec(16, 5, sessions=2)),
        transport=_transport(engine),
    )  # fmt: skip
    s = result.summary
    assert (s.requests, s.ok, s.failed) == (12, 12, 0)
    assert engine.peak == 4
    assert s.ttft is not None and s.ttft.p50 == pytest.approx(0.2)
    assert s.itl is not None and s.itl.max == pytest.approx(0.05) and s.itl.count == 12 * 4
    assert s.e2e is not None and s.e2e.p99 == pytest.approx(0.2 + 4 * 0.05)
    assert s.completion_tokens == 60 and s.prompt_tokens == 12 * 11 and s.cached_tokens == 48
    # 12 requests, 4 at a time, 0.4 s each: three waves
    assert s.duration == pytest.approx(1.2)
    assert s.request_throughput == pytest.approx(10.0)
    assert [x.index for x in result.samples] == list(range(12))
    body = engine.bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["max_tokens"] == 5
    assert engine.headers[0]["x-llmgw-band"] == "silver"
    assert {h["x-session-id"] for h in engine.headers} == {"bench-0-0", "bench-0-1"}


async def test_token_count_falls_back_to_chunks() -> None:
    engine = FakeEngine(usage=False)
    result = await bench.run(TARGET, _config(requests=3), transport=_transport(engine))
    assert result.summary.completion_tokens == 15
    assert not any(s.usage_reported for s in result.samples)
    assert result.samples[0].prompt_tokens == 16  # the workload's approximation


async def test_non_streaming() -> None:
    engine = FakeEngine(prefill=0.1, step=0.01)
    result = await bench.run(
        attrs.evolve(TARGET, endpoint="chat"), _config(stream=False), transport=_transport(engine)
    )
    s = result.summary
    assert s.ok == 12 and s.ttft is None and s.itl is None
    assert s.e2e is not None and s.e2e.p50 == pytest.approx(0.14)
    assert s.completion_tokens == 60
    assert "stream" not in engine.bodies[0]


async def test_duration_bound_lets_inflight_finish() -> None:
    engine = FakeEngine(prefill=0.2, step=0.05)  # 0.4 s per request
    result = await bench.run(
        TARGET, _config(requests=None, duration=1.0), transport=_transport(engine)
    )
    # waves start at 0, 0.4, 0.8; none at 1.2
    assert result.summary.requests == 12
    assert result.summary.duration == pytest.approx(1.2)


async def test_failures_are_labelled() -> None:
    calls = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        kind = calls % 5
        if kind == 1:
            return httpx.Response(429, json={"error": {"message": "slow down"}})
        if kind == 2:
            return httpx.Response(
                200, content=_chunk("x") + b'data: {"error": {"message": "boom"}}\n\n'
            )
        if kind == 3:
            return httpx.Response(200, content=_chunk("x"))  # no [DONE]
        if kind == 4:
            await trio.sleep(1000)  # an engine that hangs: the request timeout ends it
        raise httpx.ConnectError("refused", request=request)

    result = await bench.run(
        TARGET,
        _config(requests=10, concurrency=2, request_timeout=5.0),
        transport=httpx.MockTransport(handler),
    )
    s = result.summary
    assert s.ok == 0
    assert s.errors == {
        "429": 2,
        "connect_error": 2,
        "stream_error": 2,
        "timeout": 2,
        "truncated": 2,
    }
    msgs = {x.error: x.message for x in result.samples}
    assert msgs["429"] == "slow down" and msgs["stream_error"] == "boom"
    assert s.ttft is None and s.request_throughput == 0


async def test_completions_endpoint_and_url() -> None:
    seen: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        body = json.loads(request.content)
        assert isinstance(body["prompt"], str)
        out = b'data: {"choices": [{"index": 0, "text": " a"}]}\n\ndata: [DONE]\n\n'
        return httpx.Response(200, content=out)

    t = bench.Target("http://h.test/v1/", model="m", endpoint="completions", api_key="sk-1")
    result = await bench.run(t, _config(requests=2), transport=httpx.MockTransport(handler))
    assert result.summary.ok == 2 and result.summary.completion_tokens == 2
    assert seen[0] == "http://h.test/v1/completions"
    assert bench.api_url("http://h:1", "chat") == "http://h:1/v1/chat/completions"


async def test_interleaved_alternates_and_shares_prompts() -> None:
    order: list[tuple[str, str]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        order.append((request.url.host, body["messages"][0]["content"]))
        return httpx.Response(200, content=_chunk("a") + b"data: [DONE]\n\n")

    a = bench.Target("http://a.test", model="m", name="A")
    b = bench.Target("http://b.test", model="m", name="B")
    ra, rb = await bench.run_interleaved(
        [a, b], _config(requests=3, concurrency=1), rounds=2, transport=httpx.MockTransport(handler)
    )
    assert [host for host, _ in order] == ["a.test"] * 3 + ["b.test"] * 3 + ["a.test"] * 3 + [
        "b.test"
    ] * 3
    prompts = [p for _, p in order]
    assert prompts[0:3] == prompts[3:6] and prompts[6:9] == prompts[9:12]
    assert not set(prompts[0:3]) & set(prompts[6:9]), "each round sends fresh prompts"
    assert ra.target == "A" and rb.target == "B"
    assert ra.summary.requests == rb.summary.requests == 6


# ------------------------------------------------------------------------------ sweep


class LoadedEngine(FakeEngine):
    """TTFT grows once more than 2 requests are in flight (a batch of 2)."""

    def ttft(self) -> float:
        return 0.1 + 0.1 * max(0, self.inflight - 2)


async def test_sweep_suggests_targets() -> None:
    engine = LoadedEngine(prefill=0.1, step=0.01)
    result = await bench.sweep(
        TARGET,
        _config(requests=8),
        [1, 2, 4, 8],
        target_ttft=0.25,
        replicas=1,
        metrics_interval=0.05,
        transport=_transport(engine),
    )
    conc = [s.concurrency for s in result.steps]
    assert conc == [1, 2, 4], "stops after the first step that misses"
    assert [s.passed for s in result.steps] == [True, True, False]
    s = result.suggestion
    assert s is not None and s.capacity == 2 and s.concurrency == 2
    assert s.target_waiting == 1  # nothing queued at concurrency 2; floor of 1
    assert result.steps[2].engine is not None and result.steps[2].engine.waiting_max >= 1
    # every step starts at fresh workload indices
    firsts = [st.result.samples[0].index for st in result.steps]
    assert firsts == [0, 8, 16]


def _step(c: int, ttft: float, waiting: float | None, failed: int = 0) -> bench.SweepStep:
    samples = [_sample(i, ttft=ttft) for i in range(10 - failed)]
    samples += [_sample(i, error="500") for i in range(failed)]
    result = bench.BenchResult(
        "t", "m", bench.LoadConfig(), tuple(samples), bench.summarize(samples, 1)
    )
    load = None if waiting is None else bench.EngineLoad(3, waiting, waiting, None, None)
    return bench.SweepStep(c, c / 2, ttft, None, load, result)


def test_suggest_rule() -> None:
    steps = [_step(2, 0.1, 0.0), _step(4, 0.2, 1.4), _step(8, 0.3, 5.0), _step(16, 0.2, 9.0)]
    s = suggest(steps, target_ttft=0.25, percentile="p90", replicas=2)
    # 16 passes again, but the walk stops at the first miss (8)
    assert (s.capacity, s.target_waiting, s.concurrency) == (2, 2, 4)
    assert "concurrency 8 missed" in s.note
    # too many errors is a miss even with a good TTFT
    s = suggest([_step(2, 0.1, 0.0), _step(4, 0.1, 1.0, failed=2)], target_ttft=0.25,
                percentile="p90", replicas=1)  # fmt: skip
    assert s.concurrency == 2
    s = suggest([_step(1, 0.5, 0.0)], target_ttft=0.25, percentile="p90", replicas=1)
    assert s.capacity is None and "already misses" in s.note
    s = suggest([_step(1, 0.1, None)], target_ttft=0.25, percentile="p50", replicas=1)
    assert s.capacity == 1 and s.target_waiting is None and "extend" in s.note


def test_gauge_parsing() -> None:
    page = (
        "# HELP vllm:num_requests_waiting x\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="a"} 2.0\n'
        'vllm:num_requests_waiting{model_name="b"} 3\n'
        "vllm:num_requests_waiting_total 99\n"
        "sglang:num_queue_reqs 7\n"
    )
    assert gauge(page, ["vllm:num_requests_waiting"]) == 5.0
    assert gauge(page, ["nope", "sglang:num_queue_reqs"]) == 7.0
    assert gauge(page, ["nope"]) is None


async def test_the_default_transport_over_real_sockets_labels_each_outcome() -> None:
    """FastTransport (the default): a stream, an error status, a connection cut mid-body
    and a refused connection, against a raw server on loopback."""
    stream_ok = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (_chunk("a"), _chunk("b")))
        + b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
    )
    refusal = b'{"error": {"message": "no such model"}}'
    answers = [
        stream_ok,
        b"HTTP/1.1 404 Not Found\r\ncontent-length: %d\r\n\r\n%s" % (len(refusal), refusal),
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\ndata:",  # then closed
    ]

    async def handler(stream: trio.SocketStream) -> None:
        async with stream:
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive_some(65536)
            await stream.send_all(answers.pop(0))

    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
        (listener,) = await nursery.start(serve)
        port = listener.socket.getsockname()[1]
        target = bench.Target(f"http://127.0.0.1:{port}", "m")
        config = _config(requests=1, concurrency=1, request_timeout=5.0)
        results = [await bench.run(target, config) for _ in range(3)]
        nursery.cancel_scope.cancel()
    refused = await bench.run(bench.Target(f"http://127.0.0.1:{port}", "m"), config)
    assert results[0].summary.ok == 1 and results[0].samples[0].ttft is not None
    assert results[1].samples[0].error == "404"
    assert results[1].samples[0].message == "no such model"
    assert results[2].samples[0].error == "connection_lost"
    assert refused.samples[0].error == "connect_error"
