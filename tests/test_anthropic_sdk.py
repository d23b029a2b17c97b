"""The Messages API translation under the official anthropic SDK, over HTTP: against a
fake engine in the test (MockTransport), and against the simulator as the engine."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import pytest

try:  # The SDK's HTTP client: httpx2 (an httpx fork) from anthropic 0.7x on, httpx before.
    import httpx2
except ImportError:  # pragma: no cover
    import httpx as httpx2  # type: ignore[no-redef]

from llmgw.router.anthropic import (
    MessagesError,
    StreamTranslator,
    encode,
    error_event,
    error_from_chat,
    from_chat,
    to_chat,
)
from tests.anthropic_shapes import (
    WEATHER,
    call,
    chunk,
    completion,
    tool_chunk,
)
from tests.procs import sim

# ---------------------------------------------- the anthropic SDK end to end, over HTTP


def _engine(chat_request: dict[str, Any]) -> dict[str, Any]:
    """A fake engine: calls the first tool if offered one, else echoes the last message."""
    if chat_request.get("tools"):
        name = chat_request["tools"][0]["function"]["name"]
        return completion(None, [call("call_9", name, '{"city": "Oslo"}')], finish="tool_calls")
    return completion("echo: " + str(chat_request["messages"][-1]["content"]))


def _stream(response: dict[str, Any]) -> Iterator[Any]:
    message = response["choices"][0]["message"]
    yield chunk({"role": "assistant", "content": ""})
    if message["content"]:
        for i in range(0, len(message["content"]), 3):
            yield chunk({"content": message["content"][i : i + 3]})
    for i, tool in enumerate(message.get("tool_calls") or []):
        arguments = tool["function"]["arguments"]
        yield tool_chunk(i, tool["id"], tool["function"]["name"], arguments[:5])
        yield tool_chunk(i, args=arguments[5:])
    yield chunk({}, finish=response["choices"][0]["finish_reason"])
    yield chunk(usage=response["usage"])
    yield "[DONE]"


def _handler(request: httpx2.Request) -> httpx2.Response:
    try:
        body = json.loads(request.content)
        chat_request = to_chat(body)
    except MessagesError as error:
        return httpx2.Response(error.status, json=error.body())
    response = _engine(chat_request)
    if not chat_request.get("stream"):
        return httpx2.Response(200, json=from_chat(response, body["model"]))
    translator = StreamTranslator(body["model"])
    sse = b"".join(
        encode(*event) for payload in _stream(response) for event in translator.feed(payload)
    )
    return httpx2.Response(200, content=sse, headers={"content-type": "text/event-stream"})


@pytest.fixture
def client() -> Iterator[anthropic.Anthropic]:
    http = httpx2.Client(transport=httpx2.MockTransport(_handler))
    with anthropic.Anthropic(
        api_key="k", base_url="http://llmgw.test", http_client=http, max_retries=0
    ) as sdk:
        yield sdk


def test_the_sdk_creates_a_message(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "hello"}]
    )
    assert message.content[0].type == "text"
    assert message.content[0].text == "echo: hello"
    assert message.stop_reason == "end_turn"


def test_the_sdk_streams_a_tool_call(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model="claude-x",
        max_tokens=10,
        messages=[{"role": "user", "content": "weather?"}],
        tools=[WEATHER],  # type: ignore[list-item]
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    block = final.content[0]
    assert block.type == "tool_use"
    assert (block.id, block.name, block.input) == ("call_9", "get_weather", {"city": "Oslo"})
    assert (final.usage.input_tokens, final.usage.output_tokens) == (11, 5)


def test_the_sdk_streams_text(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "abcdefg"}]
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == "echo: abcdefg"
    assert len(pieces) > 1
    assert final.content[0].type == "text"
    assert final.content[0].text == "echo: abcdefg"


def test_the_sdk_raises_its_own_error_for_a_refused_request(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="claude-x",
            max_tokens=10,
            messages=[{"role": "user", "content": "x"}],
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
    assert caught.value.status_code == 400
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["error"]["type"] == "invalid_request_error"


# ------------------------------------------------ the simulator as the engine, over HTTP


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    with sim() as (_, base):
        yield base


def _via(base: str) -> Callable[[httpx2.Request], httpx2.Response]:
    """A ``/v1/messages`` handler doing what the router will: translate the request,
    ask the engine, translate its answer (whole or streamed) or its error back."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        try:
            body = json.loads(request.content)
            chat_request = to_chat(body)
        except MessagesError as error:
            return httpx2.Response(error.status, json=error.body())
        stops = body.get("stop_sequences")
        with httpx.Client(base_url=base, timeout=10) as engine:
            if not chat_request.get("stream"):
                answer = engine.post("/v1/chat/completions", json=chat_request)
                if answer.status_code != 200:
                    failure = error_from_chat(answer.status_code, answer.json())
                    return httpx2.Response(answer.status_code, json=failure)
                message = from_chat(answer.json(), body["model"], stop_sequences=stops)
                return httpx2.Response(200, json=message)
            translator = StreamTranslator(body["model"], stop_sequences=stops)
            sse: list[bytes] = []
            with engine.stream("POST", "/v1/chat/completions", json=chat_request) as answer:
                assert answer.status_code == 200
                for line in answer.iter_lines():
                    if line.startswith("data: "):
                        data = line.removeprefix("data: ")
                        payload = data if data == "[DONE]" else json.loads(data)
                        sse += [encode(*event) for event in translator.feed(payload)]
            if not translator.done:
                sse.append(encode(*error_event("the engine's stream was cut")))
        return httpx2.Response(
            200, content=b"".join(sse), headers={"content-type": "text/event-stream"}
        )

    return handler


@pytest.fixture
def sim_client(simulator: str) -> Iterator[anthropic.Anthropic]:
    http = httpx2.Client(transport=httpx2.MockTransport(_via(simulator)))
    with anthropic.Anthropic(
        api_key="k", base_url="http://llmgw.test", http_client=http, max_retries=0
    ) as sdk:
        yield sdk


_CONVERSATION: Any = {
    "model": "sim-model",
    "max_tokens": 6,
    "system": "You are terse.",
    "messages": [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sun"}],
        },
    ],
    "tools": [WEATHER],
    "metadata": {"user_id": "u"},
    "extra_body": {"top_k": 5},  # Not a keyword of this SDK version; a member all the same.
}


def test_the_simulator_answers_a_translated_conversation(sim_client: anthropic.Anthropic) -> None:
    message = sim_client.messages.create(**_CONVERSATION)
    assert message.id.startswith("msg_")
    assert message.model == "sim-model"
    assert message.content[0].type == "text"
    assert message.content[0].text
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 6
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) > 0


def test_the_simulator_streams_through_the_translator(sim_client: anthropic.Anthropic) -> None:
    with sim_client.messages.stream(**_CONVERSATION) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1
    assert final.content[0].type == "text"
    assert final.content[0].text == "".join(pieces)
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 6
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) > 0


def test_an_engine_error_reaches_the_sdk_as_its_own_error(sim_client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.APIStatusError) as caught:
        sim_client.messages.create(**{**_CONVERSATION, "model": "no-such-model"})
    assert 400 <= caught.value.status_code < 500
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["type"] == "error"
    assert "no-such-model" in caught.value.body["error"]["message"]
