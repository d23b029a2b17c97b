"""The simulator's engine zoo (--personality), its llama.cpp face (metrics, /props,
/slots) and vLLM's render endpoints: pure tests of the configuration and the pages,
and real llmgw-sim processes for what goes over HTTP."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import attrs
import httpx
import pytest
import trio

from llmgw.domain.engine_metrics import parse_metrics
from llmgw.sim import personalities, tokens
from llmgw.sim.metrics import LlamaCppPage, Recorder
from llmgw.sim.model import Engine, EngineConfig, Request
from llmgw.sim.server import SimConfig
from llmgw_cli.sim import build_parser, config_from_args, main
from tests.procs import sim
from tests.waiting import wait_until

# -- the effective configuration ------------------------------------------------------------


def config(*argv: str) -> SimConfig:
    return config_from_args(build_parser().parse_args(list(argv)))


#: What each personality must resolve to (a change to the zoo shows up here first).
EXPECTED: dict[str, tuple[str, dict[str, Any]]] = {
    "vllm": (
        "vllm",
        {
            "max_num_seqs": 256,
            "num_blocks": 16384,
            "max_num_batched_tokens": 8192,
            "max_model_len": 16384,
            "prefill_us_per_token": 50.0,
            "decode_step_ms": 10.0,
            "decode_ms_per_seq": 0.04,
            "enable_prefix_caching": True,
        },
    ),
    "sglang": (
        "sglang",
        {
            "max_num_seqs": 512,
            "num_blocks": 32768,
            "max_num_batched_tokens": 8192,
            "max_model_len": 32768,
            "prefill_us_per_token": 40.0,
            "decode_step_ms": 8.0,
            "decode_ms_per_seq": 0.03,
            "enable_prefix_caching": True,
        },
    ),
    "llamacpp": (
        "llamacpp",
        {
            "max_num_seqs": 4,
            "num_blocks": 1024,
            "max_num_batched_tokens": 2048,
            "max_model_len": 4096,
            "prefill_us_per_token": 250.0,
            "decode_step_ms": 15.0,
            "decode_ms_per_seq": 2.0,
            "enable_prefix_caching": True,
        },
    ),
    "small-cache": (
        "vllm",
        {
            "max_num_seqs": 16,
            "num_blocks": 512,
            "max_num_batched_tokens": 2048,
            "max_model_len": 4096,
            "prefill_us_per_token": 50.0,
            "decode_step_ms": 10.0,
            "decode_ms_per_seq": 0.5,
        },
    ),
    "prefill-heavy": (
        "vllm",
        {
            "max_num_seqs": 64,
            "num_blocks": 4096,
            "prefill_us_per_token": 400.0,
            "decode_step_ms": 4.0,
            "decode_ms_per_seq": 0.1,
        },
    ),
}


def test_every_personality_is_covered() -> None:
    assert set(EXPECTED) == set(personalities.NAMES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_personality_effective_config(name: str) -> None:
    fmt, fields = EXPECTED[name]
    cfg = config("--personality", name)
    assert cfg.metrics_format == fmt
    assert cfg.personality == name
    assert {k: getattr(cfg.engine, k) for k in fields} == fields
    # A request may use the whole context: it must fit the KV cache.
    assert cfg.engine.num_blocks * cfg.engine.block_size >= cfg.engine.max_model_len


def test_no_personality_is_todays_default_exactly() -> None:
    cfg = config()
    assert cfg.engine == EngineConfig()
    assert cfg.metrics_format == "vllm"
    assert cfg.personality is None
    assert attrs.evolve(cfg, host="127.0.0.1", port=8000) == SimConfig()


def test_explicit_flags_override_the_personality() -> None:
    cfg = config(
        "--personality",
        "llamacpp",
        "--max-num-seqs",
        "8",
        "--kv-blocks",
        "2048",
        "--decode-step-ms",
        "0",
        "--no-prefix-caching",
        "--metrics-format",
        "vllm",
    )
    assert cfg.engine.max_num_seqs == 8
    assert cfg.engine.num_blocks == 2048
    assert cfg.engine.decode_step_ms == 0.0  # a falsy value given is still given
    assert cfg.engine.enable_prefix_caching is False
    assert cfg.metrics_format == "vllm"
    # What was not given still comes from the personality.
    assert cfg.engine.max_model_len == 4096
    assert cfg.engine.prefill_us_per_token == 250.0
    # And without a personality the flags apply on top of the plain defaults.
    plain = config("--max-num-seqs", "3", "--prefix-caching")
    assert plain.engine == attrs.evolve(EngineConfig(), max_num_seqs=3)


def test_unknown_personality_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--personality", "tgi"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("llmgw-sim: error: ") and "tgi" in err[0]


def test_help_documents_every_personality() -> None:
    text = build_parser().format_help()
    for p in personalities.PERSONALITIES.values():
        assert f"  {p.name}: {p.summary}" in text
    assert "--kv-blocks 16384" in text  # the vllm personality's values, as flags


# -- what the stress personalities are for ---------------------------------------------------


def _prefixed(tenant: int, i: int, prefix: int = 2000, private: int = 100) -> tuple[int, ...]:
    base = tenant * 1_000_000
    return tuple(range(base, base + prefix)) + tuple(
        range(base + 500_000 + i * private, base + 500_000 + (i + 1) * private)
    )


def _run_batch(engine: Engine, tenants: list[int], tag: str) -> int:
    """Run one request per entry of `tenants` at once to the end; the peak batch size."""
    for i, t in enumerate(tenants):
        engine.add(Request(f"{tag}{i}", _prefixed(t, i), max_tokens=100), 0.0)
    peak, now = 0, 0.0
    while engine.has_work():
        step = engine.begin_step(now)
        assert step is not None
        peak = max(peak, engine.stats().num_running)
        now = step.ends
        engine.end_step(now)
    return peak


def _cached(engine: Engine, tenant: int, tag: str) -> int:
    engine.add(Request(tag, _prefixed(tenant, 999), max_tokens=1), 0.0)
    step = engine.begin_step(0.0)
    assert step is not None
    cached = engine.cached_tokens(tag)
    engine.end_step(step.ends)
    return cached


def test_small_cache_holds_two_tenants_prefixes_next_to_its_batch() -> None:
    cfg = personalities.get("small-cache").engine_config()
    two = Engine(cfg)
    assert _run_batch(two, [0, 1] * 8, "a") == 16
    assert two.stats().preemptions == 0
    assert _cached(two, 0, "x") == _cached(two, 1, "y") == 2000
    # A third tenant's prefix does not fit next to the same batch.
    three = Engine(cfg)
    _run_batch(three, [0, 1, 2] * 5 + [0], "b")
    assert three.stats().preemptions > 0


def test_prefill_heavy_makes_a_cold_prompt_cost_far_more_than_decoding() -> None:
    engine = Engine(personalities.get("prefill-heavy").engine_config())
    engine.add(Request("cold", tuple(range(2000)), max_tokens=2), 0.0)
    cold = engine.begin_step(0.0)
    assert cold is not None and cold.duration >= 0.8
    engine.end_step(cold.ends)
    decode = engine.begin_step(cold.ends)
    assert decode is not None and decode.num_decodes == 1
    assert decode.duration <= 0.005
    engine.end_step(decode.ends)
    engine.add(Request("warm", tuple(range(2000)), max_tokens=2), 0.0)
    warm = engine.begin_step(decode.ends)
    assert warm is not None and warm.duration < cold.duration / 50


# -- the llama.cpp metrics page ------------------------------------------------------------

#: llama-server b11434's /metrics, name and type, in its order (read off a running one).
LLAMACPP_PAGE = [
    ("prompt_tokens_total", "counter"),
    ("prompt_tokens_cached_total", "counter"),
    ("prompt_seconds_total", "counter"),
    ("tokens_predicted_total", "counter"),
    ("tokens_predicted_seconds_total", "counter"),
    ("n_decode_total", "counter"),
    ("n_tokens_max", "counter"),
    ("spec_decode_num_draft_tokens_total", "counter"),
    ("spec_decode_num_accepted_tokens_total", "counter"),
    ("spec_decode_num_drafts_total", "counter"),
    ("prompt_tokens_seconds", "gauge"),
    ("predicted_tokens_seconds", "gauge"),
    ("requests_processing", "gauge"),
    ("requests_deferred", "gauge"),
    ("n_busy_slots_per_decode", "gauge"),
]


def page_samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split(" ")
            out[name] = float(value)
    return out


def check_llamacpp_page(text: str) -> dict[str, float]:
    """The page has exactly llama-server's samples, typed and ordered as it does."""
    lines = text.splitlines()
    assert len(lines) == 3 * len(LLAMACPP_PAGE)
    for i, (name, kind) in enumerate(LLAMACPP_PAGE):
        help_, type_, sample = lines[3 * i : 3 * i + 3]
        assert help_.startswith(f"# HELP llamacpp:{name} ")
        assert type_ == f"# TYPE llamacpp:{name} {kind}"
        assert re.fullmatch(rf"llamacpp:{name} [0-9.e+-]+", sample), sample
    assert "vllm:" not in text and "sglang:" not in text and "kv_cache" not in text
    assert "{" not in text  # llama-server labels nothing
    return page_samples(text)


