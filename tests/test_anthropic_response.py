"""llmgw.router.anthropic.from_chat and the error shapes: an engine's chat completion
(or its error) as a Messages response, checked with the anthropic SDK's types."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import Message
from anthropic.types.shared import ErrorResponse
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.router.anthropic import (
    MessagesError,
    error_body,
    error_from_chat,
    error_type,
    from_chat,
    to_chat,
)
from tests.anthropic_shapes import (
    DROP,
    JSON_VALUES,
    TEXT,
    WEATHER,
    call,
    chat,
    completion,
    mangled,
    paths,
    request,
)

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


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=6),
        st.recursive(
            st.none() | st.booleans() | st.integers() | TEXT,
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
@given(st.sampled_from(list(paths(_RICH_RESPONSE))[1:]), st.one_of(st.just(DROP), JSON_VALUES))
def test_a_mangled_response_is_a_valid_message_or_a_502(
    path: tuple[Any, ...], replacement: Any
) -> None:
    response = mangled(_RICH_RESPONSE, path, replacement)
    try:
        message = from_chat(response, "m")
    except MessagesError as error:
        assert (error.status, error.type) == (502, "api_error")
    else:
        Message.model_validate(message)


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
