from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain.engine_metrics import EngineSample, parse_metrics, windowed_hit_rate
from tests.properties import examples

# A current vLLM (V1) page: data-parallel ranks in the `engine` label, counters with
# OpenMetrics-style _created siblings, histograms, process metrics around it.
VLLM = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 7.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 5.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 2.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.3
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="Qwen/Qwen3-8B"} 1000.0
vllm:prefix_cache_queries_created{engine="0",model_name="Qwen/Qwen3-8B"} 1.7e9
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-8B"} 400.0
vllm:prefix_cache_hits_total{engine="1",model_name="Qwen/Qwen3-8B"} 600.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 42.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 42.0
"""

# vLLM 0.6 (V0): GPU-prefixed cache names, a hit-rate gauge, no engine label.
VLLM_OLD = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama-2-7b"} 3.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="llama-2-7b"} 9.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama-2-7b"} 4.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="llama-2-7b"} 0.82
# HELP vllm:gpu_prefix_cache_hit_rate GPU prefix cache block hit rate.
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{model_name="llama-2-7b"} 0.25
"""

SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen2.5-7B-Instruct"} 11.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="Qwen/Qwen2.5-7B-Instruct"} 6.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="Qwen/Qwen2.5-7B-Instruct"} 0.61
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="Qwen/Qwen2.5-7B-Instruct"} 0.37
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="Qwen/Qwen2.5-7B-Instruct"} 312.5
"""

LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 33065
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
"""


def test_vllm_current_sums_counts_and_averages_fractions() -> None:
    s = parse_metrics(VLLM)
    assert s.engine == "vllm"
    assert s.known
    assert s.running == 12.0
    assert s.waiting == 3.0
    assert s.kv_usage == pytest.approx(0.4)
    assert s.prefix_queries == 2000.0
    assert s.prefix_hits == 1000.0
    # Counters alone say nothing about the cache now.
    assert s.prefix_hit_rate is None


def test_vllm_windowed_prefix_hit_rate() -> None:
    first = parse_metrics(VLLM)
    later_page = VLLM.replace("1000.0", "1500.0").replace("} 400.0", "} 800.0")
    second = parse_metrics(later_page, previous=first)
    # 1000 more queried tokens, 400 more hits.
    assert second.prefix_hit_rate == pytest.approx(0.4)


def test_windowed_hit_rate_unknown_cases() -> None:
    prev = EngineSample("vllm", prefix_hits=100.0, prefix_queries=200.0)
    assert windowed_hit_rate(None, prev) is None
    idle = EngineSample("vllm", prefix_hits=100.0, prefix_queries=200.0)
    assert windowed_hit_rate(prev, idle) is None  # no queries in the window
    restarted = EngineSample("vllm", prefix_hits=5.0, prefix_queries=10.0)
    assert windowed_hit_rate(prev, restarted) is None  # counters went backwards
    missing = EngineSample("vllm")
    assert windowed_hit_rate(prev, missing) is None
    ok = EngineSample("vllm", prefix_hits=130.0, prefix_queries=300.0)
    assert windowed_hit_rate(prev, ok) == pytest.approx(0.3)


def test_vllm_old_names() -> None:
    s = parse_metrics(VLLM_OLD)
    assert s == EngineSample(
        engine="vllm", waiting=4.0, running=3.0, kv_usage=0.82, prefix_hit_rate=0.25
    )


def test_vllm_both_kv_names_prefers_current() -> None:
    page = VLLM + 'vllm:gpu_cache_usage_perc{engine="0",model_name="x"} 0.99\n'
    assert parse_metrics(page).kv_usage == pytest.approx(0.4)


def test_vllm_older_v1_prefix_counter_names() -> None:
    page = (
        'vllm:gpu_prefix_cache_queries_total{model_name="m"} 50\n'
        'vllm:gpu_prefix_cache_hits_total{model_name="m"} 10\n'
    )
    s = parse_metrics(page)
    assert (s.prefix_queries, s.prefix_hits) == (50.0, 10.0)


def test_sglang() -> None:
    s = parse_metrics(SGLANG)
    assert s == EngineSample(
        engine="sglang", waiting=6.0, running=11.0, kv_usage=0.61, prefix_hit_rate=0.37
    )


def test_llamacpp_has_no_kv_gauge() -> None:
    s = parse_metrics(LLAMACPP)
    assert s == EngineSample(engine="llamacpp", waiting=5.0, running=2.0)
    assert s.kv_usage is None
    assert s.prefix_hit_rate is None


def test_absent_metrics_are_none_not_zero() -> None:
    page = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
    s = parse_metrics(page)
    assert s.engine == "vllm"
    assert s.running == 0.0
    assert s.waiting is None
    assert s.kv_usage is None


def test_engine_detected_without_any_wanted_metric() -> None:
    s = parse_metrics('vllm:generation_tokens_total{model_name="m"} 5\n')
    assert s == EngineSample(engine="vllm")


