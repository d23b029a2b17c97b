"""llmgw.router.anthropic.to_chat: a Messages request as a chat completions request,
checked with the openai SDK's request type; what cannot be honoured is a 400 naming
the member."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types.shared import ErrorResponse
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.router.anthropic import (
    MessagesError,
    to_chat,
)
from tests.anthropic_shapes import (
    CHAT_REQUEST,
    DROP,
    JSON_VALUES,
    WEATHER,
    call,
    chat,
    paths,
    request,
)

# ---------------------------------------------------------------------------- to_chat


def test_a_plain_request() -> None:
    body = request(
        system="Be brief.",
        stop_sequences=["END", "\n\n"],
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        metadata={"user_id": "u-1"},
        service_tier="auto",
    )
    assert chat(body) == {
        "model": "claude-x",
        "max_tokens": 64,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        ],
        "stop": ["END", "\n\n"],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "user": "u-1",
    }


def test_system_blocks_are_joined_and_a_stream_asks_for_usage() -> None:
    body = request(
        system=[
            {"type": "text", "text": "One.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Two."},
        ],
        stream=True,
    )
    translated = chat(body)
    assert translated["messages"][0] == {"role": "system", "content": "One.\n\nTwo."}
    assert translated["stream"] is True
    assert translated["stream_options"] == {"include_usage": True}
    assert "stream" not in chat(request(stream=False))


def test_text_and_images() -> None:
    content = [
        {"type": "text", "text": "What is in these?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
    ]
    translated = chat(request(messages=[{"role": "user", "content": content}]))
    assert translated["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in these?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
            ],
        }
    ]
    # A single text block is sent as a plain string, which every chat template takes.
    single = chat(request(messages=[{"role": "user", "content": [{"type": "text", "text": "x"}]}]))
    assert single["messages"] == [{"role": "user", "content": "x"}]


def test_a_tool_conversation() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "get_weather",
                    "input": {"city": "Rome"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "no data"}],
                    "is_error": True,
                },
                {"type": "text", "text": "Thanks"},
            ],
        },
    ]
    body = request(
        messages=messages,
        tools=[WEATHER],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
    )
    translated = chat(body)
    assert translated["messages"] == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                call("toolu_1", "get_weather", '{"city":"Paris"}'),
                call("toolu_2", "get_weather", '{"city":"Rome"}'),
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no data"},
        {"role": "user", "content": "Thanks"},
    ]
    assert translated["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER["input_schema"],
                "description": "The weather in a city",
            },
        }
    ]
    assert translated["tool_choice"] == "auto"
    assert translated["parallel_tool_calls"] is False


def test_an_assistant_turn_of_tool_calls_only_and_images_in_a_tool_result() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://e.com/p.png"}}
    messages = [
        {"role": "user", "content": "Screenshot?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [image]},
            ],
        },
    ]
    tool = {"name": "shot", "input_schema": {"type": "object"}}
    translated = chat(request(messages=messages, tools=[tool]))["messages"]
    assert translated[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("t1", "shot", "{}")],
    }
    assert translated[2] == {"role": "tool", "tool_call_id": "t1", "content": ""}
    assert translated[3] == {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": "https://e.com/p.png"}}],
    }


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        (
            {"type": "tool", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
        ),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: Any) -> None:
    translated = chat(request(tools=[WEATHER], tool_choice=choice))
    assert translated["tool_choice"] == expected
    assert "parallel_tool_calls" not in translated


def _mangle(**members: Any) -> dict[str, Any]:
    body = request(**members)
    return {k: v for k, v in body.items() if v is not DROP}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_mangle(max_tokens=DROP), "max_tokens: Field required"),
        (_mangle(max_tokens=0), "max_tokens: Input should be an integer from 1 to 2147483648"),
        (_mangle(max_tokens=1 << 40), "max_tokens"),
        (_mangle(max_tokens=True), "max_tokens"),
        (_mangle(max_tokens="5"), "max_tokens"),
        (_mangle(max_tokens=2.0), "max_tokens"),
        (_mangle(model=DROP), "model"),
        (_mangle(model=""), "model"),
        (_mangle(messages=DROP), "messages: Field required"),
        (_mangle(messages=[]), "messages: List should have at least 1 item"),
        (_mangle(messages={"role": "user"}), "messages: Input should be a valid list"),
        (_mangle(messages=[{"role": "system", "content": "x"}]), "messages.0.role"),
        (_mangle(messages=[{"role": "user"}]), "messages.0.content: Field required"),
        (_mangle(messages=[{"role": "user", "content": []}]), "messages.0.content: List"),
        (_mangle(messages=[{"role": "user", "content": 5}]), "messages.0.content"),
        (_mangle(messages=[{"role": "user", "content": "x", "name": "n"}]), "messages.0.name"),
        (
            _mangle(messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]),
            "messages.0.content.0.type: 'document' blocks are not supported",
        ),
        (
            _mangle(messages=[{"role": "user", "content": [{"text": "x"}]}]),
            "messages.0.content.0.type: Field required",
        ),
        (
            _mangle(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]),
            "messages.0.content.0.text",
        ),
        (
            _mangle(
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/bmp",
                                    "data": "x",
                                },
                            }
                        ],
                    }
                ]
            ),
            "messages.0.content.0.source.media_type",
        ),
        (
            _mangle(
                messages=[
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}
                ]
            ),
            "messages.0.content.0.input",
        ),
        (
            _mangle(messages=[{"role": "assistant", "content": [{"type": "thinking"}]}]),
            "'thinking' blocks are not supported",
        ),
        (
            _mangle(
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "x"}],
                    }
                ]
            ),
            "messages.0.content.0.tool_use_id: no tool_use block with id 't9'",
        ),
        (_mangle(system=[{"type": "image"}]), "system.0.type"),
        (_mangle(system=5), "system"),
        (_mangle(tools=[{"name": "bad name", "input_schema": {"type": "object"}}]), "tools.0.name"),
        (_mangle(tools=[{"name": "f", "input_schema": {"type": "array"}}]), "tools.0.input_schema"),
        (_mangle(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "server tool"),
        (_mangle(tools=[WEATHER, WEATHER]), "unique"),
        (_mangle(tools=[WEATHER], tool_choice={"type": "tool", "name": "x"}), "no tool named"),
        (_mangle(tool_choice={"type": "any"}), "tool_choice: requires tools"),
        (_mangle(tool_choice={"type": "sometimes"}), "tool_choice.type"),
        (_mangle(tools=[WEATHER], tool_choice="auto"), "tool_choice: Input should be an object"),
        (_mangle(temperature=1.5), "temperature"),
        (_mangle(temperature=True), "temperature"),
        (_mangle(top_p=-0.1), "top_p"),
        (_mangle(top_k=-1), "top_k"),
        (_mangle(stop_sequences="END"), "stop_sequences"),
        (_mangle(stop_sequences=[""]), "stop_sequences.0"),
        (_mangle(stream="yes"), "stream"),
        (_mangle(metadata={"session": "s"}), "metadata.session"),
        (_mangle(thinking={"type": "enabled", "budget_tokens": 1024}), "thinking"),
        (_mangle(mcp_servers=[]), "body.mcp_servers: Extra inputs are not permitted"),
    ],
)
def test_an_invalid_request_is_a_400_naming_the_member(body: dict[str, Any], message: str) -> None:
    with pytest.raises(MessagesError) as caught:
        to_chat(body)
    error = caught.value
    assert (error.status, error.type) == (400, "invalid_request_error")
    assert message in error.message
    ErrorResponse.model_validate(error.body())


def test_a_body_that_is_not_an_object() -> None:
    with pytest.raises(MessagesError, match="body: Input should be an object"):
        to_chat([])  # type: ignore[arg-type]


def test_disabled_thinking_is_accepted() -> None:
    assert "thinking" not in chat(request(thinking={"type": "disabled"}))


# ------------------------------------------------ hypothesis: any request, 400 or valid

_RICH = request(
    system=[{"type": "text", "text": "s"}],
    messages=[
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "q"},
                _IMAGE := {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "AA"},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "t"},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "x"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "r"}, _IMAGE],
                },
                {"type": "text", "text": "more"},
            ],
        },
    ],
    tools=[WEATHER],
    tool_choice={"type": "tool", "name": "get_weather"},
    stop_sequences=["x"],
    temperature=0.1,
    top_p=0.5,
    top_k=3,
    stream=True,
    metadata={"user_id": "u"},
)


_PATHS = list(paths(_RICH))[1:]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_PATHS), st.one_of(st.just(DROP), JSON_VALUES))
def test_a_mangled_request_is_a_400_or_a_valid_chat_request(
    path: tuple[Any, ...], replacement: Any
) -> None:
    body = json.loads(json.dumps(_RICH))
    *parents, last = path
    container = body
    for key in parents:
        container = container[key]
    if replacement is DROP:
        del container[last]
    else:
        container[last] = replacement
    try:
        translated = to_chat(body)
    except MessagesError as error:
        assert (error.status, error.type) == (400, "invalid_request_error")
        ErrorResponse.model_validate(error.body())
    else:
        CHAT_REQUEST.validate_python(translated)
        json.dumps(translated, allow_nan=False)  # What the engine is sent is JSON.
