"""The engine paths beside chat (issue #19) through a real llmgw-server in front of real
llmgw-sim processes: models.retrieve, /health and /version answered by llmgw itself;
tokenize, detokenize, rerank and score routed by the model in their body; a path no
replica's engine serves refused at once; request ids and trace context passed on;
an engine that wants an API key reached with the endpoint's."""

from __future__ import annotations

import io
import re
import wave
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llmgw.router.paths import PATHS, engine_names
from tests.procs import server, sim
from tests.waiting import wait_for

CONFIG = """
[router]
scrape_interval = "200ms"
scrape_timeout = "150ms"

[store]
url = ""

[[models]]
name = "m"
aliases = ["m-alias"]
"""


def _requests(base: str) -> list[dict[str, Any]]:
    return httpx.get(f"{base}/sim/requests", timeout=5).json()["requests"]  # type: ignore[no-any-return]


def test_the_path_table_is_the_one_docs_router_md_shows() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "router.md").read_text()
    rows = re.findall(r"^\| `POST (/[^`]+)` \| ([^|]+) \| ([^|]+) \|", doc, re.M)
    assert {path: engines.strip() for path, _, engines in rows} == {
        p.path: engine_names(p.engines) for p in PATHS.values()
    }


def test_models_retrieve_health_and_version() -> None:
    with sim(model="m") as (_, base), server("--endpoint", f"s={base}=m", config=CONFIG) as srv:
        srv.wait_scraped()
        client = openai.OpenAI(base_url=f"{srv.base}/v1", api_key="none", max_retries=0)
        assert client.models.retrieve("m").id == "m"
        assert client.models.retrieve("m-alias").id == "m-alias"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("nope")
        health = httpx.get(f"{srv.base}/health", timeout=5)
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        version = httpx.get(f"{srv.base}/version", timeout=5).json()
        assert version["server"] == "llmgw" and version["version"]


def test_health_needs_no_key_and_says_not_ready_before_a_scrape(tmp_path: Path) -> None:
    config = f'[store]\nurl = "sqlite:///{tmp_path / "k.db"}"\n[auth]\nrequired = true\n'
    # An endpoint that never answers: nothing is ever scraped.
    with server("--endpoint", "s=http://127.0.0.1:9=m", config=config) as srv:
        assert httpx.get(f"{srv.base}/v1/models", timeout=5).status_code == 401
        health = httpx.get(f"{srv.base}/health", timeout=5)
        assert (health.status_code, health.json()) == (503, {"status": "not ready"})


def test_tokenize_rerank_and_score_are_routed_by_their_model() -> None:
    with ExitStack() as stack:
        bases = [stack.enter_context(sim(model="m"))[1] for _ in range(2)]
        flags = [a for i, b in enumerate(bases) for a in ("--endpoint", f"s{i}={b}=m")]
        srv = stack.enter_context(server(*flags, config=CONFIG))
        srv.wait_scraped()
        with httpx.Client(base_url=srv.base, timeout=10) as http:
            tokens = http.post("/tokenize", json={"model": "m-alias", "prompt": "hello world"})
            assert tokens.status_code == 200, tokens.text
            assert tokens.json()["count"] == 3  # the sim's 4 characters per token
            assert tokens.headers["x-llmgw-model"] == "m"
            text = http.post("/detokenize", json={"model": "m", "tokens": tokens.json()["tokens"]})
            assert text.status_code == 200 and text.json()["prompt"].count("<") == 3
            rerank = http.post(
                "/v1/rerank",
                json={"model": "m", "query": "red apples", "documents": ["blue sky", "red apples"]},
            ).json()
            assert [r["index"] for r in rerank["results"]] == [1, 0]
            assert rerank["usage"]["total_tokens"] > 0
            for path in ("/score", "/v1/score"):
                score = http.post(path, json={"model": "m", "text_1": "abcd", "text_2": ["abcd"]})
                assert score.status_code == 200 and score.json()["data"][0]["score"] == 1.0
            unknown = http.post("/tokenize", json={"model": "other", "prompt": "x"})
            assert unknown.status_code == 404
            assert unknown.json()["error"]["code"] == "model_not_found"
        # Each went to a replica under its own path, the alias renamed to the model.
        seen = [r for b in bases for r in _requests(b) if r["method"] == "POST"]
        assert sorted(r["path"] for r in seen) == sorted(
            ["/tokenize", "/detokenize", "/v1/rerank", "/score", "/v1/score"]
        )
        # Counted once the answer is out: the metrics may trail the client by a moment.
        wait_for(
            lambda: srv.metric("llmgw_requests_total", model="m", status="200") == 5, "5 counted"
        )


