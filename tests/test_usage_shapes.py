"""The usage objects the router reads from engines' answers, in each API's names."""

from __future__ import annotations

import pytest

from llmgw.domain.usage import Usage


@pytest.mark.parametrize(
    ("given", "read"),
    [
        # Chat completions, with the cached prompt tokens vLLM reports.
        (
            {
                "prompt_tokens": 10,
                "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 4},
            },
            Usage(10, 3, 4),
        ),
        # The Responses API.
        (
            {"input_tokens": 7, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 0}},
            Usage(7, 2, 0),
        ),
        # Anthropic's: input_tokens leaves out what the cache read.
        ({"input_tokens": 1, "output_tokens": 4, "cache_read_input_tokens": 21}, Usage(22, 4, 21)),
        # Anthropic's message_delta: the output alone (the relay keeps the input).
        ({"output_tokens": 9}, Usage(0, 9)),
        # Not usage.
        ({"prompt_tokens": "10"}, None),
        (None, None),
    ],
)
def test_usage_in_each_apis_names(given: object, read: Usage | None) -> None:
    assert Usage.from_openai(given) == read
