"""llmgw.router.anthropic.StreamTranslator: an engine's chat completion chunks as
Anthropic's stream events, checked with the SDK's event types and its accumulator."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
from anthropic.types.shared import ErrorResponse
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.router.anthropic import (
    MessagesError,
    StreamTranslator,
    encode,
    error_event,
    from_chat,
)
from tests.anthropic_shapes import (
    DROP,
    JSON_VALUES,
    TEXT,
    TEXT_THEN_TOOL,
    accumulate,
    call,
    chunk,
    completion,
    mangled,
    paths,
    run,
    tool_chunk,
)


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
    text = draw(TEXT)
    tools = draw(
        st.lists(
            st.tuples(
                st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
                st.dictionaries(st.text(max_size=5), st.integers() | TEXT, max_size=3),
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


_STREAM_PATHS = [
    (i, *path) for i, payload in enumerate(TEXT_THEN_TOOL[:-1]) for path in paths(payload)
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_STREAM_PATHS), st.one_of(st.just(DROP), JSON_VALUES))
def test_a_mangled_stream_is_valid_events_or_a_502(path: tuple[Any, ...], replacement: Any) -> None:
    payloads = mangled(TEXT_THEN_TOOL, path, replacement)
    try:
        events = run(StreamTranslator("m"), payloads)
    except MessagesError as error:
        assert (error.status, error.type) == (502, "api_error")
        return
    if events[-1][0] == "error":
        ErrorResponse.model_validate(events[-1][1])
    # (Not accumulated: mangled arguments are not JSON, which the SDK refuses, as it should.)