def test_llamacpp_page_follows_the_engine_and_parses_as_llamacpp() -> None:
    engine = Engine(personalities.get("llamacpp").engine_config())
    rec = Recorder()
    page = LlamaCppPage(engine.stats, rec)
    assert set(check_llamacpp_page(page.render().decode()).values()) == {0.0}

    prompt = tuple(range(200))

    def step(now: float) -> float:
        scheduled = engine.begin_step(now)
        assert scheduled is not None
        rec.stepped(engine.end_step(scheduled.ends).step)
        return scheduled.ends

    engine.add(Request("r0", prompt, max_tokens=3), 0.0)
    now = step(0.0)
    for i in range(1, 6):  # 4 slots: two of these wait
        engine.add(Request(f"r{i}", prompt, max_tokens=3), now)
    step(now)
    text = page.render().decode()
    values = check_llamacpp_page(text)
    assert values["llamacpp:requests_processing"] == 4
    assert values["llamacpp:requests_deferred"] == 2
    assert values["llamacpp:n_decode_total"] == 2
    assert values["llamacpp:n_busy_slots_per_decode"] == (1 + 4) / 2
    # r0 computed its prompt in full; three more found it cached but its last block.
    assert values["llamacpp:prompt_tokens_total"] == 200 + 3 * 8
    assert values["llamacpp:prompt_tokens_cached_total"] == 3 * 192
    assert values["llamacpp:tokens_predicted_total"] == 1 + 4
    assert values["llamacpp:n_tokens_max"] == 0  # nothing has finished yet
    assert values["llamacpp:prompt_tokens_seconds"] > 0
    # The throughput gauges cover the time since the previous scrape, as llama-server's.
    again = page_samples(page.render().decode())
    assert again["llamacpp:prompt_tokens_seconds"] == 0
    assert again["llamacpp:prompt_tokens_total"] == values["llamacpp:prompt_tokens_total"]

    sample = parse_metrics(text, model="sim-model")
    assert sample.engine == "llamacpp"
    assert (sample.waiting, sample.running) == (2.0, 4.0)
    assert sample.kv_usage is None and sample.prefix_hit_rate is None


