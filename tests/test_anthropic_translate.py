"""llmgw.router.anthropic: Messages API <-> chat completions, checked with both SDKs' types.

The shapes are the official SDKs' (anthropic's response and stream event models, its
SSE parser and stream accumulator; openai's request TypedDicts), not guessed here.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai.types.chat as oai
import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from hypothesis import given, settings
from hypothesis import strategies as st

try:  # The SDK's HTTP client: httpx2 (an httpx fork) from anthropic 0.7x on, httpx before.
    import httpx2
except ImportError:  # pragma: no cover
    import httpx as httpx2  # type: ignore[no-redef]

from llmgw.router.anthropic import (
    MessagesError,
    StreamTranslator,
    encode,
    error_body,
    error_event,
    error_from_chat,
    error_type,
    from_chat,
    to_chat,
)
from tests.procs import sim

EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)
CHAT_REQUEST = pydantic.TypeAdapter(oai.completion_create_params.CompletionCreateParamsBase)
_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def request(**members: Any) -> dict[str, Any]:
    return {
        "model": "claude-x",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
        **members,
    }


def chat(body: dict[str, Any]) -> dict[str, Any]:
    """to_chat, and the result checked against the openai SDK's request type."""
    translated = to_chat(body)
    CHAT_REQUEST.validate_python(translated)
    return translated


def completion(
    content: str | None = "Hello",
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str = "stop",
    usage: dict[str, Any] | None = None,
    **choice: Any,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-abc123",
        "object": "chat.completion",
        "model": "engine-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, **choice}],
        "usage": usage or {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
    }


def call(id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


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
    return {k: v for k, v in body.items() if v is not _DROP}


_DROP = object()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_mangle(max_tokens=_DROP), "max_tokens: Field required"),
        (_mangle(max_tokens=0), "max_tokens: Input should be an integer from 1 to 2147483648"),
        (_mangle(max_tokens=1 << 40), "max_tokens"),
        (_mangle(max_tokens=True), "max_tokens"),
        (_mangle(max_tokens="5"), "max_tokens"),
        (_mangle(max_tokens=2.0), "max_tokens"),
        (_mangle(model=_DROP), "model"),
        (_mangle(model=""), "model"),
        (_mangle(messages=_DROP), "messages: Field required"),
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


# -------------------------------------------------------------------------- from_chat


def test_a_text_response() -> None:
    message = from_chat(completion("Hello there"), "claude-x")
    assert message == {
        "id": "msg_abc123",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [{"type": "text", "text": "Hello there"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 5},
    }
    Message.model_validate(message)


def test_a_tool_call_response() -> None:
    response = completion(
        "Let me check.",
        [call("call_1", "get_weather", '{"city": "Paris"}'), call("call_2", "noargs", "")],
        finish="tool_calls",
    )
    message = from_chat(response, "claude-x")
    Message.model_validate(message)
    assert message["content"] == [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_2", "name": "noargs", "input": {}},
    ]
    assert message["stop_reason"] == "tool_use"


def test_arguments_that_are_not_a_json_object_are_kept_raw_and_sent_back_as_they_were() -> None:
    for arguments in ('{"city": "Par', "[1, 2]", "plain words"):
        response = completion(None, [call("c", "f", arguments)], finish="tool_calls")
        message = from_chat(response, "m")
        Message.model_validate(message)
        assert message["content"] == [
            {"type": "tool_use", "id": "c", "name": "f", "input": {"_raw": arguments}}
        ]
        # The next turn gives the engine back exactly what it wrote.
        back = to_chat(request(messages=[{"role": "assistant", "content": message["content"]}]))
        assert back["messages"][0]["tool_calls"][0]["function"]["arguments"] == arguments


def test_tool_use_round_trip() -> None:
    """Engine tool calls -> Messages response -> the next request -> the same tool calls."""
    calls = [call("call_a", "get_weather", '{"city":"Paris"}'), call("call_b", "f", '{"n":[1,2]}')]
    message = from_chat(completion("ok", calls, finish="tool_calls"), "claude-x")
    results = [
        {"type": "tool_result", "tool_use_id": block["id"], "content": "done"}
        for block in message["content"]
        if block["type"] == "tool_use"
    ]
    body = request(
        messages=[
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": message["content"]},
            {"role": "user", "content": results},
        ],
        tools=[WEATHER, {"name": "f", "input_schema": {"type": "object"}}],
    )
    translated = chat(body)["messages"]
    assert translated[1] == {"role": "assistant", "content": "ok", "tool_calls": calls}
    assert translated[2:] == [
        {"role": "tool", "tool_call_id": "call_a", "content": "done"},
        {"role": "tool", "tool_call_id": "call_b", "content": "done"},
    ]


@pytest.mark.parametrize(
    ("finish", "choice", "stops", "reason", "sequence"),
    [
        ("stop", {}, None, "end_turn", None),
        ("length", {}, None, "max_tokens", None),
        ("tool_calls", {}, None, "tool_use", None),
        ("content_filter", {}, None, "refusal", None),
        ("stop", {"stop_reason": "END"}, None, "stop_sequence", "END"),  # vLLM
        ("stop", {"stop_reason": 128001}, None, "end_turn", None),  # vLLM, an EOS token
        ("stop", {"matched_stop": "END"}, ["END"], "stop_sequence", "END"),  # SGLang
        ("stop", {"matched_stop": "</s>"}, ["END"], "end_turn", None),  # not the client's
    ],
)
def test_stop_reasons(
    finish: str, choice: dict[str, Any], stops: list[str] | None, reason: str, sequence: str | None
) -> None:
    message = from_chat(completion("x", finish=finish, **choice), "m", stop_sequences=stops)
    Message.model_validate(message)
    assert (message["stop_reason"], message["stop_sequence"]) == (reason, sequence)


def test_a_tool_call_finished_with_stop_is_tool_use() -> None:
    message = from_chat(completion(None, [call("c", "f", "{}")], finish="stop"), "m")
    assert message["stop_reason"] == "tool_use"


def test_cached_prompt_tokens_are_cache_reads() -> None:
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 64},
    }
    message = from_chat(completion(usage=usage), "m")
    assert message["usage"] == {
        "input_tokens": 36,
        "output_tokens": 7,
        "cache_read_input_tokens": 64,
    }
    Message.model_validate(message)


