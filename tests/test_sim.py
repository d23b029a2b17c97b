"""llmgw-sim as a real process, driven by the official openai client and plain HTTP."""

from __future__ import annotations

import math
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
import trio

from llmgw_cli.sim import build_parser, config_from_args
from tests.procs import BIN, sim
from tests.waiting import wait_until

# -- helpers ------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def scrape(base: str) -> dict[str, float]:
    """`/metrics` as {name or name{labels}: value}; a name alone sums its samples."""
    text = httpx.get(f"{base}/metrics", timeout=5).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        out[name + labels] = value
        out[name] = out.get(name, 0.0) + value
    return out


async def wait_metric(base: str, name: str, pred: Any, within: float = 10.0) -> float:
    """Wait until /metrics has a value of `name` for which `pred` holds, and return it."""
    seen: list[float] = []

    async def holds() -> bool:
        seen.append((await trio.to_thread.run_sync(scrape, base)).get(name, math.nan))
        return bool(pred(seen[-1]))

    await wait_until(holds, f"{name} as expected", within, context=lambda: f"value: {seen[-1:]}")
    return seen[-1]


def client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=30)


def unique_text(n_chars: int) -> str:
    """Text no earlier request shared a prefix with."""
    salt = uuid.uuid4().hex
    words = (salt + " lorem ipsum dolor sit amet ") * (n_chars // 40 + 1)
    return words[:n_chars]


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


async def set_faults(base: str, **changes: Any) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        r = await http.post(f"{base}/sim/faults", json=changes)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    """One default simulator shared by the tests that leave it as they found it."""
    with sim() as (_, url):
        yield url


@pytest.fixture
async def no_faults(base: str) -> AsyncIterator[str]:
    yield base
    await set_faults(
        base,
        error_rate=0,
        hang_rate=0,
        first_token_delay=0,
        abort_after_chunks=None,
        exit_after=None,
    )


# -- the OpenAI surface -------------------------------------------------------------------


async def test_streaming_chat_usage_matches_streamed_tokens(base: str) -> None:
    stream = await client(base).chat.completions.create(
        model="sim-model",
        messages=user("Tell me about paged attention."),
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces: list[str] = []
    finish = None
    usage = None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            finish = choice.finish_reason or finish
    assert usage is not None and finish == "length"
    assert usage.completion_tokens == len(pieces) == 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens > len("Tell me about paged attention.") // 4
    assert all(re.fullmatch(r" [a-z]{3}", p) for p in pieces)


async def test_streaming_ends_with_done_and_usage_only_when_asked(base: str) -> None:
    body = {"model": "sim-model", "prompt": "hello", "max_tokens": 3, "stream": True}
    async with httpx.AsyncClient() as http:
        r = await http.post(f"{base}/v1/completions", json=body)
        events = [line for line in r.text.split("\n\n") if line]
        assert events[-1] == "data: [DONE]"
        assert "usage" not in r.text
        body["stream_options"] = {"include_usage": True}
        r = await http.post(f"{base}/v1/completions", json=body)
        assert '"usage":{"prompt_tokens":2,"completion_tokens":3' in r.text
        assert r.headers["content-type"].startswith("text/event-stream")


async def test_non_streaming_chat_and_completions(base: str) -> None:
    c = client(base)
    chat = await c.chat.completions.create(
        model="sim-model", messages=user("hi"), max_completion_tokens=5
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None and chat.usage.completion_tokens == 5
    assert len(chat.choices[0].message.content or "") == 5 * 4

    comp = await c.completions.create(model="sim-model", prompt="Once upon a time", max_tokens=7)
    assert comp.usage is not None
    assert (comp.usage.prompt_tokens, comp.usage.completion_tokens) == (4, 7)
    assert len(comp.choices[0].text) == 7 * 4

    # Without max_tokens: --default-max-tokens (16), reported as a natural stop.
    dflt = await c.completions.create(model="sim-model", prompt="x")
    assert dflt.usage is not None and dflt.usage.completion_tokens == 16
    assert dflt.choices[0].finish_reason == "stop"


async def test_request_seed_makes_output_deterministic(base: str) -> None:
    c = client(base)

    async def text(seed: int) -> str:
        r = await c.completions.create(model="sim-model", prompt="abc", max_tokens=10, seed=seed)
        return r.choices[0].text

    assert await text(7) == await text(7)
    assert await text(7) != await text(8)


async def test_seed_flag_makes_processes_repeat_each_other() -> None:
    """Requests without their own seed draw one from the engine's seeded RNG, so the same
    requests in the same order give the same text from any process with that --seed."""

    async def texts(url: str) -> list[str]:
        c = client(url)
        out: list[str] = []
        for _ in range(2):  # the same request twice: the second draws the next seed
            comp = await c.completions.create(model="sim-model", prompt="Once", max_tokens=8)
            out.append(comp.choices[0].text)
            chat = await c.chat.completions.create(
                model="sim-model", messages=user("hi"), max_tokens=8
            )
            out.append(chat.choices[0].message.content or "")
        return out

    with sim("--seed", "7") as (_, a), sim("--seed", "7") as (_, b), sim("--seed", "8") as (_, c):
        first = await texts(a)
        assert first[0] != first[2]  # not a function of the prompt alone
        assert await texts(b) == first
        other = await texts(c)
        assert all(x != y for x, y in zip(other, first, strict=True)), (other, first)


async def test_repeated_long_prompt_is_faster_and_reports_cached_tokens(base: str) -> None:
    c = client(base)
    messages = user(unique_text(8000))  # ~2,000 tokens

    async def ttft() -> tuple[float, int]:
        start = time.perf_counter()
        stream = await c.chat.completions.create(
            model="sim-model",
            messages=messages,
            max_tokens=2,
            stream=True,
            stream_options={"include_usage": True},
        )
        first = math.inf
        cached = -1
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and first == math.inf:
                first = time.perf_counter() - start
            if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
                cached = chunk.usage.prompt_tokens_details.cached_tokens or 0
        return first, cached

    cold, cached0 = await ttft()
    warm = [await ttft() for _ in range(3)]
    assert cached0 == 0
    assert all(cached > 1900 for _, cached in warm)
    # Cold prefill of ~2,000 tokens costs ~100 ms at the default 50 us/token; a warm
    # one recomputes one block. Noise only adds time, so the best warm run is fair.
    assert min(t for t, _ in warm) < cold / 2, (cold, warm)


async def test_unknown_model_is_404_and_bad_json_is_400(base: str) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        await client(base).chat.completions.create(model="nope", messages=user("hi"))
    assert e.value.status_code == 404
    async with httpx.AsyncClient() as http:
        r = await http.post(f"{base}/v1/chat/completions", json={"model": "nope", "messages": []})
        assert r.status_code == 404
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        r = await http.post(f"{base}/v1/completions", content=b"{not json")
        assert r.status_code == 400
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        r = await http.post(
            f"{base}/v1/completions", json={"prompt": "x", "max_tokens": 0, "model": "sim-model"}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


async def test_embeddings_are_deterministic(base: str) -> None:
    c = client(base)
    a = await c.embeddings.create(model="sim-model", input=["alpha", "beta"])
    b = await c.embeddings.create(model="sim-model", input="alpha", encoding_format="float")
    va, vb, va2 = a.data[0].embedding, a.data[1].embedding, b.data[0].embedding
    assert len(va) == 384
    assert va == pytest.approx(va2, abs=1e-6)  # base64 float32 vs JSON float
    assert va != pytest.approx(vb, abs=1e-3)
    assert math.isclose(sum(x * x for x in va), 1.0, rel_tol=1e-4)
    assert a.usage.prompt_tokens == 2 + 1  # 'alpha' is 2 tokens, 'beta' 1


async def test_models_health_render_and_probe_endpoints(base: str) -> None:
    models = await client(base).models.list()
    assert [m.id for m in models.data] == ["sim-model"]
    async with httpx.AsyncClient(base_url=base) as http:
        assert (await http.get("/health")).status_code == 200
        body = {"model": "sim-model", "messages": user("render me")}
        r = await http.post("/v1/chat/completions/render", json=body)
        assert r.status_code == 200
        ids = r.json()["token_ids"]
        assert ids and all(isinstance(t, int) for t in ids)
        # Rendering does not generate.
        assert scrape(base).get("vllm:num_requests_running") == 0
        r = await http.post("/v1/completions/render", json={"model": "sim-model", "prompt": "abcd"})
        assert len(r.json()[0]["token_ids"]) == 1
        r = await http.post("/v1/completions/render", json={"model": "zzz", "prompt": "abcd"})
        assert r.status_code == 404
        r = await http.post("/tokenize", json={"prompt": "abcdefgh"})
        assert r.json()["count"] == 2 and len(r.json()["tokens"]) == 2
        assert (await http.get("/health_generate")).status_code == 200
        info = (await http.get("/get_model_info")).json()
        assert info["model_path"] == "sim-model" and info["is_generation"] is True
        server = (await http.get("/get_server_info")).json()
        assert server["max_running_requests"] == 64
        assert (await http.post("/reset_prefix_cache")).status_code == 200
        assert (await http.get("/nowhere")).status_code == 404


async def test_reset_prefix_cache_drops_hits(base: str) -> None:
    c = client(base)
    text = unique_text(2000)

    async def cached() -> int:
        r = await c.completions.create(model="sim-model", prompt=text, max_tokens=1)
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        return r.usage.prompt_tokens_details.cached_tokens or 0

    assert await cached() == 0
    assert await cached() > 400
    async with httpx.AsyncClient() as http:
        await http.post(f"{base}/reset_prefix_cache")
    assert await cached() == 0


# -- engine behaviour visible in /metrics -------------------------------------------------


async def test_metrics_in_vllm_format(base: str) -> None:
    await client(base).completions.create(model="sim-model", prompt="count me", max_tokens=3)
    m = scrape(base)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:time_to_first_token_seconds_bucket",
    ):
        labelled = [k for k in m if k.startswith(name + "{")]
        assert labelled and all('model_name="sim-model"' in k for k in labelled), name
    assert m['vllm:request_success_total{finished_reason="length",model_name="sim-model"}'] >= 1
    assert m["vllm:generation_tokens_total"] >= 3
    assert m['vllm:time_to_first_token_seconds_count{model_name="sim-model"}'] >= 1


async def test_kv_usage_rises_under_load_and_falls_back(base: str) -> None:
    c = client(base)
    assert scrape(base)["vllm:kv_cache_usage_perc"] == 0.0
    streams = [
        await c.completions.create(
            model="sim-model", prompt=unique_text(4000), max_tokens=40, stream=True
        )
        for _ in range(4)
    ]
    busy = await wait_metric(base, "vllm:kv_cache_usage_perc", lambda v: v > 0.04)
    assert busy <= 1.0

    async def drain(s: Any) -> None:
        async for _ in s:
            pass

    async with trio.open_nursery() as nursery:
        for s in streams:
            nursery.start_soon(drain, s)
    assert await wait_metric(base, "vllm:kv_cache_usage_perc", lambda v: v == 0.0) == 0.0


async def test_client_disconnect_aborts_the_sequence(base: str) -> None:
    before = scrape(base)
    aborted = 'vllm:request_success_total{finished_reason="abort",model_name="sim-model"}'
    async with httpx.AsyncClient() as http:
        body = {"model": "sim-model", "prompt": "long story", "max_tokens": 5000, "stream": True}
        async with http.stream("POST", f"{base}/v1/completions", json=body) as r:
            lines = r.aiter_lines()
            while "text" not in await anext(lines):
                pass
            assert scrape(base)["vllm:num_requests_running"] == 1
    # Leaving the block closed the connection: the sequence must go at once.
    await wait_metric(base, "vllm:num_requests_running", lambda v: v == 0, within=5)
    assert scrape(base)["vllm:kv_cache_usage_perc"] == 0.0
    assert scrape(base)[aborted] == before[aborted] + 1


@pytest.mark.parametrize(
    ("fmt", "running", "waiting", "usage"),
    [
        ("vllm", "vllm:num_requests_running", "vllm:num_requests_waiting", None),
        ("sglang", "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"),
    ],
)
async def test_third_request_waits_when_batch_is_full(
    fmt: str, running: str, waiting: str, usage: str | None
) -> None:
    with sim("--max-num-seqs", "2", "--metrics-format", fmt) as (_, url):
        c = client(url)
        streams = [
            await c.completions.create(
                model="sim-model", prompt=f"req {i}", max_tokens=3000, stream=True
            )
            for i in range(3)
        ]
        assert await wait_metric(url, waiting, lambda v: v == 1) == 1
        m = scrape(url)
        assert m[running] == 2
        assert f'{running}{{model_name="sim-model"}}' in m
        if usage is not None:
            assert 0 < m[usage] < 1
            assert not any(k.startswith("vllm:") for k in m)
            assert "sglang:prompt_tokens_total" in m and "sglang:cache_hit_rate" in m
        for s in streams:
            await s.close()
        assert await wait_metric(url, running, lambda v: v == 0) == 0
        assert scrape(url)[waiting] == 0


# -- fault injection ----------------------------------------------------------------------


async def test_runtime_faults_change_behaviour(no_faults: str) -> None:
    base = no_faults
    c = client(base)
    async with httpx.AsyncClient() as http:
        current = (await http.get(f"{base}/sim/faults")).json()
        assert current["error_rate"] == 0 and current["abort_after_chunks"] is None
        bad = await http.post(f"{base}/sim/faults", json={"error_rate": 2})
        assert bad.status_code == 400
        bad = await http.post(f"{base}/sim/faults", json={"no_such_fault": 1})
        assert bad.status_code == 400

    assert (await set_faults(base, error_rate=1.0, error_status=429))["error_status"] == 429
    with pytest.raises(openai.RateLimitError):
        await c.completions.create(model="sim-model", prompt="x", max_tokens=1)
    await set_faults(base, error_rate=0.0)
    await c.completions.create(model="sim-model", prompt="x", max_tokens=1)

    await set_faults(base, abort_after_chunks=2)
    events, done = await sse_events(base, max_tokens=10)
    assert (len(events), done) == (2, False)
    await set_faults(base, abort_after_chunks=None)
    events, done = await sse_events(base, max_tokens=10)
    assert (len(events), done) == (12, True)  # role, 10 tokens, finish


async def sse_events(base: str, max_tokens: int) -> tuple[list[str], bool]:
    """The data events of one streamed chat, and whether it ended with [DONE]."""
    events: list[str] = []
    body = {"messages": user("hi"), "max_tokens": max_tokens, "stream": True}
    async with (
        httpx.AsyncClient() as http,
        http.stream("POST", f"{base}/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        try:
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    return events, True
                if line.startswith("data: "):
                    events.append(line)
        except httpx.RemoteProtocolError:
            pass  # the connection was closed mid-body
    return events, False


async def test_error_rate_flag() -> None:
    with sim("--fault-error-rate", "1", "--fault-error-status", "503") as (_, url):
        with pytest.raises(openai.InternalServerError) as e:
            await client(url).chat.completions.create(model="sim-model", messages=user("x"))
        assert e.value.status_code == 503
        async with httpx.AsyncClient(base_url=url) as http:
            r = await http.post("/v1/embeddings", json={"input": "x"})
            assert r.status_code == 503
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
            assert (await http.get("/health")).status_code == 200  # probes still pass


async def test_hang_rate_flag() -> None:
    with sim("--fault-hang-rate", "1") as (_, url):
        async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=1.0)) as http:
            body = {"prompt": "x", "max_tokens": 2, "stream": True}
            async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
                assert r.status_code == 200  # headers, then nothing
                with pytest.raises(httpx.ReadTimeout):
                    await r.aread()
            with pytest.raises(httpx.ReadTimeout):
                await http.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert scrape(url)["vllm:num_requests_running"] == 0


async def test_first_token_delay_flag() -> None:
    with sim("--fault-first-token-delay", "1s") as (_, url):
        c = client(url)
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:

            async def request() -> None:
                await c.completions.create(model="sim-model", prompt="x", max_tokens=2)

            nursery.start_soon(request)
            # Held back requests are visible as waiting, as in a slow engine.
            await wait_metric(url, "vllm:num_requests_waiting", lambda v: v == 1)
        assert time.perf_counter() - start >= 0.95
        await set_faults(url, first_token_delay=0)
        start = time.perf_counter()
        await c.completions.create(model="sim-model", prompt="x", max_tokens=2)
        assert time.perf_counter() - start < 0.9


@pytest.mark.parametrize(("text", "seconds"), [("250ms", 0.25), ("2s", 2.0), ("1.5", 1.5)])
def test_first_token_delay_takes_a_duration(text: str, seconds: float) -> None:
    args = build_parser().parse_args(["--fault-first-token-delay", text])
    assert config_from_args(args).faults.first_token_delay == seconds


async def test_fractional_error_rate_fails_about_that_share() -> None:
    """With a seed the coin flips repeat: two processes fail the same requests."""

    async def outcomes(url: str) -> list[bool]:
        c = client(url)
        ok: list[bool] = []
        for _ in range(60):
            try:
                await c.completions.create(model="sim-model", prompt="x", max_tokens=1)
                ok.append(True)
            except openai.InternalServerError as e:
                assert e.status_code == 500
                ok.append(False)
        return ok

    args = ("--seed", "1", "--fault-error-rate", "0.5")
    with sim(*args) as (_, first), sim(*args) as (_, second):
        pattern = await outcomes(first)
        assert 15 <= pattern.count(False) <= 45, pattern
        assert await outcomes(second) == pattern


async def test_abort_after_chunks_flag() -> None:
    with sim("--fault-abort-after-chunks", "3") as (_, url):
        events, done = await sse_events(url, max_tokens=20)
        assert (len(events), done) == (3, False)
        await wait_metric(url, "vllm:num_requests_running", lambda v: v == 0)
        # Non-streaming requests are not cut.
        r = await client(url).completions.create(model="sim-model", prompt="x", max_tokens=5)
        assert r.usage is not None and r.usage.completion_tokens == 5


def test_exit_after_flag() -> None:
    with sim("--fault-exit-after", "2") as (proc, url):
        for _ in range(2):
            r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert r.status_code == 200
        assert proc.popen.wait(timeout=10) == 1
        assert "exiting after 2 requests" in proc.output()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health")


# -- the command line ---------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "llmgw-sim"), *args], capture_output=True, text=True, timeout=30
    )


def test_help_version_and_bad_flags() -> None:
    assert run_cli("--version").stdout.startswith("llmgw-sim ")
    helped = run_cli("--help")
    assert helped.returncode == 0 and "--fault-abort-after-chunks" in helped.stdout
    for bad in (
        ["--bogus"],
        ["--metrics-format", "xml"],
        ["--port", "70000"],
        ["--kv-blocks"],
        ["--fault-first-token-delay", "soon"],
        ["--fault-first-token-delay", "inf"],
    ):
        r = run_cli(*bad)
        assert r.returncode == 2, bad
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("llmgw-sim: error: "), r.stderr


def test_busy_port_is_a_runtime_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_cli("--port", str(port))
    assert r.returncode == 1
    assert (
        r.stderr == f"llmgw-sim: error: cannot listen on 127.0.0.1:{port}: address already in use\n"
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_exit_cleanly(sig: int) -> None:
    with sim() as (proc, url):
        assert httpx.get(f"{url}/health").status_code == 200
        proc.kill(sig)
        assert proc.popen.wait(timeout=10) == 0


def test_model_aliases() -> None:
    with sim("--model", "alias-b") as (_, url):
        listed = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
        assert listed == ["sim-model", "alias-b"]
        for name in listed:
            r = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": "x"})
            assert r.status_code == 200 and r.json()["model"] == name