def test_llamacpp_page_prints_values_as_llama_server_does() -> None:
    engine = Engine(EngineConfig())
    rec = Recorder()
    rec.steps, rec.busy_slots, rec.prompt_seconds = 1_234_567, 1_234_567 * 3, 0.001648
    samples = dict(
        (line.split(" ")[0], line.split(" ")[1])
        for line in LlamaCppPage(engine.stats, rec).render().decode().splitlines()
        if not line.startswith("#")
    )
    assert samples["llamacpp:n_decode_total"] == "1.23457e+06"  # C++'s %g, as on llama-server
    assert samples["llamacpp:n_busy_slots_per_decode"] == "3"
    assert samples["llamacpp:prompt_seconds_total"] == "0.001648"


# -- llama.cpp's face over HTTP -----------------------------------------------------------


async def _long_stream(base: str) -> None:
    """A completion far longer than the test: it runs until cancelled."""
    body = {"prompt": "tell me everything", "max_tokens": 3000, "stream": True}
    async with (
        httpx.AsyncClient(timeout=None) as http,
        http.stream("POST", f"{base}/v1/completions", json=body) as r,
    ):
        assert r.status_code == 200
        async for _ in r.aiter_bytes():
            pass


async def test_llamacpp_personality_over_http() -> None:
    """--personality llamacpp with two slots (an explicit flag over the personality's
    four): three long streams keep both slots busy and one request deferred."""
    with sim("--personality", "llamacpp", "--max-num-seqs", "2") as (_, base):
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            props = (await http.get("/props")).json()
            assert props["total_slots"] == 2
            assert props["default_generation_settings"]["n_ctx"] == 4096
            assert props["model_alias"] == props["model_path"] == "sim-model"
            assert props["endpoint_slots"] is True and props["endpoint_metrics"] is True
            idle = (await http.get("/slots")).json()
            assert [s["id"] for s in idle] == [0, 1]
            assert not any(s["is_processing"] for s in idle)
            assert (await http.get("/slots?fail_on_no_slot=1")).status_code == 200

            async def metrics() -> str:
                r = await http.get("/metrics")
                assert r.headers["content-type"] == "text/plain; version=0.0.4"
                assert r.headers["process-start-time-unix"].isdigit()
                return r.text

            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(_long_stream, base)
                seen: list[dict[str, float]] = []

                async def two_running_one_deferred() -> bool:
                    seen.append(check_llamacpp_page(await metrics()))
                    return (
                        seen[-1]["llamacpp:requests_processing"] == 2
                        and seen[-1]["llamacpp:requests_deferred"] == 1
                    )

                await wait_until(
                    two_running_one_deferred,
                    "2 processing, 1 deferred",
                    context=lambda: str(seen[-1:]),
                )
                sample = parse_metrics(await metrics())
                assert (sample.engine, sample.waiting, sample.running) == ("llamacpp", 1.0, 2.0)
                assert sample.kv_usage is None

                slots = (await http.get("/slots")).json()
                assert [s["is_processing"] for s in slots] == [True, True]
                assert {s["n_prompt_tokens"] for s in slots} == {5}
                for s in slots:
                    token = s["next_token"][0]
                    assert token["n_decoded"] + token["n_remain"] == 3000
                    assert s["params"]["max_tokens"] == 3000
                assert len({s["id_task"] for s in slots}) == 2
                busy = await http.get("/slots?fail_on_no_slot=1")
                assert busy.status_code == 503
                assert busy.json()["error"]["type"] == "unavailable_error"
                nursery.cancel_scope.cancel()

            async def all_free() -> bool:
                values = page_samples(await metrics())
                return (
                    values["llamacpp:requests_processing"]
                    == 0
                    == values["llamacpp:requests_deferred"]
                )

            await wait_until(all_free, "the aborted streams freeing their slots")
            assert (await http.get("/slots?fail_on_no_slot=1")).status_code == 200