def test_content_parts_in_a_response_are_its_text() -> None:
    response = completion(None)
    response["choices"][0]["message"]["content"] = [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b"},
    ]
    assert from_chat(response, "m")["content"] == [{"type": "text", "text": "ab"}]


def test_a_response_without_usage_or_id() -> None:
    response = completion()
    del response["usage"], response["id"]
    message = from_chat(response, "m")
    Message.model_validate(message)
    assert message["usage"] == {"input_tokens": 0, "output_tokens": 0}
    assert message["id"].startswith("msg_")


@pytest.mark.parametrize(
    "response",
    [{}, {"choices": []}, {"choices": [{"message": "x"}]}, {"choices": [1]}],
)
def test_a_response_without_a_choice_is_a_502(response: dict[str, Any]) -> None:
    with pytest.raises(MessagesError) as caught:
        from_chat(response, "m")
    assert (caught.value.status, caught.value.type) == (502, "api_error")


# -------------------------------------------------------------------------- streaming


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> Any:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "chatcmpl-s1", "object": "chat.completion.chunk", "choices": choices, **extra}


def tool_chunk(index: int, id: str | None = None, name: str | None = None, args: str = "") -> Any:
    function: dict[str, Any] = {"arguments": args}
    if name is not None:
        function["name"] = name
    fragment: dict[str, Any] = {"index": index, "function": function}
    if id is not None:
        fragment.update(id=id, type="function")
    return chunk({"tool_calls": [fragment]})


