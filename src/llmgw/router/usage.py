"""The router's token estimates, for when an engine reports no usage."""

from __future__ import annotations

from llmgw.domain.usage import Usage

#: The usage of a request that ended without the engine reporting any.
NO_USAGE = Usage()

#: Bytes of prompt per token, as tokenizers average on English text: the router sees
#: text, never its engine's tokens.
BYTES_PER_TOKEN = 4


def estimate_prompt_tokens(body_size: int) -> int:
    """A rough prompt size from the request body (:data:`BYTES_PER_TOKEN`): for a stream
    cut before the engine reported usage, and the prefill work of a request routed."""
    return max(1, body_size // BYTES_PER_TOKEN)


#: Completion tokens charged for a request that sets no ``max_tokens``.
DEFAULT_COMPLETION = 256


def expected_tokens(body_size: int, max_tokens: int | None) -> int:
    """Prompt and completion tokens a request may take, before it is served: what rate
    limits and admission charge (the prompt estimated as :func:`estimate_prompt_tokens`)."""
    completion = max_tokens if max_tokens is not None else DEFAULT_COMPLETION
    return estimate_prompt_tokens(body_size) + completion