async def test_vllm_and_sglang_personalities_over_http() -> None:
    with sim("--personality", "vllm") as (_, vllm), sim("--personality", "sglang") as (_, sgl):
        async with httpx.AsyncClient(timeout=10) as http:
            text = (await http.get(f"{vllm}/metrics")).text
            assert "vllm:num_requests_running" in text and "llamacpp:" not in text
            assert 'num_gpu_blocks="16384"' in text
            assert parse_metrics(text).engine == "vllm"
            # llama-server's side endpoints are not part of a vLLM replica.
            assert (await http.get(f"{vllm}/props")).status_code == 404
            assert (await http.get(f"{vllm}/slots")).status_code == 404
            info = (await http.get(f"{sgl}/get_server_info")).json()
            assert info["max_running_requests"] == 512
            assert info["max_total_num_tokens"] == 32768 * 16
            text = (await http.get(f"{sgl}/metrics")).text
            assert "sglang:num_running_reqs" in text and "vllm:" not in text
            assert parse_metrics(text).engine == "sglang"


# -- vLLM's render endpoints -----------------------------------------------------------------

GENERATE_REQUEST_KEYS = {
    "request_id",
    "token_ids",
    "features",
    "sampling_params",
    "model",
    "stream",
    "stream_options",
    "cache_salt",
    "priority",
    "kv_transfer_params",
}


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with sim() as (_, url):
        yield url