def run(translator: StreamTranslator, payloads: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    """The events for `payloads`, each checked with the SDK's type, and their order."""
    events = [event for payload in payloads for event in translator.feed(payload)]
    for name, data in events:
        if name != "error":
            parsed = EVENT.validate_python(data)
            assert parsed.type == name
    check_order([name for name, _ in events], [data.get("index") for _, data in events])
    return events


def check_order(names: list[str], indices: list[int | None]) -> None:
    """Anthropic's grammar: message_start (block_start delta* block_stop)* message_delta
    message_stop, blocks numbered from 0; or, cut anywhere, an error event last."""
    if names and names[-1] == "error":
        names, indices = names[:-1], indices[:-1]
        complete = False
    else:
        complete = True
    assert "error" not in names
    if not names:
        assert not complete, "a stream that was not cut has a message"
        return
    assert names[0] == "message_start"
    open_block: int | None = None
    next_block = 0
    for position, (name, index) in enumerate(zip(names, indices, strict=True)):
        if position == 0:
            continue
        if name == "content_block_start":
            assert open_block is None and index == next_block
            open_block, next_block = index, next_block + 1
        elif name == "content_block_delta":
            assert open_block is not None and index == open_block
        elif name == "content_block_stop":
            assert open_block is not None and index == open_block
            open_block = None
        elif name == "message_delta":
            assert open_block is None and names[position + 1 :] == ["message_stop"]
        else:
            assert name == "message_stop" and names[position - 1] == "message_delta"
    if complete:
        assert names[-2:] == ["message_delta", "message_stop"]


def accumulate(events: list[tuple[str, dict[str, Any]]]) -> Message:
    snapshot = None
    buffers: dict[int, bytes] = {}
    for _, data in events:
        snapshot = accumulate_event(
            event=EVENT.validate_python(data), current_snapshot=snapshot, json_bufs=buffers
        )
    assert snapshot is not None
    return Message.model_validate(snapshot.to_dict())


TEXT_THEN_TOOL = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Let me "}),
    chunk({"content": "check."}),
    tool_chunk(0, "call_1", "get_weather"),
    tool_chunk(0, args='{"city": '),
    tool_chunk(0, args='"Paris"}'),
    tool_chunk(1, "call_2", "get_time", '{"tz": "CET"}'),
    chunk({}, finish="tool_calls"),
    chunk(usage={"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29}),
    "[DONE]",
]


def test_a_stream_of_text_then_tool_calls() -> None:
    events = run(StreamTranslator("claude-x"), TEXT_THEN_TOOL)
    assert events == [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_s1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-x",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 0, "output_tokens": 0},
                },
            },
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Let me "},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "check."},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {
                    "type": "tool_use",
                    "id": "call_1",
                    "name": "get_weather",
                    "input": {},
                },
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"city": '},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '"Paris"}'},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 2,
                "content_block": {
                    "type": "tool_use",
                    "id": "call_2",
                    "name": "get_time",
                    "input": {},
                },
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 2,
                "delta": {"type": "input_json_delta", "partial_json": '{"tz": "CET"}'},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 2}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 9, "input_tokens": 20},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    final = accumulate(events)
    assert final.stop_reason == "tool_use"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (20, 9)
    assert [block.to_dict() for block in final.content] == [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_2", "name": "get_time", "input": {"tz": "CET"}},
    ]


def test_a_tool_call_whose_name_comes_late_waits_for_it() -> None:
    payloads = [
        chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"arguments": '{"a"'}}]}),
        tool_chunk(0, name="f", args=": 1}"),
        chunk({}, finish="tool_calls"),
        "[DONE]",
    ]
    events = run(StreamTranslator("m"), payloads)
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[2][1]["delta"]["partial_json"] == '{"a": 1}'
    assert accumulate(events).content[0].to_dict()["input"] == {"a": 1}


def test_a_stream_that_stops_on_a_stop_sequence_with_cached_tokens() -> None:
    usage = {
        "prompt_tokens": 50,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
    payloads = [
        chunk({"content": "a b"}),
        {
            **chunk({}, finish="stop"),
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "END"}],
        },
        chunk(usage=usage),
        "[DONE]",
    ]
    events = run(StreamTranslator("m", stop_sequences=["END"]), payloads)
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert delta["usage"] == {"output_tokens": 3, "input_tokens": 18, "cache_read_input_tokens": 32}
    final = accumulate(events)
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "END")
    assert final.usage.cache_read_input_tokens == 32


def test_continuous_usage_gives_input_tokens_at_the_start() -> None:
    first = chunk({"role": "assistant"}, usage={"prompt_tokens": 12, "completion_tokens": 0})
    events = run(StreamTranslator("m"), [first, chunk({}, finish="length"), "[DONE]"])
    assert events[0][1]["message"]["usage"] == {"input_tokens": 12, "output_tokens": 0}
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"
    assert accumulate(events).content == []


