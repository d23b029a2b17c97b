"""``POST /v1/messages`` through a real llmgw-server in front of real llmgw-sim replicas,
driven by the official ``anthropic`` SDK (issue #19): whole and streamed messages
with tools, the key as ``x-api-key``, Anthropic-shaped errors, usage counted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest

from llmgw.sim import tokens
from tests.anthropic_shapes import WEATHER
from tests.procs import Server, server, sim
from tests.waiting import wait_for

CONFIG = """
[router]
scrape_interval = "200ms"
scrape_timeout = "150ms"

[store]
url = "sqlite:///{db}"

[[models]]
name = "m"
aliases = ["claude-local"]
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    db = tmp_path_factory.mktemp("messages") / "llmgw.db"
    with (
        sim(model="m") as (_, base),
        server("--endpoint", f"s={base}=m", config=CONFIG.format(db=db)) as srv,
    ):
        srv.wait_scraped()
        r = httpx.post(f"{srv.admin}/api/v1/keys", json={"name": "agent"}, timeout=5)
        assert r.status_code == 201, r.text
        yield srv, r.json()["secret"]


def client(srv: Server, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.base, api_key=key, max_retries=0, timeout=30)


def test_a_message_with_tools(gateway: tuple[Server, str]) -> None:
    srv, key = gateway
    before = srv.metric("llmgw_requests_total", model="m", status="200")
    message = client(srv, key).messages.create(
        model="claude-local",
        max_tokens=12,
        system="Be brief.",
        tools=[WEATHER],  # type: ignore[list-item]
        messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.model == "claude-local"
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.content and message.content[0].type == "text"
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 12
    wait_for(
        lambda: srv.metric("llmgw_requests_total", model="m", status="200") == before + 1,
        "the message counted",
    )
    assert srv.metric("llmgw_completion_tokens_total", model="m") >= message.usage.output_tokens


def test_a_streamed_message(gateway: tuple[Server, str]) -> None:
    srv, key = gateway
    with client(srv, key).messages.stream(
        model="m",
        max_tokens=10,
        messages=[{"role": "user", "content": "Tell me a story."}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 10
    assert final.usage.input_tokens > 0


def test_the_key_and_errors_in_anthropics_shape(gateway: tuple[Server, str]) -> None:
    srv, key = gateway
    ask = {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(anthropic.AuthenticationError) as denied:
        client(srv, "sk-wrong").messages.create(model="m", **ask)  # type: ignore[arg-type]
    assert denied.value.body["type"] == "error"  # type: ignore[index]
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as missing:
        client(srv, key).messages.create(model="nope", **ask)  # type: ignore[arg-type]
    assert "does not exist" in missing.value.body["error"]["message"]  # type: ignore[index]
    # Strict as Anthropic: no max_tokens, or a role it does not have.
    for bad in (
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        {"model": "m", "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]},
    ):
        r = httpx.post(f"{srv.base}/v1/messages", json=bad, headers={"x-api-key": key}, timeout=5)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert r.headers["x-request-id"]
    r = httpx.post(f"{srv.base}/v1/messages", content=b"{", headers={"x-api-key": key}, timeout=5)
    assert r.status_code == 400 and r.json()["type"] == "error"


def test_usage_of_messages_is_the_keys(gateway: tuple[Server, str], tmp_path: Path) -> None:
    srv, key = gateway
    client(srv, key).messages.create(
        model="m", max_tokens=3, messages=[{"role": "user", "content": "count me"}]
    )

    def counted() -> bool:
        report = httpx.get(f"{srv.admin}/api/v1/usage?group_by=key", timeout=5).json()
        rows = [r for r in report["usage"] if r["name"] == "agent"]
        return bool(rows) and rows[0]["requests"] >= 1 and rows[0]["completion_tokens"] >= 3

    wait_for(counted, "the key's usage recorded", 10)


def test_count_tokens_asks_a_replica(gateway: tuple[Server, str]) -> None:
    srv, key = gateway
    api = client(srv, key)
    short = api.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    long = api.messages.count_tokens(
        model="claude-local", messages=[{"role": "user", "content": "hi " * 40}]
    )
    # What the simulator's tokenizer makes of each rendered conversation.
    for counted, content in ((short, "hi"), (long, "hi " * 40)):
        rendered = tokens.render_chat([{"role": "user", "content": content}])
        assert counted.input_tokens == tokens.count(rendered)


@pytest.mark.parametrize(
    ("flags", "engine_paths"),
    [
        # The simulator as a vLLM without the endpoint: tried once, then translated.
        (
            ["--personality", "vllm"],
            ["/v1/messages", "/v1/chat/completions", "/v1/chat/completions", "/tokenize"],
        ),
        # A vLLM with it: everything as sent.
        (
            ["--personality", "vllm", "--messages"],
            ["/v1/messages", "/v1/messages", "/v1/messages/count_tokens"],
        ),
        # llama.cpp: as sent, but its streams translated (paths.MESSAGES_NATIVE_STREAM).
        (
            ["--personality", "llamacpp"],
            ["/v1/messages", "/v1/chat/completions", "/v1/messages/count_tokens"],
        ),
    ],
)
def test_native_or_translated_by_the_replicas_engine(
    flags: list[str], engine_paths: list[str]
) -> None:
    """A replica whose engine serves Anthropic's API gets the client's request (llama.cpp
    not for streams); a vLLM without it is tried natively, and once it answers 404 gets
    the translation. All answer the SDK alike, and all are counted."""
    from tests.test_api_paths import _requests

    config = CONFIG.replace('url = "sqlite:///{db}"', 'url = ""')
    with (
        sim(*flags, model="m") as (_, base),
        server("--endpoint", f"s={base}=m", config=config) as srv,
    ):
        srv.wait_scraped()
        api = client(srv, "none")
        message = api.messages.create(
            model="claude-local", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
        assert message.usage.output_tokens == 5 and message.usage.input_tokens > 0
        with api.messages.stream(
            model="m", max_tokens=6, messages=[{"role": "user", "content": "go"}]
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert text and final.usage.output_tokens == 6 and final.usage.input_tokens > 0
        counted = api.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
        assert counted.input_tokens == message.usage.input_tokens
        assert [r["path"] for r in _requests(base) if r["method"] == "POST"] == engine_paths
        # Counted from the engine's own usage either way (Anthropic's split stream too).
        wait_for(
            lambda: srv.metric("llmgw_completion_tokens_total", model="m") == 11,
            "both messages' output counted",
        )
        assert srv.metric("llmgw_prompt_tokens_total", model="m") == 2 * counted.input_tokens
