"""llmgw.router.body: the request body's top level, and the members routing reads."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.router.affinity import prompt_text_for_affinity
from llmgw.router.body import BodyError, parse


def body(**members: object) -> bytes:
    return json.dumps({"model": "m", **members}).encode()


def test_the_members_routing_reads() -> None:
    b = parse(body(stream=True, stream_options={"include_usage": True}, max_tokens=7))
    assert (b.model, b.stream, b.include_usage, b.max_tokens) == ("m", True, True, 7)
    b = parse(body(max_completion_tokens=9))
    assert (b.stream, b.include_usage, b.max_tokens) == (False, False, 9)
    assert parse(body(max_tokens=None, max_completion_tokens=3)).max_tokens == 3


@pytest.mark.parametrize(
    ("members", "param", "message"),
    [
        ({"max_tokens": -100000}, "max_tokens", "must be an integer from 0 to"),
        ({"max_tokens": 2.5}, "max_tokens", "got 2.5"),
        ({"max_tokens": True}, "max_tokens", "got True"),
        ({"max_tokens": "10"}, "max_tokens", "got '10'"),
        ({"max_completion_tokens": -1}, "max_completion_tokens", "from 0"),
        ({"n": 0}, "n", "from 1 to 128"),
        ({"n": 129}, "n", "got 129"),
        ({"temperature": "hot"}, "temperature", "from 0 to 2"),
        ({"temperature": -0.1}, "temperature", "got -0.1"),
        ({"top_p": 1.5}, "top_p", "from 0 to 1"),
        ({"presence_penalty": 3}, "presence_penalty", "from -2 to 2"),
        ({"frequency_penalty": [1]}, "frequency_penalty", "got list"),
        ({"stream": "yes"}, "stream", "true or false"),
        ({"stream_options": 1}, "stream_options", "must be an object"),
        ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage", "got 1"),
        ({"model": ""}, "model", "model parameter"),
        ({"model": 5}, "model", "model parameter"),
    ],
)
def test_a_member_out_of_type_or_range_is_a_400_naming_it(
    members: dict[str, object], param: str, message: str
) -> None:
    with pytest.raises(BodyError) as caught:
        parse(body(**members))
    assert caught.value.param == param
    assert message in str(caught.value)
    assert str(caught.value).startswith(param) or param == "model"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"[1]", "must be a JSON object"),
        (b"{", "not valid JSON"),
        (b'{"model": "m",}', "not valid JSON"),
        (b'{"model": "m"} x', "not valid JSON"),
        (b"\xff", "not valid JSON"),
        (b'{"model": "m", "a": ' + b"[" * 2000 + b"]" * 2000 + b"}", "nested too deeply"),
    ],
)
def test_a_body_that_is_no_json_object_is_refused(raw: bytes, message: str) -> None:
    with pytest.raises(BodyError, match=message):
        parse(raw)


def test_members_below_the_top_are_not_built_as_python_objects() -> None:
    # 10 million empty objects: the json module built them all (~900 MB).
    raw = b'{"model": "m", "input": [' + b"{}," * 10_000_000 + b"{}]}"
    tracemalloc.start()
    try:
        parsed = parse(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert parsed.model == "m"
    assert peak < 1 << 20


def test_the_payload_is_the_clients_bytes_unless_something_must_change() -> None:
    raw = b'{"model": "m",  "messages": [{"role": "user", "content": "hi"}], "x": 1.50}'
    b = parse(raw)
    assert b.payload("m", add_usage=False) is raw
    renamed = json.loads(b.payload("canonical", add_usage=False))
    assert renamed == {
        "model": "canonical",
        "messages": [{"role": "user", "content": "hi"}],
        "x": 1.5,
    }
    assert b"1.50" in b.payload("canonical", add_usage=False)  # other members untouched
    b = parse(body(stream=True, stream_options={"continuous_usage_stats": True}))
    assert json.loads(b.payload("m", add_usage=True))["stream_options"] == {
        "continuous_usage_stats": True,
        "include_usage": True,
    }
    assert json.loads(parse(body()).payload("m", add_usage=True))["stream_options"] == {
        "include_usage": True
    }


def test_affinity_reads_messages_or_prompt() -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert parse(body(messages=messages)).affinity_fields() == {"messages": messages}
    assert parse(body(prompt="once")).affinity_fields() == {"prompt": "once"}
    assert parse(body(input="x")).affinity_fields() == {}


_TEXT = st.text(
    alphabet=st.sampled_from(["a", "é", "\u4e2d", "\U0001f600", '"', "\\", "\n", "\x01"])
)
_MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant"]),
        "content": st.one_of(
            _TEXT,
            st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}), max_size=2),
        ),
    }
)


@given(
    messages=st.lists(_MESSAGE, max_size=4),
    chars=st.integers(1, 40),
    ascii_only=st.booleans(),
)
def test_affinity_decoded_to_its_budget_hashes_the_same_text(
    messages: list[dict[str, object]], chars: int, ascii_only: bool
) -> None:
    """Escapes and multi-byte characters at the cut: the prefix is the whole one's."""
    raw = json.dumps({"model": "m", "messages": messages}, ensure_ascii=ascii_only).encode()
    b = parse(raw)
    whole = prompt_text_for_affinity(b.affinity_fields(), limit=chars)
    assert prompt_text_for_affinity(b.affinity_fields(chars), limit=chars) == whole


def test_a_huge_content_is_decoded_only_as_far_as_affinity_reads() -> None:
    content = 'ab\u4e2d\\"' * 1_000_000  # ~9 MB of JSON
    b = parse(body(messages=[{"role": "user", "content": content}]))
    tracemalloc.start()
    try:
        fields = b.affinity_fields(4096)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024, peak  # the whole string is ~5M characters, ~15 MB
    assert fields["messages"][0]["content"] == content[: len(fields["messages"][0]["content"])]
    assert len(fields["messages"][0]["content"]) >= 4096