def test_an_empty_stream_is_still_a_whole_message() -> None:
    translator = StreamTranslator("m")
    assert not translator.started
    events = run(translator, ["[DONE]"])
    assert translator.started
    assert [name for name, _ in events] == ["message_start", "message_delta", "message_stop"]
    assert accumulate(events).stop_reason == "end_turn"
    assert translator.done
    assert translator.feed(chunk({"content": "late"})) == []


def test_an_engine_error_mid_stream_ends_it_with_an_error_event() -> None:
    translator = StreamTranslator("m")
    events = run(
        translator,
        [chunk({"content": "par"}), {"error": {"message": "engine died", "code": 500}}, "[DONE]"],
    )
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "error",
    ]
    assert events[-1] == error_event("engine died")
    ErrorResponse.model_validate(events[-1][1])


def test_a_tool_call_resumed_after_the_next_block_began_is_refused() -> None:
    translator = StreamTranslator("m")
    translator.feed(tool_chunk(0, "a", "f", "{"))
    translator.feed(tool_chunk(1, "b", "g", "{}"))
    with pytest.raises(MessagesError) as caught:
        translator.feed(tool_chunk(0, args="}"))
    assert (caught.value.status, caught.value.type) == (502, "api_error")


def test_a_tool_call_never_named_is_refused() -> None:
    translator = StreamTranslator("m")
    translator.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}))
    with pytest.raises(MessagesError, match="without a name") as caught:
        translator.feed("[DONE]")
    assert caught.value.status == 502


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=6),
        st.recursive(
            st.none() | st.booleans() | st.integers() | _TEXT,
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=4), inner, max_size=3)
            ),
            max_leaves=6,
        ),
        max_size=4,
    )
)
def test_tool_arguments_survive_the_round_trip(arguments: dict[str, Any]) -> None:
    """Engine arguments -> tool_use input -> the next request's arguments: the same JSON."""
    response = completion(None, [call("c", "f", json.dumps(arguments))], finish="tool_calls")
    blocks = from_chat(response, "m")["content"]
    assert blocks[0]["input"] == arguments
    back = to_chat(request(messages=[{"role": "assistant", "content": blocks}]))
    assert json.loads(back["messages"][0]["tool_calls"][0]["function"]["arguments"]) == arguments


def test_encode() -> None:
    assert encode("message_stop", {"type": "message_stop"}) == (
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    assert encode("x", {"text": "é"}) == 'event: x\ndata: {"text":"é"}\n\n'.encode()


# ------------------------------------------------------------ hypothesis: stream == whole


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


@st.composite
def generations(draw: Callable[..., Any]) -> tuple[str, list[tuple[str, str, str]], list[Any]]:
    """A generation (text, tool calls) and a chat completions stream that delivers it."""
    text = draw(_TEXT)
    tools = draw(
        st.lists(
            st.tuples(
                st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
                st.dictionaries(st.text(max_size=5), st.integers() | _TEXT, max_size=3),
            ),
            max_size=3,
        )
    )
    cuts = st.lists(st.integers(0, 1000), max_size=4)
    payloads: list[Any] = [chunk({"role": "assistant", "content": ""})]
    payloads += [chunk({"content": piece}) for piece in _split(text, draw(cuts))]
    calls = []
    for i, (name, arguments) in enumerate(tools):
        encoded = json.dumps(arguments)
        pieces = _split(encoded, draw(cuts))
        payloads.append(tool_chunk(i, f"call_{i}", name, pieces[0] if pieces else ""))
        payloads += [tool_chunk(i, args=piece) for piece in pieces[1:]]
        calls.append((f"call_{i}", name, encoded))
    payloads.append(chunk({}, finish="tool_calls" if tools else "stop"))
    payloads.append(chunk(usage={"prompt_tokens": 3, "completion_tokens": 4}))
    payloads.append("[DONE]")
    return text, calls, payloads


@settings(max_examples=60, deadline=None)
@given(generations())
def test_a_stream_accumulates_to_the_message_of_the_whole_response(
    generation: tuple[str, list[tuple[str, str, str]], list[Any]],
) -> None:
    text, calls, payloads = generation
    events = run(StreamTranslator("m"), payloads)
    streamed = accumulate(events).to_dict()
    whole = completion(
        text or None,
        [call(*c) for c in calls] or None,
        finish="tool_calls" if calls else "stop",
        usage={"prompt_tokens": 3, "completion_tokens": 4},
    )
    expected = from_chat(whole, "m")
    streamed["id"] = expected["id"]
    assert streamed.pop("stop_details") is None  # Set by the accumulator's message_delta.
    assert streamed == expected
    # Indices count up from 0, each block started once and stopped once, in order.
    starts = [d["index"] for n, d in events if n == "content_block_start"]
    stops = [d["index"] for n, d in events if n == "content_block_stop"]
    assert starts == stops == list(range(len(expected["content"])))


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

_JSON = st.recursive(
    # Finite floats only: NaN and infinities are not JSON, and the client's body was.
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key, member in value.items():
            yield from _paths(member, (*path, key))
    elif isinstance(value, list):
        for i, member in enumerate(value):
            yield from _paths(member, (*path, i))


_PATHS = list(_paths(_RICH))[1:]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_PATHS), st.one_of(st.just(_DROP), _JSON))
def test_a_mangled_request_is_a_400_or_a_valid_chat_request(
    path: tuple[Any, ...], replacement: Any
) -> None:
    body = json.loads(json.dumps(_RICH))
    *parents, last = path
    container = body
    for key in parents:
        container = container[key]
    if replacement is _DROP:
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


