"""OpenTelemetry traces (issue #21), seen by an OTLP/HTTP receiver in the test process
(tests/otlp_receiver.py): a real llmgw-server in front of real llmgw-sim processes,
which record the traceparent each request brought. One request is followed from the
client's span through llmgw's request, admission and attempt spans into the engine;
retries and fallbacks are events; the sampler's ratio and the client's sampled flag
decide what is recorded, and an unrecorded request reaches the engine as with tracing
off; the last spans are flushed when the server stops. Then the configuration's
checks."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio

from llmgw import config as cfg
from llmgw import extras
from llmgw.router import tracing
from tests.otlp_receiver import Receiver, Span, otlp_receiver
from tests.procs import server, set_faults, sim
from tests.waiting import wait_for

SERVER, CLIENT, INTERNAL = 2, 3, 1  # opentelemetry.proto's Span.SpanKind

BASE = """
[router]
scrape_interval = "200ms"
scrape_timeout = "150ms"

[store]
url = "{store}"

[tracing]
endpoint = "{endpoint}"
sample_ratio = {ratio}
service_name = "llmgw-test"
"""

#: The batch processor's delay: spans within a test's patience (OTel's default is 5 s).
QUICK_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50"}


def _engine_saw(base: str) -> list[dict[str, Any]]:
    requests = httpx.get(f"{base}/sim/requests", timeout=5).json()["requests"]
    return [r for r in requests if r["path"] == "/v1/chat/completions"]


def _traceparent() -> tuple[str, str]:
    return secrets.token_hex(16), secrets.token_hex(8)


def _of_trace(rx: Receiver, trace_id: str, count: int) -> dict[str, list[Span]]:
    """The spans of `trace_id` by name, once `count` of them are in."""

    def arrived() -> dict[str, list[Span]] | None:
        spans = [s for s in rx.spans() if s.trace_id == trace_id]
        if len(spans) < count:
            return None
        named: dict[str, list[Span]] = {}
        for span in spans:
            named.setdefault(span.name, []).append(span)
        return named

    return wait_for(arrived, f"{count} spans of trace {trace_id}", timeout=20)


def test_a_streamed_request_is_one_trace_from_the_client_through_llmgw_into_the_engine(
    tmp_path: Path,
) -> None:
    config = (
        BASE.format(store=f"sqlite:///{tmp_path / 'k.db'}", endpoint="{endpoint}", ratio=1.0)
        + '[[models]]\nname = "m"\naliases = ["m-alias"]\n'
    )
    with (
        otlp_receiver() as rx,
        sim(model="m") as (_, base),
        server(
            "--endpoint",
            f"s={base}=m",
            config=config.replace("{endpoint}", rx.url),
            env=QUICK_EXPORT,
        ) as srv,
    ):
        srv.wait_scraped()
        made = httpx.post(
            f"{srv.admin}/api/v1/keys", json={"name": "app", "band": "silver"}, timeout=5
        )
        assert made.status_code == 201, made.text
        key = made.json()
        client = openai.OpenAI(base_url=f"{srv.base}/v1", api_key=key["secret"], max_retries=0)
        trace_id, client_span = _traceparent()
        stream = client.chat.completions.create(
            model="m-alias",
            messages=[{"role": "user", "content": "tell me a story"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={
                "traceparent": f"00-{trace_id}-{client_span}-01",
                "tracestate": "client=7",
                "x-request-id": "traced-1",
            },
        )
        chunks = list(stream)
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == 6

        spans = _of_trace(rx, trace_id, 3)
        assert sorted(spans) == ["admission", "chat m-alias", "upstream"], spans
        (request,) = spans["chat m-alias"]
        (admission,) = spans["admission"]
        (attempt,) = spans["upstream"]
        # llmgw's span continues the client's trace, under the client's span.
        assert (request.parent_span_id, request.kind) == (client_span, SERVER)
        assert request.service == "llmgw-test"
        assert not request.error
        a = request.attributes
        assert {k: a[k] for k in a if k.startswith("gen_ai.")} == {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "m-alias",
            "gen_ai.response.model": "m",
            "gen_ai.usage.input_tokens": usage.prompt_tokens,
            "gen_ai.usage.output_tokens": usage.completion_tokens,
        }
        assert a["llmgw.replica"] == "s"
        assert a["llmgw.key_id"] == key["id"]
        assert a["llmgw.band"] == "silver"
        assert a["llmgw.request_id"] == "traced-1"
        assert a["llmgw.retries"] == 0
        assert a["http.response.status_code"] == 200
        assert a["llmgw.decision.tier"]
        duration = (request.end_ns - request.start_ns) / 1e9
        assert 0 < a["llmgw.ttft"] <= duration
        assert 0 <= a["llmgw.admission.wait"] <= duration
        assert request.events == ()
        # Admission, then the attempt, both children of the request, inside it.
        assert admission.parent_span_id == attempt.parent_span_id == request.span_id
        assert admission.kind == INTERNAL and attempt.kind == CLIENT
        assert admission.attributes["llmgw.band"] == "silver"
        assert admission.attributes["llmgw.pool"] == "m"
        assert request.start_ns <= admission.start_ns <= admission.end_ns <= attempt.start_ns
        assert attempt.end_ns <= request.end_ns
        assert attempt.attributes["llmgw.replica"] == "s"
        assert attempt.attributes["gen_ai.request.model"] == "m"  # the name the engine knows
        assert attempt.attributes["http.response.status_code"] == 200
        assert attempt.attributes["llmgw.outcome"] == "ok"
        assert attempt.attributes["llmgw.decision.tier"] == a["llmgw.decision.tier"]
        # The engine was handed the same trace, with llmgw's attempt as its parent.
        (seen,) = _engine_saw(base)
        assert seen["traceparent"] == f"00-{trace_id}-{attempt.span_id}-01"
        assert seen["tracestate"] == "client=7"
        assert seen["x-request-id"] == "traced-1"


def test_retries_and_fallbacks_are_events_and_every_attempt_a_span() -> None:
    config = (
        BASE.format(store="", endpoint="{endpoint}", ratio=1.0)
        + '[[models]]\nname = "m"\nfallbacks = ["f"]\n[[models]]\nname = "f"\n'
    )
    with (
        otlp_receiver() as rx,
        sim(model="m") as (_, broken),
        sim(model="f") as (_, spare),
        server(
            "--endpoint",
            f"a={broken}=m",
            "--endpoint",
            f"b={spare}=f",
            config=config.replace("{endpoint}", rx.url),
            env=QUICK_EXPORT,
        ) as srv,
    ):
        srv.wait_scraped()
        set_faults(broken, error_rate=1.0, error_status=503)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        # No traceparent: llmgw starts the trace.
        r = httpx.post(
            f"{srv.base}/v1/chat/completions",
            json=body,
            headers={"x-request-id": "fell-back"},
            timeout=10,
        )
        assert r.status_code == 200 and r.headers["x-llmgw-endpoint"] == "b", r.text
        request = wait_for(
            lambda: next(
                (s for s in rx.spans() if s.attributes.get("llmgw.request_id") == "fell-back"),
                None,
            ),
            "the request's span",
        )
        spans = _of_trace(rx, request.trace_id, 4)
        assert request.name == "chat m" and request.parent_span_id == ""
        assert request.attributes["gen_ai.response.model"] == "f"
        assert request.attributes["llmgw.replica"] == "b"
        assert request.attributes["llmgw.retries"] == 1
        assert not request.error  # the client got its answer
        assert request.events == (
            ("llmgw.fallback", {"llmgw.fallback.from": "m", "llmgw.fallback.to": "f"}),
            (
                "llmgw.retry",
                {
                    "llmgw.retry.failed_replica": "a",
                    "llmgw.retry.reason": "server_error",
                    "llmgw.replica": "b",
                },
            ),
        )
        attempts = {s.attributes["llmgw.replica"]: s for s in spans["upstream"]}
        assert sorted(attempts) == ["a", "b"]
        assert all(s.parent_span_id == request.span_id for s in attempts.values())
        failed, served = attempts["a"], attempts["b"]
        assert failed.error and failed.attributes["http.response.status_code"] == 503
        assert failed.attributes["error.type"] == "server_error"
        assert not served.error and served.attributes["gen_ai.request.model"] == "f"
        assert failed.end_ns <= served.start_ns
        # Each engine saw its own attempt as the parent.
        for base, attempt in ((broken, failed), (spare, served)):
            (seen,) = _engine_saw(base)
            given, flags = seen["traceparent"].rsplit("-", 1)
            assert given == f"00-{request.trace_id}-{attempt.span_id}"
            # Sampled; a trace llmgw starts also says its id is random (W3C level 2).
            assert int(flags, 16) & 1, flags


def test_a_stream_the_client_leaves_ends_its_spans_with_what_was_relayed() -> None:
    config = BASE.format(store="", endpoint="{endpoint}", ratio=1.0) + '[[models]]\nname = "m"\n'
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "long"}],
        "max_tokens": 5000,
        "stream": True,
    }
    with (
        otlp_receiver() as rx,
        sim(model="m") as (_, base),
        server(
            "--endpoint",
            f"s={base}=m",
            config=config.replace("{endpoint}", rx.url),
            env=QUICK_EXPORT,
        ) as srv,
    ):
        srv.wait_scraped()
        trace_id, client_span = _traceparent()
        headers = {"traceparent": f"00-{trace_id}-{client_span}-01"}
        with httpx.stream(
            "POST", f"{srv.base}/v1/chat/completions", json=body, headers=headers, timeout=30
        ) as r:
            next(line for line in r.iter_lines() if line.startswith("data: "))
        spans = _of_trace(rx, trace_id, 3)
    (request,) = spans["chat m"]
    (attempt,) = spans["upstream"]
    assert request.attributes["http.response.status_code"] == 499
    assert request.attributes["error.type"] == "client_gone"
    assert request.attributes["llmgw.usage.estimated"] is True
    assert request.attributes["gen_ai.usage.output_tokens"] >= 1
    assert request.attributes["llmgw.ttft"] > 0
    assert not request.error  # the client's doing, not llmgw's
    assert attempt.attributes["llmgw.outcome"] == "client_gone"
    assert "http.response.status_code" not in attempt.attributes


def test_what_the_sampler_leaves_out_reaches_the_engine_as_without_tracing() -> None:
    config = BASE.format(store="", endpoint="{endpoint}", ratio=0) + '[[models]]\nname = "m"\n'
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    unsampled_trace, unsampled_span = _traceparent()
    sampled_trace, sampled_span = _traceparent()
    unsampled = f"00-{unsampled_trace}-{unsampled_span}-00"
    with otlp_receiver() as rx, sim(model="m") as (_, base):
        # The batch processor's delay is longer than the test: only the flush on the
        # server's stop can export the spans.
        with server(
            "--endpoint",
            f"s={base}=m",
            config=config.replace("{endpoint}", rx.url),
            env={"OTEL_BSP_SCHEDULE_DELAY": "600000"},
        ) as srv:
            srv.wait_scraped()
            for headers in (
                {},  # the ratio (0) decides: not recorded
                {"traceparent": unsampled},  # the client does not sample: neither
                # The client samples: recorded, whatever the ratio (parent_based).
                {"traceparent": f"00-{sampled_trace}-{sampled_span}-01"},
            ):
                r = httpx.post(
                    f"{srv.base}/v1/chat/completions", json=body, headers=headers, timeout=10
                )
                assert r.status_code == 200, r.text
            seen = _engine_saw(base)
            assert rx.spans() == []
            assert srv.proc.stop() == 0
        # Flushed on the way out: the sampled request's spans, and nothing else.
        spans = rx.spans()
        assert sorted(s.name for s in spans) == ["admission", "chat m", "upstream"], spans
        assert {s.trace_id for s in spans} == {sampled_trace}
    # What was not recorded reached the engine as it came: nothing, or the client's
    # own traceparent; the recorded one with llmgw's attempt as the parent.
    (attempt,) = (s for s in spans if s.name == "upstream")
    assert [r.get("traceparent") for r in seen] == [
        None,
        unsampled,
        f"00-{sampled_trace}-{attempt.span_id}-01",
    ]


def test_the_ratio_decides_alone_when_not_parent_based() -> None:
    config = cfg.TracingConfig(
        endpoint="http://127.0.0.1:9/v1/traces", sample_ratio=0.0, parent_based=False
    )
    sampled = [(b"traceparent", f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01".encode())]

    async def main() -> None:
        tracer = tracing.Tracing(config)
        assert tracer.request(sampled, "chat m", 0.0) is None
        assert tracer.request([], "chat m", 0.0) is None
        await tracer.aclose()

    trio.run(main)


def _problems(**tracing_: Any) -> list[str]:
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load(data={"tracing": tracing_}, environ={})
    return list(info.value.problems)


def test_the_tracing_configuration_is_checked() -> None:
    assert cfg.load(data={}, environ={}).tracing.endpoint == ""  # off by default
    on = cfg.load(
        environ={"LLMGW_TRACING__ENDPOINT": "http://collector:4318/v1/traces"}, data={}
    ).tracing
    assert (on.endpoint, on.sample_ratio, on.parent_based) == (
        "http://collector:4318/v1/traces",
        1.0,
        True,
    )
    assert _problems(endpoint="http://c:4318/v1/traces", sample_ratio=1.5) == [
        "tracing.sample_ratio: must be in [0, 1], got 1.5"
    ]
    assert _problems(sample_ratio=-0.1) == ["tracing.sample_ratio: must be in [0, 1], got -0.1"]
    (problem,) = _problems(endpoint="collector:4318")
    assert problem.startswith("tracing.endpoint: must be an OTLP/HTTP URL")
    assert _problems(endpoint="http://c/v1/traces", service_name="", timeout="0s") == [
        "tracing.timeout: must be greater than 0, got 0",
        "tracing.service_name: must not be empty",
    ]
    (problem,) = _problems(endpoint="http://c/v1/traces", headers={"bad name": "x"})
    assert problem.startswith("tracing.headers: 'bad name' is not a header name")


def test_an_exporter_key_is_hidden_in_the_printed_configuration() -> None:
    config = cfg.load(
        data={"tracing": {"endpoint": "http://c/v1/traces", "headers": {"api-key": "s3cret"}}},
        environ={},
    )
    text = cfg.dump_toml(config)
    assert "s3cret" not in text and 'api-key = "<hidden>"' in text
    # What it prints is refused back: the secret itself is wanted.
    (problem,) = _problems(endpoint="http://c/v1/traces", headers={"api-key": "<hidden>"})
    assert "give the secret itself" in problem


def test_tracing_without_its_packages_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    needs = {"llmgw_no_such_module.sdk": "opentelemetry-sdk"}
    monkeypatch.setitem(extras.EXTRAS, "tracing", needs)
    (problem,) = _problems(endpoint="http://c/v1/traces")
    assert problem == (
        "tracing.endpoint: tracing needs opentelemetry-sdk, not installed: "
        "pip install 'llmgw[tracing]' (or leave tracing.endpoint empty)"
    )
    assert cfg.load(data={}, environ={}).tracing.endpoint == ""  # off, nothing needed