def test_a_path_no_replica_serves_is_refused_without_reaching_one() -> None:
    with (
        sim("--personality", "llamacpp", model="m") as (_, base),
        server("--endpoint", f"s={base}=m", config=CONFIG) as srv,
    ):
        srv.wait_scraped()
        assert srv.endpoints()["s"]["engine"] == "llamacpp"
        for path in ("/pooling", "/v1/score", "/classify"):
            r = httpx.post(f"{srv.base}{path}", json={"model": "m", "input": "x"}, timeout=5)
            assert r.status_code == 404, (path, r.text)
            error = r.json()["error"]
            assert error["code"] == "unsupported_endpoint"
            assert "they run llama.cpp" in error["message"] and "vLLM" in error["message"]
        # What llama.cpp does serve goes through.
        ok = httpx.post(f"{srv.base}/tokenize", json={"model": "m", "prompt": "abcd"}, timeout=5)
        assert ok.status_code == 200, ok.text
        assert [r["path"] for r in _requests(base) if r["method"] == "POST"] == ["/tokenize"]


def test_request_ids_are_echoed_passed_on_and_made_when_missing() -> None:
    with sim(model="m") as (_, base), server("--endpoint", f"s={base}=m", config=CONFIG) as srv:
        srv.wait_scraped()
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        given = httpx.post(
            f"{srv.base}/v1/chat/completions",
            json=body,
            headers={"x-request-id": "req-42", "traceparent": trace, "tracestate": "a=1"},
            timeout=10,
        )
        assert given.status_code == 200 and given.headers["x-request-id"] == "req-42"
        made = httpx.post(f"{srv.base}/v1/chat/completions", json=body, timeout=10)
        assert re.fullmatch(r"[0-9a-f]{32}", made.headers["x-request-id"])
        # Not passed on as given: too long, or a character a log line could trip on.
        for bad in ("x" * 129, "a b", 'a"b'):
            r = httpx.post(
                f"{srv.base}/v1/chat/completions",
                json=body,
                headers={"x-request-id": bad},
                timeout=10,
            )
            assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"]), bad
        # Errors llmgw answers itself carry one too, and so do streams.
        refused = httpx.post(f"{srv.base}/v1/chat/completions", json={"model": "x"}, timeout=5)
        assert refused.status_code == 404 and refused.headers["x-request-id"]
        with httpx.stream(
            "POST",
            f"{srv.base}/v1/chat/completions",
            json={**body, "stream": True},
            headers={"x-request-id": "stream-1"},
            timeout=10,
        ) as stream:
            assert stream.headers["x-request-id"] == "stream-1"
            stream.read()
        seen = [r for r in _requests(base) if r["path"] == "/v1/chat/completions"]
        assert seen[0]["x-request-id"] == "req-42"
        assert (seen[0]["traceparent"], seen[0]["tracestate"]) == (trace, "a=1")
        assert seen[1]["x-request-id"] == made.headers["x-request-id"]
        assert "traceparent" not in seen[1]
        assert seen[-1]["x-request-id"] == "stream-1"