def _mangled(value: Any, path: tuple[Any, ...], replacement: Any) -> Any:
    value = json.loads(json.dumps(value))
    *parents, last = path
    container = value
    for key in parents:
        container = container[key]
    if replacement is _DROP:
        del container[last]
    else:
        container[last] = replacement
    return value


_RICH_RESPONSE = completion(
    "text",
    [call("c1", "f", '{"a": 1}'), call("c2", "g", "{")],
    finish="tool_calls",
    usage={
        "prompt_tokens": 9,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 4},
    },
    stop_reason="x",
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(list(_paths(_RICH_RESPONSE))[1:]), st.one_of(st.just(_DROP), _JSON))
def test_a_mangled_response_is_a_valid_message_or_a_502(
    path: tuple[Any, ...], replacement: Any
) -> None:
    response = _mangled(_RICH_RESPONSE, path, replacement)
    try:
        message = from_chat(response, "m")
    except MessagesError as error:
        assert (error.status, error.type) == (502, "api_error")
    else:
        Message.model_validate(message)


_STREAM_PATHS = [
    (i, *path) for i, payload in enumerate(TEXT_THEN_TOOL[:-1]) for path in _paths(payload)
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_STREAM_PATHS), st.one_of(st.just(_DROP), _JSON))
def test_a_mangled_stream_is_valid_events_or_a_502(path: tuple[Any, ...], replacement: Any) -> None:
    payloads = _mangled(TEXT_THEN_TOOL, path, replacement)
    try:
        events = run(StreamTranslator("m"), payloads)
    except MessagesError as error:
        assert (error.status, error.type) == (502, "api_error")
        return
    if events[-1][0] == "error":
        ErrorResponse.model_validate(events[-1][1])
    # (Not accumulated: mangled arguments are not JSON, which the SDK refuses, as it should.)


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (422, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (529, "overloaded_error"),
    ],
)
def test_error_bodies(status: int, kind: str) -> None:
    body = error_body(status, "boom")
    assert body == {"type": "error", "error": {"type": kind, "message": "boom"}}
    assert error_type(status) == kind
    if kind != "request_too_large":  # Documented, but not (yet) in the SDK's union.
        ErrorResponse.model_validate(body)


@pytest.mark.parametrize(
    ("status", "response", "message"),
    [
        (400, {"error": {"message": "too long", "type": "BadRequestError"}}, "too long"),  # OpenAI
        (400, {"object": "error", "message": "bad max_tokens", "code": 400}, "bad max_tokens"),
        (503, {"error": "Loading model"}, "Loading model"),  # llama.cpp
        (500, {"error": {}}, "engine error"),
        (502, b"<html>", "engine error (HTTP 502)"),
    ],
)
def test_engine_errors(status: int, response: Any, message: str) -> None:
    body = error_from_chat(status, response)
    assert body["error"] == {"type": error_type(status), "message": message}
    ErrorResponse.model_validate(body)


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