@pytest.fixture
async def http(base: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        yield client


async def test_chat_render_is_one_generate_request(http: httpx.AsyncClient) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = await http.post("/v1/chat/completions/render", json={"messages": messages})
    assert r.status_code == 200
    got = r.json()
    assert set(got) == GENERATE_REQUEST_KEYS
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", got["request_id"])
    ids = tokens.encode(tokens.render_chat(messages))
    assert got["token_ids"] == ids
    assert got["model"] is None  # as the request gave it
    assert (got["features"], got["kv_transfer_params"], got["cache_salt"]) == (None, None, None)
    assert (got["stream"], got["stream_options"], got["priority"]) == (False, None, 0)
    params = got["sampling_params"]
    assert params["max_tokens"] == 16384 - len(ids)  # vLLM: what the context leaves
    assert (params["n"], params["temperature"], params["top_p"], params["seed"]) == (
        1,
        1.0,
        1.0,
        None,
    )

    r = await http.post(
        "/v1/chat/completions/render",
        json={
            "model": "sim-model",
            "messages": messages,
            "max_completion_tokens": 7,
            "max_tokens": 99,
            "temperature": 0,
            "seed": 3,
            "stop": "\n",
            "stream": True,
            "stream_options": {"include_usage": False},
            "cache_salt": "tenant-a",
            "priority": -2,
            "logprobs": True,
            "top_logprobs": 2,
        },
    )
    got = r.json()
    assert got["token_ids"] == ids and got["model"] == "sim-model"
    assert got["stream"] is True
    assert got["stream_options"] == {"include_usage": False, "continuous_usage_stats": False}
    assert (got["cache_salt"], got["priority"]) == ("tenant-a", -2)
    params = got["sampling_params"]
    assert (params["max_tokens"], params["temperature"], params["seed"]) == (7, 0.0, 3)
    assert (params["stop"], params["logprobs"]) == (["\n"], 2)


async def test_completions_render_is_a_list_one_per_prompt(http: httpx.AsyncClient) -> None:
    r = await http.post("/v1/completions/render", json={"prompt": "abcdefgh", "max_tokens": 5})
    (one,) = r.json()
    assert set(one) == GENERATE_REQUEST_KEYS
    assert re.fullmatch(r"cmpl-[0-9a-f]{32}", one["request_id"])
    assert one["token_ids"] == tokens.encode("abcdefgh")
    assert one["sampling_params"]["max_tokens"] == 5

    r = await http.post("/v1/completions/render", json={"prompt": [5, 6, 7]})
    assert [item["token_ids"] for item in r.json()] == [[5, 6, 7]]

    r = await http.post(
        "/v1/completions/render", json={"prompt": ["ab", "cdefghij"], "stream": False}
    )
    batch = r.json()
    assert [item["token_ids"] for item in batch] == [tokens.encode("ab"), tokens.encode("cdefghij")]
    assert batch[0]["request_id"] != batch[1]["request_id"]
    assert [item["sampling_params"]["max_tokens"] for item in batch] == [16383, 16382]

    r = await http.post("/v1/completions/render", json={"prompt": [[1, 2], [3]]})
    assert [item["token_ids"] for item in r.json()] == [[1, 2], [3]]


CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("chat", {}, "messages"),
        ("chat", {"messages": []}, "messages"),
        ("chat", {"messages": "hi"}, "messages"),
        ("chat", {"messages": [{"content": "no role"}]}, "messages"),
        ("chat", {"messages": [{"role": "user", "content": 5}]}, "messages"),
        ("chat", {"messages": CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
        ("chat", {"messages": CHAT, "max_tokens": "5"}, "max_tokens"),
        ("chat", {"messages": CHAT, "max_tokens": 16384}, "max_tokens"),
        ("chat", {"messages": CHAT, "temperature": "hot"}, "temperature"),
        ("chat", {"messages": CHAT, "temperature": -1}, "temperature"),
        ("chat", {"messages": CHAT, "top_p": 2}, "top_p"),
        ("chat", {"messages": CHAT, "stop": 5}, "stop"),
        ("chat", {"messages": CHAT, "stream": "yes"}, "stream"),
        ("chat", {"messages": CHAT, "stream_options": []}, "stream_options"),
        ("chat", {"messages": CHAT, "stream_options": {"include_usage": 1}}, "stream_options"),
        ("chat", {"messages": CHAT, "priority": 1.5}, "priority"),
        ("chat", {"messages": CHAT, "cache_salt": 5}, "cache_salt"),
        ("chat", {"messages": CHAT, "n": 2}, "n"),
        ("chat", {"messages": CHAT, "seed": "x"}, "seed"),
        ("chat", {"messages": CHAT, "logprobs": "x"}, "logprobs"),
        ("chat", {"messages": CHAT, "max_tokens": 2, "min_tokens": 3}, "min_tokens"),
        ("completions", {}, "prompt"),
        ("completions", {"prompt": {}}, "prompt"),
        ("completions", {"prompt": []}, "prompt"),
        ("completions", {"prompt": ""}, "prompt"),
        ("completions", {"prompt": [1.5]}, "prompt"),
        ("completions", {"prompt": [True]}, "prompt"),
        ("completions", {"prompt": ["a", 3]}, "prompt"),
        ("completions", {"prompt": [[["a"]]]}, "prompt"),
        ("completions", {"prompt": ["a", []]}, "prompt"),
        ("completions", {"prompt": "x" * 70000}, "prompt"),
        ("completions", {"prompt": list(range(16384))}, "max_tokens"),
        ("completions", {"prompt": "x", "logprobs": True}, "logprobs"),
        ("completions", {"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
async def test_render_refuses_malformed_bodies_with_400(
    http: httpx.AsyncClient, route: str, body: dict[str, Any], param: str
) -> None:
    path = "/v1/chat/completions/render" if route == "chat" else "/v1/completions/render"
    r = await http.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"text"', b"[" * 100_000, b"\xff\xfe"])
@pytest.mark.parametrize("path", ["/v1/chat/completions/render", "/v1/completions/render"])
async def test_render_refuses_bodies_that_are_not_json_objects(
    http: httpx.AsyncClient, path: str, raw: bytes
) -> None:
    r = await http.post(path, content=raw)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_json"


async def test_render_unknown_model_is_404_and_nothing_runs(
    http: httpx.AsyncClient, base: str
) -> None:
    for path, body in (
        ("/v1/chat/completions/render", {"model": "zzz", "messages": CHAT}),
        ("/v1/completions/render", {"model": "zzz", "prompt": "x"}),
    ):
        r = await http.post(path, json=body)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    before = (await http.get("/metrics")).text
    for _ in range(3):
        await http.post("/v1/completions/render", json={"prompt": "render only " * 50})
    after = (await http.get("/metrics")).text

    def prompt_tokens(text: str) -> str:
        return json.dumps(re.findall(r"^vllm:prompt_tokens_total.*$", text, re.M))

    assert prompt_tokens(after) == prompt_tokens(before)  # rendering computes nothing