def test_model_filter() -> None:
    page = (
        'sglang:num_running_reqs{model_name="a"} 1\n'
        'sglang:num_running_reqs{model_name="b"} 10\n'
        "sglang:num_queue_reqs 3\n"  # no model_name label: always counts
        'sglang:token_usage{model_name="a"} 0.2\n'
        'sglang:token_usage{model_name="b"} 0.8\n'
    )
    assert parse_metrics(page).running == 11.0
    a = parse_metrics(page, model="a")
    assert (a.running, a.waiting, a.kv_usage) == (1.0, 3.0, 0.2)
    b = parse_metrics(page, model="b")
    assert (b.running, b.kv_usage) == (10.0, 0.8)
    none = parse_metrics(page, model="c")
    assert none.running is None
    assert none.waiting == 3.0


def test_escaped_label_values() -> None:
    tricky = 'we\\"ird} model,\\\\ # x\\n'
    page = (
        f'vllm:num_requests_running{{model_name="{tricky}",engine="0"}} 4\n'
        'vllm:num_requests_running{model_name="plain"} 100\n'
    )
    s = parse_metrics(page, model='we"ird} model,\\ # x\n')
    assert s.running == 4.0


def test_timestamps_exemplars_eof_crlf_and_whitespace() -> None:
    page = (
        "# TYPE vllm:num_requests_running gauge\r\n"
        'vllm:num_requests_running{model_name="m"} 2 1700000000000\r\n'
        '  vllm:num_requests_waiting{model_name="m"}   3.5e0  \r\n'
        'vllm:prefix_cache_hits_total{model_name="m"} 7 # {trace_id="a b}c"} 1.0 1700000000.0\n'
        "vllm:num_requests_running{} 1\n"
        "# EOF\n"
    )
    s = parse_metrics(page)
    assert s.running == 3.0
    assert s.waiting == 3.5
    assert s.prefix_hits == 7.0


def test_nan_and_inf_are_absent() -> None:
    page = (
        'vllm:kv_cache_usage_perc{model_name="m"} NaN\n'
        'vllm:num_requests_waiting{model_name="m"} +Inf\n'
        'vllm:num_requests_running{model_name="m"} 2\n'
    )
    s = parse_metrics(page)
    assert s.kv_usage is None
    assert s.waiting is None
    assert s.running == 2.0


def test_exact_names_only() -> None:
    page = (
        'vllm:num_requests_waiting_by_reason{reason="x"} 99\n'
        'vllm:num_requests_waiting{model_name="m"} 1\n'
        'vllm:prefix_cache_hits_created{model_name="m"} 1.7e9\n'
    )
    s = parse_metrics(page)
    assert s.waiting == 1.0
    assert s.prefix_hits is None


def test_bytes_input() -> None:
    assert parse_metrics(LLAMACPP.encode()).running == 2.0


@pytest.mark.parametrize(
    "page",
    [
        "",
        "<html><body>502 Bad Gateway</body></html>",
        "\x00\xff garbage {{{ }}} ===",
        "# only comments\n# EOF\n",
        "some_other_exporter_metric 1\n",
    ],
)
def test_garbage_is_unknown(page: str) -> None:
    s = parse_metrics(page)
    assert s == EngineSample(engine="unknown")
    assert not s.known


def test_malformed_lines_are_skipped() -> None:
    page = (
        'vllm:num_requests_running{model_name="m 5\n'  # unterminated label value
        "vllm:num_requests_running{model_name=m} 5\n"  # unquoted
        "vllm:num_requests_running{model_name} 5\n"
        "vllm:num_requests_running abc\n"
        "vllm:num_requests_running\n"
        'vllm:num_requests_running{model_name="m\\'
        "\nvllm:num_requests_waiting 2\n"
    )
    s = parse_metrics(page)
    assert s.engine == "vllm"
    assert s.running is None
    assert s.waiting == 2.0


def test_mixed_engines_first_wins() -> None:
    s = parse_metrics("sglang:num_running_reqs 4\nvllm:num_requests_running 9\n")
    assert (s.engine, s.running) == ("sglang", 4.0)


@settings(max_examples=examples(300))
@given(st.text(alphabet=st.sampled_from(list('vlm:_{}="\\ ,#\n0123.eNaIf-+sgrunq')), max_size=300))
def test_never_raises_on_noise(page: str) -> None:
    s = parse_metrics(page)
    assert isinstance(s, EngineSample)


@settings(max_examples=examples(100))
@given(st.binary(max_size=200))
def test_never_raises_on_bytes(page: bytes) -> None:
    assert isinstance(parse_metrics(page), EngineSample)


def test_big_page_is_fast() -> None:
    # ~100 KB of histogram buckets around the few gauges we read.
    lines = []
    for i in range(1200):
        lines.append(
            f'vllm:e2e_request_latency_seconds_bucket{{engine="0",le="{i}.0",'
            f'model_name="meta-llama/Llama-3.1-8B-Instruct"}} {i}.0'
        )
    page = "\n".join(lines) + "\n" + VLLM
    assert len(page) > 100_000
    parse_metrics(page)
    start = time.perf_counter()
    for _ in range(20):
        s = parse_metrics(page)
    per_page = (time.perf_counter() - start) / 20
    assert s.running == 12.0
    # Generous bound for slow CI; measured ~0.3 ms here.
    assert per_page < 0.02
