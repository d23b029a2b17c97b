"""The Messages API translation's tests' shared shapes: requests and engine responses
as the tests write them, stream chunks and their translation, the SDK's types that
check what comes out, and the mangling the property tests apply."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai.types.chat as oai
import pydantic
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from hypothesis import strategies as st

from llmgw.router.anthropic import (
    StreamTranslator,
    to_chat,
)

EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)
CHAT_REQUEST = pydantic.TypeAdapter(oai.completion_create_params.CompletionCreateParamsBase)
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)

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


DROP = object()


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


JSON_VALUES = st.recursive(
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


def paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key, member in value.items():
            yield from paths(member, (*path, key))
    elif isinstance(value, list):
        for i, member in enumerate(value):
            yield from paths(member, (*path, i))


def mangled(value: Any, path: tuple[Any, ...], replacement: Any) -> Any:
    value = json.loads(json.dumps(value))
    *parents, last = path
    container = value
    for key in parents:
        container = container[key]
    if replacement is DROP:
        del container[last]
    else:
        container[last] = replacement
    return value