def test_an_engine_that_wants_an_api_key_gets_the_endpoints() -> None:
    secret = "sk-engine-7f3a"
    config = (
        CONFIG
        + f"""
[[endpoints]]
id = "keyed"
url = "{{base}}"
models = ["m"]
api_key = "{secret}"
headers = {{ "x-org" = "llmgw-tests" }}
"""
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with sim("--api-key", secret, model="m") as (_, base):
        # The engine refuses a request without the key, as vLLM --api-key does.
        assert httpx.post(f"{base}/v1/chat/completions", json=body, timeout=5).status_code == 401
        with server(config=config.replace("{base}", base)) as srv:
            srv.wait_scraped()
            r = httpx.post(f"{srv.base}/v1/chat/completions", json=body, timeout=10)
            assert r.status_code == 200, r.text
            # Never shown by the admin API, nor in --print-config.
            assert secret not in httpx.get(f"{srv.admin}/api/v1/endpoints", timeout=5).text
            assert secret not in srv.proc.output()
        assert _requests(base)[-1]["authorized"] is True


def _wav(seconds: float = 0.25, rate: int = 16000) -> bytes:
    """A short silent mono 16-bit WAV, written by the stdlib."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\0\0" * int(seconds * rate))
    return out.getvalue()


def test_audio_uploads_are_routed_by_their_form_model() -> None:
    audio = _wav()
    with sim(model="m") as (_, base), server("--endpoint", f"s={base}=m", config=CONFIG) as srv:
        srv.wait_scraped()
        client = openai.OpenAI(base_url=f"{srv.base}/v1", api_key="none", max_retries=0)
        # By its alias: the form is written again with the model's own name.
        heard = client.audio.transcriptions.create(model="m-alias", file=("clip.wav", audio))
        assert heard.text == f"transcribed clip.wav: {len(audio)} bytes"
        said = client.audio.translations.create(model="m", file=("clip.wav", audio))
        assert said.text == f"translated clip.wav: {len(audio)} bytes"
        # A form without a model, or not a form at all, is the client's error.
        for files, data in (({"file": ("x.wav", audio)}, {}), (None, {"model": "m"})):
            r = httpx.post(
                f"{srv.base}/v1/audio/transcriptions", files=files, data=data, timeout=10
            )
            assert r.status_code == 400, r.text
        heard = 2 * (len(audio) // 320)
        wait_for(lambda: srv.metric("llmgw_prompt_tokens_total", model="m") == heard, "usage")
        assert srv.metric("llmgw_requests_total", model="m", status="200") == 2
        seen = [r["path"] for r in _requests(base) if r["method"] == "POST"]
        assert seen == ["/v1/audio/transcriptions", "/v1/audio/translations"]


def test_usage_records_keep_the_request_id(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "usage.db"
    config = CONFIG.replace('url = ""', f'url = "sqlite:///{db}"')
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with sim(model="m") as (_, base), server("--endpoint", f"s={base}=m", config=config) as srv:
        srv.wait_scraped()
        given = httpx.post(
            f"{srv.base}/v1/chat/completions",
            json=body,
            headers={"x-request-id": "trace-me-1"},
            timeout=10,
        )
        made = httpx.post(f"{srv.base}/v1/chat/completions", json=body, timeout=10)
        assert given.status_code == made.status_code == 200

        def recorded() -> set[str]:
            with sqlite3.connect(db) as conn:
                return {r for (r,) in conn.execute("SELECT request_id FROM usage_records")}

        ids = wait_for(lambda: len(recorded()) == 2 and recorded(), "both requests recorded", 10)
    assert ids == {"trace-me-1", made.headers["x-request-id"]}


def test_render_endpoints_reach_the_engine() -> None:
    with sim(model="m") as (_, base), server("--endpoint", f"s={base}=m", config=CONFIG) as srv:
        srv.wait_scraped()
        chat = {"model": "m-alias", "messages": [{"role": "user", "content": "hello"}]}
        rendered = httpx.post(f"{srv.base}/v1/chat/completions/render", json=chat, timeout=10)
        assert rendered.status_code == 200, rendered.text
        prompt = httpx.post(
            f"{srv.base}/v1/completions/render", json={"model": "m", "prompt": "abcd"}, timeout=10
        )
        assert prompt.status_code == 200, prompt.text
        assert [r["path"] for r in _requests(base) if r["method"] == "POST"] == [
            "/v1/chat/completions/render",
            "/v1/completions/render",
        ]


def test_an_engine_llmgw_launches_gets_its_profiles_key() -> None:
    """A deployment profile's api_key: the engine is started with it in its environment
    (never its command line), the router sends it, and nothing shows it."""
    from tests.procs import agent, fleet_server
    from tests.test_fleet_e2e import control_config, model

    secret = "sk-launched-91c"
    config = control_config([model("m") + f'api_key = "{secret}"\n'])
    with fleet_server(config) as srv, agent(srv.agent_address, "n1", address="127.0.0.91") as node:
        (replica,) = srv.wait(lambda: srv.ready_replicas("m", 1), "a ready replica of m")
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = httpx.post(f"{srv.base}/v1/chat/completions", json=body, timeout=10)
        assert r.status_code == 200, r.text
        engine_url = srv.endpoints()[replica["id"]]["url"]
        direct = httpx.post(f"{engine_url}/v1/chat/completions", json=body, timeout=10)
        assert direct.status_code == 401  # the engine wants the key, as vLLM would
        ((_, pid),) = node.engines().items()
        assert secret.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert f"LLMGW_SIM_API_KEY={secret}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
        shown = httpx.get(f"{srv.admin}/api/v1/models/m", timeout=5).text
        assert secret not in shown and "<hidden>" in shown
        assert secret not in httpx.get(f"{srv.admin}/api/v1/endpoints", timeout=5).text
